// ops::indexer_score (ops.h). Its own file so it builds with -ffp-contract=off: the scalar
// path must round every product and sum where the definition says, as the AVX2 path does.
#include <immintrin.h>

#include <cmath>
#include <cstdlib>

#include "engine/kernels/ops.h"

namespace ds4::ops {
namespace {

float dot8_ref(const float *a, const float *b, int dim) {
    float l[8];
    for (int j = 0; j < 8; ++j) l[j] = j < dim ? a[j] * b[j] : 0.f;
    for (int i = 8; i < dim; ++i) l[i % 8] = std::fma(a[i], b[i], l[i % 8]);
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

// Four heads' dots with k as one vector [d0, d1, d2, d3], each in dot8_ref's order: two
// horizontal adds pair (l0+l1),(l2+l3) then their sums per 128-bit half, and the halves
// (lanes 0-3 and 4-7 of each head) are added last.
inline __m128 dot4x8(const float *q, int dim, const float *k) {
    __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(k));
    __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(q + dim), _mm256_loadu_ps(k));
    __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(q + 2 * dim), _mm256_loadu_ps(k));
    __m256 a3 = _mm256_mul_ps(_mm256_loadu_ps(q + 3 * dim), _mm256_loadu_ps(k));
    for (int i = 8; i < dim; i += 8) {
        const __m256 kv = _mm256_loadu_ps(k + i);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), kv, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + dim + i), kv, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q + 2 * dim + i), kv, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q + 3 * dim + i), kv, a3);
    }
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// Keys k[0..7] into kt position-major: kt[i * stride + e] = k[e][i] (dim % 8 == 0).
inline void transpose_keys(const float *const *k, int dim, float *kt, int stride) {
    for (int i0 = 0; i0 < dim; i0 += 8) {
        __m256 r[8];
        for (int e = 0; e < 8; ++e) r[e] = _mm256_loadu_ps(k[e] + i0);
        const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
        const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
        const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
        const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
        const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
        const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
        const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
        const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
        float *d = kt + (size_t)i0 * stride;
        _mm256_storeu_ps(d + 0 * stride, _mm256_permute2f128_ps(u0, u4, 0x20));
        _mm256_storeu_ps(d + 1 * stride, _mm256_permute2f128_ps(u1, u5, 0x20));
        _mm256_storeu_ps(d + 2 * stride, _mm256_permute2f128_ps(u2, u6, 0x20));
        _mm256_storeu_ps(d + 3 * stride, _mm256_permute2f128_ps(u3, u7, 0x20));
        _mm256_storeu_ps(d + 4 * stride, _mm256_permute2f128_ps(u0, u4, 0x31));
        _mm256_storeu_ps(d + 5 * stride, _mm256_permute2f128_ps(u1, u5, 0x31));
        _mm256_storeu_ps(d + 6 * stride, _mm256_permute2f128_ps(u2, u6, 0x31));
        _mm256_storeu_ps(d + 7 * stride, _mm256_permute2f128_ps(u3, u7, 0x31));
    }
}

}  // namespace

float indexer_score(const float *q, const float *w, int heads, int dim, const float *k, float qscale) {
    float score = 0;
    if (dim % 8 == 0 && heads % 4 == 0) {
        const __m128 qs = _mm_set1_ps(qscale), zero = _mm_setzero_ps();
        for (int h = 0; h < heads; h += 4) {
            const __m128 d = dot4x8(q + (size_t)h * dim, dim, k);
            alignas(16) float t[4];
            _mm_store_ps(t, _mm_max_ps(_mm_mul_ps(d, qs), zero));
            for (int i = 0; i < 4; ++i) score = std::fma(t[i], w[h + i], score);
        }
        return score;
    }
    for (int h = 0; h < heads; ++h) {
        const float d = dot8_ref(q + (size_t)h * dim, k, dim) * qscale;
        score = std::fma(d > 0 ? d : 0.f, w[h], score);
    }
    return score;
}

// Eight entries at once, one per lane: every lane runs the per-head definition above
// operation for operation (first product, fused multiply-adds into lane i % 8, the same
// pairwise sum, scale, ReLU, fused multiply-add of the head weight in head order), so each
// result has indexer_score's bits; the entries' rows are transposed 8 x 8 into kt first.
void indexer_score8(const float *q, const float *w, int heads, int dim, const float *const *k, float qscale,
                    float *out) {
    if (dim % 8 != 0 || dim > kIndexerKeysMaxDim) {
        for (int e = 0; e < 8; ++e) out[e] = indexer_score(q, w, heads, dim, k[e], qscale);
        return;
    }
    alignas(32) float kt[kIndexerKeysMaxDim * 8];
    transpose_keys(k, dim, kt, 8);
    const __m256 qs = _mm256_set1_ps(qscale), zero = _mm256_setzero_ps();
    __m256 score = _mm256_setzero_ps();
    for (int h = 0; h < heads; ++h) {
        const float *qh = q + (size_t)h * dim;
        __m256 l[8];
        for (int j = 0; j < 8; ++j) l[j] = _mm256_mul_ps(_mm256_broadcast_ss(qh + j), _mm256_load_ps(kt + j * 8));
        for (int i = 8; i < dim; i += 8)
            for (int j = 0; j < 8; ++j)
                l[j] = _mm256_fmadd_ps(_mm256_broadcast_ss(qh + i + j), _mm256_load_ps(kt + (size_t)(i + j) * 8), l[j]);
        const __m256 d = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(l[0], l[1]), _mm256_add_ps(l[2], l[3])),
                                       _mm256_add_ps(_mm256_add_ps(l[4], l[5]), _mm256_add_ps(l[6], l[7])));
        score = _mm256_fmadd_ps(_mm256_max_ps(_mm256_mul_ps(d, qs), zero), _mm256_set1_ps(w[h]), score);
    }
    _mm256_storeu_ps(out, score);
}

