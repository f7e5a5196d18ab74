// Host-side launchers of the CUDA backend's kernels (all asynchronous on stream s). Device
// pointers throughout; shapes as in the CPU executor (engine/cpu).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/gguf/gguf.h"

namespace ds4::cuda {

// Products of at least this many rows (tokens) use the tensor-core kernels where they apply.
constexpr int64_t kMmaMinTokens = 16;

void init_quant_tables();
void init_qmatmul_tables();
// Whether one-token integer products over rows of `in` elements stage them (cuda_qblocks.cuh).
bool stage_rows(int64_t in);

// y[t*ys + o] = sum_i W[o, i] * x[t*xs + i] with f32 activations, W in its GGUF encoding
// (the engine uses it for F32 / F16 / BF16 weights; block formats go through matmul_q).
void matmul(cudaStream_t s, gguf::Type type, const void *w, int64_t in, int64_t out, uint64_t row_bytes, const float *x,
            int64_t n_tok, int64_t x_stride, float *y, int64_t y_stride);

// Two one-token products of f32 activations x (in elements) in one launch, each row as
// matmul computes it; false (nothing launched) where they would not take matmul's
// split-row kernel.
bool matmul_pair(cudaStream_t s, gguf::Type type, int64_t in, const void *w0, int64_t out0, uint64_t rb0, float *y0, const void *w1,
                 int64_t out1, uint64_t rb1, float *y1, const float *x);

// Split-K (cuda_splitk.cu): how many input splits a product of `blocks` output tiles and
// `ksteps` input steps gets (1: none); the partial buffer [splits][n_tok][out]; the reduction
// (splits added in order) into y, which also frees the partials.
int splitk_count(int64_t blocks, int64_t ksteps);
float *splitk_alloc(cudaStream_t s, int splits, int64_t n_tok, int64_t out);
void splitk_finish(cudaStream_t s, float *part, int splits, int64_t n_tok, int64_t out, float *y, int64_t ys);

// F16 weights on the tensor cores for kMmaMinTokens+ rows and 16+ outputs (cuda_hmma.cu;
// activations split into two f16 parts); false when the shape is not handled. matmul()
// takes this path by itself.
bool matmul_f16_mma(cudaStream_t s, const void *w, int64_t in, int64_t out, uint64_t row_bytes, const float *x, int64_t n_tok,
                    int64_t x_stride, float *y, int64_t y_stride);

// Block-quantised weights multiply activations quantised as the CPU engine does
// (quant::vec_dot_type): Q8_0 for Q8_0 weights, Q8_K for Q2_K / Q4_K / IQ2_XXS; F32 for the
// plain types (no quantisation). One quantised row (act_row_bytes, a multiple of 16):
// int8 q[n], float d[n / block] (Q8_0: its f16 scale widened), int16 bsums[n / 16] (Q8_K).
gguf::Type act_type(gguf::Type weight);
uint64_t act_row_bytes(gguf::Type weight, int64_t n);
// q + t*qrow = row t of x (x + t*xs, n elements) quantised for weights of type `weight`;
// int8 values and scales bit-identical to quant::quantize_activation.
void quantize_act(cudaStream_t s, gguf::Type weight, const float *x, int64_t n_tok, int64_t xs, int64_t n, uint8_t *q,
                  uint64_t qrow);
// y[t*ys + o] = dot(W[o], xq row t) with integer block dots (Q8_0 / Q2_K / Q4_K / IQ2_XXS).
// From kMmaMinTokens tokens on, Q8_0 / Q2_K / IQ2_XXS run on the tensor cores (cuda_mmq.cu)
// unless tensor_cores is false; the dp4a kernels otherwise. Both are exact in their integer
// parts; their float sums are ordered differently.
void matmul_q(cudaStream_t s, gguf::Type type, const void *w, int64_t in, int64_t out, uint64_t row_bytes, const uint8_t *xq,
              uint64_t qrow, int64_t n_tok, float *y, int64_t y_stride, bool tensor_cores = true);
// Two one-token products over the same quantised input (in elements) in one launch, each row
// as matmul_q computes it; false (nothing launched) where it does not apply.
bool matmul_q_pair(cudaStream_t s, gguf::Type type, int64_t in, const void *w0, int64_t out0, uint64_t rb0, float *y0, const void *w1,
                   int64_t out1, uint64_t rb1, float *y1, const uint8_t *xq, uint64_t qrow);
// The tensor-core product (grouped as matmul_q_grouped; out_per_group = out, group_chunks =
// 0 when plain); false when the format or shape is not handled (nothing launched).
bool matmul_q_mma(cudaStream_t s, gguf::Type type, const void *w, int64_t in, int64_t out, uint64_t row_bytes,
                  const uint8_t *xq, uint64_t qrow, int64_t n_tok, float *y, int64_t y_stride, int64_t xn, int64_t out_per_group,
                  int64_t group_chunks);
// Grouped: output o multiplies the slice [(o / out_per_group) * in, + in) of each xq row,
// rows quantised whole (xn elements), as if each group's slice had been quantised alone --
// which it is, slices starting on activation block boundaries.
void matmul_q_grouped(cudaStream_t s, gguf::Type type, const void *w, int64_t in, int64_t out, uint64_t row_bytes,
                      const uint8_t *xq, uint64_t qrow, int64_t xn, int64_t out_per_group, int64_t n_tok, float *y,
                      int64_t y_stride);
// dst row r = src row idx[r] (row_bytes a multiple of 16).
void gather_bytes(cudaStream_t s, const uint8_t *src, uint64_t row_bytes, const int *idx, uint8_t *dst, int rows);
// out[r*os + i] = W[ids[r], i] decoded, for r < rows.
// y = W . rmsnorm(x) (unit norm weight) for fewer than kMmaMinTokens rows of f32 / f16 / bf16 weights, the
// norm folded into the product; false (nothing launched) where it does not apply.
bool matmul_rms(cudaStream_t s, gguf::Type type, const void *w, int64_t in, int64_t out, uint64_t row_bytes, const float *x,
                int64_t n_tok, int64_t x_stride, float eps, float *y, int64_t y_stride);
void dequant_rows(cudaStream_t s, gguf::Type type, const void *w, uint64_t row_bytes, int64_t n, const int32_t *ids,
                  int64_t rows, float *out, int64_t out_stride);

// Per-row RMSNorm (sum of squares in double). w may be null. Rows are x + r*xs (or, when
// idx is given, x + idx[r]*xs); out may alias x.
void rmsnorm_rows(cudaStream_t s, const float *x, int64_t xs, const int32_t *idx, int64_t n, const float *w, float eps,
                  float *out, int64_t os, int rows);
// rmsnorm_rows (no gather) whose rows are also quantised as quantize_act quantises them, for
// Q8_0 weights into q0 and / or for Q8_K weights into qk (null: not wanted): one launch.
void rmsnorm_quant_rows(cudaStream_t s, const float *x, int64_t xs, int64_t n, const float *w, float eps, float *out, int64_t os,
                        uint8_t *q0, uint64_t q0row, uint8_t *qk, uint64_t qkrow, int rows);
// H[rows][hc][D] -> X, post, comb from the mixed projections mix[rows][(2+hc)*hc].
void hc_pre_mix(cudaStream_t s, const float *mix, const float *base, const float *scale, const float *H, int hc, int D,
                int iters, float eps, float *post, float *comb, float *X, int rows);
void hc_post(cudaStream_t s, float *H, const float *A, const float *post, const float *comb, int hc, int D, int rows);
// Per (row, head): optional RMSNorm (weight w or none) then interleaved-pair RoPE of the
// trailing 2*n_pairs channels at pos[row] (sign -1 rotates back).
void norm_rope_heads(cudaStream_t s, float *x, int n_heads, int hd, bool norm, const float *w, float eps,
                     const int64_t *pos, const float *inv_freq, int n_pairs, float sign, int rows);
// norm_rope_heads without the norm, each row (n_heads * hd) then quantised as quantize_act does,
// in blocks of qk (32: Q8_0, 256: Q8_K) into q: one launch.
void rope_heads_quant(cudaStream_t s, int qk, float *x, int n_heads, int hd, const int64_t *pos, const float *inv_freq, int n_pairs,
                      float sign, uint8_t *q, uint64_t qrow, int rows);
// norm_rope_heads of q (n_heads heads, no norm weight, sign +1) and of the rows' single kv
// head (norm weight kv_w), then kv row r copied to kv_dst[r] (the cache ring): one launch.
void norm_rope_q_kv(cudaStream_t s, float *q, int n_heads, float *kv, const float *kv_w, float *const *kv_dst, int hd, float eps,
                    const int64_t *pos, const float *inv_freq, int n_pairs, int rows);

// Compressor ring update for n rows of one segment starting at absolute position n0.
void comp_ring_write(cudaStream_t s, const float *p_kv, const float *p_gate, int row0, const float *ape, int width,
                     int ratio, int64_t n0, int n, float *kv_ring, float *gate_ring, int cap);
// Entries [first, last) of one compressor, from its rings.
void comp_emit(cudaStream_t s, const float *kv_ring, const float *gate_ring, int cap, int width, int dim, int ratio,
               bool overlap, int first, int last, float *entries, const float *norm_w, float eps, const float *inv_freq,
               int n_pairs);

// Lightning indexer: scores[r][s] = sum_h w_h/sqrt(IH) * ReLU(q_h . e_s)/sqrt(Id) for
// s < n_vis[r]; then the top-k indices (ties: lower first) into sel[r][topk] in ascending
// index order, count in nsel.
void indexer_scores(cudaStream_t s, const float *iq, const float *iw, int IH, int Id, const float *const *entries,
                    const int *n_vis, int max_vis, float *scores, int rows);
void topk_rows(cudaStream_t s, float *scores, int stride, const int *n_vis, int k, int *sel, int *nsel, int rows);

struct AttnRow {
    const float *kv;        // the session's window ring for this layer
    const float *entries;   // its compressed entries (null: none)
    const int *sel;         // CSA: selected entry indices (null: entries 0..n_ent-1)
    int64_t pos;
    int cap;
    int n_ent;              // selected count (CSA) or visible count (HCA)
};
// Floats of scratch attend() needs (scores, or the per-split partial outputs of few rows).
size_t attend_scratch_floats(int rows, int H, int hd, int max_keys);
void attend(cudaStream_t s, const float *q, const AttnRow *rows_desc, int H, int hd, int window, const float *sinks,
            float *scratch, int max_keys, float *o, int rows);

// Router: scores sqrt(softplus(logit)); ids by hash table (tid2eid[token]) or top-k of
// score + bias; weights renormalised and scaled.
void route(cudaStream_t s, const float *logits, int E, int K, const int32_t *tid2eid, const int32_t *tokens,
           const float *bias, float scale, int *ids, float *wts, int rows);
void gather_rows(cudaStream_t s, const float *src, int width, const int *idx, float *dst, int rows);
// g = silu(min(g, lim)) * clamp(u, -lim, lim)
void swiglu(cudaStream_t s, float *g, const float *u, int64_t n, float lim);
// swiglu over rows of F, each row also quantised as quantize_act does, in blocks of qk (32:
// Q8_0, 256: Q8_K) into q: one launch.
void swiglu_quant(cudaStream_t s, int qk, float *g, const float *u, int64_t F, float lim, uint8_t *q, uint64_t qrow, int rows);
// dst[idx[r]] += w[r] * src[r]
void scatter_add_rows(cudaStream_t s, const float *src, int width, const int *idx, const float *w, float *dst, int rows);
void add(cudaStream_t s, float *y, const float *x, int64_t n);
// y[r] = RMSNorm(sum_k (sigmoid(mix[r][k]*scale0 + base[k]) + eps) * H[idx[r]][k]) * norm_w
void hyper_head(cudaStream_t s, const float *H, const int32_t *idx, const float *mix, const float *base, const float *scale,
                int hc, int D, float hc_eps, const float *norm_w, float rms_eps, float *y, int rows);

// Routed experts grouped on the device (cuda_moe.cu). The step's P = rows * K (row, choice)
// pairs, ordered by expert then by pair: used[u] is the u-th chosen expert (ascending),
// its pairs are [off[u], off[u+1]), prow/pw each pair's row and weight. err is set to
// 1 + the first bad pair's index when the router chose an id outside [0, E).
struct MoeGroups {
    int *n_used, *used, *off, *prow;
    float *pw;
    int *err;
};
// A layer's stacked expert tensors on the device: expert e's matrix starts e * eb_* bytes in
// -- or, with slot (the VRAM expert cache: device table expert -> slot), slot[e] * eb_*.
struct ExpertMats {
    const uint8_t *gate, *up, *down;
    uint64_t eb_gate, eb_up, eb_down, rb_gate, rb_up, rb_down;
    gguf::Type type_gate, type_up, type_down;
    const int *slot = nullptr;
};
bool moe_type_supported(gguf::Type t);
void moe_group(cudaStream_t s, const int *ids, const float *wts, int P, int K, int E, const MoeGroups &g);
// h[pair][F] = clamped SwiGLU of the pair's expert gate/up on its row of xq (quantised for
// the gate type); blocks for max_used experts from the u0-th used one, those past n_used exit.
void moe_gate_up(cudaStream_t s, const ExpertMats &m, int64_t in, int64_t F, const uint8_t *xq, uint64_t qrow,
                 const MoeGroups &g, int max_used, bool one_row, float *h, float lim, int u0 = 0);
// y[pair][D] = the pair's expert down on hq's row of the same pair.
void moe_down(cudaStream_t s, const ExpertMats &m, int64_t in, int64_t D, const uint8_t *hq, uint64_t qrow,
              const MoeGroups &g, int max_used, bool one_row, float *y, int u0 = 0);
// Tensor-core expert products for steps with many routed pairs (grouped on the host): tile i
// multiplies expert tiles[i].e's matrix (w + e * expert_bytes) with the activation rows of
// pairs [p0, p0 + np) -- row rowidx[p] of xq, or row p when rowidx is null -- into y[p].
struct MmaTile {
    int e, p0, np;
};
constexpr int kMmaTilePairs = 64;   // np <= this
bool mma_type_supported(gguf::Type t);
void matmul_q_mma_tiles(cudaStream_t s, gguf::Type type, const void *w, uint64_t expert_bytes, int64_t in, int64_t out,
                        uint64_t row_bytes, const uint8_t *xq, uint64_t qrow, const int *rowidx, const MmaTile *tiles, int n_tiles,
                        float *y, int64_t y_stride);
// A[r] = sum over k of pw[pos[r*K+k]] * y[pos[r*K+k]] for each row's K pair positions
// (ascending), from zero (overwrites A).
void moe_combine_pos(cudaStream_t s, const float *y, int D, const int *pos, const float *pw, int K, float *A, int rows);
// A[r] = sum of pw * y over row r's pairs, in pair order (overwrites A).
void moe_combine(cudaStream_t s, const float *y, int D, int P, const MoeGroups &g, float *A, int rows);
// hc_post whose sublayer output is moe_combine's sum of y plus, when not null, the shared
// expert's output rows (as add() adds them): the same values, without materialising A.
void hc_post_moe(cudaStream_t s, float *H, const float *y, int P, const MoeGroups &g, const float *shared, const float *post,
                 const float *comb, int hc, int D, int rows);

}  // namespace ds4::cuda
