// The softmax parts. exp_shift against exp in double: a dense sweep of [-86, 0] and samples
// of (0, 88] within 1 ulp (Cephes measured 0.995 at worst), exactly 1 at t = 0, 0 below -86,
// NaN kept; its sum in the stated order; AVX-512 and AVX2 the same bits, tails of every
// length written and nothing past them. max_of against a plain loop, and NaN; argmax_first
// against std::max_element with ties, NaNs and the largest value in every position.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "engine/kernels/ops.h"

namespace ds4::ops {
namespace {

// Distance in ulp between a float and the exact value (double).
double ulps(float got, double want) {
    const float w = float(want);
    const double ulp = double(std::nextafter(w, std::numeric_limits<float>::infinity())) - double(w);
    return std::fabs(double(got) - want) / ulp;
}

TEST(ExpShift, WithinOneUlpOfExp) {
    std::vector<float> t;
    for (float v = -86.f; v <= 0.f; v += 1.f / 1024) t.push_back(v);
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> up(0.f, 88.f);
    for (int i = 0; i < 4096; ++i) t.push_back(up(rng));
    for (float m : {0.f, 3.5f, -20.f}) {
        std::vector<float> x(t.size());
        for (size_t i = 0; i < t.size(); ++i) x[i] = t[i] + m;
        (void)exp_shift(x.data(), int64_t(x.size()), m);
        double worst = 0;
        for (size_t i = 0; i < t.size(); ++i) {
            const float ti = (t[i] + m) - m;   // the argument the kernel saw
            worst = std::max(worst, ulps(x[i], std::exp(double(ti))));
        }
        EXPECT_LE(worst, 1.0) << "m " << m;
    }
}

TEST(ExpShift, EdgesZeroOneAndNaN) {
    std::vector<float> x = {5.f, 5.f - 86.5f, 5.f - 1000.f, -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 5.f - 85.9f};
    (void)exp_shift(x.data(), int64_t(x.size()), 5.f);
    EXPECT_EQ(x[0], 1.f);
    EXPECT_EQ(x[1], 0.f);
    EXPECT_EQ(x[2], 0.f);
    EXPECT_EQ(x[3], 0.f);
    EXPECT_TRUE(std::isnan(x[4]));
    EXPECT_GT(x[5], 0.f);
    EXPECT_TRUE(std::isnormal(x[5]));
}

TEST(ExpShift, Avx512AndAvx2GiveTheSameBitsAndStopAtN) {
    if (!detail::exp_shift_avx512_usable()) GTEST_SKIP() << "no AVX-512 on this CPU (or DS4_NO_AVX512 set)";
    std::mt19937 rng(5);
    std::normal_distribution<float> g(0, 8);
    for (int64_t n = 0; n <= 70; ++n) {
        std::vector<float> src(size_t(n) + 16);
        for (auto &v : src) v = g(rng);
        std::vector<float> a = src, b = src;
        detail::exp_shift_avx512(a.data(), n, 1.25f);
        detail::exp_shift_avx2(b.data(), n, 1.25f);
        const double sa = detail::exp_shift_avx512(a.data(), 0, 0.f) + 0, sum_a = [&] {
            std::vector<float> c = src;
            return detail::exp_shift_avx512(c.data(), n, 1.25f);
        }();
        const double sum_b = [&] {
            std::vector<float> c = src;
            return detail::exp_shift_avx2(c.data(), n, 1.25f);
        }();
        EXPECT_EQ(sa, 0.0);
        ASSERT_EQ(std::memcmp(a.data(), b.data(), src.size() * 4), 0) << "n " << n;
        ASSERT_EQ(std::memcmp(&sum_a, &sum_b, 8), 0) << "n " << n;
        // the sum's order: 8 double lanes (element i to lane i mod 8, in order), then pairs
        double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t i = 0; i < n; ++i) lane[i % 8] += double(a[size_t(i)]);
        const double want = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
        ASSERT_EQ(std::memcmp(&sum_a, &want, 8), 0) << "n " << n << ": " << sum_a << " vs " << want;
        for (size_t i = size_t(n); i < src.size(); ++i) ASSERT_EQ(std::memcmp(&a[i], &src[i], 4), 0) << "wrote past n " << n;
    }
}

// softmax_pool against its definition, channel by channel (the exponentials by exp_shift on
// the channel's gates, so only the pooling is under test here), and AVX-512 against AVX2.
TEST(SoftmaxPool, EqualsItsDefinitionPerChannelOnBothIsas) {
    std::mt19937 rng(11);
    std::normal_distribution<float> g(0, 3);
    for (int n : {1, 4, 8, 128})
        for (int64_t dim : {int64_t(1), int64_t(7), int64_t(8), int64_t(16), int64_t(37), int64_t(512)}) {
            std::vector<std::vector<float>> gs(static_cast<size_t>(n)), vs(static_cast<size_t>(n));
            std::vector<const float *> gp, vp;
            for (int k = 0; k < n; ++k) {
                gs[size_t(k)].resize(size_t(dim) + 16);
                vs[size_t(k)].resize(size_t(dim) + 16);
                for (auto &v : gs[size_t(k)]) v = g(rng);
                for (auto &v : vs[size_t(k)]) v = g(rng);
                gp.push_back(gs[size_t(k)].data());
                vp.push_back(vs[size_t(k)].data());
            }
            std::vector<float> want(static_cast<size_t>(dim));
            for (int64_t c = 0; c < dim; ++c) {
                std::vector<float> e(static_cast<size_t>(n));
                float mx = -std::numeric_limits<float>::infinity();
                for (int k = 0; k < n; ++k) mx = std::max(mx, e[size_t(k)] = gp[size_t(k)][c]);
                (void)exp_shift(e.data(), n, mx);
                double den = 0, acc = 0;
                for (int k = 0; k < n; ++k) {
                    den += e[size_t(k)];
                    acc += double(e[size_t(k)]) * vp[size_t(k)][c];
                }
                want[size_t(c)] = float(acc / den);
            }
            std::vector<float> a(size_t(dim) + 1, -3.f), b(size_t(dim) + 1, -3.f);
            detail::softmax_pool_avx2(gp.data(), vp.data(), n, dim, a.data());
            for (int64_t c = 0; c < dim; ++c)
                ASSERT_EQ(std::memcmp(&a[size_t(c)], &want[size_t(c)], 4), 0)
                    << "n " << n << " dim " << dim << " channel " << c << ": " << a[size_t(c)] << " vs " << want[size_t(c)];
            EXPECT_EQ(a[size_t(dim)], -3.f) << "wrote past dim";
            if (!detail::exp_shift_avx512_usable()) continue;
            detail::softmax_pool_avx512(gp.data(), vp.data(), n, dim, b.data());
            ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "n " << n << " dim " << dim;
        }
}

TEST(MaxOf, LargestOfInitAndValuesAndNaN) {
    std::mt19937 rng(9);
    std::normal_distribution<float> g(0, 5);
    for (int64_t n = 0; n <= 40; ++n) {
        std::vector<float> x(size_t(n) + 1);
        for (auto &v : x) v = g(rng);
        for (float init : {-100.f, 0.f, 100.f}) {
            float want = init;
            for (int64_t i = 0; i < n; ++i) want = std::max(want, x[size_t(i)]);
            ASSERT_EQ(max_of(x.data(), n, init), want) << "n " << n;   // x[n] is not read into it
        }
        if (n > 0) {
            x[size_t(n - 1)] = std::numeric_limits<float>::quiet_NaN();
            EXPECT_TRUE(std::isnan(max_of(x.data(), n, 0.f))) << "n " << n;
        }
    }
}

TEST(ArgmaxFirst, IsStdMaxElementWithTiesAndNaN) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::mt19937 rng(17);
    std::uniform_int_distribution<int> small(-3, 3);   // few distinct values: many ties
    for (int64_t n : {1, 2, 7, 8, 9, 15, 16, 17, 33, 70, 8192}) {
        for (int round = 0; round < 20; ++round) {
            std::vector<float> x(size_t(n) + 1, 1000.f);   // x[n] is past the end, and larger
            for (int64_t i = 0; i < n; ++i) x[size_t(i)] = float(small(rng));
            if (round % 4 == 1) x[size_t(rng() % n)] = nan;
            if (round % 4 == 2) x[0] = nan;
            if (round % 4 == 3) x[size_t(rng() % n)] = 7.f;   // one largest, anywhere
            const int64_t want = std::max_element(x.begin(), x.begin() + n) - x.begin();
            ASSERT_EQ(argmax_first(x.data(), n), want) << "n " << n << " round " << round;
        }
    }
    for (int64_t n = 1; n <= 40; ++n)   // a single largest value in every position
        for (int64_t at = 0; at < n; ++at) {
            std::vector<float> x(size_t(n), -1.f);
            x[size_t(at)] = 2.f;
            ASSERT_EQ(argmax_first(x.data(), n), at) << "n " << n;
        }
    EXPECT_EQ(argmax_first(nullptr, 0), -1);
}

}  // namespace
}  // namespace ds4::ops
