// The CUDA backend's element-wise, normalisation, attention and routing kernels. Written
// for clarity first: one block per row (or per row and head), reductions in shared memory.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "cuda/cuda_async_copy.cuh"
#include "cuda/cuda_check.h"
#include "cuda/cuda_launch.cuh"
#include "cuda/cuda_kernels.h"
#include "cuda/cuda_moe_sum.cuh"
#include "cuda/cuda_quant_act.cuh"

namespace ds4::cuda {

namespace {

constexpr int kBlock = 256;

// Block-wide sum/max; every thread gets the result. sh: kBlock/32 slots.
template <class T>
__device__ T block_sum(T v, T *sh) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    const int w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[w] = v;
    __syncthreads();
    T r = 0;
    for (int i = 0; i < nw; ++i) r += sh[i];
    return r;
}

__device__ float block_max(float v, float *sh) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    const int w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[w] = v;
    __syncthreads();
    float r = -INFINITY;
    for (int i = 0; i < nw; ++i) r = fmaxf(r, sh[i]);
    return r;
}

__device__ __forceinline__ float sigmoidf(float x) { return 1.f / (1.f + expf(-x)); }

// Same rounding as the CPU tables: float angle, double cos/sin.
__device__ __forceinline__ void rope_pair(float *r, int i, const float *inv_freq, int64_t pos, float sign) {
    const float a = inv_freq[i] * (float)pos;
    const float c = (float)cos((double)a), sn = sign * (float)sin((double)a);
    const float x0 = r[2 * i], x1 = r[2 * i + 1];
    r[2 * i] = x0 * c - x1 * sn;
    r[2 * i + 1] = x1 * c + x0 * sn;
}

// 1 / rms of a row of n (one block per row). Eight loads go out before the first add (the
// plain strided loop waited on each), and the adds keep the order of that loop, so the sum is
// the same to the bit.
__device__ __forceinline__ float row_rms_inv(const float *xr, int64_t n, float eps, double *sh) {
    const int64_t B = blockDim.x;
    double ss = 0;
    int64_t i = threadIdx.x;
    for (; i + 7 * B < n; i += 8 * B) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) v[u] = xr[i + u * B];
#pragma unroll
        for (int u = 0; u < 8; ++u) ss += (double)v[u] * v[u];
    }
    for (; i < n; i += B) ss += (double)xr[i] * xr[i];
    ss = block_sum(ss, sh);
    return (float)(1.0 / sqrt(ss / (double)n + (double)eps));
}

__global__ void rmsnorm_kernel(const float *x, int64_t xs, const int32_t *idx, int64_t n, const float *w, float eps,
                               float *out, int64_t os) {
    pdl_enter();
    __shared__ double sh[kBlock / 32];
    const int r = blockIdx.x;
    const float *xr = x + (idx ? (int64_t)idx[r] : (int64_t)r) * xs;
    const float inv = row_rms_inv(xr, n, eps, sh);
    const int64_t B = blockDim.x;
    float *o = out + (int64_t)r * os;
    int64_t i = threadIdx.x;
    for (; i + 3 * B < n; i += 4 * B) {
        float v[4], g[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = xr[i + u * B], g[u] = w ? w[i + u * B] : 1.f;
#pragma unroll
        for (int u = 0; u < 4; ++u) o[i + u * B] = w ? v[u] * inv * g[u] : v[u] * inv;
    }
    for (; i < n; i += B) o[i] = w ? xr[i] * inv * w[i] : xr[i] * inv;
}

// rmsnorm_kernel's row (the same sum and products), also quantised for Q8_0 weights (q0) and /
// or Q8_K weights (qk) as quantize_kernel quantises it: a step's norms feed integer products
// next, and this saves their quantise launches. Lane l of a warp takes chunk c0 + l of 8.
__global__ void rmsnorm_quant_kernel(const float *x, int64_t xs, int64_t n, const float *w, float eps, float *out, int64_t os,
                                     uint8_t *q0, uint64_t q0row, uint8_t *qk, uint64_t qkrow) {
    pdl_enter();
    __shared__ double sh[kBlock / 32];
    const int r = blockIdx.x;
    const float *xr = x + (int64_t)r * xs;
    const float inv = row_rms_inv(xr, n, eps, sh);
    float *o = out + (int64_t)r * os;
    const int lane = threadIdx.x & 31;
    const int64_t chunks = n / 8;
    for (int64_t c0 = 0; c0 < chunks; c0 += blockDim.x) {   // uniform: every lane of a warp quantises
        const int64_t c = c0 + threadIdx.x;
        const bool in = c < chunks;
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const int64_t e = 8 * c + u;
            v[u] = in ? (w ? xr[e] * inv * w[e] : xr[e] * inv) : 0.f;
        }
        if (in)
#pragma unroll
            for (int u = 0; u < 8; ++u) o[8 * c + u] = v[u];
        if (q0) quantize_chunk<32>(v, in, lane, c, n, q0 + (int64_t)r * q0row);
        if (qk) quantize_chunk<256>(v, in, lane, c, n, qk + (int64_t)r * qkrow);
    }
}

// Sinkhorn: columns, then (rows, columns) for the remaining iterations. A thread per element
// (tid < hc * hc); each sums its row or column in the serial order, so the result is the same
// whichever threads run it (hc_pre_kernel's one-warp form gives the same bits).
__device__ __forceinline__ void hc_sinkhorn(float *cb, int hc, int iters, float eps, int tid) {
    const bool mine = tid < hc * hc;
    const int mj = mine ? tid / hc : 0, mk = mine ? tid % hc : 0;
    auto sync = [] { __syncthreads(); };
    for (int it = 0; it < iters; ++it) {
        if (it > 0) {
            float s = 0;
            if (mine)
                for (int k2 = 0; k2 < hc; ++k2) s += cb[mj * hc + k2];
            sync();
            if (mine) cb[mj * hc + mk] /= s + eps;
            sync();
        }
        float s = 0;
        if (mine)
            for (int j2 = 0; j2 < hc; ++j2) s += cb[j2 * hc + mk];
        sync();
        if (mine) cb[mj * hc + mk] /= s + eps;
        sync();
    }
}

// The same Sinkhorn on one warp with the mixer in registers (hc * hc <= 32): each row /
// column sum gathers its elements by shuffles, then adds them in the serial order. HC: hc
// known at compile time (4, V4's), so the gathers go out together; 0 = any.
template <int HC>
__device__ __forceinline__ float hc_sinkhorn_warp(const float *cb, int hc_rt, int iters, float eps, int tid) {
    const int hc = HC ? HC : hc_rt;
    const bool mine = tid < hc * hc;
    const int mj = mine ? tid / hc : 0, mk = mine ? tid % hc : 0;
    float x = mine ? cb[tid] : 0.f;
    constexpr int kMax = HC ? HC : 5;   // hc * hc <= 32
    // the sum of elements base, base + step, ... (hc of them) in that order
    auto line_sum = [&](int base, int step) {
        float g[kMax];
#pragma unroll
        for (int k = 0; k < kMax; ++k) g[k] = __shfl_sync(0xffffffffu, x, k < hc ? base + k * step : 0);
        float s = 0;
#pragma unroll
        for (int k = 0; k < kMax; ++k)
            if (k < hc) s += g[k];
        return s;
    };
    for (int it = 0; it < iters; ++it) {
        if (it > 0) {
            const float sr = line_sum(mj * hc, 1);
            if (mine) x /= sr + eps;
        }
        const float sc = line_sum(mk, hc);
        if (mine) x /= sc + eps;
    }
    return x;
}

