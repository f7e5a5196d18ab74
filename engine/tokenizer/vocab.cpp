#include "engine/tokenizer/vocab.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/common/error.h"
#include "engine/gguf/gguf.h"
#include "engine/tokenizer/unicode.h"

namespace ds4::tok {
namespace {

constexpr const char *kBosText = "<｜begin▁of▁sentence｜>";
constexpr const char *kEosText = "<｜end▁of▁sentence｜>";
constexpr const char *kPadText = "<｜▁pad▁｜>";

std::string reserved_name(int64_t id) { return "<|reserved_" + std::to_string(id) + "|>"; }

const gguf::Value &array_of(const gguf::Reader &r, const char *key, gguf::ValueType elem, const char *what) {
    const gguf::Value &v = r.get_array(key);
    if (v.elem_type != elem) failf("GGUF key %s: expected an array of %s", key, what);
    return v;
}

int32_t optional_id(const gguf::Reader &r, const char *key, size_t n_tokens) {
    if (!r.has(key)) return -1;
    int64_t id = r.get_int(key);
    if (id < 0 || static_cast<size_t>(id) >= n_tokens)
        failf("GGUF key %s: token id %lld is outside the vocabulary of %zu tokens", key, (long long)id, n_tokens);
    return static_cast<int32_t>(id);
}

}  // namespace

Vocab read_vocab(const gguf::Reader &r) {
    Vocab v;
    v.model = r.get_string("tokenizer.ggml.model");
    if (v.model != "gpt2")
        fail("GGUF key tokenizer.ggml.model is '" + v.model + "': only the byte-level BPE 'gpt2' tokenizer is supported");
    // Another pre-tokenizer still decodes exactly; only encoding text needs ours (the
    // tokenizer refuses that, loudly, and token-id prompts keep working).
    v.pre = r.get_string("tokenizer.ggml.pre", "deepseek-v3");

    const gguf::Value &toks = array_of(r, "tokenizer.ggml.tokens", gguf::ValueType::STRING, "strings");
    if (toks.arr.empty()) fail("GGUF key tokenizer.ggml.tokens is empty");
    if (toks.arr.size() > 0x7FFFFFFF) fail("GGUF key tokenizer.ggml.tokens has too many tokens");
    v.tokens.reserve(toks.arr.size());
    for (const gguf::Value &t : toks.arr) v.tokens.push_back(t.s);

    v.types.assign(v.tokens.size(), static_cast<int32_t>(TokenType::Normal));
    if (r.has("tokenizer.ggml.token_type")) {
        const gguf::Value &ty = r.get_array("tokenizer.ggml.token_type");
        if (ty.arr.size() != v.tokens.size())
            failf("GGUF key tokenizer.ggml.token_type has %zu entries for %zu tokens", ty.arr.size(), v.tokens.size());
        for (size_t i = 0; i < ty.arr.size(); ++i) {
            if (!ty.arr[i].is_integer()) fail("GGUF key tokenizer.ggml.token_type: expected an array of integers");
            int64_t t = ty.arr[i].as_int();
            if (t < 0 || t > 6) failf("GGUF key tokenizer.ggml.token_type[%zu] = %lld is not a token type", i, (long long)t);
            v.types[i] = static_cast<int32_t>(t);
        }
    }
    if (r.has("tokenizer.ggml.merges")) {
        const gguf::Value &m = array_of(r, "tokenizer.ggml.merges", gguf::ValueType::STRING, "strings");
        v.merges.reserve(m.arr.size());
        for (const gguf::Value &x : m.arr) v.merges.push_back(x.s);
    }
    v.bos = optional_id(r, "tokenizer.ggml.bos_token_id", v.tokens.size());
    v.eos = optional_id(r, "tokenizer.ggml.eos_token_id", v.tokens.size());
    v.pad = optional_id(r, "tokenizer.ggml.padding_token_id", v.tokens.size());
    v.eot = optional_id(r, "tokenizer.ggml.eot_token_id", v.tokens.size());
    v.chat_template = r.get_string("tokenizer.chat_template", "");
    return v;
}

void write_vocab(gguf::Writer &w, const Vocab &v) {
    if (v.types.size() != v.tokens.size()) fail("tokenizer vocabulary: token and type counts differ");
    w.set("tokenizer.ggml.model", gguf::Value::str(v.model));
    w.set("tokenizer.ggml.pre", gguf::Value::str(v.pre));
    w.set("tokenizer.ggml.tokens", gguf::Value::str_array(v.tokens));
    w.set("tokenizer.ggml.token_type", gguf::Value::i32_array(v.types));
    w.set("tokenizer.ggml.merges", gguf::Value::str_array(v.merges));
    if (v.bos >= 0) w.set("tokenizer.ggml.bos_token_id", gguf::Value::u32(static_cast<uint32_t>(v.bos)));
    if (v.eos >= 0) w.set("tokenizer.ggml.eos_token_id", gguf::Value::u32(static_cast<uint32_t>(v.eos)));
    if (v.pad >= 0) w.set("tokenizer.ggml.padding_token_id", gguf::Value::u32(static_cast<uint32_t>(v.pad)));
    if (v.eot >= 0) w.set("tokenizer.ggml.eot_token_id", gguf::Value::u32(static_cast<uint32_t>(v.eot)));
    if (!v.chat_template.empty()) w.set("tokenizer.chat_template", gguf::Value::str(v.chat_template));
}

Vocab fallback_vocab(int n_vocab) {
    if (n_vocab < 259)
        failf("byte-level fallback vocabulary needs n_vocab >= 259 (3 control + 256 byte tokens), got %d", n_vocab);
    Vocab v;
    v.tokens = {kBosText, kEosText, kPadText};
    v.tokens.reserve(n_vocab);
    v.types.assign(3, static_cast<int32_t>(TokenType::Control));
    for (int b = 0; b < 256; ++b) {
        std::string s;
        utf8_append(s, byte_to_unicode(static_cast<uint8_t>(b)));
        v.tokens.push_back(s);
        v.types.push_back(static_cast<int32_t>(TokenType::Normal));
    }
    for (int id = 259; id < n_vocab; ++id) {
        v.tokens.push_back(reserved_name(id));
        v.types.push_back(static_cast<int32_t>(TokenType::Unused));
    }
    v.bos = 0, v.eos = 1, v.pad = 2;
    return v;
}

void write_fallback_vocab(gguf::Writer &w, int n_vocab) { write_vocab(w, fallback_vocab(n_vocab)); }

// ---------------------------------------------------------------- HF tokenizer.json

namespace {

using nlohmann::json;

// The DeepSeek V3/V4 pre_tokenizer Split patterns, as tokenizer.json holds them.
const char *const kSplitPatterns[3] = {
    "\\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
};

// Literal CR/LF and the escapes \r \n mean the same inside these patterns.
std::string canonical_pattern(std::string s) {
    std::string out;
    for (char c : s) {
        if (c == '\r') out += "\\r";
        else if (c == '\n') out += "\\n";
        else out += c;
    }
    return out;
}

[[noreturn]] void reject(const std::string &path, const std::string &what) {
    fail("tokenizer.json " + path + ": " + what + " (only the DeepSeek V3/V4 byte-level BPE is supported)");
}

bool is_null_or(const json &j, const char *key, const json &ok) {
    auto it = j.find(key);
    return it == j.end() || it->is_null() || *it == ok;
}

void check_pre_tokenizer(const std::string &path, const json &pt) {
    if (!pt.is_object() || pt.value("type", "") != "Sequence" || !pt.contains("pretokenizers") ||
        !pt["pretokenizers"].is_array() || pt["pretokenizers"].size() != 4)
        reject(path, "pre_tokenizer is not a Sequence of 3 Splits and a ByteLevel");
    const json &seq = pt["pretokenizers"];
    for (int i = 0; i < 3; ++i) {
        const json &s = seq[i];
        if (!s.is_object() || s.value("type", "") != "Split" || !s.contains("pattern") || !s["pattern"].is_object() ||
            !s["pattern"].contains("Regex") || !s["pattern"]["Regex"].is_string())
            reject(path, "pre_tokenizer step " + std::to_string(i) + " is not a regex Split");
        if (canonical_pattern(s["pattern"]["Regex"].get<std::string>()) != canonical_pattern(kSplitPatterns[i]))
            reject(path, "pre_tokenizer step " + std::to_string(i) + " has a different regex");
        if (s.value("behavior", "") != "Isolated" || s.value("invert", false))
            reject(path, "pre_tokenizer step " + std::to_string(i) + " is not an Isolated, non-inverted Split");
    }
    const json &bl = seq[3];
    if (!bl.is_object() || bl.value("type", "") != "ByteLevel" || bl.value("add_prefix_space", false) ||
        bl.value("use_regex", true))
        reject(path, "pre_tokenizer step 3 is not ByteLevel(add_prefix_space=false, use_regex=false)");
}

// "bos_token": "<x>" or {"content": "<x>", ...}
std::string config_token(const json &cfg, const char *key) {
    auto it = cfg.find(key);
    if (it == cfg.end() || it->is_null()) return "";
    if (it->is_string()) return it->get<std::string>();
    if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
        return (*it)["content"].get<std::string>();
    return "";
}

json load_json(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail("cannot open " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    try {
        return json::parse(ss.str());
    } catch (const std::exception &e) {
        fail(path + ": invalid JSON: " + e.what());
    }
}

}  // namespace

Vocab read_vocab_hf_json(const std::string &path, int n_vocab) {
    json root = load_json(path);
    if (!root.is_object() || !root.contains("model") || !root["model"].is_object()) reject(path, "no model object");
    const json &model = root["model"];
    if (model.value("type", "BPE") != "BPE") reject(path, "model.type is not BPE");
    if (!is_null_or(model, "byte_fallback", false)) reject(path, "model.byte_fallback is set");
    if (!is_null_or(model, "ignore_merges", false)) reject(path, "model.ignore_merges is set");
    if (!is_null_or(model, "continuing_subword_prefix", "")) reject(path, "model.continuing_subword_prefix is set");
    if (!is_null_or(model, "end_of_word_suffix", "")) reject(path, "model.end_of_word_suffix is set");
    if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"] != 0.0)
        reject(path, "model.dropout is set");
    if (root.contains("normalizer") && !root["normalizer"].is_null()) {
        const json &n = root["normalizer"];
        bool empty_seq = n.is_object() && n.value("type", "") == "Sequence" && n.contains("normalizers") &&
                         n["normalizers"].is_array() && n["normalizers"].empty();
        if (!empty_seq) reject(path, "a normalizer is set");
    }
    if (!root.contains("pre_tokenizer")) reject(path, "no pre_tokenizer");
    check_pre_tokenizer(path, root["pre_tokenizer"]);
    if (!model.contains("vocab") || !model["vocab"].is_object()) reject(path, "model.vocab is not an object");

    // id -> token, from the model vocabulary and the added tokens.
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    std::vector<bool> have;
    auto put = [&](int64_t id, const std::string &text, TokenType type, const char *where) {
        if (id < 0 || id >= 0x7FFFFFFF) reject(path, std::string(where) + " has token id " + std::to_string(id));
        if (n_vocab > 0 && id >= n_vocab)
            fail("tokenizer.json " + path + ": token id " + std::to_string(id) + " ('" + text +
                 "') does not fit the model's vocabulary of " + std::to_string(n_vocab));
        if (static_cast<size_t>(id) >= tokens.size()) {
            tokens.resize(id + 1);
            types.resize(id + 1, static_cast<int32_t>(TokenType::Unused));
            have.resize(id + 1, false);
        }
        tokens[id] = text;
        types[id] = static_cast<int32_t>(type);
        have[id] = true;
    };
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
        if (!it.value().is_number_integer()) reject(path, "model.vocab['" + it.key() + "'] is not an integer");
        put(it.value().get<int64_t>(), it.key(), TokenType::Normal, "model.vocab");
    }
    if (root.contains("added_tokens") && root["added_tokens"].is_array()) {
        for (const json &a : root["added_tokens"]) {
            if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
                !a["content"].is_string())
                reject(path, "an added_tokens entry lacks id/content");
            bool special = a.value("special", false);
            put(a["id"].get<int64_t>(), a["content"].get<std::string>(),
                special ? TokenType::Control : TokenType::UserDefined, "added_tokens");
        }
    }
    size_t n = n_vocab > 0 ? static_cast<size_t>(n_vocab) : tokens.size();
    tokens.resize(n);
    types.resize(n, static_cast<int32_t>(TokenType::Unused));
    have.resize(n, false);
    for (size_t i = 0; i < n; ++i)
        if (!have[i]) tokens[i] = reserved_name(static_cast<int64_t>(i)), types[i] = static_cast<int32_t>(TokenType::Unused);

