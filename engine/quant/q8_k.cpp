// Q8_K: the activation format for the K/IQ weight dots (256 elements, f32 scale, int8,
// per-16 sums so the weight formats' min terms cost one small dot per block).
#include <cmath>

#include "engine/quant/blocks.h"
#include "engine/quant/kernels.h"

namespace ds4::quant::detail {

// Symmetric: d = amax / 127, q = round(x / d) in -127..127 (never -128, which the
// maddubs-based dots rely on). Non-finite inputs give 0.
void quant_q8_k(const float *src, void *dst, int64_t n) {
    BlockQ8_K *y = static_cast<BlockQ8_K *>(dst);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float *x = src + b * kQK_K;
        float amax = 0;
        for (int i = 0; i < kQK_K; ++i)
            if (std::isfinite(x[i])) amax = std::fmax(amax, std::fabs(x[i]));
        const float id = amax > 0 ? 127.f / amax : 0.f;
        y[b].d = amax / 127.f;
        for (int i = 0; i < kQK_K; ++i) {
            float v = x[i] * id;
            v = std::isfinite(v) ? std::nearbyint(v) : 0.f;
            y[b].qs[i] = int8_t(v > 127.f ? 127.f : (v < -127.f ? -127.f : v));
        }
        for (int j = 0; j < kQK_K / 16; ++j) {
            int s = 0;
            for (int i = 0; i < 16; ++i) s += y[b].qs[16 * j + i];
            y[b].bsums[j] = int16_t(s);
        }
    }
}

void dequant_q8_k(const void *src, float *dst, int64_t n) {
    const BlockQ8_K *x = static_cast<const BlockQ8_K *>(src);
    for (int64_t b = 0; b < n / kQK_K; ++b)
        for (int i = 0; i < kQK_K; ++i) dst[b * kQK_K + i] = x[b].d * float(x[b].qs[i]);
}

}  // namespace ds4::quant::detail
