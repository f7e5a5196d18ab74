// The committed trained model (models/ds4-pystd-q8_0.gguf) against what HF transformers
// computed for the same weights in float32 (tests/trained/fixture_heldout512.json, written by
// tools/train/evaluate.py on the GPU machine): one held-out sequence of 512 tokens, the
// embedded tokenizer, and the greedy demo continuation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "engine/model/session.h"
#include "engine/tokenizer/tokenizer.h"

namespace {

using nlohmann::json;

// DS4_TRAINED_MODEL may name another export of the same weights (e.g. a temporary F32 one).
std::string model_path() {
    const char *p = std::getenv("DS4_TRAINED_MODEL");
    return p && *p ? p : DS4_SOURCE_DIR "/models/ds4-pystd-q8_0.gguf";
}
const std::string kFixture = DS4_SOURCE_DIR "/tests/trained/fixture_heldout512.json";

// Measured with the Q8_0 file: 507/512 argmax agree (99.0%), every miss where HF's top-1/top-2
// logit gap is small; mean loss -0.025% (F32 export: 100%). Earlier model: 98.2%, +0.018%.
constexpr double kMinAgreement = 0.98;
constexpr double kClearMargin = 0.25;   // argmax must agree wherever HF's gap is at least this
constexpr double kLossRelTol = 2e-3;    // ~10x the measured Q8_0 gap

class TrainedModel : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        std::ifstream f(kFixture);
        ASSERT_TRUE(f) << "cannot open " << kFixture;
        fx_ = new json(json::parse(f));
        model_ = ds4::Model::open(model_path()).release();
        tok_ = new ds4::tok::Tokenizer(ds4::tok::Tokenizer::from_gguf(model_->reader()));
    }
    static void TearDownTestSuite() {
        delete tok_;
        delete model_;
        delete fx_;
    }
    static std::vector<int32_t> ids(const json &j) { return j.get<std::vector<int32_t>>(); }

    static json *fx_;
    static ds4::Model *model_;
    static ds4::tok::Tokenizer *tok_;
};

json *TrainedModel::fx_ = nullptr;
ds4::Model *TrainedModel::model_ = nullptr;
ds4::tok::Tokenizer *TrainedModel::tok_ = nullptr;

TEST_F(TrainedModel, HeldOutSequenceMatchesHfArgmaxAndLoss) {
    const json &fx = *fx_;
    const std::vector<int32_t> toks = ids(fx["tokens"]);
    const std::vector<int32_t> ref_arg = ids(fx["argmax"]);
    const std::vector<double> margin = fx["margin"].get<std::vector<double>>();
    const double ref_loss = fx["mean_loss"].get<double>();
    ASSERT_EQ(toks.size(), 512u);
    ASSERT_EQ(ref_arg.size(), toks.size());
    const int V = model_->config().n_vocab;
    ASSERT_EQ(V, 8192);

    ds4::Session s(*model_, (int)toks.size());
    std::vector<float> logits;
    s.sync(toks, {}, &logits);
    ASSERT_EQ(logits.size(), toks.size() * (size_t)V);

    int agree = 0;
    double loss = 0;
    for (size_t i = 0; i < toks.size(); ++i) {
        const float *l = logits.data() + i * V;
        const int am = (int)(std::max_element(l, l + V) - l);
        agree += am == ref_arg[i];
        if (margin[i] >= kClearMargin) {
            EXPECT_EQ(am, ref_arg[i]) << "position " << i << ": HF's top-2 gap is " << margin[i];
        }
        if (i + 1 < toks.size()) {
            double z = 0;
            for (int v = 0; v < V; ++v) z += std::exp((double)l[v] - l[am]);
            loss += l[am] + std::log(z) - l[toks[i + 1]];
        }
    }
    loss /= (double)(toks.size() - 1);
    const double agreement = (double)agree / (double)toks.size();
    std::printf("argmax agreement %.4f (%d/%zu), mean loss %.6f vs HF %.6f (%+.3e)\n", agreement, agree, toks.size(),
                loss, ref_loss, (loss - ref_loss) / ref_loss);
    EXPECT_GE(agreement, kMinAgreement);
    EXPECT_LT(std::fabs(loss - ref_loss) / ref_loss, kLossRelTol);
    // A trained model, not noise: uniform guessing would score log(8192) = 9.01.
    EXPECT_LT(loss, 6.0);
}

TEST_F(TrainedModel, EmbeddedTokenizerRoundTripsPython) {
    const std::string snippet =
        "def fibonacci(n):\n"
        "    \"\"\"Return the n-th Fibonacci number (F(0) = 0).\"\"\"\n"
        "    a, b = 0, 1\n"
        "    for _ in range(n):\n"
        "        a, b = b, a + b\n"
        "    return a\n"
        "\n\n"
        "if __name__ == '__main__':\n"
        "\tprint([fibonacci(i) for i in range(12345)][-1] % 1_000_007, \"naïve — ok\")\r\n";
    const std::vector<int32_t> t = tok_->encode(snippet);
    EXPECT_EQ(tok_->decode(t), snippet);
    // The trained merges are in use (a byte-level fallback would give one token per byte).
    EXPECT_LT(t.size() * 2, snippet.size()) << t.size() << " tokens for " << snippet.size() << " bytes";
    EXPECT_EQ(tok_->vocab_size(), 8192);
    EXPECT_EQ(tok_->bos(), 0);
    EXPECT_EQ(tok_->eos(), 1);

    // Same ids as HF tokenizers for the demo prompts (BOS written by the caller).
    for (const json &p : (*fx_)["other_prompts"]) {
        std::vector<int32_t> want = ids(p["prompt_ids"]);
        std::vector<int32_t> got;
        if (p["bos"].get<bool>()) got.push_back(tok_->bos());
        tok_->encode(p["prompt"].get<std::string>(), got);
        EXPECT_EQ(got, want) << "prompt " << p["prompt"].dump();
    }
}

TEST_F(TrainedModel, GreedyDemoFollowsHf) {
    const json &d = (*fx_)["demo"];
    const std::vector<int32_t> prompt = tok_->encode(d["prompt"].get<std::string>());
    ASSERT_EQ(prompt, ids(d["prompt_ids"]));
    const std::vector<int32_t> want = ids(d["greedy_ids"]);

    ds4::Session s(*model_, 256);
    s.sync(prompt);
    std::vector<int32_t> got;
    while (got.size() < want.size()) {
        const int32_t next = s.argmax();
        got.push_back(next);
        if (tok_->is_stop(next)) break;
        s.eval(next);
    }
    size_t same = 0;
    while (same < got.size() && same < want.size() && got[same] == want[same]) ++same;
    std::printf("%s%s\n[%zu of %zu greedy tokens equal HF float32's]\n", d["prompt"].get<std::string>().c_str(),
                tok_->decode(got).c_str(), same, want.size());
    // Measured: the Q8_0 file follows HF's float32 greedy path for all 60 tokens (the earlier
    // model's for 47, then a near-tie went the other way); 30 leaves room for such ties.
    EXPECT_GE(same, 30u);
}

}  // namespace
