#include "engine/kernels/ops.h"

#include <immintrin.h>

#include <cmath>

namespace ds4::ops {

namespace {

// Sum of squares in double: the hyper-connection norm runs over hc_mult * n_embd values. In
// 16 lanes, then a fixed order, so every caller gets the same bits for the same row; one
// serial chain cost a 4-cycle add a value (prefill's per-head norms alone ~11 ms a 256-row
// step on the flash shape).
double sum_squares(const float *x, int64_t n) {
    int64_t i = 0;
    double ss = 0;
#if defined(__AVX2__) && defined(__FMA__)
    __m256d a[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 4; ++k) {
            const __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4 * k));
            a[k] = _mm256_fmadd_pd(v, v, a[k]);
        }
    const __m256d s = _mm256_add_pd(_mm256_add_pd(a[0], a[1]), _mm256_add_pd(a[2], a[3]));
    alignas(32) double l[4];
    _mm256_store_pd(l, s);
    ss = (l[0] + l[1]) + (l[2] + l[3]);
#endif
    for (; i < n; ++i) ss += (double)x[i] * x[i];
    return ss;
}

}  // namespace

void rmsnorm(const float *x, int64_t n, const float *w, float eps, float *out) {
    const double ss = sum_squares(x, n);
    const float r = (float)(1.0 / std::sqrt(ss / (double)n + (double)eps));
    if (w) {
        for (int64_t i = 0; i < n; ++i) out[i] = x[i] * r * w[i];
    } else {
        for (int64_t i = 0; i < n; ++i) out[i] = x[i] * r;
    }
}

void softmax(float *x, int64_t n) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
    double s = 0;
    for (int64_t i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - m);
        s += x[i];
    }
    const float inv = (float)(1.0 / s);
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

namespace {

// sinkhorn of one 4 x 4 matrix (V4's hc_mult) held in two registers, rows 0-1 and 2-3, a row
// to a 128-bit lane: a column pass adds the four lanes, a row pass adds within each lane,
// both from 0 in index order as the loop below, and the 16 divisions are two vector ones
// (the lane-parallel loop spends hc vector divisions a line whatever the matrices it holds:
// a decode row has one, and Sinkhorn was ~2.5% of a default-model decode step).
void sinkhorn4(float *m, int iters, float eps) {
    __m256 a = _mm256_loadu_ps(m), b = _mm256_loadu_ps(m + 8);
    const __m256 ve = _mm256_set1_ps(eps), zero = _mm256_setzero_ps();
    auto cols = [&] {
        __m128 s = _mm_add_ps(_mm_setzero_ps(), _mm256_castps256_ps128(a));
        s = _mm_add_ps(s, _mm256_extractf128_ps(a, 1));
        s = _mm_add_ps(s, _mm256_castps256_ps128(b));
        s = _mm_add_ps(_mm_add_ps(s, _mm256_extractf128_ps(b, 1)), _mm256_castps256_ps128(ve));
        const __m256 d = _mm256_set_m128(s, s);
        a = _mm256_div_ps(a, d);
        b = _mm256_div_ps(b, d);
    };
    auto rows = [&](__m256 x) {   // lane 0 of each row gathers ((0 + x0) + x1) + x2) + x3
        __m256 s = _mm256_add_ps(zero, x);
        s = _mm256_add_ps(s, _mm256_permute_ps(x, 0x55));
        s = _mm256_add_ps(s, _mm256_permute_ps(x, 0xAA));
        s = _mm256_add_ps(_mm256_add_ps(s, _mm256_permute_ps(x, 0xFF)), ve);
        return _mm256_div_ps(x, _mm256_permute_ps(s, 0x00));
    };
    cols();
    for (int it = 1; it < iters; ++it) {
        a = rows(a);
        b = rows(b);
        cols();
    }
    _mm256_storeu_ps(m, a);
    _mm256_storeu_ps(m + 8, b);
}

}  // namespace

void sinkhorn(float *const *m, int n, int hc, int iters, float eps) {
    if (hc == 4 && n < kSinkhornLanes) {   // 4 vector divisions an iteration a matrix, against 32 for all
        for (int l = 0; l < n; ++l) sinkhorn4(m[l], iters, eps);
        return;
    }
    constexpr int L = kSinkhornLanes;
    alignas(32) float e[16 * 16][L];
    const int hh = hc * hc;
    for (int i = 0; i < hh; ++i)
        for (int l = 0; l < L; ++l) e[i][l] = l < n ? m[l][i] : 1.f;   // idle lanes: any positive matrix
    // One pass normalises the lines of a stride-`along` walk: columns (along = hc, step 1
    // between lines) or rows (along = 1, step hc).
    auto normalise = [&](int along, int step) {
        for (int line = 0; line < hc; ++line) {
            float *first = e[line * step];
            alignas(32) float s[L];
            for (int l = 0; l < L; ++l) s[l] = 0.f;
            for (int i = 0; i < hc; ++i)
                for (int l = 0; l < L; ++l) s[l] += first[i * along * L + l];
            for (int l = 0; l < L; ++l) s[l] += eps;
            for (int i = 0; i < hc; ++i)
                for (int l = 0; l < L; ++l) first[i * along * L + l] /= s[l];
        }
    };
    normalise(hc, 1);
    for (int it = 1; it < iters; ++it) {
        normalise(1, hc);
        normalise(hc, 1);
    }
    for (int i = 0; i < hh; ++i)
        for (int l = 0; l < n; ++l) m[l][i] = e[i][l];
}

float dot(const float *a, const float *b, int64_t n) {
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
        s4 += a[i + 4] * b[i + 4];
        s5 += a[i + 5] * b[i + 5];
        s6 += a[i + 6] * b[i + 6];
        s7 += a[i + 7] * b[i + 7];
    }
    float s = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

void axpy(float a, const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void rope_apply(float *x, int64_t head_dim, int64_t n_pairs, const float *cos, const float *sin, float sign) {
    float *r = x + head_dim - 2 * n_pairs;
    for (int64_t i = 0; i < n_pairs; ++i) {
        const float c = cos[i], s = sign * sin[i];
        const float a = r[2 * i], b = r[2 * i + 1];
        r[2 * i] = a * c - b * s;
        r[2 * i + 1] = b * c + a * s;
    }
}

float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

}  // namespace ds4::ops
