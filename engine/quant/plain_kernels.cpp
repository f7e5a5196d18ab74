// F32 / F16 / BF16 rows: conversions and dots against f32 activations.
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

// One row at a time: a single sequential stream is what the memory system handles best
// (interleaving several rows measured 2-4x slower from DRAM on the 2-core dev machine);
// four accumulators hide the FMA latency.
template <class L>
float dot_plain(const uint8_t *w, const float *x, int64_t n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const uint8_t *p = w + i * L::kBytes;
        a0 = _mm256_fmadd_ps(L::load8(p), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(L::load8(p + 8 * L::kBytes), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(L::load8(p + 16 * L::kBytes), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(L::load8(p + 24 * L::kBytes), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(L::load8(w + i * L::kBytes), _mm256_loadu_ps(x + i), a0);
    float s = simd::hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; ++i) s += L::one(w + i * L::kBytes) * x[i];
    return s;
}

template <class L>
void rows_any(const uint8_t *w, size_t stride, int64_t nrows, const void *xv, int64_t n, float *out) {
    const float *x = static_cast<const float *>(xv);
    for (int64_t r = 0; r < nrows; ++r) out[r] = dot_plain<L>(w + r * stride, x, n);
}

}  // namespace

void rows_f32(const uint8_t *w, size_t stride, int64_t nrows, const void *x, int64_t n, float *out) {
    rows_any<LoadF32>(w, stride, nrows, x, n, out);
}
void rows_f16(const uint8_t *w, size_t stride, int64_t nrows, const void *x, int64_t n, float *out) {
    rows_any<LoadF16>(w, stride, nrows, x, n, out);
}
void rows_bf16(const uint8_t *w, size_t stride, int64_t nrows, const void *x, int64_t n, float *out) {
    rows_any<LoadBF16>(w, stride, nrows, x, n, out);
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
