// The 8-head attention kernels against the per-head loop they replace (ops::dot for the
// scores, ops::axpy for the output), bit for bit, on AVX-512 and on AVX2: key counts that
// are not a multiple of the kernels' 4- and 2-key steps, head sizes that are and are not a
// multiple of the AVX-512 output's 32-element step.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "engine/kernels/attend8.h"
#include "engine/kernels/ops.h"
#include "tests/common/switch_guard.h"

namespace ds4::ops {
namespace {

// Both kernels (AVX-512 where the CPU has it, AVX2 always) against the per-head loop.
void scores_and_output_equal_the_per_head_loop() {
    std::mt19937 rng(7);
    std::normal_distribution<float> g(0, 1);
    for (int64_t hd : {16, 48, 64, 512}) {
        for (int64_t nk : {1, 2, 3, 4, 5, 7, 33, 130}) {
            std::vector<float> q(8 * hd), keys(nk * hd), w(8 * nk);
            for (auto &v : q) v = g(rng);
            for (auto &v : keys) v = g(rng) * 3;
            for (auto &v : w) v = std::abs(g(rng)) / float(nk);
            std::vector<const float *> rows;
            for (int64_t k = 0; k < nk; ++k) rows.push_back(&keys[k * hd]);
            const float scale = 0.0441941738f;
            std::vector<float> lg(8 * nk), o(8 * hd, -1.f);
            attend8_scores(q.data(), rows.data(), nk, hd, scale, lg.data());
            attend8_output(w.data(), rows.data(), nk, hd, o.data());
            for (int h = 0; h < 8; ++h) {
                for (int64_t k = 0; k < nk; ++k) {
                    const float ref = dot(&q[h * hd], rows[k], hd) * scale;
                    ASSERT_EQ(std::memcmp(&lg[h * nk + k], &ref, 4), 0)
                        << "hd " << hd << " nk " << nk << " head " << h << " key " << k << ": " << lg[h * nk + k]
                        << " vs " << ref;
                }
                std::vector<float> ref(hd, 0.f);
                for (int64_t k = 0; k < nk; ++k) axpy(w[h * nk + k], rows[k], ref.data(), hd);
                ASSERT_EQ(std::memcmp(&o[h * hd], ref.data(), hd * 4), 0) << "hd " << hd << " nk " << nk << " head " << h;
            }
        }
    }
}

TEST(Attend8, ScoresAndOutputEqualThePerHeadLoop) {
    if (!attend8_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU (or DS4_NO_AVX512 set)";
    scores_and_output_equal_the_per_head_loop();
}

TEST(Attend8, Avx2ScoresAndOutputEqualThePerHeadLoop) {
    const ds4::test::SwitchGuard restore(attend8_avx512());
    restore.flag = false;
    scores_and_output_equal_the_per_head_loop();
}

TEST(Attend8, UsableForWholeSixteens) {
    EXPECT_TRUE(attend8_usable(16));
    EXPECT_TRUE(attend8_usable(512));
    EXPECT_FALSE(attend8_usable(8));
    EXPECT_FALSE(attend8_usable(0));
}

}  // namespace
}  // namespace ds4::ops
