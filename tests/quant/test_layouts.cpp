// Format data and bit layouts: the IQ2_XXS codebook's defining properties, and
// hand-built blocks whose decoded values are worked out here from the GGML layouts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "engine/quant/blocks.h"
#include "engine/quant/iq2xxs_tables.h"
#include "engine/quant/quants.h"
#include "quant_test_util.h"

namespace q = ds4::quant;
using q::Type;

TEST(Iq2xxsCodebook, GridProperties) {
    std::set<uint64_t> distinct;
    for (int k = 0; k < 256; ++k) {
        const uint64_t e = q::kIq2xxsGrid[k];
        distinct.insert(e);
        for (int j = 0; j < 8; ++j) {
            const uint8_t b = uint8_t(e >> (8 * j));
            ASSERT_TRUE(b == 0x08 || b == 0x19 || b == 0x2b) << "entry " << k << " byte " << j;
        }
        if (k) {
            EXPECT_LT(q::kIq2xxsGrid[k - 1], e) << "entries are stored in ascending order";
        }
    }
    EXPECT_EQ(distinct.size(), 256u);
    EXPECT_EQ(q::kIq2xxsGrid[0], 0x0808080808080808ull);   // all-smallest point is entry 0
}

TEST(Iq2xxsCodebook, SignsHaveEvenParity) {
    std::set<uint8_t> seen;
    for (uint32_t i = 0; i < 128; ++i) {
        const uint8_t s = q::iq2_signs_from7(i);
        EXPECT_EQ(s & 127, int(i));
        EXPECT_EQ(__builtin_popcount(s) % 2, 0) << i;
        EXPECT_EQ(s >> 7, __builtin_popcount(i) & 1) << "bit 7 is the parity of the 7 stored bits";
        seen.insert(s);
    }
    EXPECT_EQ(seen.size(), 128u);   // exactly the 128 even-parity bytes
    EXPECT_EQ(q::iq2_signs_from7(1), 129);
    EXPECT_EQ(q::iq2_signs_from7(3), 3);
}

TEST(Layouts, Iq2xxsHandBuiltBlock) {
    q::BlockIQ2_XXS b{};
    b.d = q::f32_to_f16(2.0f);
    // group 5: grid indices (1, 0, 255, 2), sign indices (1, 0, 0, 127), scale 3
    const uint32_t aux0 = 1u | (0u << 8) | (255u << 16) | (2u << 24);
    const uint32_t aux1 = 1u | (0u << 7) | (0u << 14) | (127u << 21) | (3u << 28);
    std::memcpy(b.qs + 4 * 5, &aux0, 4);
    std::memcpy(b.qs + 4 * 5 + 2, &aux1, 4);
    std::vector<float> y(256);
    q::dequantize_row(Type::IQ2_XXS, &b, y.data(), 256);
    const float db = 2.0f * 3.5f / 4;   // d * (0.5 + 3) / 4
    // other groups: index 0 (all 8), no signs, scale 0 -> d * 0.5 / 4 * 8
    for (int i = 0; i < 256; ++i) {
        if (i / 32 != 5) {
            ASSERT_EQ(y[i], 2.0f * 0.125f * 8) << i;
        }
    }
    const float *g = y.data() + 160;
    // entry 1 = bytes (0x2b, 8, 8, 8, 8, 8, 8, 8); sign index 1 -> 0x81: elements 0 and 7 negative
    EXPECT_EQ(g[0], -43 * db);
    for (int j = 1; j < 7; ++j) EXPECT_EQ(g[j], 8 * db);
    EXPECT_EQ(g[7], -8 * db);
    for (int j = 8; j < 16; ++j) EXPECT_EQ(g[j], 8 * db);        // entry 0, no signs
    // entry 255 = 0x2b2b2b1908081908
    const int e255[8] = {8, 0x19, 8, 8, 0x19, 0x2b, 0x2b, 0x2b};
    for (int j = 0; j < 8; ++j) EXPECT_EQ(g[16 + j], e255[j] * db);
    // entry 2 = (0x19, 0x19, 8, ...); sign index 127 has odd parity -> 0xff: all negative
    const int e2[8] = {0x19, 0x19, 8, 8, 8, 8, 8, 8};
    for (int j = 0; j < 8; ++j) EXPECT_EQ(g[24 + j], -e2[j] * db);
}

TEST(Layouts, Q2_KHandBuiltBlock) {
    q::BlockQ2_K b{};
    b.d = q::f32_to_f16(1.0f);
    b.dmin = q::f32_to_f16(0.5f);
    std::memset(b.scales, 0x21, 16);   // sc = 1, m = 2 -> q=0 decodes to -1
    b.scales[12] = 0x35;               // sub-block 12 (elements 192..207): sc = 5, m = 3
    b.qs[32 + 5] = 3 << 4;             // second half, byte 5, bits 4..5 -> element 128 + 64 + 5
    b.qs[7] = 2 << 6;                  // first half, byte 7, bits 6..7 -> element 96 + 7
    b.qs[20] = 1;                      // first half, byte 20, bits 0..1 -> element 20
    std::vector<float> y(256);
    q::dequantize_row(Type::Q2_K, &b, y.data(), 256);
    for (int i = 0; i < 256; ++i) {
        float want = (i >= 192 && i < 208) ? -1.5f : -1.0f;
        if (i == 197) want = 5 * 3 - 1.5f;
        if (i == 103) want = 2 - 1.0f;
        if (i == 20) want = 1 - 1.0f;
        ASSERT_EQ(y[i], want) << i;
    }
}

