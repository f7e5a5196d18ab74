// ops::indexer_score (ops.h). Its own file so it builds with -ffp-contract=off: the scalar
// path must round every product and sum where the definition says, as the AVX2 path does.
#include <immintrin.h>

#include <cmath>

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

}  // namespace ds4::ops