// Block (row t, slice y): every block derives the pre weights (a few sigmoids, same bits in
// each) and mixes its slice of D; block 0 also builds post and the Sinkhorn mixer. With four
// streams the mixer is 16 elements: one warp runs its 2 x iters steps in registers, with no
// barrier (the 1024-thread single block this replaced spent most of its time in barriers).
__global__ void hc_pre_kernel(const float *mix, const float *base, const float *scale, const float *H, int hc, int D,
                              int iters, float eps, float *post, float *comb, float *X) {
    pdl_enter();
    __shared__ float pre[16], cb[256];
    const int t = blockIdx.x, nmix = (2 + hc) * hc, tid = threadIdx.x;
    const bool lead = blockIdx.y == 0;
    const float *m = mix + (int64_t)t * nmix;
    if (tid < hc) {
        const int k = tid;
        pre[k] = sigmoidf(m[k] * scale[0] + base[k]) + eps;
        if (lead) {
            post[t * hc + k] = 2.f * sigmoidf(m[hc + k] * scale[1] + base[hc + k]);
            // row j = tid of the mixer: softmax + eps
            const int j = tid;
            float mx = -INFINITY;
            for (int k2 = 0; k2 < hc; ++k2) {
                cb[j * hc + k2] = m[2 * hc + j * hc + k2] * scale[2] + base[2 * hc + j * hc + k2];
                mx = fmaxf(mx, cb[j * hc + k2]);
            }
            double sd = 0;
            for (int k2 = 0; k2 < hc; ++k2) sd += cb[j * hc + k2] = expf(cb[j * hc + k2] - mx);
            const float inv = (float)(1.0 / sd);
            for (int k2 = 0; k2 < hc; ++k2) cb[j * hc + k2] = cb[j * hc + k2] * inv + eps;
        }
    }
    __syncthreads();
    if (lead) {
        if (hc * hc <= 32) {
            if (tid < 32) {
                const float x = hc == 4 ? hc_sinkhorn_warp<4>(cb, 4, iters, eps, tid) : hc_sinkhorn_warp<0>(cb, hc, iters, eps, tid);
                if (tid < hc * hc) comb[(int64_t)t * hc * hc + tid] = x;
            }
        } else {
            hc_sinkhorn(cb, hc, iters, eps, tid);
            for (int i = tid; i < hc * hc; i += blockDim.x) comb[(int64_t)t * hc * hc + i] = cb[i];
        }
    }
    const float *h = H + (int64_t)t * hc * D;
    for (int d = blockIdx.y * blockDim.x + tid; d < D; d += gridDim.y * blockDim.x) {
        float v = 0;
        for (int k = 0; k < hc; ++k) v += pre[k] * h[(int64_t)k * D + d];
        X[(int64_t)t * D + d] = v;
    }
}

// H's hc streams of row t at element d updated from the sublayer output o.
__device__ __forceinline__ void hc_post_elem(float *H, float o, const float *post, const float *comb, int hc, int D, int t, int d) {
    float *h = H + (int64_t)t * hc * D;
    float old[16];
    for (int j = 0; j < hc; ++j) old[j] = h[(int64_t)j * D + d];
    const float *cb = comb + (int64_t)t * hc * hc;
    for (int k = 0; k < hc; ++k) {
        float v = post[t * hc + k] * o;
        for (int j = 0; j < hc; ++j) v += cb[j * hc + k] * old[j];
        h[(int64_t)k * D + d] = v;
    }
}

__global__ void hc_post_kernel(float *H, const float *A, const float *post, const float *comb, int hc, int D) {
    pdl_enter();
    const int t = blockIdx.y;
    const int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= D) return;
    hc_post_elem(H, A[(int64_t)t * D + d], post, comb, hc, D, t, d);
}

// hc_post_kernel with the FFN's output made on the fly: the routed experts' outputs y summed
// per row by moe_combine_kernel's own loop (moe_row_sum), plus the shared expert's output
// (null: none) as add_kernel adds it -- the same float steps, so the same output, two
// launches fewer.
__global__ void hc_post_moe_kernel(float *H, const float *__restrict__ y, int P, MoeGroups g, const float *__restrict__ shared,
                                   const float *post, const float *comb, int hc, int D) {
    pdl_enter();
    const int t = blockIdx.y;
    const int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= D) return;
    float acc = moe_row_sum(y, D, P, g, t, d);
    if (shared) acc += shared[(int64_t)t * D + d];
    hc_post_elem(H, acc, post, comb, hc, D, t, d);
}

// Blocks past rows * n_heads (when kv is given) take the rows' single kv head instead,
// normed with kv.w, and copy it to kv.dst[r] when done (a step's q and kv in one launch).
struct KvHead {
    float *x;
    const float *w;
    float *const *dst;
    int rows;
};
__global__ void norm_rope_kernel(float *x, int n_heads, int hd, bool norm, const float *w, float eps, const int64_t *pos,
                                 const float *inv_freq, int n_pairs, float sign, KvHead kv) {
    pdl_enter();
    __shared__ double sh[kBlock / 32];
    const bool is_kv = kv.x && (int)blockIdx.x >= kv.rows * n_heads;
    const int b = is_kv ? (int)blockIdx.x - kv.rows * n_heads : (int)blockIdx.x;
    const int r = is_kv ? b : b / n_heads, h = is_kv ? 0 : b % n_heads;
    float *v = is_kv ? kv.x + (int64_t)r * hd : x + ((int64_t)r * n_heads + h) * hd;
    if (is_kv) w = kv.w;
    if (norm) {
        double ss = 0;
        for (int i = threadIdx.x; i < hd; i += blockDim.x) ss += (double)v[i] * v[i];
        ss = block_sum(ss, sh);
        const float inv = (float)(1.0 / sqrt(ss / (double)hd + (double)eps));
        for (int i = threadIdx.x; i < hd; i += blockDim.x) v[i] = w ? v[i] * inv * w[i] : v[i] * inv;
        __syncthreads();
    }
    float *rp = v + hd - 2 * n_pairs;
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) rope_pair(rp, i, inv_freq, pos[r], sign);
    if (is_kv) {
        __syncthreads();
        for (int i = threadIdx.x; i < hd; i += blockDim.x) kv.dst[r][i] = v[i];
    }
}

__global__ void comp_ring_kernel(const float *p_kv, const float *p_gate, int row0, const float *ape, int width, int ratio,
                                 int64_t n0, float *kv_ring, float *gate_ring, int cap) {
    pdl_enter();
    const int i = blockIdx.x;
    const int64_t pos = n0 + i;
    const float *kv = p_kv + (int64_t)(row0 + i) * width, *g = p_gate + (int64_t)(row0 + i) * width;
    const float *a = ape + (pos % ratio) * width;
    float *kd = kv_ring + (pos % cap) * width, *gd = gate_ring + (pos % cap) * width;
    for (int k = threadIdx.x; k < width; k += blockDim.x) {
        kd[k] = kv[k];
        gd[k] = g[k] + a[k];
    }
}

__global__ void comp_emit_kernel(const float *kv_ring, const float *gate_ring, int cap, int width, int dim, int ratio,
                                 bool overlap, int first, float *entries, const float *norm_w, float eps,
                                 const float *inv_freq, int n_pairs) {
    pdl_enter();
    __shared__ double sh[kBlock / 32];
    const int wi = first + blockIdx.x;
    const int64_t start = (int64_t)wi * ratio;
    const bool prev = overlap && wi > 0;
    const int off = overlap ? dim : 0;
    float *out = entries + (int64_t)wi * dim;
    double ss = 0;
    for (int ch = threadIdx.x; ch < dim; ch += blockDim.x) {
        float mx = -INFINITY;
        if (prev)
            for (int j = 0; j < ratio; ++j) mx = fmaxf(mx, gate_ring[((start - ratio + j) % cap) * width + ch]);
        for (int j = 0; j < ratio; ++j) mx = fmaxf(mx, gate_ring[((start + j) % cap) * width + off + ch]);
        double den = 0, acc = 0;
        if (prev)
            for (int j = 0; j < ratio; ++j) {
                const int64_t row = ((start - ratio + j) % cap) * width;
                const float e = expf(gate_ring[row + ch] - mx);
                den += e;
                acc += (double)e * kv_ring[row + ch];
            }
        for (int j = 0; j < ratio; ++j) {
            const int64_t row = ((start + j) % cap) * width;
            const float e = expf(gate_ring[row + off + ch] - mx);
            den += e;
            acc += (double)e * kv_ring[row + off + ch];
        }
        const float v = (float)(acc / den);
        out[ch] = v;
        ss += (double)v * v;
    }
    ss = block_sum(ss, sh);
    const float inv = (float)(1.0 / sqrt(ss / (double)dim + (double)eps));
    for (int ch = threadIdx.x; ch < dim; ch += blockDim.x) out[ch] = out[ch] * inv * norm_w[ch];
    __syncthreads();
    float *rp = out + dim - 2 * n_pairs;
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) rope_pair(rp, i, inv_freq, start, 1.f);
}

