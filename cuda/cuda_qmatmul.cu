// Integer products for block-quantised weights, matching the CPU engine (engine/quant): the
// activation rows are quantised once per input -- Q8_0 blocks of 32 for Q8_0 weights, Q8_K
// blocks of 256 with per-16 sums for Q2_K / Q4_K / IQ2_XXS -- with the CPU quantiser's exact
// arithmetic (same scale, same reciprocal, same rounding rule, same non-finite handling), so
// the int8 values and scales are bit-identical; the dots are then int8 x int8 dp4a with int32
// sums per sub-block, scaled like the CPU kernels. Only the order of the float sums differs.
//
// Layout of one quantised activation row (act_row_bytes): int8 q[n], float d[n / qk]
// (Q8_0: the f16 scale widened), int16 bsums[n / 16] (Q8_K only), padded to 16 bytes.
//
// The dot kernel: a warp per output row, each lane 8 consecutive elements per step (always
// inside one sub-block of any format, so one sub-scale), the warp covering 256 contiguous
// elements per step (coalesced weight reads); the weight chunk is decoded once into two
// int8x4 words for a tile of up to 8 tokens (grid.y walks the tiles; a one-token product
// is compiled apart, with a tile of 1).
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/cuda_check.h"
#include "cuda/cuda_launch.cuh"
#include "cuda/cuda_kernels.h"
#include "cuda/cuda_qblocks.cuh"
#include "cuda/cuda_quant_act.cuh"
#include "engine/common/error.h"
#include "engine/quant/blocks.h"
#include "engine/quant/iq2xxs_tables.h"

