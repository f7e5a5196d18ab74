// Small element-wise and reduction kernels of the forward pass (f32). Written as plain
// loops that the compiler vectorises for AVX2; the heavy lifting is in matmul.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ds4::ops {

// out = x / sqrt(mean(x^2) + eps) * w   (w may be nullptr: unweighted). out may alias x.
void rmsnorm(const float *x, int64_t n, const float *w, float eps, float *out);
// In-place softmax over n values.
void softmax(float *x, int64_t n);
float dot(const float *a, const float *b, int64_t n);
// The lightning indexer's score of one compressed entry k (dim floats) for one query of
// `heads` heads (q: heads x dim): sum over h, in order from 0, of max(q_h.k * qscale, 0) * w[h]
// (each term added by a fused multiply-add). Each q_h.k is summed as 8 lanes (lane l takes
// elements l, l+8, ... by fused multiply-add from the first product), then
// ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)): what GCC made of the per-head `dot` loop it replaces,
// written out so that it does not depend on the compiler. AVX2 for dim % 8 == 0 and
// heads % 4 == 0, a scalar loop of the same operations otherwise.
float indexer_score(const float *q, const float *w, int heads, int dim, const float *k, float qscale);
// indexer_score of eight entries k[0..7] (same q, w), bit for bit: lane e of one 8-wide
// evaluation of the definition is entry e (decode scores thousands of entries per row).
void indexer_score8(const float *q, const float *w, int heads, int dim, const float *const *k, float qscale,
                    float *out);
// The same for sixteen entries, bit for bit: in one AVX-512 register where the CPU has
// AVX-512 F/DQ and DS4_NO_AVX512=1 is not set (indexer_score16_avx512(); tests flip it),
// else in two AVX2 registers.
bool &indexer_score16_avx512();
void indexer_score16(const float *q, const float *w, int heads, int dim, const float *const *k, float qscale,
                     float *out);
// indexer_score16 in its two halves, for many queries against the same sixteen entries (a
// prefill's rows): indexer_keys16 lays k[0..15] out position-major in kt (16 * dim floats,
// 64-byte aligned; dim % 8 == 0, dim <= kIndexerKeysMaxDim), indexer_score16_kt scores one
// query against them, the same bits.
constexpr int kIndexerKeysMaxDim = 512;
void indexer_keys16(const float *const *k, int dim, float *kt);
void indexer_score16_kt(const float *q, const float *w, int heads, int dim, const float *kt, float qscale, float *out);
// An indexer score: entry idx of a row scored `score`.
struct IndexScore {
    float score;
    int idx;
};
// The indexer's pick (topk.cpp): [first, first + k) becomes the k best of [first, last) by
// score descending, ties to the lower index, NaN below every number; that is
// std::partial_sort's result under this order. The entries must come in increasing idx (as a
// row's scores do); [first + k, last) is left in no particular state.
void top_k_scores(IndexScore *first, IndexScore *last, size_t k);
// Softmax parts (softmax_parts.cpp). exp_shift: x[i] = exp(x[i] - m) for x[i] - m <= 88,
// within 1 ulp of exp, 0 below -86, returning their sum in double (8 lanes, then pairs); the
// same bits on AVX-512 and AVX2. max_of: the largest of init and x[0..n) (NaN if any is).
double exp_shift(float *x, int64_t n, float m);
float max_of(const float *x, int64_t n, float init);
// std::max_element's index over x[0..n): the first of the largest values, NaNs passed over
// unless x[0] is NaN (then 0); -1 for n <= 0.
int64_t argmax_first(const float *x, int64_t n);
// The compressors' pooling: per channel c < dim, a softmax over the n slots' gate[k][c]
// weights val[k][c]: out[c] = sum_k e_k val[k][c] / sum_k e_k with e_k = exp(gate[k][c] - max)
// by exp_shift's exp (a NaN gate is passed over by the max), both sums in double over k in
// order. Channels go 16 (AVX-512) or 8 (AVX2) a step, the same bits on both.
void softmax_pool(const float *const *gate, const float *const *val, int n, int64_t dim, float *out);
// SwiGLU with the reference's clamping (swiglu.cpp): g[i] = silu(min(g[i], lim)) *
// clamp(u[i], -lim, lim), in place over n values; the exp within 1 ulp of libm's (so a value
// may differ from a libm silu by about that), the same bits on AVX-512 and AVX2.
void swiglu(float *g, const float *u, int64_t n, float lim);
namespace detail {
void swiglu_avx2(float *g, const float *u, int64_t n, float lim);
void swiglu_avx512(float *g, const float *u, int64_t n, float lim);   // where exp_shift_avx512_usable()
double exp_shift_avx2(float *x, int64_t n, float m);
double exp_shift_avx512(float *x, int64_t n, float m);   // where exp_shift_avx512_usable()
void softmax_pool_avx2(const float *const *gate, const float *const *val, int n, int64_t dim, float *out);
void softmax_pool_avx512(const float *const *gate, const float *const *val, int n, int64_t dim, float *out);
bool exp_shift_avx512_usable();
}  // namespace detail
// Sinkhorn's alternating normalisation of n <= kSinkhornLanes hc x hc matrices (row-major,
// hc <= 16) in place: columns, then rows and columns iters - 1 more times; each sum taken
// from 0 in index order and each entry divided by sum + eps. Every matrix gets exactly the
// adds and divisions of the one-matrix loop, in its order, so the bits are the same; the
// matrices sit in the lanes of a lane-major copy, so their ~32 * iters divisions each run
// as vector divisions, n matrices at a time; fewer than kSinkhornLanes 4 x 4 matrices
// instead sit in two registers each, the 16 divisions of a pass two vector ones.
constexpr int kSinkhornLanes = 8;
void sinkhorn(float *const *m, int n, int hc, int iters, float eps);
// y += a * x
void axpy(float a, const float *x, float *y, int64_t n);
// Interleaved-pair rotation of the trailing 2*n_pairs channels of x (length head_dim):
// (x0, x1) -> (x0 c - x1 s, x0 s + x1 c) with c, s per pair. sign = -1 rotates back.
void rope_apply(float *x, int64_t head_dim, int64_t n_pairs, const float *cos, const float *sin, float sign);
inline float sigmoid(float x) { return 1.f / (1.f + __builtin_expf(-x)); }
// torch.nn.functional.softplus (beta 1, threshold 20).
float softplus(float x);

}  // namespace ds4::ops