__global__ void indexer_scores_kernel(const float *iq, const float *iw, int IH, int Id, const float *const *entries,
                                      const int *n_vis, int max_vis, float *scores) {
    pdl_enter();
    const int r = blockIdx.y;
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= n_vis[r]) return;
    const float qscale = 1.f / sqrtf((float)Id), wscale = 1.f / sqrtf((float)IH);
    const float *k = entries[r] + (int64_t)s * Id;
    const float *q = iq + (int64_t)r * IH * Id;
    const float *w = iw + (int64_t)r * IH;
    float score = 0;
    for (int h = 0; h < IH; ++h) {
        float d = 0;
        for (int i = 0; i < Id; ++i) d = fmaf(q[(int64_t)h * Id + i], k[i], d);
        score += (d > 0 ? d * qscale : 0.f) * (w[h] * wscale);
    }
    scores[(int64_t)r * max_vis + s] = score;
}

// The same scores with the row's queries staged in shared memory (rows padded by one float
// so lanes reading different heads hit different banks): a warp per entry, each lane a
// few heads over the entry (staged, broadcast), then a shuffle sum over the heads. A warp
// takes `per_warp` entries: 4 when many rows share the launch (the queries are staged once per
// block), 1 for a decode step, whose few rows would otherwise leave most SMs idle.
__global__ void __launch_bounds__(kBlock) indexer_scores_shared_kernel(const float *iq, const float *iw, int IH, int Id,
                                                                       const float *const *entries, const int *n_vis,
                                                                       int max_vis, float *scores, int per_warp) {
    pdl_enter();
    extern __shared__ float sm[];
    float *qs = sm, *es = sm + (size_t)IH * (Id + 1);
    const int r = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n = n_vis[r];
    const int s0 = blockIdx.x * (kBlock / 32) * per_warp;
    if (s0 >= n) return;
    const float *q = iq + (int64_t)r * IH * Id;
    for (int i = threadIdx.x; i < IH * Id; i += blockDim.x) qs[(i / Id) * (Id + 1) + i % Id] = q[i];
    __syncthreads();
    const float qscale = 1.f / sqrtf((float)Id), wscale = 1.f / sqrtf((float)IH);
    const float *w = iw + (int64_t)r * IH;
    float *e = es + (size_t)warp * Id;
    for (int j = 0; j < per_warp; ++j) {
        const int sidx = s0 + warp * per_warp + j;
        if (sidx >= n) break;   // uniform per warp
        const float *k = entries[r] + (int64_t)sidx * Id;
        for (int i = lane; i < Id; i += 32) e[i] = k[i];
        __syncwarp();
        float part = 0;
        for (int h = lane; h < IH; h += 32) {
            const float *qh = qs + (size_t)h * (Id + 1);
            float d = 0;
            for (int i = 0; i < Id; ++i) d = fmaf(qh[i], e[i], d);
            part += (d > 0 ? d * qscale : 0.f) * (w[h] * wscale);
        }
        for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffffu, part, off);
        if (lane == 0) scores[(int64_t)r * max_vis + sidx] = part;
        __syncwarp();
    }
}

// Key k of a row's visible set: its window rows first (oldest first), then its entries.
__device__ __forceinline__ const float *attn_key(const AttnRow &d, int64_t w0, int n_win, int hd, int k) {
    if (k < n_win) return d.kv + ((w0 + k) % d.cap) * hd;
    const int e = k - n_win;
    return d.entries + (int64_t)(d.sel ? d.sel[e] : e) * hd;
}

