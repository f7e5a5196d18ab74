// Q2_K: 256 elements in 16 sub-blocks of 16, x = d*sc*q - dmin*m with 4-bit sc/m, 2-bit q.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/quant/blocks.h"
#include "engine/quant/half.h"
#include "engine/quant/kernels.h"
#include "engine/quant/kquant_fit.h"
#include "engine/quant/simd.h"

namespace ds4::quant::detail {
namespace {

constexpr float kMaxF16 = 65504.f;

// Super-block scale for 4-bit sub-scales: returns the stored f16 and fills q[16] in 0..15.
uint16_t quantize_scales(const float *v, uint8_t *q) {
    const float vmax = *std::max_element(v, v + 16);
    if (!(vmax > 0)) {
        std::fill(q, q + 16, uint8_t(0));
        return 0;
    }
    const float iscale = 15.f / vmax;
    for (int j = 0; j < 16; ++j) q[j] = uint8_t(std::clamp(nearest_int(iscale * v[j]), 0, 15));
    return f32_to_f16_fast(std::min(vmax / 15.f, kMaxF16));
}

}  // namespace

void quant_q2_k(const float *src, void *dst, int64_t n) {
    BlockQ2_K *y = static_cast<BlockQ2_K *>(dst);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        float x[kQK_K], w[16], scales[16], mins[16];
        uint8_t L[kQK_K], qsc[16], qmin[16];
        sanitize(src + b * kQK_K, x, kQK_K);
        for (int j = 0; j < 16; ++j) {
            const float *xs = x + 16 * j;
            // weight errors by magnitude on top of a floor, so small values still count
            float s2 = 0;
            for (int i = 0; i < 16; ++i) s2 += xs[i] * xs[i];
            const float floor_w = std::sqrt(s2 / 16);
            for (int i = 0; i < 16; ++i) w[i] = floor_w + std::fabs(xs[i]);
            scales[j] = fit_scale_offset(16, 3, xs, w, L + 16 * j, &mins[j], -0.5f, 0.1f, 15);
        }
        y[b].d = quantize_scales(scales, qsc);
        y[b].dmin = quantize_scales(mins, qmin);
        for (int j = 0; j < 16; ++j) y[b].scales[j] = uint8_t(qsc[j] | (qmin[j] << 4));
        // requantize against the scales actually stored
        const float d = f16_to_f32_fast(y[b].d), dmin = f16_to_f32_fast(y[b].dmin);
        for (int j = 0; j < 16; ++j) {
            const float dl = d * qsc[j], ml = dmin * qmin[j];
            for (int i = 0; i < 16; ++i) {
                const int l = dl != 0 ? nearest_int((x[16 * j + i] + ml) / dl) : 0;
                L[16 * j + i] = uint8_t(std::clamp(l, 0, 3));
            }
        }
        for (int h = 0; h < 2; ++h)
            for (int l = 0; l < 32; ++l) {
                const uint8_t *q = L + 128 * h + l;
                y[b].qs[32 * h + l] = uint8_t(q[0] | (q[32] << 2) | (q[64] << 4) | (q[96] << 6));
            }
    }
}

void dequant_q2_k(const void *src, float *dst, int64_t n) {
    const BlockQ2_K *x = static_cast<const BlockQ2_K *>(src);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float d = f16_to_f32_fast(x[b].d), dmin = f16_to_f32_fast(x[b].dmin);
        float *y = dst + b * kQK_K;
        for (int h = 0; h < 2; ++h) {
            const uint8_t *q = x[b].qs + 32 * h;
            for (int k = 0; k < 4; ++k)
                for (int part = 0; part < 2; ++part) {
                    const uint8_t sc = x[b].scales[8 * h + 2 * k + part];
                    const float dl = d * float(sc & 15), ml = dmin * float(sc >> 4);
                    for (int l = 0; l < 16; ++l) *y++ = dl * float((q[16 * part + l] >> (2 * k)) & 3) - ml;
                }
        }
    }
}

namespace {

// Per 128-bit lane: broadcast 16-bit element 2k (low lane) / 2k+1 (high lane).
alignas(32) constexpr uint8_t kScaleShuffle[4][32] = {
    {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3},
    {4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7},
    {8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11},
    {12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13,
     14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15},
};

template <int C>
void dot_cols(const uint8_t *wv, const void *const *xv, int64_t n, float *out) {
    const BlockQ2_K *w = reinterpret_cast<const BlockQ2_K *>(wv);
    const BlockQ8_K *x[C];
    __m256 acc[C];
    float accm[C];
    for (int c = 0; c < C; ++c) {
        x[c] = static_cast<const BlockQ8_K *>(xv[c]);
        acc[c] = _mm256_setzero_ps();
        accm[c] = 0;
    }
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(0xF);
    __m256i shuf[4];
    for (int k = 0; k < 4; ++k) shuf[k] = _mm256_load_si256(reinterpret_cast<const __m256i *>(kScaleShuffle[k]));
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const BlockQ2_K &wb = w[b];
        const float dw = f16_to_f32_fast(wb.d), dminw = f16_to_f32_fast(wb.dmin);
        const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(wb.scales));
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m4));
        const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc8, m4));
        // decoded once: 2-bit quants and the sub-block scale vectors, in dot order
        __m256i q2[8], sc[8];
        for (int h = 0; h < 2; ++h) {
            const __m256i s = h == 0 ? _mm256_permute2x128_si256(sc16, sc16, 0x00)
                                     : _mm256_permute2x128_si256(sc16, sc16, 0x11);
            const __m256i q = simd::loadu(wb.qs + 32 * h);
            for (int k = 0; k < 4; ++k) {
                q2[4 * h + k] = _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), m3);
                sc[4 * h + k] = _mm256_shuffle_epi8(s, shuf[k]);
            }
        }
        for (int c = 0; c < C; ++c) {
            const BlockQ8_K &xb = x[c][b];
            accm[c] += xb.d * dminw * float(simd::hsum_i32(_mm256_madd_epi16(mins, simd::loadu(xb.bsums))));
            __m256i sum0 = _mm256_setzero_si256(), sum1 = sum0;
            for (int j = 0; j < 8; j += 2) {
                const __m256i p0 = _mm256_maddubs_epi16(q2[j], simd::loadu(xb.qs + 32 * j));
                const __m256i p1 = _mm256_maddubs_epi16(q2[j + 1], simd::loadu(xb.qs + 32 * j + 32));
                sum0 = _mm256_add_epi32(sum0, _mm256_madd_epi16(p0, sc[j]));
                sum1 = _mm256_add_epi32(sum1, _mm256_madd_epi16(p1, sc[j + 1]));
            }
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(xb.d * dw), _mm256_cvtepi32_ps(_mm256_add_epi32(sum0, sum1)), acc[c]);
        }
    }
    for (int c = 0; c < C; ++c) out[c] = simd::hsum(acc[c]) - accm[c];
}

}  // namespace

void dot_q2_k(const uint8_t *w, const void *const *x, int ncols, int64_t n, float *out) {
    DS4_QUANT_COLS_DISPATCH(dot_cols, w, x, n, out)
}

}  // namespace ds4::quant::detail
