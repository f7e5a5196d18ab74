// The indexer's top-k per row without k passes over the scores: a radix select on the
// scores' order-preserving bit patterns (four 8-bit digits, a shared-memory histogram per
// digit) finds the k-th largest value, the rows above it and the lowest-index ties at it are
// gathered, and a bitonic sort in shared memory puts them in the CPU's order: score
// descending, lower index first on ties. A row with no more than k visible entries skips the
// select and sorts them all. Cost: about 5 passes over a row's scores plus a k-element sort,
// where the k-round argmax it replaces made k passes (512 at V4-Flash's top-k).
#include <cub/block/block_scan.cuh>

#include <climits>
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

// a before b: higher score, then lower index
__device__ __forceinline__ bool before(float sa, int ia, float sb, int ib) { return sa > sb || (sa == sb && ia < ib); }

__global__ void __launch_bounds__(kThreads) topk_radix_kernel(const float *__restrict__ scores, int stride,
                                                              const int *__restrict__ n_vis, int k, int p2,
                                                              int *__restrict__ sel, int *__restrict__ nsel) {
    pdl_enter();
    using Scan = cub::BlockScan<int, kThreads>;
    __shared__ typename Scan::TempStorage scan_tmp;
    __shared__ unsigned hist[256];
    __shared__ uint32_t s_prefix;
    __shared__ int s_rem, s_cnt;
    extern __shared__ unsigned char smem[];
    float *cv = reinterpret_cast<float *>(smem);
    int *ci = reinterpret_cast<int *>(cv + p2);

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
            if (tid == 0) {
                int want = s_rem, cum = 0, d = 255;
                for (; d > 0; --d) {
                    if (cum + (int)hist[d] >= want) break;
                    cum += (int)hist[d];
                }
                s_rem = want - cum;
                s_prefix = prefix | ((uint32_t)d << shift);
            }
            mask |= 255u << shift;
            __syncthreads();
        }
        T = s_prefix, rem = s_rem;
    }
    // gather: everything (all), or keys above T and the first `rem` keys equal to T by index
    if (tid == 0) s_cnt = 0;
    __syncthreads();
    int eq_base = 0;
    for (int base = 0; base < n; base += kThreads) {
        const int i = base + tid;
        const bool in = i < n;
        const float v = in ? sc[i] : 0.f;
        const uint32_t u = order_key(v);
        const int eq = (!all && in && u == T) ? 1 : 0;
        int rank = 0, total = 0;
        Scan(scan_tmp).ExclusiveSum(eq, rank, total);
        const bool take = in && (all || u > T || (eq && eq_base + rank < rem));
        if (take) {
            const int p = atomicAdd(&s_cnt, 1);
            cv[p] = v, ci[p] = i;
        }
        eq_base += total;
        __syncthreads();
    }
    for (int p = kk + tid; p < p2; p += kThreads) cv[p] = -INFINITY, ci[p] = INT_MAX;
    __syncthreads();
    // bitonic sort of p2 (a power of two) entries into `before` order
    for (int size = 2; size <= p2; size <<= 1) {
        for (int stride2 = size >> 1; stride2 > 0; stride2 >>= 1) {
            for (int i = tid; i < p2; i += kThreads) {
                const int j = i ^ stride2;
                if (j > i) {
                    const bool up = (i & size) == 0;   // this run sorts into `before` order
                    const bool swap = up ? before(cv[j], ci[j], cv[i], ci[i]) : before(cv[i], ci[i], cv[j], ci[j]);
                    if (swap) {
                        const float tv = cv[i];
                        const int ti = ci[i];
                        cv[i] = cv[j], ci[i] = ci[j], cv[j] = tv, ci[j] = ti;
                    }
                }
            }
            __syncthreads();
        }
    }
    for (int p = tid; p < kk; p += kThreads) sel[(int64_t)r * k + p] = ci[p];
    if (tid == 0) nsel[r] = kk;
}

}  // namespace

void topk_rows(cudaStream_t s, float *scores, int stride, const int *n_vis, int k, int *sel, int *nsel, int rows) {
    if (rows <= 0) return;
    if (k <= 0) fail("CUDA backend: top-k of 0");
    int p2 = 1;
    while (p2 < k) p2 <<= 1;
    const size_t shm = (size_t)p2 * (sizeof(float) + sizeof(int));
    if (shm > 96 * 1024) failf("CUDA backend: an indexer top-k of %d is too large for one block's sort", k);
    if (shm > 48 * 1024)   // past the default dynamic shared-memory limit
        DS4_CUDA_CHECK(cudaFuncSetAttribute(topk_radix_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm));
    launch_pdl(topk_radix_kernel, rows, kThreads, shm, s, scores, stride, n_vis, k, p2, sel, nsel);
    DS4_CUDA_LAUNCHED();
}

}  // namespace ds4::cuda
