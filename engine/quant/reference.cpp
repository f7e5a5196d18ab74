// Scalar reference decoders, written element by element from the format definitions
// (independent of the block-structured fast kernels they check).
#include <cstring>

#include "engine/common/error.h"
#include "engine/quant/blocks.h"
#include "engine/quant/half.h"
#include "engine/quant/iq2xxs_tables.h"
#include "engine/quant/kernels.h"

namespace ds4::quant::detail {
namespace {

float ref_q8_0(const uint8_t *blk, int i) {
    const BlockQ8_0 *b = reinterpret_cast<const BlockQ8_0 *>(blk);
    return f16_to_f32_soft(b->d) * float(b->qs[i]);
}

float ref_q8_k(const uint8_t *blk, int i) {
    const BlockQ8_K *b = reinterpret_cast<const BlockQ8_K *>(blk);
    return b->d * float(b->qs[i]);
}

float ref_q2_k(const uint8_t *blk, int i) {
    const BlockQ2_K *b = reinterpret_cast<const BlockQ2_K *>(blk);
    const int half = i / 128, r = i % 128, shift = 2 * (r / 32), l = r % 32;
    const int q = (b->qs[32 * half + l] >> shift) & 3;
    const uint8_t sc = b->scales[i / 16];
    const float dl = f16_to_f32_soft(b->d) * float(sc & 15);
    const float ml = f16_to_f32_soft(b->dmin) * float(sc >> 4);
    return dl * float(q) - ml;
}

float ref_q4_k(const uint8_t *blk, int i) {
    const BlockQ4_K *b = reinterpret_cast<const BlockQ4_K *>(blk);
    const int chunk = i / 64, r = i % 64, l = r % 32, hi = r / 32;
    const uint8_t byte = b->qs[32 * chunk + l];
    const int q = hi ? byte >> 4 : byte & 15;
    uint8_t sc, m;
    q4k_scale_min(i / 32, b->scales, &sc, &m);
    const float dl = f16_to_f32_soft(b->d) * float(sc);
    const float ml = f16_to_f32_soft(b->dmin) * float(m);
    return dl * float(q) - ml;
}

float ref_iq2_xxs(const uint8_t *blk, int i) {
    const BlockIQ2_XXS *b = reinterpret_cast<const BlockIQ2_XXS *>(blk);
    const int g = i / 32, l = (i % 32) / 8, j = i % 8;
    uint32_t aux[2];
    std::memcpy(aux, b->qs + 4 * g, 8);
    const uint8_t idx = uint8_t(aux[0] >> (8 * l));
    const uint8_t mag = uint8_t(kIq2xxsGrid[idx] >> (8 * j));
    const uint8_t signs = iq2_signs_from7((aux[1] >> (7 * l)) & 127);
    const float db = f16_to_f32_soft(b->d) * (0.5f + float(aux[1] >> 28)) * 0.25f;
    return db * float(mag) * ((signs >> j) & 1 ? -1.f : 1.f);
}

template <float (*F)(const uint8_t *, int)>
void decode(const void *src, float *dst, int64_t n, int qk, int bytes) {
    const uint8_t *p = static_cast<const uint8_t *>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = F(p + (i / qk) * bytes, int(i % qk));
}

}  // namespace

void dequant_ref(uint32_t type, const void *src, float *dst, int64_t n) {
    const uint8_t *p = static_cast<const uint8_t *>(src);
    switch (type) {
        case 0:   // F32
            std::memcpy(dst, p, size_t(n) * 4);
            return;
        case 1:   // F16
            for (int64_t i = 0; i < n; ++i) {
                uint16_t h;
                std::memcpy(&h, p + 2 * i, 2);
                dst[i] = f16_to_f32_soft(h);
            }
            return;
        case 30:  // BF16
            for (int64_t i = 0; i < n; ++i) {
                uint16_t h;
                std::memcpy(&h, p + 2 * i, 2);
                dst[i] = bf16_to_f32_inline(h);
            }
            return;
        case 8: decode<ref_q8_0>(src, dst, n, kQK8_0, sizeof(BlockQ8_0)); return;
        case 15: decode<ref_q8_k>(src, dst, n, kQK_K, sizeof(BlockQ8_K)); return;
        case 10: decode<ref_q2_k>(src, dst, n, kQK_K, sizeof(BlockQ2_K)); return;
        case 12: decode<ref_q4_k>(src, dst, n, kQK_K, sizeof(BlockQ4_K)); return;
        case 16: decode<ref_iq2_xxs>(src, dst, n, kQK_K, sizeof(BlockIQ2_XXS)); return;
        default: failf("quant: no reference decoder for tensor type %u", type);
    }
}

}  // namespace ds4::quant::detail