// Many rows (prefill): the heads share one K=V row per key, so a block takes kAttnHeads heads
// of one row and stages each chunk of kAttnKeys keys in shared memory once for all of them
// (one block per head re-read every key per head). Two passes over the keys, as attend_kernel:
// scores (a thread per (head, key), kept in the scratch rows), then the weights
// exp(s - max) / den applied in key order; dimension d of a head's output is summed by one
// thread, keys in order, as attend_kernel does.
constexpr int kAttnHeads = 16, kAttnKeys = 16, kAttnMaxHd = 512;
__global__ void __launch_bounds__(kBlock) attend_rows_kernel(const float *q, const AttnRow *desc, int H, int hd, int window,
                                                             const float *sinks, float *scratch, int max_keys, float *o) {
    pdl_enter();
    extern __shared__ float4 sm4[];
    const int ldk = hd + 4;   // floats per staged row: 16-byte aligned, rows on different banks
    float *qs = reinterpret_cast<float *>(sm4), *ks = qs + (size_t)kAttnHeads * ldk;
    __shared__ float inv_s[kAttnHeads];
    const int hb = H < kAttnHeads ? H : kAttnHeads;
    const int r = blockIdx.x, h0 = blockIdx.y * hb, t = threadIdx.x;
    const AttnRow d = desc[r];
    const int64_t w0 = d.pos - window + 1 > 0 ? d.pos - window + 1 : 0;
    const int n_win = (int)(d.pos - w0 + 1), n_keys = n_win + (d.entries ? d.n_ent : 0);
    const int h4 = hd / 4;
    for (int i = t; i < hb * h4; i += blockDim.x) {
        const int hh = i / h4, c = i % h4;
        reinterpret_cast<float4 *>(qs + (size_t)hh * ldk)[c] = reinterpret_cast<const float4 *>(q + ((int64_t)r * H + h0 + hh) * hd)[c];
    }
    const float scale = 1.f / sqrtf((float)hd);
    const int hh = t / kAttnKeys, kk = t % kAttnKeys;   // this thread's (head, key) in a chunk
    float mx = hh < hb ? sinks[h0 + hh] : 0.f;
    for (int k0 = 0; k0 < n_keys; k0 += kAttnKeys) {
        __syncthreads();
        for (int i = t; i < kAttnKeys * h4; i += blockDim.x) {
            const int j = i / h4, c = i % h4;
            if (k0 + j < n_keys)
                reinterpret_cast<float4 *>(ks + (size_t)j * ldk)[c] = reinterpret_cast<const float4 *>(attn_key(d, w0, n_win, hd, k0 + j))[c];
        }
        __syncthreads();
        if (hh < hb && k0 + kk < n_keys) {
            const float4 *a = reinterpret_cast<const float4 *>(qs + (size_t)hh * ldk), *b = reinterpret_cast<const float4 *>(ks + (size_t)kk * ldk);
            float sc = 0.f;
            for (int c = 0; c < h4; ++c) {
                const float4 x = a[c], y = b[c];
                sc = fmaf(x.x, y.x, sc), sc = fmaf(x.y, y.y, sc), sc = fmaf(x.z, y.z, sc), sc = fmaf(x.w, y.w, sc);
            }
            sc *= scale;
            scratch[((int64_t)r * H + h0 + hh) * max_keys + k0 + kk] = sc;
            mx = fmaxf(mx, sc);
        }
    }
    // per head: the max, then the sum of exp (in double) over the 16 threads of the head
    for (int off = kAttnKeys / 2; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    double den = 0;
    if (hh < hb) {
        float *lg = scratch + ((int64_t)r * H + h0 + hh) * max_keys;
        for (int k = kk; k < n_keys; k += kAttnKeys) den += lg[k] = expf(lg[k] - mx);
    }
    for (int off = kAttnKeys / 2; off > 0; off >>= 1) den += __shfl_xor_sync(0xffffffffu, den, off);
    if (hh < hb && kk == 0) inv_s[hh] = (float)(1.0 / (den + exp((double)sinks[h0 + hh] - mx)));
    // outputs: thread (head hh, dims kk + 16 i)
    float acc[kAttnMaxHd / kAttnKeys];
#pragma unroll
    for (int i = 0; i < kAttnMaxHd / kAttnKeys; ++i) acc[i] = 0.f;
    const int nd = hd / kAttnKeys;
    for (int k0 = 0; k0 < n_keys; k0 += kAttnKeys) {
        __syncthreads();   // exp-weights written; the previous chunk consumed
        for (int i = t; i < kAttnKeys * h4; i += blockDim.x) {
            const int j = i / h4, c = i % h4;
            if (k0 + j < n_keys)
                reinterpret_cast<float4 *>(ks + (size_t)j * ldk)[c] = reinterpret_cast<const float4 *>(attn_key(d, w0, n_win, hd, k0 + j))[c];
        }
        __syncthreads();
        if (hh < hb) {
            const float *lg = scratch + ((int64_t)r * H + h0 + hh) * max_keys;
            const float inv = inv_s[hh];
            const int nk = n_keys - k0 < kAttnKeys ? n_keys - k0 : kAttnKeys;
            for (int j = 0; j < nk; ++j) {
                const float p = lg[k0 + j] * inv;
                const float *kv = ks + (size_t)j * ldk + kk;
#pragma unroll
                for (int i = 0; i < kAttnMaxHd / kAttnKeys; ++i)
                    if (i < nd) acc[i] = fmaf(p, kv[kAttnKeys * i], acc[i]);
            }
        }
    }
    if (hh < hb) {
        float *ov = o + ((int64_t)r * H + h0 + hh) * hd;
#pragma unroll
        for (int i = 0; i < kAttnMaxHd / kAttnKeys; ++i)
            if (i < nd) ov[kk + kAttnKeys * i] = acc[i];
    }
}

// The same attention on the tensor cores (prefill), in one pass over the keys: per row, the
// 16 heads' scores against a chunk of 16 keys are one m16 x n16 x k(hd) product and the
// chunk's share of the output one m16 x n(hd) x k16 product (the heads share K = V), with the
// softmax kept online (running max m and sum l per head; the output rescaled by exp(m - m')
// when the max rises, divided by l + exp(sink - m) at the end). Each chunk is copied once
// (cp.async, two buffers: the next chunk is in flight while this one is used). TF32
// m16n8k8 with each f32 operand split into a TF32 high part and the TF32 rounding of the rest,
// three products (hi.hi + hi.lo + lo.hi; lo.lo is below f32 rounding): ~21 bits of each
// operand, f32 accumulation and exponent range. The results agree with the f32 kernel to
// about f32 rounding, not bit for bit. Scores: warp w takes the k8 steps w, w + 8, ... and
// the 8 partial sums are added in warp order; output: warp w takes dimensions 8 (w + 8 i)...
// DS4_CUDA_ATTN_F32=1 runs attend_rows_kernel instead.
__device__ __forceinline__ uint32_t to_tf32(float x) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ void split_tf32(float x, uint32_t &hi, uint32_t &lo) {
    hi = to_tf32(x);
    lo = to_tf32(x - __uint_as_float(hi));   // exact: hi is x rounded to 10 fraction bits
}
__device__ __forceinline__ void mma_tf32(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// m16n8k8 fragments (PTX ISA), g = lane / 4, c = lane % 4: A = rows g, g+8 at k c, c+4;
// B = k c, c+4 at column g; C = (row g | g+8, columns 2c, 2c+1).
__device__ __forceinline__ void load_a_split(const float *m, int ld, int k0, int g, int c, uint32_t (&hi)[4], uint32_t (&lo)[4]) {
    split_tf32(m[g * ld + k0 + c], hi[0], lo[0]);
    split_tf32(m[(g + 8) * ld + k0 + c], hi[1], lo[1]);
    split_tf32(m[g * ld + k0 + c + 4], hi[2], lo[2]);
    split_tf32(m[(g + 8) * ld + k0 + c + 4], hi[3], lo[3]);
}
constexpr int kTcKeys = 16, kTcLdp = kTcKeys + 4, kTcLdr = kTcKeys + 1;
// Dynamic shared memory: q rows, two key chunks, the 8 warps' partial scores.
constexpr size_t tc_attn_floats(int hd) { return (size_t)(kAttnHeads + 2 * kTcKeys) * (hd + 4) + 8 * kAttnHeads * kTcLdr; }
__global__ void __launch_bounds__(kBlock, 2) attend_rows_tc_kernel(const float *q, const AttnRow *desc, int H, int hd, int window,
                                                                  const float *sinks, float *o) {
    pdl_enter();
    extern __shared__ float4 sm4[];
    const int ldk = hd + 4;   // rows 4 banks apart: the A and score-B fragment loads are conflict-free
    float *qs = reinterpret_cast<float *>(sm4), *kb = qs + (size_t)kAttnHeads * ldk, *red = kb + (size_t)2 * kTcKeys * ldk;
    __shared__ float ps[kAttnHeads][kTcLdp];   // this chunk's exp(s - m) per (head, key)
    __shared__ float alpha_s[kAttnHeads];      // this chunk's rescale per head; at the end, 1 / denominator
    const int hb = H < kAttnHeads ? H : kAttnHeads;
    const int r = blockIdx.x, h0 = blockIdx.y * hb, t = threadIdx.x, lane = t & 31, warp = t >> 5, g = lane >> 2, c = lane & 3;
    const AttnRow d = desc[r];
    const int64_t w0 = d.pos - window + 1 > 0 ? d.pos - window + 1 : 0;
    const int n_win = (int)(d.pos - w0 + 1), n_keys = n_win + (d.entries ? d.n_ent : 0);
    const int h4 = hd / 4, nks = hd / 8, nc = (n_keys + kTcKeys - 1) / kTcKeys;
    // key rows of chunk ch into buffer ch % 2 (rows past the last key zeroed: their weights are
    // 0 and 0 * garbage may not be)
    auto stage = [&](int ch) {
        float *ks = kb + (size_t)(ch & 1) * kTcKeys * ldk;
        const int k0 = ch * kTcKeys;
        for (int i = t; i < kTcKeys * h4; i += blockDim.x) {
            const int j = i / h4, cc = i % h4;
            float *dst = ks + (size_t)j * ldk + 4 * cc;
            if (k0 + j < n_keys) cp16(dst, attn_key(d, w0, n_win, hd, k0 + j) + 4 * cc, 16);
            else *reinterpret_cast<float4 *>(dst) = make_float4(0.f, 0.f, 0.f, 0.f);
        }
        cp_commit();
    };
    stage(0);
    for (int i = t; i < kAttnHeads * h4; i += blockDim.x) {   // q rows; zeros past the block's heads
        const int hh = i / h4, cc = i % h4;
        reinterpret_cast<float4 *>(qs + (size_t)hh * ldk)[cc] =
            hh < hb ? reinterpret_cast<const float4 *>(q + ((int64_t)r * H + h0 + hh) * hd)[cc] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    const float scale = 1.f / sqrtf((float)hd);
    const int hh = t / kTcKeys, kk = t % kTcKeys;   // the softmax step's (head, key of the chunk)
    float m = hh < hb ? sinks[h0 + hh] : 0.f;       // running max, the sink included (as the two-pass max)
    double l = 0;                                   // running sum of exp(s - m) over the keys
    float oacc[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) oacc[i][j] = 0.f;
    for (int ch = 0; ch < nc; ++ch) {
        if (ch + 1 < nc) stage(ch + 1);
        else cp_commit();
        cp_wait<1>();
        __syncthreads();   // chunk ch (and q) in place
        const float *ks = kb + (size_t)(ch & 1) * kTcKeys * ldk;
        const int k0 = ch * kTcKeys;
        {   // scores: hi.hi, hi.lo, lo.hi in separate accumulators (independent chains)
            float acc[3][2][4];
#pragma unroll
            for (int p = 0; p < 3; ++p)
#pragma unroll
                for (int n = 0; n < 2; ++n)
#pragma unroll
                    for (int i = 0; i < 4; ++i) acc[p][n][i] = 0.f;
            for (int s = warp; s < nks; s += 8) {
                uint32_t ah[4], al[4];
                load_a_split(qs, ldk, 8 * s, g, c, ah, al);
#pragma unroll
                for (int n = 0; n < 2; ++n) {
                    const float *kr = ks + (size_t)(8 * n + g) * ldk + 8 * s + c;
                    uint32_t bh0, bl0, bh1, bl1;
                    split_tf32(kr[0], bh0, bl0);
                    split_tf32(kr[4], bh1, bl1);
                    mma_tf32(acc[0][n], ah, bh0, bh1);
                    mma_tf32(acc[1][n], ah, bl0, bl1);
                    mma_tf32(acc[2][n], al, bh0, bh1);
                }
            }
            float *rw = red + (size_t)warp * kAttnHeads * kTcLdr;
#pragma unroll
            for (int n = 0; n < 2; ++n) {
                float v[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) v[i] = acc[0][n][i] + (acc[1][n][i] + acc[2][n][i]);
                rw[g * kTcLdr + 8 * n + 2 * c] = v[0];
                rw[g * kTcLdr + 8 * n + 2 * c + 1] = v[1];
                rw[(g + 8) * kTcLdr + 8 * n + 2 * c] = v[2];
                rw[(g + 8) * kTcLdr + 8 * n + 2 * c + 1] = v[3];
            }
        }
        __syncthreads();
        {   // online softmax: the 16 threads of a head (half a warp) hold the chunk's 16 keys
            const bool live = hh < hb && k0 + kk < n_keys;
            float sc = -INFINITY;
            if (live) {
                sc = 0.f;
                for (int w = 0; w < 8; ++w) sc += red[((size_t)w * kAttnHeads + hh) * kTcLdr + kk];
                sc *= scale;
            }
            float cm = sc;
            for (int off = kTcKeys / 2; off > 0; off >>= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, off));
            const float mn = fmaxf(m, cm);
            const float p = live ? expf(sc - mn) : 0.f;
            double ls = p;
            for (int off = kTcKeys / 2; off > 0; off >>= 1) ls += __shfl_xor_sync(0xffffffffu, ls, off);
            const float a = expf(m - mn);
            l = l * (double)a + ls;
            m = mn;
            ps[hh][kk] = p;
            if (kk == 0) alpha_s[hh] = a;
        }
        __syncthreads();
        {   // output: rescaled to the new max, then this chunk added
            const float a0 = alpha_s[g], a1 = alpha_s[g + 8];
#pragma unroll
            for (int i = 0; i < 8; ++i) oacc[i][0] *= a0, oacc[i][1] *= a0, oacc[i][2] *= a1, oacc[i][3] *= a1;
#pragma unroll
            for (int s = 0; s < kTcKeys / 8; ++s) {
                uint32_t ah[4], al[4];
                load_a_split(&ps[0][0], kTcLdp, 8 * s, g, c, ah, al);
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const int nt = warp + 8 * i;
                    if (nt >= nks) break;
                    const float *v0 = ks + (size_t)(8 * s + c) * ldk + 8 * nt + g;
                    uint32_t bh0, bl0, bh1, bl1;
                    split_tf32(v0[0], bh0, bl0);
                    split_tf32(v0[4 * ldk], bh1, bl1);
                    mma_tf32(oacc[i], ah, bh0, bh1);
                    mma_tf32(oacc[i], ah, bl0, bl1);
                    mma_tf32(oacc[i], al, bh0, bh1);
                }
            }
        }
        __syncthreads();   // chunk consumed: its buffer, the partial sums, ps and alpha_s are reused
    }
    if (hh < hb && kk == 0) alpha_s[hh] = (float)(1.0 / (l + exp((double)sinks[h0 + hh] - m)));
    __syncthreads();
    const float inv0 = alpha_s[g], inv1 = alpha_s[g + 8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int nt = warp + 8 * i;
        if (nt >= nks) break;
        const int dim = 8 * nt + 2 * c;
        if (g < hb) {
            float *ov = o + ((int64_t)r * H + h0 + g) * hd + dim;
            ov[0] = oacc[i][0] * inv0, ov[1] = oacc[i][1] * inv0;
        }
        if (g + 8 < hb) {
            float *ov = o + ((int64_t)r * H + h0 + g + 8) * hd + dim;
            ov[0] = oacc[i][2] * inv1, ov[1] = oacc[i][3] * inv1;
        }
    }
}

// Few rows (decode): one block per (row, head) walks every key alone, 64 blocks for a token.
// Split the keys instead (flash-decoding): block (row x head, split) takes kSplitKeys keys --
// scores a warp per key, their local max m, sum l of exp(s - m) and the partial output
// sum exp(s - m) v -- and attend_merge_kernel rescales the splits to the common max (the sink
// included) and divides once.
constexpr int kSplitKeys = 32;
// Each split's exp(s - m) is computed once into shared memory (every thread had recomputed
// all 32 per output element) and the key loop is unrolled so the key rows' loads go out
// together; the fma chain per element keeps key order, so the bits are unchanged.
__global__ void __launch_bounds__(kBlock) attend_split_kernel(const float *q, const AttnRow *desc, int H, int hd, int window,
                                                              float *part, int max_splits) {
    pdl_enter();
    __shared__ float p[kSplitKeys], ew[kSplitKeys];
    __shared__ const float *kp[kSplitKeys];
    __shared__ float shf[kBlock / 32];
    const int rh = blockIdx.x, r = rh / H, h = rh % H, sp = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const AttnRow d = desc[r];
    const int64_t w0 = d.pos - window + 1 > 0 ? d.pos - window + 1 : 0;
    const int n_win = (int)(d.pos - w0 + 1), n_keys = n_win + (d.entries ? d.n_ent : 0);
    const int k0 = sp * kSplitKeys, nk = n_keys - k0 < kSplitKeys ? n_keys - k0 : kSplitKeys;
    float *out = part + ((int64_t)rh * max_splits + sp) * (hd + 2);
    if (nk <= 0) {   // past this row's keys: an empty split
        if (threadIdx.x == 0) out[hd] = -INFINITY, out[hd + 1] = 0.f;
        return;
    }
    if (threadIdx.x < nk) kp[threadIdx.x] = attn_key(d, w0, n_win, hd, k0 + threadIdx.x);
    __syncthreads();
    const float *qv = q + ((int64_t)r * H + h) * hd;
    const float scale = 1.f / sqrtf((float)hd);
    float mx = -INFINITY;
    for (int j = warp; j < nk; j += kBlock / 32) {
        const float4 *kv = reinterpret_cast<const float4 *>(kp[j]);
        const float4 *q4 = reinterpret_cast<const float4 *>(qv);
        float sc = 0;
#pragma unroll 4
        for (int i = lane; i < hd / 4; i += 32) {
            const float4 a = q4[i], b = kv[i];
            sc = fmaf(a.x, b.x, sc), sc = fmaf(a.y, b.y, sc), sc = fmaf(a.z, b.z, sc), sc = fmaf(a.w, b.w, sc);
        }
        for (int off = 16; off > 0; off >>= 1) sc += __shfl_xor_sync(0xffffffffu, sc, off);
        sc *= scale;
        if (lane == 0) p[j] = sc;
        mx = fmaxf(mx, sc);
    }
    mx = block_max(mx, shf);   // synchronises: p is complete
    if (threadIdx.x < nk) ew[threadIdx.x] = expf(p[threadIdx.x] - mx);
    __syncthreads();
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float v[kSplitKeys];
#pragma unroll
        for (int j = 0; j < kSplitKeys; ++j) v[j] = j < nk ? kp[j][i] : 0.f;
        float acc = 0.f;
#pragma unroll
        for (int j = 0; j < kSplitKeys; ++j)
            if (j < nk) acc = fmaf(ew[j], v[j], acc);
        out[i] = acc;
    }
    if (threadIdx.x == 0) {
        float l = 0.f;
        for (int j = 0; j < nk; ++j) l += ew[j];
        out[hd] = mx, out[hd + 1] = l;
    }
}

