// The parts of attention's softmax, many weights at a time: the maximum, and x[i] = exp(x[i]
// - m) with their sum. A libm expf per weight, a scalar max and a sequential double sum were
// ~20% of a flash-shape prefill step's attention on Zen 5.
//
// Cephes' expf: t = k ln2 + r with k = round(t / ln2) and ln2 in two parts (so r is nearly
// exact), exp(r) = 1 + r + r^2 P(r) with P of degree 5, then 2^k added to the exponent.
// Within 1 ulp of exp (tests/kernels) for t <= 88 (softmax has t <= 0). Below t = -86 the result is 0 (exp(-86) ~ 4e-38:
// nothing against the largest weight, 1), which keeps every result a normal float, so the
// exponent add is exact; NaN stays NaN. AVX-512 and AVX2 run the same operations (fused
// multiply-adds where written, nothing contracted: -ffp-contract=off), lane for lane, so
// both give the same bits. The sum is in double, 8 lanes (lane j takes i = j mod 8, in order),
// then ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), on both.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "engine/kernels/ops.h"

namespace ds4::ops {

namespace {

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kLowest = -86.f;
constexpr float kHighest = 88.f;
constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                         4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

#define DS4_AVX512 __attribute__((target("avx512f,avx512dq")))
// GCC 12 warns about the undefined pass-through operand inside its AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

DS4_AVX512 inline __m512 exp16(__m512 t) {
    const __mmask16 zero = _mm512_cmp_ps_mask(t, _mm512_set1_ps(kLowest), _CMP_LT_OQ);
    const __mmask16 nan = _mm512_cmp_ps_mask(t, t, _CMP_UNORD_Q);
    const __m512 t0 = t;
    t = _mm512_min_ps(t, _mm512_set1_ps(kHighest));
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(t, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(kLn2Hi), t);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(kLn2Lo), r);
    __m512 p = _mm512_set1_ps(kP[0]);
    for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP[i]));
    const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.f));
    const __m512i e = _mm512_slli_epi32(_mm512_cvtps_epi32(k), 23);
    const __m512 v = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(y), e));
    return _mm512_mask_mov_ps(_mm512_maskz_mov_ps(_knot_mask16(zero), v), nan, t0);
}

inline __m256 exp8(__m256 t) {
    const __m256 zero = _mm256_cmp_ps(t, _mm256_set1_ps(kLowest), _CMP_LT_OQ);
    const __m256 nan = _mm256_cmp_ps(t, t, _CMP_UNORD_Q);
    const __m256 t0 = t;
    t = _mm256_min_ps(t, _mm256_set1_ps(kHighest));
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(t, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(kLn2Hi), t);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(kLn2Lo), r);
    __m256 p = _mm256_set1_ps(kP[0]);
    for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP[i]));
    const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.f));
    const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(k), 23);
    const __m256 v = _mm256_andnot_ps(zero, _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(y), e)));
    return _mm256_blendv_ps(v, t0, nan);
}

}  // namespace

namespace detail {

DS4_AVX512 double exp_shift_avx512(float *x, int64_t n, float m) {
    const __m512 mv = _mm512_set1_ps(m);
    __m512d sum = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv));
        _mm512_storeu_ps(x + i, e);
        sum = _mm512_add_pd(sum, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        sum = _mm512_add_pd(sum, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    }
    if (i < n) {
        const __mmask16 k = __mmask16((1u << (n - i)) - 1);
        const __m512 e = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), mv)));
        _mm512_mask_storeu_ps(x + i, k, e);
        sum = _mm512_add_pd(sum, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        if (n - i > 8) sum = _mm512_add_pd(sum, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    }
    alignas(64) double l[8];
    _mm512_store_pd(l, sum);
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

double exp_shift_avx2(float *x, int64_t n, float m) {
    const __m256 mv = _mm256_set1_ps(m);
    __m256d lo = _mm256_setzero_pd(), hi = lo;   // lanes 0-3, 4-7
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
        _mm256_storeu_ps(x + i, e);
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    if (i < n) {
        alignas(32) int32_t lanes[8];
        for (int j = 0; j < 8; ++j) lanes[j] = i + j < n ? -1 : 0;
        const __m256i k = _mm256_load_si256(reinterpret_cast<const __m256i *>(lanes));
        const __m256 e = _mm256_and_ps(_mm256_castsi256_ps(k), exp8(_mm256_sub_ps(_mm256_maskload_ps(x + i, k), mv)));
        _mm256_maskstore_ps(x + i, k, e);
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    alignas(32) double l[8];
    _mm256_store_pd(l, lo);
    _mm256_store_pd(l + 4, hi);
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

bool exp_shift_avx512_usable() {
    static const bool on = [] {
        if (const char *e = std::getenv("DS4_NO_AVX512"); e && *e && *e != '0') return false;
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
    }();
    return on;
}

}  // namespace detail

double exp_shift(float *x, int64_t n, float m) {
    return detail::exp_shift_avx512_usable() ? detail::exp_shift_avx512(x, n, m) : detail::exp_shift_avx2(x, n, m);
}

float max_of(const float *x, int64_t n, float init) {
    // max is exact, so any order gives the same value; a NaN anywhere gives NaN
    __m256 acc = _mm256_set1_ps(init), nan = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        acc = _mm256_max_ps(v, acc);   // a NaN in v gives acc: noted apart
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    if (_mm256_movemask_ps(nan)) return std::numeric_limits<float>::quiet_NaN();
    alignas(32) float l[8];
    _mm256_store_ps(l, acc);
    float m = l[0];
    for (int j = 1; j < 8; ++j) m = std::isnan(l[j]) || l[j] > m ? l[j] : m;
    for (; i < n; ++i) m = std::isnan(x[i]) || x[i] > m ? x[i] : m;
    return m;
}

}  // namespace ds4::ops
