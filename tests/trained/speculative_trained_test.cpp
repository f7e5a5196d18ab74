// Speculative decoding on the committed model pair (models/ds4-pystd-q8_0.gguf and its
// drafter): greedy output with the drafter is token-identical to plain greedy decoding
// over 100 prompts cut from the held-out sequence, and the session ends in the same state.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "engine/model/session.h"
#include "engine/model/speculative.h"

namespace {

TEST(TrainedSpeculative, GreedyWithTheDrafterEqualsGreedyWithout) {
    std::ifstream f(DS4_SOURCE_DIR "/tests/trained/fixture_heldout512.json");
    ASSERT_TRUE(f);
    const std::vector<int32_t> seq = nlohmann::json::parse(f)["tokens"].get<std::vector<int32_t>>();
    ASSERT_EQ(seq.size(), 512u);
    // One thread: on a shared machine a second pool thread mostly waits to be scheduled.
    auto target = ds4::Model::open(DS4_SOURCE_DIR "/models/ds4-pystd-q8_0.gguf", {1});
    auto drafter = ds4::Model::open(DS4_SOURCE_DIR "/models/ds4-pystd-drafter-q8_0.gguf", {1});
    auto tex = target->make_executor(), dex = drafter->make_executor();
    const int n_prompts = 100, gen = 12, ctx = 128;
    ds4::SpecCounters total;
    int differing = 0;
    for (int i = 0; i < n_prompts; ++i) {
        const int len = 4 + (i % 7) * 9;   // 4..58 tokens
        const int start = (i * 37) % (int)(seq.size() - len);
        const std::span<const int32_t> prompt(seq.data() + start, len);
        ds4::Session plain(*target, *tex, ctx);
        plain.sync(prompt);
        std::vector<int32_t> want{plain.argmax()};
        while ((int)want.size() < gen) {
            plain.eval(want.back());
            want.push_back(plain.argmax());
        }
        ds4::Session t(*target, *tex, ctx), d(*drafter, *dex, ctx);
        ds4::SpecOptions o;
        o.draft_max = 4;
        ds4::SpeculativeDecoder dec(t, d, o);
        t.sync(prompt);
        std::vector<int32_t> got{t.argmax()};
        while ((int)got.size() < gen) dec.step(got.back(), {}, nullptr, gen - (int)got.size(), &got);
        EXPECT_EQ(got, want) << "prompt " << i << " (tokens " << start << ".." << start + len << ")";
        differing += got != want;
        plain.eval(want.back());
        t.eval(got.back());
        EXPECT_EQ(t.save_tail(), plain.save_tail()) << "prompt " << i;
        total += dec.counters();
    }
    EXPECT_EQ(differing, 0);
    EXPECT_GT(total.accepted, 0u);
    std::printf("[ speculative ] %d prompts x %d tokens: %llu trials, %llu drafted, %llu accepted (%.1f%%), %.2f accepted per trial\n",
                n_prompts, gen, (unsigned long long)total.trials, (unsigned long long)total.drafted, (unsigned long long)total.accepted,
                100.0 * total.accepted / std::max<uint64_t>(1, total.drafted), (double)total.accepted / std::max<uint64_t>(1, total.trials));
}

}  // namespace
