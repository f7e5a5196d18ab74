// F32 / F16 / BF16: conversions and dots against f32 activations.
#include <cstring>

#include "engine/quant/half.h"
#include "engine/quant/kernels.h"
#include "engine/quant/simd.h"

namespace ds4::quant::detail {
namespace {

struct LoadF32 {
    static __m256 load8(const uint8_t *p) { return _mm256_loadu_ps(reinterpret_cast<const float *>(p)); }
    static float one(const uint8_t *p) { float f; std::memcpy(&f, p, 4); return f; }
    static constexpr int kBytes = 4;
};
struct LoadF16 {
    static __m256 load8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))); }
    static float one(const uint8_t *p) { uint16_t h; std::memcpy(&h, p, 2); return f16_to_f32_fast(h); }
    static constexpr int kBytes = 2;
};
struct LoadBF16 {
    static __m256 load8(const uint8_t *p) {
        const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
    static float one(const uint8_t *p) { uint16_t h; std::memcpy(&h, p, 2); return bf16_to_f32_inline(h); }
    static constexpr int kBytes = 2;
};

// Four accumulators per column hide the FMA latency; each group of 8 weights is
// converted once for all columns.
template <class L, int C>
void dot_plain(const uint8_t *w, const void *const *xv, int64_t n, float *out) {
    const float *x[C];
    __m256 a[C][4];
    for (int c = 0; c < C; ++c) {
        x[c] = static_cast<const float *>(xv[c]);
        for (int k = 0; k < 4; ++k) a[c][k] = _mm256_setzero_ps();
    }
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const uint8_t *p = w + i * L::kBytes;
        // 4 KB ahead: from memory these dots waited on their loads (one core of an Emerald
        // Rapids VM: f16 9.5 -> 12.8-13.1 GB/s, bf16 9.0 -> 12.4-12.9, f32 12.0-12.6 -> 14.1-14.7)
        simd::prefetch_ahead<4096, L::kBytes / 2>(p);
        const __m256 w0 = L::load8(p), w1 = L::load8(p + 8 * L::kBytes);
        const __m256 w2 = L::load8(p + 16 * L::kBytes), w3 = L::load8(p + 24 * L::kBytes);
        for (int c = 0; c < C; ++c) {
            a[c][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[c] + i), a[c][0]);
            a[c][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[c] + i + 8), a[c][1]);
            a[c][2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x[c] + i + 16), a[c][2]);
            a[c][3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x[c] + i + 24), a[c][3]);
        }
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 w0 = L::load8(w + i * L::kBytes);
        for (int c = 0; c < C; ++c) a[c][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[c] + i), a[c][0]);
    }
    for (int c = 0; c < C; ++c) {
        float s = simd::hsum(_mm256_add_ps(_mm256_add_ps(a[c][0], a[c][1]), _mm256_add_ps(a[c][2], a[c][3])));
        for (int64_t j = i; j < n; ++j) s += L::one(w + j * L::kBytes) * x[c][j];
        out[c] = s;
    }
}

template <int C> void dot_f32_c(const uint8_t *w, const void *const *x, int64_t n, float *out) { dot_plain<LoadF32, C>(w, x, n, out); }
template <int C> void dot_f16_c(const uint8_t *w, const void *const *x, int64_t n, float *out) { dot_plain<LoadF16, C>(w, x, n, out); }
template <int C> void dot_bf16_c(const uint8_t *w, const void *const *x, int64_t n, float *out) { dot_plain<LoadBF16, C>(w, x, n, out); }

}  // namespace

void dot_f32(const uint8_t *w, const void *const *x, int ncols, int64_t n, float *out) {
    DS4_QUANT_COLS_DISPATCH(dot_f32_c, w, x, n, out)
}
void dot_f16(const uint8_t *w, const void *const *x, int ncols, int64_t n, float *out) {
    DS4_QUANT_COLS_DISPATCH(dot_f16_c, w, x, n, out)
}
void dot_bf16(const uint8_t *w, const void *const *x, int ncols, int64_t n, float *out) {
    DS4_QUANT_COLS_DISPATCH(dot_bf16_c, w, x, n, out)
}

void dequant_f16(const void *src, float *dst, int64_t n) {
    const uint8_t *p = static_cast<const uint8_t *>(src);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, LoadF16::load8(p + 2 * i));
    for (; i < n; ++i) dst[i] = LoadF16::one(p + 2 * i);
}

void dequant_bf16(const void *src, float *dst, int64_t n) {
    const uint8_t *p = static_cast<const uint8_t *>(src);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, LoadBF16::load8(p + 2 * i));
    for (; i < n; ++i) dst[i] = LoadBF16::one(p + 2 * i);
}

void quant_f16(const float *src, void *dst, int64_t n) {
    uint8_t *p = static_cast<uint8_t *>(dst);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i *>(p + 2 * i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; ++i) {
        const uint16_t h = f32_to_f16_fast(src[i]);
        std::memcpy(p + 2 * i, &h, 2);
    }
}

void quant_bf16(const float *src, void *dst, int64_t n) {
    uint8_t *p = static_cast<uint8_t *>(dst);
    for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_bf16_inline(src[i]);
        std::memcpy(p + 2 * i, &h, 2);
    }
}

}  // namespace ds4::quant::detail
