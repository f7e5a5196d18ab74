// Small AVX2 helpers shared by the kernels.
#pragma once
#include <immintrin.h>

namespace ds4::quant::simd {

inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

inline int hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

inline int hsum_i32(__m128i s) {
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

// [sum(p0), sum(p1), sum(p2), sum(p3)] of four int32x8 vectors (integer adds: exact).
inline __m128i sum4_i32(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
    const __m256i c = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
    return _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
}

// Signed int8 dot in 32-bit lanes: sum over each 4 bytes of a*b. |a| must not be 128
// when paired with b = -128 (the activations here are within -127..127).
inline __m256i dot_i8(__m256i a, __m256i b) {
    const __m256i ua = _mm256_sign_epi8(a, a);
    const __m256i sb = _mm256_sign_epi8(b, a);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ua, sb), _mm256_set1_epi16(1));
}

// Ask for the weights Ahead bytes past p, Lines cache lines of them (blocks of 66-144
// bytes would skip lines with one a block): the hardware prefetcher loses track across the
// many short rows of a decode step, and from memory the dots waited on their loads without
// this. Each kernel's distance is the one it measured best with.
template <int Ahead = 2048, int Lines = 2>
inline void prefetch_ahead(const void *p) {
    const char *c = static_cast<const char *>(p) + Ahead;
    for (int l = 0; l < Lines; ++l) _mm_prefetch(c + 64 * l, _MM_HINT_T0);
}

// GF2P8AFFINEQB matrices: output bit i takes the parity of matrix byte 7 - i AND the input
// byte, so a row with one bit set moves that bit. src[i]: the input bit of output bit i
// (-1: zero; 7 in the sign matrix: the parity of input bits 0-6).
constexpr long long affine_matrix(const int (&src)[8], bool parity7 = false) {
    unsigned long long a = 0;
    for (int i = 0; i < 8; ++i) {
        const unsigned long long row = src[i] < 0 ? 0 : parity7 && src[i] == 7 ? 0x7Fu : 1u << src[i];
        a |= row << (8 * (7 - i));
    }
    return (long long)a;
}

inline __m256i loadu(const void *p) { return _mm256_loadu_si256(static_cast<const __m256i *>(p)); }

}  // namespace ds4::quant::simd
