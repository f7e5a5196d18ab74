// ops::indexer_score against the definition written out here: per head a dot of 8 lanes
// (first product, then fused multiply-adds), lanes added ((0+1)+(2+3))+((4+5)+(6+7)), ReLU of
// the scaled dot times the head weight added by a fused multiply-add, heads in order. The AVX2 path and the scalar
// path (shapes it does not take) must both give these exact bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/kernels/ops.h"
#include "tests/common/switch_guard.h"

namespace ds4 {
namespace {

float reference_score(const float *q, const float *w, int heads, int dim, const float *k, float qscale) {
    float score = 0;
    for (int h = 0; h < heads; ++h) {
        float lane[8] = {};
        for (int i = 0; i < dim; ++i) {
            const float a = q[(size_t)h * dim + i], b = k[i];
            lane[i % 8] = i < 8 ? a * b : std::fma(a, b, lane[i % 8]);
        }
        const float d = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
        const float s = d * qscale;
        score = std::fma(s > 0 ? s : 0.f, w[h], score);
    }
    return score;
}

uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

TEST(IndexerScore, EqualsTheDefinitionBitForBit) {
    std::mt19937 rng(5);
    std::normal_distribution<float> g(0, 1);
    struct Shape {
        int heads, dim;
    };
    // (16, 32): the trained model; (64, 128): V4-Flash; the rest take the scalar path.
    for (Shape sh : {Shape{16, 32}, Shape{64, 128}, Shape{4, 8}, Shape{8, 64}, Shape{3, 32}, Shape{16, 12}, Shape{1, 5}}) {
        std::vector<float> q((size_t)sh.heads * sh.dim), w(sh.heads), k(sh.dim);
        int positive = 0, zero = 0;
        for (int rep = 0; rep < 200; ++rep) {
            for (float &v : q) v = g(rng);
            for (float &v : w) v = g(rng);
            for (float &v : k) v = g(rng);
            const float qscale = 1.f / std::sqrt((float)sh.dim);
            const float want = reference_score(q.data(), w.data(), sh.heads, sh.dim, k.data(), qscale);
            const float got = ops::indexer_score(q.data(), w.data(), sh.heads, sh.dim, k.data(), qscale);
            ASSERT_EQ(bits(got), bits(want)) << "heads " << sh.heads << " dim " << sh.dim << " rep " << rep << ": " << got
                                             << " vs " << want;
            (want > 0 ? positive : zero)++;
        }
        EXPECT_GT(positive, 0);
        EXPECT_GT(zero, 0);
    }
}

using BatchFn = void (*)(const float *, const float *, int, int, const float *const *, float, float *);

// A batch kernel of `width` entries per call gives each entry its own bits, NaN and negative
// dots too (entry 0 has a NaN dot in every head, and entry width - 7 in the second eight).
void check_batch(BatchFn fn, int width, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(0.f, 1.f);
    for (int dim : {8, 16, 32, 128, 24, 12}) {
        for (int heads : {1, 3, 4, 16, 64}) {
            std::vector<float> q((size_t)heads * dim), w(heads), k((size_t)width * dim + 5);
            for (float &v : q) v = g(rng);
            for (float &v : w) v = g(rng);
            for (float &v : k) v = g(rng);
            k[3] = NAN;
            k[5 + (size_t)(width - 7) * dim + 1] = NAN;
            std::vector<const float *> kp(width);
            for (int e = 0; e < width; ++e) kp[e] = k.data() + 5 * (e > 0) + (size_t)e * dim;   // not aligned
            std::vector<float> got(width);
            const float qscale = 1.f / std::sqrt((float)dim);
            fn(q.data(), w.data(), heads, dim, kp.data(), qscale, got.data());
            for (int e = 0; e < width; ++e) {
                const float want = reference_score(q.data(), w.data(), heads, dim, kp[e], qscale);
                ASSERT_EQ(bits(got[e]), bits(want)) << "width " << width << " heads " << heads << " dim " << dim << " entry " << e;
            }
        }
    }
}

// Eight entries per call (decode's path).
TEST(IndexerScore, EightEntriesEqualOneByOne) { check_batch(ops::indexer_score8, 8, 5); }

// Sixteen entries per call, in one AVX-512 register (where the CPU has it) and in two AVX2
// registers (always).
TEST(IndexerScore, SixteenEntriesEqualOneByOne) {
    if (!ops::indexer_score16_avx512()) GTEST_SKIP() << "no AVX-512 F/DQ on this CPU (or DS4_NO_AVX512 set)";
    check_batch(ops::indexer_score16, 16, 9);
}

TEST(IndexerScore, SixteenEntriesOnAvx2EqualOneByOne) {
    const ds4::test::SwitchGuard restore(ops::indexer_score16_avx512());
    restore.flag = false;
    check_batch(ops::indexer_score16, 16, 9);
}

TEST(IndexerScore, NegativeAndNanDotsCountAsZero) {
    const int heads = 4, dim = 8;
    std::vector<float> q(heads * dim, 1.f), w(heads, 1.f), k(dim, -1.f);
    EXPECT_EQ(ops::indexer_score(q.data(), w.data(), heads, dim, k.data(), 1.f), 0.f);
    k[0] = NAN;
    EXPECT_EQ(ops::indexer_score(q.data(), w.data(), heads, dim, k.data(), 1.f), 0.f);
    k.assign(dim, 0.5f);   // each dot 4, scaled 2: four heads of weight 1
    EXPECT_EQ(ops::indexer_score(q.data(), w.data(), heads, dim, k.data(), 0.5f), 8.f);
}

}  // namespace
}  // namespace ds4