// The splits' factors exp(m_s - m) once into shared memory (kMergeChunk at a time), then each
// output element sums its splits in order with the loads unrolled: same bits as a serial walk.
constexpr int kMergeChunk = 64;
__global__ void __launch_bounds__(kBlock) attend_merge_kernel(const float *part, int H, int hd, const float *sinks, int max_splits,
                                                              float *o) {
    pdl_enter();
    __shared__ float f[kMergeChunk];
    __shared__ double dd[kMergeChunk], den_s;
    const int rh = blockIdx.x, h = rh % H;
    const float *pp = part + (int64_t)rh * max_splits * (hd + 2);
    float mx = sinks[h];
    for (int sp = 0; sp < max_splits; ++sp) mx = fmaxf(mx, pp[(int64_t)sp * (hd + 2) + hd]);
    // den in split order, as a serial walk: thread 0 adds what the others computed
    double den = exp((double)sinks[h] - mx);
    float *ov = o + (int64_t)rh * hd;
    float acc[2] = {0.f, 0.f};   // hd <= 2 * kBlock (checked at launch)
    for (int s0 = 0; s0 < max_splits; s0 += kMergeChunk) {
        const int ns = max_splits - s0 < kMergeChunk ? max_splits - s0 : kMergeChunk;
        __syncthreads();
        if (threadIdx.x < ns) {
            const float *ps = pp + (int64_t)(s0 + threadIdx.x) * (hd + 2);
            const bool live = ps[hd + 1] > 0.f;
            f[threadIdx.x] = live ? expf(ps[hd] - mx) : 0.f;
            dd[threadIdx.x] = live ? (double)ps[hd + 1] * exp((double)ps[hd] - mx) : -1.0;
        }
        __syncthreads();
        if (threadIdx.x == 0)
            for (int j = 0; j < ns; ++j)
                if (dd[j] >= 0.0) den += dd[j];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int i = threadIdx.x + u * kBlock;
            if (i >= hd) continue;
            float a = acc[u];
            int j = 0;
            for (; j + 8 <= ns; j += 8) {
                float v[8];
#pragma unroll
                for (int k = 0; k < 8; ++k) v[k] = pp[(int64_t)(s0 + j + k) * (hd + 2) + i];
#pragma unroll
                for (int k = 0; k < 8; ++k)
                    if (dd[j + k] >= 0.0) a = fmaf(v[k], f[j + k], a);
            }
            for (; j < ns; ++j)
                if (dd[j] >= 0.0) a = fmaf(pp[(int64_t)(s0 + j) * (hd + 2) + i], f[j], a);
            acc[u] = a;
        }
    }
    if (threadIdx.x == 0) den_s = den;
    __syncthreads();
    const float inv = (float)(1.0 / den_s);
