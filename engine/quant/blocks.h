// Byte layouts of the GGML block formats (so other parts — converter, CUDA backend, tests —
// can address blocks without re-deriving them). All fields little-endian, no padding.
#pragma once
#include <cstdint>

namespace ds4::quant {

constexpr int kQK8_0 = 32;
constexpr int kQK_K = 256;

struct BlockQ8_0 {
    uint16_t d;        // f16 scale
    int8_t qs[kQK8_0];
};
static_assert(sizeof(BlockQ8_0) == 34);

// x = d * (scales[i] & 15) * q - dmin * (scales[i] >> 4), 16 sub-blocks of 16, q in 0..3.
// qs: for each half of 128 elements (32 bytes), bits 2k..2k+1 of byte l hold element
// 32k + l of that half.
struct BlockQ2_K {
    uint8_t scales[kQK_K / 16];
    uint8_t qs[kQK_K / 4];
    uint16_t d;
    uint16_t dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// 8 sub-blocks of 32 with 6-bit scale and min packed into scales[12]; q in 0..15.
// qs: for each 64 elements (32 bytes), low nibble of byte l = element l, high = 32 + l.
struct BlockQ4_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);

// 8 groups of 32; group g is qs[4g..4g+3] read as two u32: the first holds 4 grid
// indices (one byte per 8 elements), the second 4 x 7-bit sign indices (bits 7l..7l+6)
// and a 4-bit scale in bits 28..31: x = d * (0.5 + scale) / 4 * grid * sign.
struct BlockIQ2_XXS {
    uint16_t d;
    uint16_t qs[kQK_K / 8];
};
static_assert(sizeof(BlockIQ2_XXS) == 66);

// Activation format for the K/IQ dots: x = d * qs, bsums[j] = sum of qs[16j..16j+15].
struct BlockQ8_K {
    float d;
    int8_t qs[kQK_K];
    int16_t bsums[kQK_K / 16];
};
static_assert(sizeof(BlockQ8_K) == 292);

// Q4_K packed 6-bit scale/min of sub-block j (0..7).
inline void q4k_scale_min(int j, const uint8_t *s, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

}  // namespace ds4::quant