#define DS4_AVX512 __attribute__((target("avx512f,avx512dq")))
// GCC 12 warns about the undefined pass-through operand inside its AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

bool &indexer_score16_avx512() {
    static bool on = [] {
        if (const char *e = std::getenv("DS4_NO_AVX512"); e && *e && *e != '0') return false;
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
    }();
    return on;
}

namespace {

// indexer_score8 with 16 lanes: each broadcast q element feeds sixteen entries' fma (on AMD
// Zen 5 the 8-wide kernel waits on its two loads a fma). Lane e runs entry e's operations of
// indexer_score8 in the same order, so the bits are the same.
DS4_AVX512 void score16_kt_avx512(const float *q, const float *w, int heads, int dim, const float *kt, float qscale,
                                  float *out) {
    const __m512 qs = _mm512_set1_ps(qscale), zero = _mm512_setzero_ps();
    __m512 score = _mm512_setzero_ps();
    for (int h = 0; h < heads; ++h) {
        const float *qh = q + (size_t)h * dim;
        __m512 l[8];
        for (int j = 0; j < 8; ++j) l[j] = _mm512_mul_ps(_mm512_set1_ps(qh[j]), _mm512_load_ps(kt + j * 16));
        for (int i = 8; i < dim; i += 8)
            for (int j = 0; j < 8; ++j)
                l[j] = _mm512_fmadd_ps(_mm512_set1_ps(qh[i + j]), _mm512_load_ps(kt + (size_t)(i + j) * 16), l[j]);
        const __m512 d = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(l[0], l[1]), _mm512_add_ps(l[2], l[3])),
                                       _mm512_add_ps(_mm512_add_ps(l[4], l[5]), _mm512_add_ps(l[6], l[7])));
        score = _mm512_fmadd_ps(_mm512_max_ps(_mm512_mul_ps(d, qs), zero), _mm512_set1_ps(w[h]), score);
    }
    _mm512_storeu_ps(out, score);
}

// The same on AVX2, the sixteen entries in two registers. All eight chains of both halves
// with their operands would not fit 16 registers, so a head's chains go four at a time
// (each chain's mul and fmas in the same order; the two quads' sums kept), and each
// broadcast q element feeds two fmas: 1.5 loads a fma, where indexer_score8 takes 2.
void score16_kt_avx2(const float *q, const float *w, int heads, int dim, const float *kt, float qscale, float *out) {
    const __m256 qs = _mm256_set1_ps(qscale), zero = _mm256_setzero_ps();
    __m256 score[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int h = 0; h < heads; ++h) {
        const float *qh = q + (size_t)h * dim;
        __m256 quad[2][2];   // [(l0 + l1) + (l2 + l3), (l4 + l5) + (l6 + l7)] of each half
        for (int j0 = 0; j0 < 8; j0 += 4) {
            __m256 l[4][2];
            for (int j = 0; j < 4; ++j) {
                const __m256 b = _mm256_broadcast_ss(qh + j0 + j);
                l[j][0] = _mm256_mul_ps(b, _mm256_load_ps(kt + (j0 + j) * 16));
                l[j][1] = _mm256_mul_ps(b, _mm256_load_ps(kt + (j0 + j) * 16 + 8));
            }
            for (int i = 8; i < dim; i += 8)
                for (int j = 0; j < 4; ++j) {
                    const __m256 b = _mm256_broadcast_ss(qh + i + j0 + j);
                    const float *k = kt + (size_t)(i + j0 + j) * 16;
                    l[j][0] = _mm256_fmadd_ps(b, _mm256_load_ps(k), l[j][0]);
                    l[j][1] = _mm256_fmadd_ps(b, _mm256_load_ps(k + 8), l[j][1]);
                }
            for (int e = 0; e < 2; ++e)
                quad[j0 / 4][e] = _mm256_add_ps(_mm256_add_ps(l[0][e], l[1][e]), _mm256_add_ps(l[2][e], l[3][e]));
        }
        const __m256 wh = _mm256_set1_ps(w[h]);
        for (int e = 0; e < 2; ++e) {
            const __m256 d = _mm256_add_ps(quad[0][e], quad[1][e]);
            score[e] = _mm256_fmadd_ps(_mm256_max_ps(_mm256_mul_ps(d, qs), zero), wh, score[e]);
        }
    }
    _mm256_storeu_ps(out, score[0]);
    _mm256_storeu_ps(out + 8, score[1]);
}

}  // namespace

void indexer_score16(const float *q, const float *w, int heads, int dim, const float *const *k, float qscale,
                     float *out) {
    if (dim % 8 != 0 || dim > kIndexerKeysMaxDim) {
        indexer_score8(q, w, heads, dim, k, qscale, out);
        indexer_score8(q, w, heads, dim, k + 8, qscale, out + 8);
        return;
    }
    alignas(64) float kt[kIndexerKeysMaxDim * 16];
    indexer_keys16(k, dim, kt);
    indexer_score16_kt(q, w, heads, dim, kt, qscale, out);
}

void indexer_keys16(const float *const *k, int dim, float *kt) {
    transpose_keys(k, dim, kt, 16);
    transpose_keys(k + 8, dim, kt + 8, 16);
}

void indexer_score16_kt(const float *q, const float *w, int heads, int dim, const float *kt, float qscale,
                        float *out) {
    if (indexer_score16_avx512()) score16_kt_avx512(q, w, heads, dim, kt, qscale, out);
    else score16_kt_avx2(q, w, heads, dim, kt, qscale, out);
}

}  // namespace ds4::ops
