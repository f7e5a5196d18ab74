#include "tools/make_model/scripted.h"

#include <cmath>
#include <map>

#include "engine/common/error.h"
#include "tools/make_model/make_model.h"

namespace ds4::make_model {

const char *const kScriptToolCall =
    "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
const char *const kScriptAnswer = "It is sunny in Paris.";

namespace {

// User-defined tokens, from id 259 (after the byte-level fallback's 3 + 256).
const std::vector<std::string> kAdded = {
    "</think>",                                                      // 259: the chat prompt's last token
    "<tool_result>",                                                 // 260: the marker
    "\n\n<｜DSML｜tool_calls>\n",                                     // 261
    "<｜DSML｜invoke name=\"get_weather\">\n",                         // 262
    "<｜DSML｜parameter name=\"city\" string=\"true\">",                // 263
    "Paris",                                                         // 264
    "</｜DSML｜parameter>\n",                                         // 265
    "<｜DSML｜parameter name=\"days\" string=\"false\">",               // 266
    "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",      // 267
    "It is sunny",                                                   // 268
    " in Paris",                                                     // 269
    "<｜User｜>", "<｜Assistant｜>", "</tool_result>",
};
constexpr int kThinkEnd = 259, kMarker = 260, kEos = 1;
constexpr int byte_id(char c) { return 3 + static_cast<unsigned char>(c); }

// key token -> successor (the script); kThinkEnd's is the no-tool-result branch.
const std::map<int, int> kNext = {
    {kThinkEnd, 261}, {261, 262}, {262, 263}, {263, 264}, {264, 265}, {265, 266}, {266, byte_id('3')},
    {byte_id('3'), 267}, {267, kEos},
    {268, 269}, {269, byte_id('.')}, {byte_id('.'), kEos}, {byte_id('>'), 268},
};
constexpr int kAnswerFirst = 268;

// Residual coordinates: 0 constant, 1 attention signal, 2 marker, 3.. one per key token.
constexpr int kConst = 0, kSignal = 1, kMarkerDim = 2;
constexpr float kKeyValue = 4.f, kHead = 100.f, kSignalGain = 1.f, kSignalBias = 1.f;
constexpr float kSink = 10.f, kValueGain = 1e4f;

int key_dim(int tok) {
    int d = 3;
    for (auto &[k, v] : kNext) {
        if (k == tok) return d;
        ++d;
    }
    return -1;
}

}  // namespace

ModelConfig scripted_config() {
    ModelConfig c = preset_config("tiny");
    c.n_layer = 1;
    c.compress_ratio = {0};
    c.swiglu_limit = {10.f};
    c.n_hash_layer = 0;
    c.hc_mult = 1;
    c.n_vocab = 320;
    c.sliding_window = 128;
    return c;
}

tok::Vocab scripted_vocab(int n_vocab) {
    tok::Vocab v = tok::fallback_vocab(n_vocab);
    // A chat model (it follows the DeepSeek-V4 chat format), so clients default to chat for it.
    v.chat_template = "{# DeepSeek-V4 chat format, rendered by ds4's engine (engine/tokenizer/chat_template.h) #}";
    for (size_t i = 0; i < kAdded.size(); ++i) {
        v.tokens[259 + i] = kAdded[i];
        v.types[259 + i] = static_cast<int32_t>(tok::TokenType::UserDefined);
    }
    return v;
}

std::vector<float> scripted_values(const convert::TensorSpec &s, const ModelConfig &c) {
    std::vector<float> v(static_cast<size_t>(s.nelements()), 0.f);
    const int E = c.n_embd;
    if (3 + int(kNext.size()) > E) fail("scripted model: n_embd too small for the script");
    auto at = [&](int64_t row, int64_t col) -> float & { return v[static_cast<size_t>(row * s.ne[0] + col)]; };
    const std::string &n = s.gguf;
    auto ends = [&](const char *suffix) {
        const std::string x = suffix;
        return n.size() >= x.size() && n.compare(n.size() - x.size(), x.size(), x) == 0;
    };
    if (n == "token_embd.weight") {
        for (int t = 0; t < c.n_vocab; ++t) {
            at(t, kConst) = 1.f;
            if (int d = key_dim(t); d >= 0) at(t, d) = kKeyValue;
            if (t == kMarker) at(t, kMarkerDim) = 1.f;
        }
    } else if (n == "output.weight") {
        for (auto &[k, next] : kNext) at(next, key_dim(k)) += kHead;
        // After "</think>" the answer ties with the call, plus the signal minus a bias.
        at(kAnswerFirst, key_dim(kThinkEnd)) += kHead;
        at(kAnswerFirst, kSignal) += kSignalGain;
        at(kAnswerFirst, kConst) -= kSignalBias;
    } else if (ends("attn.wkv.weight") || n.find("attn_kv.weight") != std::string::npos) {
        at(0, kMarkerDim) = 1.f;   // value channel 0 = the marker coordinate
    } else if (n.find("attn_kv_a_norm") != std::string::npos) {
        for (auto &x : v) x = 1.f;
        v[0] = kValueGain;
    } else if (n.find("attn_sinks") != std::string::npos) {
        for (auto &x : v) x = kSink;
    } else if (n.find("attn_output_a") != std::string::npos) {
        at(0, 0) = 1.f;   // group 0's first low-rank channel = head 0, channel 0
    } else if (n.find("attn_output_b") != std::string::npos) {
        at(kSignal, 0) = 1.f;
    } else if (s.role == convert::Role::Norm || s.role == convert::Role::HcScale) {
        for (auto &x : v) x = 1.f;
    }
    // Everything else (queries, FFN, routers, hyper-connection mixes and bases) is zero:
    // pre = sigmoid(0), post = 2 sigmoid(0) = 1, the 1x1 comb = 1.
    return v;
}

}  // namespace ds4::make_model