namespace ds4::cuda {

uint64_t *g_grid_addr = nullptr;   // g_iq2xxs_grid's device address, set once by init_qmatmul_tables

namespace {

using gguf::Type;

// ---------------------------------------------------------------------------------------
// Activation quantisation. Lane l of a warp holds elements [8l, 8l + 8) of a 256-element
// span; a block is QK / 8 lanes, whose amax is a shuffle max (exact in any order).

template <int QK>
__global__ void __launch_bounds__(128) quantize_kernel(const float *__restrict__ x, int64_t xs, int64_t n,
                                                       uint8_t *__restrict__ q, uint64_t qrow) {
    pdl_enter();
    const int lane = threadIdx.x & 31;
    const int64_t c = ((int64_t)blockIdx.x * 4 + (threadIdx.x >> 5)) * 32 + lane;   // chunk of 8
    const bool in = 8 * c < n;   // n is a multiple of QK, so a block's lanes agree
    const int64_t t = blockIdx.y;
    const float *xr = x + t * xs + 8 * c;
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = in ? xr[i] : 0.f;
    quantize_chunk<QK>(v, in, lane, c, n, q + t * qrow);
}

constexpr int kWarps = 4;

// NT: tokens per tile (1 for decode, so the registers of a bigger tile do not cut occupancy).
// SG: one-token rows staged through shared memory (staged_rows_dot; same bits), the first
// piece of the row copied before waiting on the kernel before (weights never change: the
// copy overlaps that kernel's tail); NB: 2 staging buffers a warp for rows of several pieces.
template <int T, int NT, bool SG = false, int NB = 1>
__global__ void __launch_bounds__(32 * kWarps, SG ? 8 : NT == 1 ? 6 : 4) qmatmul_kernel(const uint8_t *__restrict__ w, int64_t in, int64_t out,
                                                              uint64_t row_bytes, const uint8_t *__restrict__ xq,
                                                              uint64_t qrow, int64_t n_tok, float *__restrict__ y,
                                                              int64_t y_stride, const uint64_t *__restrict__ grid_g,
                                                              XGroups xg) {
    using F = Fmt<T>;
    const int lane = threadIdx.x & 31;
    const int64_t o = (int64_t)blockIdx.x * kWarps + (threadIdx.x >> 5);
    const uint8_t *row = w + (uint64_t)o * row_bytes;
    __shared__ __align__(16) uint8_t stage_s[SG ? kWarps : 1][SG ? NB * Stage<T>::kBytes : 16];
    if constexpr (SG) {
        const uint8_t *rows[1] = {row};
        if (o < out) stage_piece<T, 1>(rows, stage_s[threadIdx.x >> 5], in, 0, lane);
    } else if (NT == 1 && o < out) {
        prefetch_l2(row, row_bytes, lane, 32);
    }
    pdl_enter();
    __shared__ uint64_t grid_s[T == 16 ? 256 : 1];
    stage_grid<T>(grid_s, grid_g);
    if (o >= out) return;
    const int64_t t0 = (int64_t)blockIdx.y * NT;
    const int nt = (int)(n_tok - t0 < NT ? n_tok - t0 : NT);
    const uint8_t *xt = xq + (uint64_t)t0 * qrow;
    const int64_t nblk = xg.xn / F::kQK, cg = (o / xg.opg) * xg.gchunks;
    if constexpr (SG) {
        const uint8_t *rows[1] = {row};
        float a[1] = {0.f}, am[1] = {0.f};
        staged_rows_dot<T, 1, NB>(rows, stage_s[threadIdx.x >> 5], in, xq, xg.xn, cg, grid_s, lane, a, am, true);
        const float v = warp_dot_total<T>(a[0], am[0]);
        if (lane == 0) y[o] = v;
    } else {
        float acc[NT], accm[NT];
    #pragma unroll
        for (int t = 0; t < NT; ++t) acc[t] = accm[t] = 0.f;
        const int64_t chunks = in >> 3;
    #pragma unroll(NT == 1 ? 4 : 2)
        for (int64_t c = lane; c < chunks; c += 32) {
            const Chunk k = load_dot<T>(row, c, grid_s);
            const int64_t xc = c + cg, blk = xc / (F::kQK / 8);
    #pragma unroll
            for (int t = 0; t < NT; ++t) {
                if (t < nt) {
                    chunk_dot<T>(k, xt + (uint64_t)t * qrow, xg.xn, nblk, xc, blk, acc[t], accm[t]);
                }
            }
        }
    #pragma unroll
        for (int t = 0; t < NT; ++t) {
            const float v = warp_dot_total<T>(acc[t], accm[t]);
            if (lane == 0 && t < nt) y[(t0 + t) * y_stride + o] = v;
        }
    }
}

__device__ uint64_t g_iq2xxs_grid[256];

// Two products of one quantised token with the same input width in one launch (a decode
// step's q_a and kv): blocks [0, b0) take the first matrix, the rest the second. Each row is
// computed as qmatmul_kernel's one-token path computes it, so the bits are the same.
struct QPair {
    const uint8_t *w[2];
    int64_t out[2];
    uint64_t rb[2];
    float *y[2];
    unsigned b0;
};
template <int T, bool SG, int NB = 1>
__global__ void __launch_bounds__(32 * kWarps, SG ? 8 : 6) qmatmul_pair_kernel(QPair p, int64_t in, const uint8_t *__restrict__ xq,
                                                                                const uint64_t *__restrict__ grid_g) {
    using F = Fmt<T>;
    const int lane = threadIdx.x & 31, m = blockIdx.x >= p.b0;
    // selects, not p.w[m]: a kernel parameter indexed at run time goes through local memory
    const int64_t o = (int64_t)(blockIdx.x - (m ? p.b0 : 0)) * kWarps + (threadIdx.x >> 5);
    const bool live = o < (m ? p.out[1] : p.out[0]);
    const uint8_t *row = (m ? p.w[1] : p.w[0]) + (uint64_t)o * (m ? p.rb[1] : p.rb[0]);
    __shared__ __align__(16) uint8_t stage_s[SG ? kWarps : 1][SG ? NB * Stage<T>::kBytes : 16];
    if constexpr (SG) {   // as qmatmul_kernel: the first piece before waiting
        const uint8_t *rows[1] = {row};
        if (live) stage_piece<T, 1>(rows, stage_s[threadIdx.x >> 5], in, 0, lane);
    } else if (live) {
        prefetch_l2(row, m ? p.rb[1] : p.rb[0], lane, 32);
    }
    pdl_enter();
    __shared__ uint64_t grid_s[T == 16 ? 256 : 1];
    stage_grid<T>(grid_s, grid_g);
    if (!live) return;
    float *y = m ? p.y[1] : p.y[0];
    float v;
    if constexpr (SG) {
        const uint8_t *rows[1] = {row};
        float a[1] = {0.f}, am[1] = {0.f};
        staged_rows_dot<T, 1, NB>(rows, stage_s[threadIdx.x >> 5], in, xq, in, 0, grid_s, lane, a, am, true);
        v = warp_dot_total<T>(a[0], am[0]);
    } else {
        const int64_t nblk = in / F::kQK, chunks = in >> 3;
        float acc = 0.f, accm = 0.f;
#pragma unroll 4
        for (int64_t c = lane; c < chunks; c += 32) {
            const Chunk k = load_dot<T>(row, c, grid_s);
            chunk_dot<T>(k, xq, in, nblk, c, c / (F::kQK / 8), acc, accm);
        }
        v = warp_dot_total<T>(acc, accm);
    }
    if (lane == 0) y[o] = v;
}



template <int T>
void launch(cudaStream_t s, const uint8_t *w, int64_t in, int64_t out, uint64_t rb, const uint8_t *xq, uint64_t qrow,
            int64_t n_tok, float *y, int64_t ys, XGroups xg) {
    if ((uintptr_t)w % Fmt<T>::kAlign || rb % Fmt<T>::kAlign)
        failf("CUDA backend: %s weights at a misaligned address or row size", gguf::type_name(Type(T)));
    if (T == 16 && !g_grid_addr) fail("CUDA backend: init_qmatmul_tables was not called");
    const unsigned rows = (unsigned)((out + kWarps - 1) / kWarps);
    if (n_tok == 1 && stageable(w, rb) && stage_rows(in) && in > Stage<T>::kElems)
        launch_pdl(qmatmul_kernel<T, 1, true, 2>, dim3(rows, 1), 32 * kWarps, 0, s, w, in, out, rb, xq, qrow, n_tok, y, ys, g_grid_addr, xg);
    else if (n_tok == 1 && stageable(w, rb) && stage_rows(in))
        launch_pdl(qmatmul_kernel<T, 1, true>, dim3(rows, 1), 32 * kWarps, 0, s, w, in, out, rb, xq, qrow, n_tok, y, ys, g_grid_addr, xg);
    else if (n_tok == 1)
        launch_pdl(qmatmul_kernel<T, 1>, dim3(rows, 1), 32 * kWarps, 0, s, w, in, out, rb, xq, qrow, n_tok, y, ys, g_grid_addr, xg);
    else launch_pdl(qmatmul_kernel<T, 8>, dim3(rows, (unsigned)((n_tok + 7) / 8)), 32 * kWarps, 0, s, w, in, out, rb, xq, qrow, n_tok, y, ys, g_grid_addr, xg);
    DS4_CUDA_LAUNCHED();
}

__global__ void gather_bytes_kernel(const uint4 *__restrict__ src, uint64_t row16, const int *__restrict__ idx,
                                    uint4 *__restrict__ dst) {
    pdl_enter();
    const int r = blockIdx.x;
    const uint4 *s = src + (uint64_t)idx[r] * row16;
    uint4 *d = dst + (uint64_t)r * row16;
    for (uint64_t i = threadIdx.x; i < row16; i += blockDim.x) d[i] = s[i];
}

}  // namespace

// Staging pays where a lane has more than one round of chunk loads: rows of 1024 elements
// (4 chunks a lane) ran slower staged, 2048 and up faster (ncu and decode tok/s, H200).
bool stage_rows(int64_t in) { return in >= 2048; }

void init_qmatmul_tables() {
    DS4_CUDA_CHECK(cudaMemcpyToSymbol(g_iq2xxs_grid, quant::kIq2xxsGrid, sizeof(quant::kIq2xxsGrid)));
    DS4_CUDA_CHECK(cudaGetSymbolAddress((void **)&g_grid_addr, g_iq2xxs_grid));
}

Type act_type(Type weight) {
    switch (weight) {
    case Type::Q8_0: return Type::Q8_0;
    case Type::Q2_K:
    case Type::Q4_K:
    case Type::IQ2_XXS: return Type::Q8_K;
    case Type::F32:
    case Type::F16:
    case Type::BF16: return Type::F32;
    default: failf("CUDA backend: tensor type %s is not supported", gguf::type_name(weight));
    }
}

uint64_t act_row_bytes(Type weight, int64_t n) {
    const Type a = act_type(weight);
    if (a == Type::F32) return (uint64_t)n * 4;
    const int64_t qk = a == Type::Q8_0 ? quant::kQK8_0 : quant::kQK_K;
    if (n % qk) failf("CUDA backend: rows of %lld elements are not a multiple of the %s block (%lld)", (long long)n,
                      gguf::type_name(weight), (long long)qk);
    uint64_t b = (uint64_t)n + 4 * (uint64_t)(n / qk) + (a == Type::Q8_K ? 2 * (uint64_t)(n / 16) : 0);
    return (b + 15) & ~uint64_t(15);
}

void quantize_act(cudaStream_t s, Type weight, const float *x, int64_t n_tok, int64_t xs, int64_t n, uint8_t *q,
                  uint64_t qrow) {
    if (n_tok <= 0) return;
    const Type a = act_type(weight);
    if (a == Type::F32) failf("CUDA backend: %s weights take f32 activations", gguf::type_name(weight));
    if (qrow < act_row_bytes(weight, n) || qrow % 16) failf("CUDA backend: quantised activation row of %llu bytes is too small or misaligned", (unsigned long long)qrow);
    const dim3 g((unsigned)((n + 1023) / 1024), (unsigned)n_tok);
    if (a == Type::Q8_0) launch_pdl(quantize_kernel<32>, g, 128, 0, s, x, xs, n, q, qrow);
    else launch_pdl(quantize_kernel<256>, g, 128, 0, s, x, xs, n, q, qrow);
    DS4_CUDA_LAUNCHED();
}

namespace {
void matmul_q_impl(cudaStream_t s, Type type, const void *w, int64_t in, int64_t out, uint64_t row_bytes, const uint8_t *xq,
                   uint64_t qrow, int64_t n_tok, float *y, int64_t y_stride, XGroups xg, bool tensor_cores) {
    if (n_tok <= 0 || out <= 0) return;
    if (qrow < act_row_bytes(type, xg.xn)) failf("CUDA backend: quantised activation rows too small for %lld elements", (long long)xg.xn);
    if (tensor_cores && n_tok >= kMmaMinTokens &&
        matmul_q_mma(s, type, w, in, out, row_bytes, xq, qrow, n_tok, y, y_stride, xg.xn, xg.opg, xg.gchunks))
        return;
    const uint8_t *wp = static_cast<const uint8_t *>(w);
    switch (type) {
    case Type::Q8_0: launch<8>(s, wp, in, out, row_bytes, xq, qrow, n_tok, y, y_stride, xg); return;
    case Type::Q2_K: launch<10>(s, wp, in, out, row_bytes, xq, qrow, n_tok, y, y_stride, xg); return;
    case Type::Q4_K: launch<12>(s, wp, in, out, row_bytes, xq, qrow, n_tok, y, y_stride, xg); return;
    case Type::IQ2_XXS: launch<16>(s, wp, in, out, row_bytes, xq, qrow, n_tok, y, y_stride, xg); return;
    default: failf("CUDA backend: no integer product for %s weights", gguf::type_name(type));
    }
}
}  // namespace

void matmul_q(cudaStream_t s, Type type, const void *w, int64_t in, int64_t out, uint64_t row_bytes, const uint8_t *xq,
              uint64_t qrow, int64_t n_tok, float *y, int64_t y_stride, bool tensor_cores) {
    matmul_q_impl(s, type, w, in, out, row_bytes, xq, qrow, n_tok, y, y_stride, XGroups{in, out > 0 ? out : 1, 0}, tensor_cores);
}

bool matmul_q_pair(cudaStream_t s, Type type, int64_t in, const void *w0, int64_t out0, uint64_t rb0, float *y0, const void *w1,
                   int64_t out1, uint64_t rb1, float *y1, const uint8_t *xq, uint64_t qrow) {
    if (out0 <= 0 || out1 <= 0 || qrow < act_row_bytes(type, in)) return false;
    const auto *a = static_cast<const uint8_t *>(w0), *b = static_cast<const uint8_t *>(w1);
    QPair p{{a, b}, {out0, out1}, {rb0, rb1}, {y0, y1}, (unsigned)((out0 + kWarps - 1) / kWarps)};
    const dim3 grid(p.b0 + (unsigned)((out1 + kWarps - 1) / kWarps));
    const bool sg = stage_rows(in) && stageable(a, rb0) && stageable(b, rb1);
    auto go = [&](auto T) -> bool {
        constexpr int t = decltype(T)::value;
        if ((uintptr_t)a % Fmt<t>::kAlign || rb0 % Fmt<t>::kAlign || (uintptr_t)b % Fmt<t>::kAlign || rb1 % Fmt<t>::kAlign) return false;
        if (t == 16 && !g_grid_addr) fail("CUDA backend: init_qmatmul_tables was not called");
        if (sg && in > Stage<t>::kElems) launch_pdl(qmatmul_pair_kernel<t, true, 2>, grid, 32 * kWarps, 0, s, p, in, xq, g_grid_addr);
        else if (sg) launch_pdl(qmatmul_pair_kernel<t, true>, grid, 32 * kWarps, 0, s, p, in, xq, g_grid_addr);
        else launch_pdl(qmatmul_pair_kernel<t, false>, grid, 32 * kWarps, 0, s, p, in, xq, g_grid_addr);
        DS4_CUDA_LAUNCHED();
        return true;
    };
    switch (type) {
    case Type::Q8_0: return go(std::integral_constant<int, 8>{});
    case Type::Q2_K: return go(std::integral_constant<int, 10>{});
    case Type::Q4_K: return go(std::integral_constant<int, 12>{});
    case Type::IQ2_XXS: return go(std::integral_constant<int, 16>{});
    default: return false;
    }
}

void matmul_q_grouped(cudaStream_t s, Type type, const void *w, int64_t in, int64_t out, uint64_t row_bytes, const uint8_t *xq,
                      uint64_t qrow, int64_t xn, int64_t out_per_group, int64_t n_tok, float *y, int64_t y_stride) {
    const int64_t qk = act_type(type) == Type::Q8_0 ? quant::kQK8_0 : quant::kQK_K;
    if (out_per_group <= 0 || out % out_per_group || in % qk || (out / out_per_group) * in > xn)
        failf("CUDA backend: grouped product of %lld outputs in groups of %lld over %lld-element slices of a %lld-element row",
              (long long)out, (long long)out_per_group, (long long)in, (long long)xn);
    matmul_q_impl(s, type, w, in, out, row_bytes, xq, qrow, n_tok, y, y_stride, XGroups{xn, out_per_group, in / 8}, true);
}

void gather_bytes(cudaStream_t s, const uint8_t *src, uint64_t row_bytes, const int *idx, uint8_t *dst, int rows) {
    if (rows <= 0) return;
    if (row_bytes % 16 || (uintptr_t)src % 16 || (uintptr_t)dst % 16) fail("CUDA backend: gather_bytes needs 16-byte rows");
    launch_pdl(gather_bytes_kernel, (unsigned)rows, 128, 0, s, reinterpret_cast<const uint4 *>(src), row_bytes / 16, idx,
                                                       reinterpret_cast<uint4 *>(dst));
    DS4_CUDA_LAUNCHED();
}

}  // namespace ds4::cuda