#pragma unroll
    for (int u = 0; u < 2; ++u) {
        const int i = threadIdx.x + u * kBlock;
        if (i < hd) ov[i] = acc[u] * inv;
    }
}

// One block per (row, head). Scores: a warp per key, lanes across the head dimension with
// 16-byte loads (coalesced rows; hd a multiple of 4), a shuffle sum. Output: threads across
// the dimension, keys in order.
__global__ void __launch_bounds__(kBlock) attend_kernel(const float *q, const AttnRow *desc, int H, int hd, int window,
                                                        const float *sinks, float *scratch, int max_keys, float *o) {
    pdl_enter();
    __shared__ float shf[kBlock / 32];
    __shared__ double shd[kBlock / 32];
    const int r = blockIdx.x / H, h = blockIdx.x % H, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const AttnRow d = desc[r];
    const float *qv = q + ((int64_t)r * H + h) * hd;
    const int64_t w0 = d.pos - window + 1 > 0 ? d.pos - window + 1 : 0;
    const int n_win = (int)(d.pos - w0 + 1), n_keys = n_win + (d.entries ? d.n_ent : 0);
    float *lg = scratch + (int64_t)blockIdx.x * max_keys;
    const float scale = 1.f / sqrtf((float)hd);
    auto key = [&](int k) { return attn_key(d, w0, n_win, hd, k); };
    float mx = sinks[h];
    for (int k = warp; k < n_keys; k += kBlock / 32) {
        const float4 *kv = reinterpret_cast<const float4 *>(key(k));
        const float4 *q4 = reinterpret_cast<const float4 *>(qv);
        float s = 0;
        for (int i = lane; i < hd / 4; i += 32) {
            const float4 a = q4[i], b = kv[i];
            s = fmaf(a.x, b.x, s), s = fmaf(a.y, b.y, s), s = fmaf(a.z, b.z, s), s = fmaf(a.w, b.w, s);
        }
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        s *= scale;
        if (lane == 0) lg[k] = s;
        mx = fmaxf(mx, s);
    }
    mx = block_max(mx, shf);
    double den = 0;
    for (int k = threadIdx.x; k < n_keys; k += blockDim.x) den += lg[k] = expf(lg[k] - mx);
    den = block_sum(den, shd) + exp((double)sinks[h] - mx);
    const float inv = (float)(1.0 / den);
    __syncthreads();
    float *ov = o + ((int64_t)r * H + h) * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float acc = 0;
        for (int k = 0; k < n_keys; ++k) acc = fmaf(lg[k] * inv, key(k)[i], acc);
        ov[i] = acc;
    }
}

// Better candidate for the router's argmax: higher value, lower expert on ties; -1 = none.
__device__ __forceinline__ bool route_better(float v, int e, float bv, int be) {
    return be < 0 || (e >= 0 && (v > bv || (v == bv && e < be)));
}

// One block per row: scores in shared memory, K rounds of a block-wide argmax.
__global__ void __launch_bounds__(kBlock) route_rows_kernel(const float *logits, int E, int K, const int32_t *tid2eid,
                                                            const int32_t *tokens, const float *bias, float scale, int *ids,
                                                            float *wts) {
    pdl_enter();
    extern __shared__ float s[];   // [E] scores, then [E] taken flags
    float *taken = s + E;
    __shared__ float wv[kBlock / 32];
    __shared__ int we[kBlock / 32];
    __shared__ int pick[64];
    const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float *lg = logits + (int64_t)t * E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const float x = lg[e];
        s[e] = sqrtf(x > 20.f ? x : log1pf(expf(x)));
        taken[e] = 0.f;
    }
    __syncthreads();
    if (tid2eid) {
        if (threadIdx.x < K) pick[threadIdx.x] = tid2eid[(int64_t)tokens[t] * K + threadIdx.x];
    } else {
        // K rounds of argmax over score + bias (ties: lower expert), excluding earlier picks.
        for (int k = 0; k < K; ++k) {
            float bv = 0.f;
            int be = -1;
            for (int e = threadIdx.x; e < E; e += blockDim.x) {
                if (taken[e] != 0.f) continue;
                const float v = s[e] + bias[e];
                if (route_better(v, e, bv, be)) bv = v, be = e;
            }
            for (int off = 16; off > 0; off >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
                const int oe = __shfl_xor_sync(0xffffffffu, be, off);
                if (route_better(ov, oe, bv, be)) bv = ov, be = oe;
            }
            if (lane == 0) wv[warp] = bv, we[warp] = be;
            __syncthreads();
            if (threadIdx.x == 0) {
                float b = wv[0];
                int e0 = we[0];
                for (int w = 1; w < (int)(blockDim.x >> 5); ++w)
                    if (route_better(wv[w], we[w], b, e0)) b = wv[w], e0 = we[w];
                pick[k] = e0;
                if (e0 >= 0) taken[e0] = 1.f;
            }
            __syncthreads();
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        // an id outside [0, E) (a damaged hash table) is caught by the caller; it weighs 0 here
        double sum = 0;
        for (int k = 0; k < K; ++k) sum += (pick[k] >= 0 && pick[k] < E) ? s[pick[k]] : 0.f;
        for (int k = 0; k < K; ++k) {
            const bool ok = pick[k] >= 0 && pick[k] < E;
            ids[(int64_t)t * K + k] = pick[k];
            wts[(int64_t)t * K + k] = ok ? (float)(s[pick[k]] / (sum + 1e-20) * scale) : 0.f;
        }
    }
}

__global__ void gather_kernel(const float *src, int width, const int *idx, float *dst) {
    pdl_enter();
    const int r = blockIdx.x;
    for (int i = threadIdx.x; i < width; i += blockDim.x) dst[(int64_t)r * width + i] = src[(int64_t)idx[r] * width + i];
}

// silu(min(g, lim)) * clamp(u, -lim, lim): one expression for both kernels below, so the
// fused one's values are swiglu_kernel's bit for bit.
__device__ __forceinline__ float swiglu_clamped(float g, float u, float lim) {
    const float a = fminf(g, lim), b = fminf(fmaxf(u, -lim), lim);
    return a / (1.f + expf(-a)) * b;
}

__global__ void swiglu_kernel(float *g, const float *u, int64_t n, float lim) {
    pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    g[i] = swiglu_clamped(g[i], u[i], lim);
}

// swiglu_kernel over rows of F, each row then quantised as quantize_kernel does (the
// shared expert's hidden row goes to its down product next).
template <int QK>
__global__ void __launch_bounds__(128) swiglu_quant_kernel(float *g, const float *u, int64_t F, float lim, uint8_t *q,
                                                           uint64_t qrow) {
    pdl_enter();
    const int lane = threadIdx.x & 31;
    const int64_t c = ((int64_t)blockIdx.x * 4 + (threadIdx.x >> 5)) * 32 + lane, t = blockIdx.y;
    const bool in = 8 * c < F;
    float *gr = g + t * F + 8 * c;
    const float *ur = u + t * F + 8 * c;
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        v[i] = in ? swiglu_clamped(gr[i], ur[i], lim) : 0.f;
        if (in) gr[i] = v[i];
    }
    quantize_chunk<QK>(v, in, lane, c, F, q + t * qrow);
}