    Vocab v;
    v.tokens = std::move(tokens);
    v.types = std::move(types);
    if (model.contains("merges") && model["merges"].is_array()) {
        v.merges.reserve(model["merges"].size());
        for (const json &m : model["merges"]) {
            if (m.is_string()) {
                v.merges.push_back(m.get<std::string>());
            } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
                v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
            } else {
                reject(path, "model.merges holds an entry that is neither \"a b\" nor [a, b]");
            }
        }
    }
    if (model.contains("unk_token") && !model["unk_token"].is_null()) {
        // An unknown token would only be produced for a byte missing from the vocabulary.
        for (int b = 0; b < 256; ++b) {
            std::string s;
            utf8_append(s, byte_to_unicode(static_cast<uint8_t>(b)));
            if (!model["vocab"].contains(s)) reject(path, "model.unk_token is set and byte tokens are missing");
        }
    }

    auto find = [&](const std::string &text) -> int32_t {
        if (text.empty()) return -1;
        for (size_t i = 0; i < v.tokens.size(); ++i)
            if (v.tokens[i] == text && v.types[i] != static_cast<int32_t>(TokenType::Unused)) return static_cast<int32_t>(i);
        return -1;
    };
    std::string bos = kBosText, eos = kEosText, pad = kPadText;
    std::filesystem::path cfg_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
    if (std::filesystem::exists(cfg_path)) {
        json cfg = load_json(cfg_path.string());
        if (cfg.is_object()) {
            if (auto s = config_token(cfg, "bos_token"); !s.empty()) bos = s;
            if (auto s = config_token(cfg, "eos_token"); !s.empty()) eos = s;
            if (auto s = config_token(cfg, "pad_token"); !s.empty()) pad = s;
        }
    }
    v.bos = find(bos);
    v.eos = find(eos);
    v.pad = find(pad);
    return v;
}

void write_tokenizer_from_hf_json(gguf::Writer &w, const std::string &path, int n_vocab) {
    if (n_vocab <= 0) failf("write_tokenizer_from_hf_json: n_vocab must be positive, got %d", n_vocab);
    write_vocab(w, read_vocab_hf_json(path, n_vocab));
}

}  // namespace ds4::tok
