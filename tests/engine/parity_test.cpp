// The engine against HF transformers' DeepseekV4ForCausalLM (committed reference logits):
// float32 conversions must match at every position to 1e-4 relative, for one-shot prefill,
// token-by-token decode and chunked prefill alike.
#include <gtest/gtest.h>

#include "engine/model/model.h"
#include "engine/model/session.h"
#include "tests/engine/fixture.h"

using namespace ds4;
using namespace ds4test;

namespace {

std::vector<float> run_mode(const Model &m, const std::vector<int32_t> &toks, const std::string &mode, int cap = 0) {
    Session s(m, (int)toks.size(), cap);
    std::vector<float> all, part;
    if (mode == "prefill") {
        s.sync(toks, {}, &all);
    } else if (mode == "decode") {
        s.sync(std::span<const int32_t>(toks).first(1));
        all = s.logits();
        for (size_t i = 1; i < toks.size(); ++i) {
            s.eval(toks[i]);
            all.insert(all.end(), s.logits().begin(), s.logits().end());
        }
    } else {
        const size_t n = std::stoul(mode);
        for (size_t end = std::min(n, toks.size());; end = std::min(end + n, toks.size())) {
            s.sync(std::span<const int32_t>(toks).first(end), {}, &part);
            all.insert(all.end(), part.begin(), part.end());
            if (end == toks.size()) break;
        }
    }
    return all;
}

class Parity : public ::testing::TestWithParam<std::string> {};

TEST_P(Parity, F32AllModesMatchReference) {
    RefFixture fx = load_fixture(GetParam());
    auto m = Model::open(converted_gguf(fx.name, "f32"), {2});
    for (const char *mode : {"prefill", "decode", "5", "16"}) {
        std::vector<float> got = run_mode(*m, fx.tokens, mode);
        ASSERT_EQ(got.size(), fx.logits.size()) << mode;
        EXPECT_LE(rel_error(fx.logits, got, fx.vocab), 1e-4) << fx.name << " mode " << mode;
    }
    // A small prefill cap forces many chunk boundaries inside one sync.
    std::vector<float> got = run_mode(*m, fx.tokens, "prefill", 7);
    EXPECT_LE(rel_error(fx.logits, got, fx.vocab), 1e-4) << fx.name << " prefill cap 7";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Parity, ::testing::Values("mix", "flashlike", "wide"));

}  // namespace
