// Vector math for the kernels that take exp over many floats (softmax_parts.cpp,
// swiglu.cpp): the two widths (AVX-512, AVX2) as one set of operations, and Cephes' expf
// written once over them, so both widths give the same bits.
//
// Cephes' expf: t = k ln2 + r with k = round(t / ln2) and ln2 in two parts (so r is nearly
// exact), exp(r) = 1 + r + r^2 P(r) with P of degree 5, then 2^k added to the exponent.
// Within 1 ulp of exp (tests/kernels) for t <= 88; a larger t is taken as 88. Below t = -86
// the result is 0 (exp(-86) ~ 4e-38), which keeps every result a normal float, so the
// exponent add is exact; NaN stays NaN. Fused multiply-adds only where written: a file that
// includes this builds with -ffp-contract=off.
//
// Internal to engine/kernels; include from a .cpp only (it sets GCC diagnostics).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace ds4::ops::vec {

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

// The vector kernels are written once over these two widths; each entry point (in the
// including file) is flattened, so every call inlines into a function of the right target (GCC warns about the
// 512-bit ABI of the templates it never emits on their own).
#pragma GCC diagnostic ignored "-Wpsabi"

struct Avx512 {
    using F = __m512;
    using D = __m512d;
    using Mask = __mmask16;
    static constexpr int kLanes = 16;
    DS4_AVX512 static Mask all() { return 0xFFFF; }
    DS4_AVX512 static Mask first(int64_t k) { return Mask((1u << k) - 1); }
    DS4_AVX512 static F set1(float v) { return _mm512_set1_ps(v); }
    DS4_AVX512 static F load(const float *p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
    DS4_AVX512 static void store(float *p, Mask m, F v) { _mm512_mask_storeu_ps(p, m, v); }
    DS4_AVX512 static F max(F a, F b) { return _mm512_max_ps(a, b); }
    DS4_AVX512 static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
    using Cmp = __mmask16;
    DS4_AVX512 static F add(F a, F b) { return _mm512_add_ps(a, b); }
    DS4_AVX512 static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
    DS4_AVX512 static F div(F a, F b) { return _mm512_div_ps(a, b); }
    DS4_AVX512 static F min(F a, F b) { return _mm512_min_ps(a, b); }
    DS4_AVX512 static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
    DS4_AVX512 static F fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
    DS4_AVX512 static F round(F a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    // a * 2^k for an integral float k where the result is a normal float
    DS4_AVX512 static F scale2(F a, F k) {
        return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_slli_epi32(_mm512_cvtps_epi32(k), 23)));
    }
    DS4_AVX512 static Cmp below(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
    DS4_AVX512 static Cmp nan(F a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
    DS4_AVX512 static F zero_where(Cmp m, F a) { return _mm512_maskz_mov_ps(_knot_mask16(m), a); }
    DS4_AVX512 static F take_where(Cmp m, F a, F b) { return _mm512_mask_mov_ps(a, m, b); }
    DS4_AVX512 static D dzero() { return _mm512_setzero_pd(); }
    DS4_AVX512 static D lo(F v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
    DS4_AVX512 static D hi(F v) { return _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)); }
    DS4_AVX512 static D dadd(D a, D b) { return _mm512_add_pd(a, b); }
    DS4_AVX512 static D dmul(D a, D b) { return _mm512_mul_pd(a, b); }
    DS4_AVX512 static D ddiv(D a, D b) { return _mm512_div_pd(a, b); }
    DS4_AVX512 static F keep(Mask k, F a) { return _mm512_maskz_mov_ps(k, a); }
    DS4_AVX512 static F loadu(const float *p) { return _mm512_loadu_ps(p); }
    DS4_AVX512 static void storeu(float *p, F v) { _mm512_storeu_ps(p, v); }
    using Sum = __m512d;
    DS4_AVX512 static Sum sum_zero() { return _mm512_setzero_pd(); }
    DS4_AVX512 static Sum sum_add(Sum s, F e) { return _mm512_add_pd(_mm512_add_pd(s, lo(e)), hi(e)); }
    DS4_AVX512 static void sum_lanes(Sum s, double *l) { _mm512_storeu_pd(l, s); }
    DS4_AVX512 static F narrow(D a, D b) {
        return _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(a)), _mm512_cvtpd_ps(b), 1);
    }
};