// norm_rope_kernel without the norm (the attention output's inverse rope) for head h of row r,
// then the head's elements quantised into row r of q as quantize_kernel quantises the whole row
// (a head is a whole number of quantisation blocks).
template <int QK>
__global__ void __launch_bounds__(128) rope_quant_kernel(float *x, int n_heads, int hd, const int64_t *pos, const float *inv_freq,
                                                         int n_pairs, float sign, uint8_t *q, uint64_t qrow) {
    pdl_enter();
    const int r = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
    float *v = x + ((int64_t)r * n_heads + h) * hd;
    float *rp = v + hd - 2 * n_pairs;
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) rope_pair(rp, i, inv_freq, pos[r], sign);
    __syncthreads();
    const int lane = threadIdx.x & 31, chunks = hd / 8;
    for (int c0 = 0; c0 < chunks; c0 += blockDim.x) {   // uniform: every lane of a warp quantises
        const int c = c0 + threadIdx.x;
        const bool in = c < chunks;
        float e[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) e[i] = in ? v[8 * c + i] : 0.f;
        quantize_chunk<QK>(e, in, lane, (int64_t)h * chunks + c, (int64_t)n_heads * hd, q + (int64_t)r * qrow);
    }
}

__global__ void scatter_add_kernel(const float *src, int width, const int *idx, const float *w, float *dst) {
    pdl_enter();
    const int r = blockIdx.x;
    for (int i = threadIdx.x; i < width; i += blockDim.x) dst[(int64_t)idx[r] * width + i] += w[r] * src[(int64_t)r * width + i];
}

__global__ void add_kernel(float *y, const float *x, int64_t n) {
    pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

__global__ void hyper_head_kernel(const float *H, const int32_t *idx, const float *mix, const float *base, const float *scale,
                                  int hc, int D, float hc_eps, const float *norm_w, float rms_eps, float *y) {
    pdl_enter();
    __shared__ double sh[kBlock / 32];
    const int r = blockIdx.x;
    const float *h = H + (int64_t)idx[r] * hc * D;
    float *yr = y + (int64_t)r * D;
    // The stream loads of four columns go out together; each column's sum and the running
    // norm keep the plain loop's order (same bits).
    float pre[16];
    for (int k = 0; k < hc; ++k) pre[k] = sigmoidf(mix[r * hc + k] * scale[0] + base[k]) + hc_eps;
    double ss = 0;
    const int B = blockDim.x;
    int d = threadIdx.x;
    for (; d + 3 * B < D; d += 4 * B) {
        float v[4] = {0.f, 0.f, 0.f, 0.f};
        for (int k = 0; k < hc; ++k) {
            float hv[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) hv[u] = h[(int64_t)k * D + d + u * B];
#pragma unroll
            for (int u = 0; u < 4; ++u) v[u] += pre[k] * hv[u];
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) yr[d + u * B] = v[u], ss += (double)v[u] * v[u];
    }
    for (; d < D; d += B) {
        float v = 0;
        for (int k = 0; k < hc; ++k) v += pre[k] * h[(int64_t)k * D + d];
        yr[d] = v;
        ss += (double)v * v;
    }
    ss = block_sum(ss, sh);
    const float inv = (float)(1.0 / sqrt(ss / (double)D + (double)rms_eps));
    for (int d = threadIdx.x; d < D; d += blockDim.x) yr[d] = yr[d] * inv * norm_w[d];
}

unsigned blocks_for(int64_t n, int per) { return (unsigned)((n + per - 1) / per); }

}  // namespace

void rmsnorm_rows(cudaStream_t s, const float *x, int64_t xs, const int32_t *idx, int64_t n, const float *w, float eps,
                  float *out, int64_t os, int rows) {
    if (rows <= 0) return;
    launch_pdl(rmsnorm_kernel, rows, kBlock, 0, s, x, xs, idx, n, w, eps, out, os);
    DS4_CUDA_LAUNCHED();
}

void rmsnorm_quant_rows(cudaStream_t s, const float *x, int64_t xs, int64_t n, const float *w, float eps, float *out, int64_t os,
                        uint8_t *q0, uint64_t q0row, uint8_t *qk, uint64_t qkrow, int rows) {
    if (rows <= 0) return;
    if (n % 8 || (q0 && n % 32) || (qk && n % 256)) failf("rmsnorm_quant_rows: rows of %lld elements do not quantise", (long long)n);
    launch_pdl(rmsnorm_quant_kernel, rows, kBlock, 0, s, x, xs, n, w, eps, out, os, q0, q0row, qk, qkrow);
    DS4_CUDA_LAUNCHED();
}

void hc_pre_mix(cudaStream_t s, const float *mix, const float *base, const float *scale, const float *H, int hc, int D,
                int iters, float eps, float *post, float *comb, float *X, int rows) {
    if (hc > 16) fail("CUDA backend: more than 16 hyper-connection streams");
    if (rows <= 0) return;
    // blocks of 256 split D (two elements a thread); hc * hc <= 256 fits the general Sinkhorn
    launch_pdl(hc_pre_kernel, dim3((unsigned)rows, (unsigned)blocks_for(D, 2 * kBlock)), kBlock, 0, s, mix, base, scale, H, hc, D, iters,
                                                                                               eps, post, comb, X);
    DS4_CUDA_LAUNCHED();
}

void hc_post_moe(cudaStream_t s, float *H, const float *y, int P, const MoeGroups &g, const float *shared, const float *post,
                 const float *comb, int hc, int D, int rows) {
    if (rows <= 0) return;
    launch_pdl(hc_post_moe_kernel, dim3(blocks_for(D, kBlock), rows), kBlock, 0, s, H, y, P, g, shared, post, comb, hc, D);
    DS4_CUDA_LAUNCHED();
}

void hc_post(cudaStream_t s, float *H, const float *A, const float *post, const float *comb, int hc, int D, int rows) {
    if (rows <= 0) return;
    launch_pdl(hc_post_kernel, dim3(blocks_for(D, kBlock), rows), kBlock, 0, s, H, A, post, comb, hc, D);
    DS4_CUDA_LAUNCHED();
}

void norm_rope_heads(cudaStream_t s, float *x, int n_heads, int hd, bool norm, const float *w, float eps, const int64_t *pos,
                     const float *inv_freq, int n_pairs, float sign, int rows) {
    if (rows <= 0) return;
    launch_pdl(norm_rope_kernel, rows * n_heads, 128, 0, s, x, n_heads, hd, norm, w, eps, pos, inv_freq, n_pairs, sign,
               KvHead{nullptr, nullptr, nullptr, 0});
    DS4_CUDA_LAUNCHED();
}

void norm_rope_q_kv(cudaStream_t s, float *q, int n_heads, float *kv, const float *kv_w, float *const *kv_dst, int hd, float eps,
                    const int64_t *pos, const float *inv_freq, int n_pairs, int rows) {
    if (rows <= 0) return;
    launch_pdl(norm_rope_kernel, rows * (n_heads + 1), 128, 0, s, q, n_heads, hd, true, (const float *)nullptr, eps, pos, inv_freq,
               n_pairs, 1.f, KvHead{kv, kv_w, kv_dst, rows});
    DS4_CUDA_LAUNCHED();
}

void comp_ring_write(cudaStream_t s, const float *p_kv, const float *p_gate, int row0, const float *ape, int width, int ratio,
                     int64_t n0, int n, float *kv_ring, float *gate_ring, int cap) {
    if (n <= 0) return;
    launch_pdl(comp_ring_kernel, n, 128, 0, s, p_kv, p_gate, row0, ape, width, ratio, n0, kv_ring, gate_ring, cap);
    DS4_CUDA_LAUNCHED();
}

void comp_emit(cudaStream_t s, const float *kv_ring, const float *gate_ring, int cap, int width, int dim, int ratio,
               bool overlap, int first, int last, float *entries, const float *norm_w, float eps, const float *inv_freq,
               int n_pairs) {
    if (last <= first) return;
    launch_pdl(comp_emit_kernel, last - first, 128, 0, s, kv_ring, gate_ring, cap, width, dim, ratio, overlap, first, entries, norm_w,
                                                  eps, inv_freq, n_pairs);
    DS4_CUDA_LAUNCHED();
}

void indexer_scores(cudaStream_t s, const float *iq, const float *iw, int IH, int Id, const float *const *entries,
                    const int *n_vis, int max_vis, float *scores, int rows) {
    if (rows <= 0 || max_vis <= 0) return;
    const size_t shm = sizeof(float) * ((size_t)IH * (Id + 1) + (size_t)(kBlock / 32) * Id);
    if (shm <= 48 * 1024) {
        const int per_warp = rows <= 4 ? 1 : 4, per_block = (kBlock / 32) * per_warp;
        launch_pdl(indexer_scores_shared_kernel, dim3((unsigned)((max_vis + per_block - 1) / per_block), rows), kBlock, shm, s, 
            iq, iw, IH, Id, entries, n_vis, max_vis, scores, per_warp);
    } else {
        launch_pdl(indexer_scores_kernel, dim3(blocks_for(max_vis, 128), rows), 128, 0, s, iq, iw, IH, Id, entries, n_vis, max_vis, scores);
    }
    DS4_CUDA_LAUNCHED();
}

