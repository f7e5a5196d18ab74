// f16 / bf16 scalar conversions: exhaustive over the 16-bit side, rounding at every
// midpoint, specials, and the F16C path against the portable one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "engine/quant/half.h"
#include "engine/quant/quants.h"

using namespace ds4::quant;

namespace {
uint32_t bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
bool f16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
// Value of an f16 from first principles (double arithmetic).
double f16_value(uint16_t h) {
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
    return s ? -v : v;
}
}  // namespace

TEST(Half, F16ToF32AllValues) {
    for (uint32_t h = 0; h < 65536; ++h) {
        const float f = f16_to_f32(uint16_t(h));
        const int e = (h >> 10) & 31;
        if (e == 31) {
            if (h & 1023) {
                EXPECT_TRUE(std::isnan(f)) << h;
            } else {
                EXPECT_TRUE(std::isinf(f)) << h;
                EXPECT_EQ(std::signbit(f), bool(h & 0x8000));
            }
            continue;
        }
        ASSERT_EQ(double(f), f16_value(uint16_t(h))) << "h=" << h;
        ASSERT_EQ(std::signbit(f), bool(h & 0x8000)) << h;
        // portable and F16C agree bit for bit (NaNs included)
        ASSERT_EQ(bits(f16_to_f32_soft(uint16_t(h))), bits(f)) << h;
    }
    for (uint32_t h = 0x7c01; h < 0x8000; ++h) EXPECT_EQ(bits(f16_to_f32_soft(uint16_t(h))), bits(f16_to_f32(uint16_t(h))));
}

TEST(Half, F32ToF16RoundTripAndMidpoints) {
    for (uint32_t h = 0; h < 65536; ++h) {
        if ((h & 0x7c00) == 0x7c00) continue;
        const float f = f16_to_f32(uint16_t(h));
        ASSERT_EQ(f32_to_f16(f), h) << h;
        ASSERT_EQ(f32_to_f16_soft(f), h) << h;
    }
    // Midpoints between neighbours (exact in f32: 12 significant bits) tie to even;
    // one ulp either side goes to the nearer neighbour.
    for (uint32_t h = 0; h < 0x7bff; ++h) {
        for (uint32_t sign : {0u, 0x8000u}) {
            const uint16_t lo = uint16_t(h | sign), hi = uint16_t((h + 1) | sign);
            const double mid = (f16_value(lo) + f16_value(hi)) / 2;
            const float m = float(mid);
            ASSERT_EQ(double(m), mid);
            const uint16_t even = (h & 1) ? hi : lo;
            ASSERT_EQ(f32_to_f16(m), even) << h;
            ASSERT_EQ(f32_to_f16_soft(m), even) << h;
            const float toward_lo = std::nextafter(m, 0.f), toward_hi = std::nextafter(m, sign ? -1e9f : 1e9f);
            ASSERT_EQ(f32_to_f16(toward_lo), lo) << h;
            ASSERT_EQ(f32_to_f16(toward_hi), hi) << h;
            ASSERT_EQ(f32_to_f16_soft(toward_lo), lo) << h;
            ASSERT_EQ(f32_to_f16_soft(toward_hi), hi) << h;
        }
    }
}

TEST(Half, F32ToF16Specials) {
    const float inf = std::numeric_limits<float>::infinity();
    EXPECT_EQ(f32_to_f16(inf), 0x7c00);
    EXPECT_EQ(f32_to_f16(-inf), 0xfc00);
    EXPECT_EQ(f32_to_f16(0.f), 0x0000);
    EXPECT_EQ(f32_to_f16(-0.f), 0x8000);
    EXPECT_EQ(f32_to_f16(65504.f), 0x7bff);
    EXPECT_EQ(f32_to_f16(65519.996f), 0x7bff);   // below the midpoint to 65536
    EXPECT_EQ(f32_to_f16(65520.f), 0x7c00);      // midpoint, 0x7bff is odd -> Inf
    EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
    EXPECT_EQ(f32_to_f16(-1e10f), 0xfc00);
    EXPECT_EQ(f32_to_f16(std::ldexp(1.f, -24)), 0x0001);   // smallest subnormal
    EXPECT_EQ(f32_to_f16(std::ldexp(1.f, -25)), 0x0000);   // half of it ties to even 0
    EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
    EXPECT_EQ(f32_to_f16(std::ldexp(1.f, -14)), 0x0400);   // smallest normal
    EXPECT_EQ(f32_to_f16(1e-30f), 0x0000);
    EXPECT_EQ(f32_to_f16(-1e-30f), 0x8000);
    EXPECT_EQ(f32_to_f16(1.f), 0x3c00);
    EXPECT_EQ(f32_to_f16(-2.f), 0xc000);
    for (uint32_t nb : {0x7fc00000u, 0x7f800001u, 0xffc00000u, 0x7fffffffu, 0x7f802000u}) {
        EXPECT_TRUE(f16_is_nan(f32_to_f16(from_bits(nb)))) << std::hex << nb;
        EXPECT_TRUE(f16_is_nan(f32_to_f16_soft(from_bits(nb)))) << std::hex << nb;
        EXPECT_EQ(f32_to_f16(from_bits(nb)) & 0x8000, (nb >> 16) & 0x8000);
    }
}

TEST(Half, F32ToF16PortableMatchesHardwareSweep) {
    // every 257th bit pattern: all exponents, signs, NaN payloads and rounding cases
    for (uint64_t u = 0; u < (1ull << 32); u += 257) {
        const float f = from_bits(uint32_t(u));
        ASSERT_EQ(f32_to_f16_soft(f), f32_to_f16(f)) << std::hex << u;
    }
}

TEST(BFloat16, RoundTripMidpointsSpecials) {
    for (uint32_t h = 0; h < 65536; ++h) {
        const float f = bf16_to_f32(uint16_t(h));
        ASSERT_EQ(bits(f), h << 16);
        if (std::isnan(f)) {
            const uint16_t r = f32_to_bf16(f);
            ASSERT_TRUE((r & 0x7f80) == 0x7f80 && (r & 0x7f)) << h;
            continue;
        }
        ASSERT_EQ(f32_to_bf16(f), h);
        if ((h & 0x7fff) >= 0x7f7f) continue;   // next one up is Inf/NaN
        // midpoint to the next bf16 (same sign, larger magnitude): ties to even
        const uint32_t mid = (h << 16) | 0x8000;
        const uint16_t even = (h & 1) ? uint16_t(h + 1) : uint16_t(h);
        ASSERT_EQ(f32_to_bf16(from_bits(mid)), even) << h;
        ASSERT_EQ(f32_to_bf16(from_bits(mid - 1)), h) << h;
        ASSERT_EQ(f32_to_bf16(from_bits(mid + 1)), uint16_t(h + 1)) << h;
    }
    EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);   // rounds up to Inf
    EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
    EXPECT_EQ(f32_to_bf16(from_bits(0x7f800001u)) & 0x7fc0, 0x7fc0);   // signalling -> quiet, not Inf
    EXPECT_EQ(f32_to_bf16(from_bits(0x00000001u)), 0x0000);
}
