// Q8_0: 32 elements, f16 scale + int8. Used for weights and as the activation format
// for Q8_0 weights.
#include <cmath>
#include <cstring>

#include "engine/quant/blocks.h"
#include "engine/quant/half.h"
#include "engine/quant/kernels.h"
#include "engine/quant/simd.h"

namespace ds4::quant::detail {

// int8 code of v (already scaled), ties away from zero as GGML's reference; NaN -> 0.
static inline int8_t clamp_round_i8(float v) {
    if (!(v == v)) return 0;
    v = std::round(v);
    return int8_t(v > 127.f ? 127.f : (v < -127.f ? -127.f : v));
}

// As GGML: d = amax / 127, q = round(x * (1 / d)); d stored as f16. Non-finite inputs
// are coded as 0 and do not affect the scale.
void quant_q8_0(const float *src, void *dst, int64_t n) {
    BlockQ8_0 *y = static_cast<BlockQ8_0 *>(dst);
    for (int64_t b = 0; b < n / kQK8_0; ++b) {
        const float *x = src + b * kQK8_0;
        float amax = 0;
        for (int i = 0; i < kQK8_0; ++i)
            if (std::isfinite(x[i])) amax = std::fmax(amax, std::fabs(x[i]));
        const float d = amax / 127.f;
        const float id = d != 0 ? 1.f / d : 0.f;
        y[b].d = f32_to_f16_fast(d);
        for (int i = 0; i < kQK8_0; ++i) y[b].qs[i] = std::isfinite(x[i]) ? clamp_round_i8(x[i] * id) : 0;
    }
}

void dequant_q8_0(const void *src, float *dst, int64_t n) {
    const BlockQ8_0 *x = static_cast<const BlockQ8_0 *>(src);
    for (int64_t b = 0; b < n / kQK8_0; ++b) {
        const __m256 d = _mm256_set1_ps(f16_to_f32_fast(x[b].d));
        for (int k = 0; k < 4; ++k) {
            const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(x[b].qs + 8 * k));
            _mm256_storeu_ps(dst + b * kQK8_0 + 8 * k, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
        }
    }
}

namespace {

template <int R>
void rows_q8_0_r(const uint8_t *w, size_t stride, const BlockQ8_0 *x, int64_t nb, float *out) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const __m256i xq = simd::loadu(x[b].qs);
        const float dx = f16_to_f32_fast(x[b].d);
        for (int r = 0; r < R; ++r) {
            const BlockQ8_0 *wb = reinterpret_cast<const BlockQ8_0 *>(w + r * stride) + b;
            const __m256i p = simd::dot_i8(simd::loadu(wb->qs), xq);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(f16_to_f32_fast(wb->d) * dx), _mm256_cvtepi32_ps(p), acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) out[r] = simd::hsum(acc[r]);
}

}  // namespace

void rows_q8_0(const uint8_t *w, size_t stride, int64_t nrows, const void *xv, int64_t n, float *out) {
    const BlockQ8_0 *x = static_cast<const BlockQ8_0 *>(xv);
    const int64_t nb = n / kQK8_0;
    int64_t r = 0;
    for (; r + 4 <= nrows; r += 4) rows_q8_0_r<4>(w + r * stride, stride, x, nb, out + r);
    for (; r < nrows; ++r) rows_q8_0_r<1>(w + r * stride, stride, x, nb, out + r);
}

}  // namespace ds4::quant::detail