namespace {

// Which attention kernel attend() runs for a shape: one decision, shared with the scratch
// sizing, so scratch is never short and the tensor-core path (which keeps its scores in
// shared memory) reserves none.
enum class AttnKernel { TensorCore, Rows, Split, Plain };

AttnKernel attn_kernel(int rows, int H, int hd, int max_keys) {
    const int hb = std::min(H, kAttnHeads);
    static const bool alu = [] {
        const char *e = std::getenv("DS4_CUDA_ATTN_F32");
        return e && *e && *e != '0';
    }();
    if (!alu && rows >= 16 && H % hb == 0 && hd % 8 == 0 && hd <= kAttnMaxHd) return AttnKernel::TensorCore;
    if (rows >= 16 && H % hb == 0 && hd % kAttnKeys == 0 && hd <= kAttnMaxHd) return AttnKernel::Rows;
    const int splits = (max_keys + kSplitKeys - 1) / kSplitKeys;
    if (splits > 1 && hd <= 2 * kBlock) return AttnKernel::Split;
    return AttnKernel::Plain;
}

}  // namespace

size_t attend_scratch_floats(int rows, int H, int hd, int max_keys) {
    const size_t rh = (size_t)rows * H;
    switch (attn_kernel(rows, H, hd, max_keys)) {
        case AttnKernel::TensorCore: return 0;
        case AttnKernel::Split: return rh * (size_t)((max_keys + kSplitKeys - 1) / kSplitKeys) * (size_t)(hd + 2);
        case AttnKernel::Rows:
        case AttnKernel::Plain: break;
    }
    return rh * (size_t)max_keys;   // a score per (row, head, key)
}

void attend(cudaStream_t s, const float *q, const AttnRow *desc, int H, int hd, int window, const float *sinks, float *scratch,
            int max_keys, float *o, int rows) {
    if (rows <= 0) return;
    if (hd % 4) failf("CUDA backend: attention needs a head dimension that is a multiple of 4 (%d)", hd);
    const int hb = std::min(H, kAttnHeads);
    switch (attn_kernel(rows, H, hd, max_keys)) {
        case AttnKernel::TensorCore: {
            const size_t shm = sizeof(float) * tc_attn_floats(hd);
            static const cudaError_t opted = cudaFuncSetAttribute(attend_rows_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                                  (int)(sizeof(float) * tc_attn_floats(kAttnMaxHd)));
            DS4_CUDA_CHECK(opted);
            launch_pdl(attend_rows_tc_kernel, dim3((unsigned)rows, (unsigned)(H / hb)), kBlock, shm, s, q, desc, H, hd, window, sinks, o);
            break;
        }
        case AttnKernel::Rows: {
            const size_t shm = sizeof(float) * (size_t)(kAttnHeads + kAttnKeys) * (hd + 4);
            // the kernel's dynamic shared memory limit, raised once (thread-safe static) to the most it asks
            static const cudaError_t opted = cudaFuncSetAttribute(attend_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                                  (int)(sizeof(float) * (kAttnHeads + kAttnKeys) * (kAttnMaxHd + 4)));
            DS4_CUDA_CHECK(opted);
            launch_pdl(attend_rows_kernel, dim3((unsigned)rows, (unsigned)(H / hb)), kBlock, shm, s, q, desc, H, hd, window, sinks,
                       scratch, max_keys, o);
            break;
        }
        case AttnKernel::Split: {
            const int splits = (max_keys + kSplitKeys - 1) / kSplitKeys;
            launch_pdl(attend_split_kernel, dim3((unsigned)(rows * H), (unsigned)splits), kBlock, 0, s, q, desc, H, hd, window, scratch,
                       splits);
            DS4_CUDA_LAUNCHED();
            launch_pdl(attend_merge_kernel, rows * H, kBlock, 0, s, scratch, H, hd, sinks, splits, o);
            break;
        }
        case AttnKernel::Plain:
            launch_pdl(attend_kernel, rows * H, kBlock, 0, s, q, desc, H, hd, window, sinks, scratch, max_keys, o);
            break;
    }
    DS4_CUDA_LAUNCHED();
}

void route(cudaStream_t s, const float *logits, int E, int K, const int32_t *tid2eid, const int32_t *tokens, const float *bias,
           float scale, int *ids, float *wts, int rows) {
    if (rows <= 0) return;
    if (K > 64 || E > 4096) failf("CUDA backend: routing %d of %d experts is beyond the router kernel", K, E);
    launch_pdl(route_rows_kernel, rows, kBlock, sizeof(float) * 2 * (size_t)E, s, logits, E, K, tid2eid, tokens, bias, scale, ids, wts);
    DS4_CUDA_LAUNCHED();
}

void gather_rows(cudaStream_t s, const float *src, int width, const int *idx, float *dst, int rows) {
    if (rows <= 0) return;
    launch_pdl(gather_kernel, rows, 128, 0, s, src, width, idx, dst);
    DS4_CUDA_LAUNCHED();
}

void swiglu(cudaStream_t s, float *g, const float *u, int64_t n, float lim) {
    if (n <= 0) return;
    launch_pdl(swiglu_kernel, blocks_for(n, kBlock), kBlock, 0, s, g, u, n, lim);
    DS4_CUDA_LAUNCHED();
}

void swiglu_quant(cudaStream_t s, int qk, float *g, const float *u, int64_t F, float lim, uint8_t *q, uint64_t qrow, int rows) {
    if (rows <= 0) return;
    if ((qk != 32 && qk != 256) || F % qk) failf("swiglu_quant: rows of %lld do not quantise in blocks of %d", (long long)F, qk);
    const dim3 grid((unsigned)((F + 1023) / 1024), (unsigned)rows);
    if (qk == 32) launch_pdl(swiglu_quant_kernel<32>, grid, 128, 0, s, g, u, F, lim, q, qrow);
    else launch_pdl(swiglu_quant_kernel<256>, grid, 128, 0, s, g, u, F, lim, q, qrow);
    DS4_CUDA_LAUNCHED();
}

void rope_heads_quant(cudaStream_t s, int qk, float *x, int n_heads, int hd, const int64_t *pos, const float *inv_freq, int n_pairs,
                      float sign, uint8_t *q, uint64_t qrow, int rows) {
    if (rows <= 0) return;
    if ((qk != 32 && qk != 256) || hd % qk) failf("rope_heads_quant: heads of %d do not quantise in blocks of %d", hd, qk);
    if (qk == 32) launch_pdl(rope_quant_kernel<32>, rows * n_heads, 128, 0, s, x, n_heads, hd, pos, inv_freq, n_pairs, sign, q, qrow);
    else launch_pdl(rope_quant_kernel<256>, rows * n_heads, 128, 0, s, x, n_heads, hd, pos, inv_freq, n_pairs, sign, q, qrow);
    DS4_CUDA_LAUNCHED();
}

void scatter_add_rows(cudaStream_t s, const float *src, int width, const int *idx, const float *w, float *dst, int rows) {
    if (rows <= 0) return;
    launch_pdl(scatter_add_kernel, rows, 128, 0, s, src, width, idx, w, dst);
    DS4_CUDA_LAUNCHED();
}

void add(cudaStream_t s, float *y, const float *x, int64_t n) {
    if (n <= 0) return;
    launch_pdl(add_kernel, blocks_for(n, kBlock), kBlock, 0, s, y, x, n);
    DS4_CUDA_LAUNCHED();
}

void hyper_head(cudaStream_t s, const float *H, const int32_t *idx, const float *mix, const float *base, const float *scale,
                int hc, int D, float hc_eps, const float *norm_w, float rms_eps, float *y, int rows) {
    if (hc > 16) fail("CUDA backend: more than 16 hyper-connection streams");
    if (rows <= 0) return;
    launch_pdl(hyper_head_kernel, rows, kBlock, 0, s, H, idx, mix, base, scale, hc, D, hc_eps, norm_w, rms_eps, y);
    DS4_CUDA_LAUNCHED();
}

}  // namespace ds4::cuda
