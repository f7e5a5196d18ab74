// The indexer's top-k per row without k passes over the scores: a radix select on the
// scores' order-preserving bit patterns (four 8-bit digits, a shared-memory histogram per
// digit, the digit found by a warp scan) finds the k-th largest value; then one pass keeps
// the entries above it and the lowest-index ties at it, written in ascending index order by
// a block scan. The set is the CPU's (score descending, lower index first on ties, first k);
// the order differs (the CPU's is by score), which only changes the order attention sums
// the selected keys in. A row with no more than k visible entries keeps them all.
#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "cuda/cuda_check.h"
#include "cuda/cuda_launch.cuh"
#include "cuda/cuda_kernels.h"
#include "engine/common/error.h"

namespace ds4::cuda {

namespace {

constexpr int kThreads = 1024;

__device__ __forceinline__ uint32_t order_key(float v) {
    const uint32_t u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(kThreads) topk_radix_kernel(const float *__restrict__ scores, int stride,
                                                              const int *__restrict__ n_vis, int k, int *__restrict__ sel,
                                                              int *__restrict__ nsel) {
    pdl_enter();
    using Scan = cub::BlockScan<int, kThreads>;
    __shared__ typename Scan::TempStorage scan_tmp;
    __shared__ unsigned hist[256];
    __shared__ uint32_t s_prefix;
    __shared__ int s_rem;

    const int r = blockIdx.x, tid = threadIdx.x;
    const int n = n_vis[r], kk = n < k ? n : k;
    const float *sc = scores + (int64_t)r * stride;
    uint32_t T = 0;
    int rem = kk;   // entries equal to T still to take
    const bool all = n <= k;
    if (!all) {
        if (tid == 0) s_prefix = 0, s_rem = k;
        uint32_t mask = 0;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int d = tid; d < 256; d += kThreads) hist[d] = 0;
            __syncthreads();
            const uint32_t prefix = s_prefix;
            for (int i = tid; i < n; i += kThreads) {
                const uint32_t u = order_key(sc[i]);
                if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1u);
            }
            __syncthreads();
            if (tid < 32) {
                // the highest digit d whose count from 255 down to d reaches the entries still
                // wanted: lane l holds digits 255 - 8l down to 248 - 8l
                const int want = s_rem;
                int c[8], sum = 0;
#pragma unroll
                for (int i = 0; i < 8; ++i) c[i] = (int)hist[255 - 8 * tid - i], sum += c[i];
                int incl = sum;
#pragma unroll
                for (int off = 1; off < 32; off <<= 1) {
                    const int v = __shfl_up_sync(0xffffffffu, incl, off);
                    if (tid >= off) incl += v;
                }
                const int before = incl - sum;
                const unsigned hit = __ballot_sync(0xffffffffu, incl >= want);
                if (tid == (hit ? __ffs(hit) - 1 : 31)) {   // the first lane whose digits reach it
                    int cum = before, d = 255 - 8 * tid, i = 0;
                    for (; i < 7 && cum + c[i] < want; ++i) cum += c[i];
                    d -= i;
                    s_rem = want - cum;
                    s_prefix = prefix | ((uint32_t)d << shift);
                }
            }
            mask |= 255u << shift;
            __syncthreads();
        }
        T = s_prefix, rem = s_rem;
    }
    // keys above T and the first `rem` keys equal to T by index (or everything), in index order
    int eq_base = 0, out_base = 0;
    for (int base = 0; base < n; base += kThreads) {
        const int i = base + tid;
        const bool in = i < n;
        const uint32_t u = in ? order_key(sc[i]) : 0u;
        const int eq = (!all && in && u == T) ? 1 : 0;
        int rank = 0, total = 0;
        Scan(scan_tmp).ExclusiveSum(eq, rank, total);
        __syncthreads();   // scan_tmp is reused below
        const int take = in && (all || u > T || (eq && eq_base + rank < rem)) ? 1 : 0;
        int at = 0, taken = 0;
        Scan(scan_tmp).ExclusiveSum(take, at, taken);
        if (take) sel[(int64_t)r * k + out_base + at] = i;
        eq_base += total, out_base += taken;
        __syncthreads();
    }
    if (tid == 0) nsel[r] = kk;
}

}  // namespace

void topk_rows(cudaStream_t s, float *scores, int stride, const int *n_vis, int k, int *sel, int *nsel, int rows) {
    if (rows <= 0) return;
    if (k <= 0) fail("CUDA backend: top-k of 0");
    launch_pdl(topk_radix_kernel, rows, kThreads, 0, s, scores, stride, n_vis, k, sel, nsel);
    DS4_CUDA_LAUNCHED();
}

}  // namespace ds4::cuda
