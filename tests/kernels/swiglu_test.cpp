// The vector SwiGLU against its definition in double: silu(min(g, L)) * clamp(u, -L, L) over
// a dense sweep of the gate through both clamps and random up values, within 3 ulp (the exp's
// 1 ulp, then an add, a division and a product, each rounded once); NaN in either input kept;
// a gate far below -88 gives a result of no size; AVX-512 and AVX2 the same bits, tails of
// every length written and nothing past them.
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

double swiglu_exact(float g, float u, float lim) {
    const double a = std::min(g, lim), b = std::clamp(u, -lim, lim);
    return a / (1.0 + std::exp(-a)) * b;
}

double ulps(float got, double want) {
    const float w = float(want);
    const double ulp = double(std::nextafter(std::fabs(w), std::numeric_limits<float>::infinity())) - double(std::fabs(w));
    return std::fabs(double(got) - want) / ulp;
}

TEST(Swiglu, WithinThreeUlpOfTheDefinition) {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> up(-14.f, 14.f);
    for (float lim : {10.f, 7.f}) {
        std::vector<float> g, u;
        for (float v = -87.f; v <= 14.f; v += 1.f / 256) {
            g.push_back(v);
            u.push_back(up(rng));
        }
        std::vector<float> out = g;
        swiglu(out.data(), u.data(), int64_t(out.size()), lim);
        double worst = 0;
        for (size_t i = 0; i < g.size(); ++i) {
            const double want = swiglu_exact(g[i], u[i], lim);
            if (std::fabs(want) < 1e-30) continue;   // deep in silu's tail: absolute, below
            worst = std::max(worst, ulps(out[i], want));
        }
        EXPECT_LE(worst, 3.0) << "lim " << lim;
        // past the gate's clamp the value is the clamp's, bit for bit
        std::vector<float> at_lim(g.size(), lim);
        swiglu(at_lim.data(), u.data(), int64_t(at_lim.size()), lim);
        for (size_t i = 0; i < g.size(); ++i) {
            if (g[i] < lim) continue;
            ASSERT_EQ(out[i], at_lim[i]) << "g " << g[i];
        }
    }
}

TEST(Swiglu, ClampsNaNAndTheFarTail) {
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    std::vector<float> g = {nan, 1.f, 50.f, 50.f, -200.f, -89.f, inf, 3.f};
    const std::vector<float> u = {1.f, nan, 1.f, -30.f, 1.f, 2.f, 1.f, 0.f};
    swiglu(g.data(), u.data(), int64_t(g.size()), 10.f);
    EXPECT_TRUE(std::isnan(g[0]));
    EXPECT_TRUE(std::isnan(g[1]));
    const double s10 = 10.0 / (1.0 + std::exp(-10.0));   // silu at the gate's clamp
    EXPECT_LE(ulps(g[2], s10), 3.0);
    EXPECT_LE(ulps(g[3], -10.0 * s10), 3.0);   // the up value clamped to -L
    EXPECT_LE(std::fabs(g[4]), 1e-30f);
    EXPECT_LE(std::fabs(g[5]), 1e-30f);
    EXPECT_LE(ulps(g[6], s10), 3.0);
    EXPECT_EQ(g[7], 0.f);
}

TEST(Swiglu, Avx512AndAvx2GiveTheSameBitsAndStopAtN) {
    if (!detail::exp_shift_avx512_usable()) GTEST_SKIP() << "no AVX-512 on this CPU (or DS4_NO_AVX512 set)";
    std::mt19937 rng(13);
    std::normal_distribution<float> dist(0, 6);
    for (int64_t n = 0; n <= 70; ++n) {
        std::vector<float> g(size_t(n) + 16), u(g.size());
        for (auto &v : g) v = dist(rng);
        for (auto &v : u) v = dist(rng);
        std::vector<float> a = g, b = g;
        detail::swiglu_avx512(a.data(), u.data(), n, 10.f);
        detail::swiglu_avx2(b.data(), u.data(), n, 10.f);
        ASSERT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * a.size()), 0) << "n " << n;
        for (size_t i = size_t(n); i < g.size(); ++i) ASSERT_EQ(a[i], g[i]) << "past n at " << i;
        for (int64_t i = 0; i < n; ++i) ASSERT_NE(a[size_t(i)], g[size_t(i)]) << "not written at " << i;
    }
}

}  // namespace
}  // namespace ds4::ops
