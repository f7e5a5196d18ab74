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

inline __m256 block_dot(const BlockQ8_0 &w, const BlockQ8_0 &x) {
    const __m256i p = simd::dot_i8(simd::loadu(w.qs), simd::loadu(x.qs));
    return _mm256_mul_ps(_mm256_set1_ps(f16_to_f32_fast(w.d) * f16_to_f32_fast(x.d)), _mm256_cvtepi32_ps(p));
}

// One row, two blocks per step on separate accumulators.
float dot_row(const BlockQ8_0 *w, const BlockQ8_0 *x, int64_t nb) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        a0 = _mm256_add_ps(a0, block_dot(w[b], x[b]));
        a1 = _mm256_add_ps(a1, block_dot(w[b + 1], x[b + 1]));
    }
    if (b < nb) a0 = _mm256_add_ps(a0, block_dot(w[b], x[b]));
    return simd::hsum(_mm256_add_ps(a0, a1));
}

}  // namespace

void rows_q8_0(const uint8_t *w, size_t stride, int64_t nrows, const void *xv, int64_t n, float *out) {
    const BlockQ8_0 *x = static_cast<const BlockQ8_0 *>(xv);
    for (int64_t r = 0; r < nrows; ++r) out[r] = dot_row(reinterpret_cast<const BlockQ8_0 *>(w + r * stride), x, n / kQK8_0);
}

}  // namespace ds4::quant::detail
