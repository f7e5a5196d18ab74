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

// Two blocks per step on separate accumulators; |w| is formed once for all columns.
template <int C>
void dot_cols(const uint8_t *wv, const void *const *xv, int64_t n, float *out) {
    const BlockQ8_0 *w = reinterpret_cast<const BlockQ8_0 *>(wv);
    const BlockQ8_0 *x[C];
    __m256 a0[C], a1[C];
    for (int c = 0; c < C; ++c) {
        x[c] = static_cast<const BlockQ8_0 *>(xv[c]);
        a0[c] = a1[c] = _mm256_setzero_ps();
    }
    const __m256i ones = _mm256_set1_epi16(1);
    auto step = [&](int64_t b, __m256 *acc) {
        const __m256i q = simd::loadu(w[b].qs);
        const __m256i aq = _mm256_sign_epi8(q, q);
        const float dw = f16_to_f32_fast(w[b].d);
        for (int c = 0; c < C; ++c) {
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aq, _mm256_sign_epi8(simd::loadu(x[c][b].qs), q)), ones);
            acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(_mm256_set1_ps(dw * f16_to_f32_fast(x[c][b].d)), _mm256_cvtepi32_ps(p)));
        }
    };
    const int64_t nb = n / kQK8_0;
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        // Hardware prefetch loses track across the 34-byte blocks of many short rows;
        // ask for the weights ~2 KB ahead explicitly.
        _mm_prefetch(reinterpret_cast<const char *>(w + b) + 2048, _MM_HINT_T0);
        step(b, a0);
        step(b + 1, a1);
    }
    if (b < nb) step(b, a0);
    for (int c = 0; c < C; ++c) out[c] = simd::hsum(_mm256_add_ps(a0[c], a1[c]));
}

}  // namespace

void dot_q8_0(const uint8_t *w, const void *const *x, int ncols, int64_t n, float *out) {
    DS4_QUANT_COLS_DISPATCH(dot_cols, w, x, n, out)
}

}  // namespace ds4::quant::detail
