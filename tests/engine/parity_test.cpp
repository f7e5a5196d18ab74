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