TEST(Layouts, Q4_KHandBuiltBlock) {
    q::BlockQ4_K b{};
    b.d = q::f32_to_f16(0.25f);
    b.dmin = q::f32_to_f16(0.125f);
    // sub-block 1: scale 9, min 40 (low 6 bits of bytes 1 and 5)
    b.scales[1] = 9;
    b.scales[5] = 40;
    // sub-block 6: scale 45 = 0b101101, min 17 = 0b010001: low nibbles in byte 10,
    // high 2 bits in the top of bytes 2 (scale) and 6 (min)
    b.scales[10] = uint8_t((45 & 15) | ((17 & 15) << 4));
    b.scales[2] |= uint8_t((45 >> 4) << 6);
    b.scales[6] |= uint8_t((17 >> 4) << 6);
    b.qs[96 + 3] = 0x07;   // chunk 3, byte 3, low nibble -> element 192 + 3 (sub-block 6)
    b.qs[5] = 0xc0;        // chunk 0, byte 5, high nibble -> element 32 + 5 (sub-block 1)
    std::vector<float> y(256);
    q::dequantize_row(Type::Q4_K, &b, y.data(), 256);
    for (int i = 0; i < 256; ++i) {
        float want = 0;
        if (i / 32 == 1) want = -0.125f * 40;
        if (i / 32 == 6) want = -0.125f * 17;
        if (i == 195) want = 0.25f * 45 * 7 - 0.125f * 17;
        if (i == 37) want = 0.25f * 9 * 12 - 0.125f * 40;
        ASSERT_EQ(y[i], want) << i;
    }
}

TEST(Layouts, Q8_0HandBuiltBlock) {
    q::BlockQ8_0 b{};
    b.d = q::f32_to_f16(-0.5f);
    b.qs[0] = -128;
    b.qs[31] = 127;
    std::vector<float> y(32);
    q::dequantize_row(Type::Q8_0, &b, y.data(), 32);
    EXPECT_EQ(y[0], 64.f);
    EXPECT_EQ(y[31], -63.5f);
    EXPECT_EQ(y[1], 0.f);
}

TEST(Quantizers, Iq2xxsKeepsSignsExceptOnePerOddGroup) {
    std::mt19937 rng(3);
    const auto x = qtest::gaussian(256 * 16, 1.f, rng);
    std::vector<q::BlockIQ2_XXS> blk(16);
    std::vector<float> y(x.size());
    q::quantize_row(Type::IQ2_XXS, x.data(), blk.data(), int64_t(x.size()));
    q::dequantize_row(Type::IQ2_XXS, blk.data(), y.data(), int64_t(x.size()));
    for (size_t g = 0; g < x.size() / 8; ++g) {
        int neg = 0, flipped = 0;
        size_t smallest = 8 * g;
        for (size_t i = 8 * g; i < 8 * g + 8; ++i) {
            neg += x[i] < 0;
            if (std::fabs(x[i]) < std::fabs(x[smallest])) smallest = i;
            if ((x[i] < 0) != (y[i] < 0)) {
                ++flipped;
                EXPECT_EQ(i, smallest) << "only the smallest magnitude may lose its sign";
            }
        }
        EXPECT_EQ(flipped, neg % 2) << "group " << g;
    }
}

TEST(Quantizers, ZeroConstantAndNonFiniteInput) {
    for (Type t : {Type::Q8_0, Type::Q2_K, Type::Q4_K, Type::IQ2_XXS}) {
        std::vector<uint8_t> buf(4096);
        std::vector<float> x(256, 0.f), y(256, 1.f);
        q::quantize_row(t, x.data(), buf.data(), 256);
        q::dequantize_row(t, buf.data(), y.data(), 256);
        for (float v : y) ASSERT_EQ(v, 0.f) << unsigned(t);
        // NaN / Inf never leak into the encoding
        x.assign(256, 0.5f);
        x[3] = NAN;
        x[100] = INFINITY;
        x[200] = -INFINITY;
        q::quantize_row(t, x.data(), buf.data(), 256);
        q::dequantize_row(t, buf.data(), y.data(), 256);
        for (int i = 0; i < 256; ++i) {
            ASSERT_TRUE(std::isfinite(y[i])) << unsigned(t) << " " << i;
            if (i != 3 && i != 100 && i != 200 && t != Type::IQ2_XXS) {
                EXPECT_NEAR(y[i], 0.5f, 0.05f) << unsigned(t) << " " << i;
            }
        }
        // an all-negative constant row (exercises the offset/min path)
        x.assign(256, -0.75f);
        q::quantize_row(t, x.data(), buf.data(), 256);
        q::dequantize_row(t, buf.data(), y.data(), 256);
        for (float v : y) EXPECT_NEAR(v, -0.75f, 0.01f) << unsigned(t);   // exact levels exist in every format
    }
}