struct Avx2 {
    using F = __m256;
    using D = __m256d;
    using Mask = __m256i;
    static constexpr int kLanes = 8;
    static Mask all() { return _mm256_set1_epi32(-1); }
    static Mask first(int64_t k) {
        return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(k)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    }
    static F set1(float v) { return _mm256_set1_ps(v); }
    static F load(const float *p, Mask m) { return _mm256_maskload_ps(p, m); }
    static void store(float *p, Mask m, F v) { _mm256_maskstore_ps(p, m, v); }
    static F max(F a, F b) { return _mm256_max_ps(a, b); }
    static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
    using Cmp = __m256;
    static F add(F a, F b) { return _mm256_add_ps(a, b); }
    static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
    static F div(F a, F b) { return _mm256_div_ps(a, b); }
    static F min(F a, F b) { return _mm256_min_ps(a, b); }
    static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
    static F fnmadd(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
    static F round(F a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
    static F scale2(F a, F k) {
        return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(a), _mm256_slli_epi32(_mm256_cvtps_epi32(k), 23)));
    }
    static Cmp below(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
    static Cmp nan(F a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
    static F zero_where(Cmp m, F a) { return _mm256_andnot_ps(m, a); }
    static F take_where(Cmp m, F a, F b) { return _mm256_blendv_ps(a, b, m); }
    static D dzero() { return _mm256_setzero_pd(); }
    static D lo(F v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
    static D hi(F v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }
    static D dadd(D a, D b) { return _mm256_add_pd(a, b); }
    static D dmul(D a, D b) { return _mm256_mul_pd(a, b); }
    static D ddiv(D a, D b) { return _mm256_div_pd(a, b); }
    static F keep(Mask k, F a) { return _mm256_and_ps(_mm256_castsi256_ps(k), a); }
    static F loadu(const float *p) { return _mm256_loadu_ps(p); }
    static void storeu(float *p, F v) { _mm256_storeu_ps(p, v); }
    struct Sum {
        D lo, hi;   // lanes 0-3, 4-7
    };
    static Sum sum_zero() { return {_mm256_setzero_pd(), _mm256_setzero_pd()}; }
    static Sum sum_add(Sum s, F e) { return {_mm256_add_pd(s.lo, lo(e)), _mm256_add_pd(s.hi, hi(e))}; }
    static void sum_lanes(Sum s, double *l) {
        _mm256_storeu_pd(l, s.lo);
        _mm256_storeu_pd(l + 4, s.hi);
    }
    static F narrow(D a, D b) { return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm256_cvtpd_ps(a)), _mm256_cvtpd_ps(b), 1); }
};

// The exp of every lane, written once for both widths (so both give the same bits).
template <class V>
inline typename V::F vexp(typename V::F t) {
    using F = typename V::F;
    const typename V::Cmp zero = V::below(t, V::set1(kLowest)), nan = V::nan(t);
    const F tc = V::min(t, V::set1(kHighest));
    const F k = V::round(V::mul(tc, V::set1(kLog2e)));
    F r = V::fnmadd(k, V::set1(kLn2Hi), tc);
    r = V::fnmadd(k, V::set1(kLn2Lo), r);
    F p = V::set1(kP[0]);
    for (int i = 1; i < 6; ++i) p = V::fmadd(p, r, V::set1(kP[i]));
    const F y = V::add(V::fmadd(p, V::mul(r, r), r), V::set1(1.f));
    return V::take_where(nan, V::zero_where(zero, V::scale2(y, k)), t);
}

}  // namespace ds4::ops::vec
