// Split-K for the tensor-core products: a product whose output tiles are too few to fill the
// GPU (few outputs, few tokens, long inputs: the 16-row batched step, a long-input projection
// in a prefill) has each tile's input range split over grid.z blocks, each writing its partial
// sums; a reduction adds the partials in split order, so results do not depend on timing.
// Partials live in stream-ordered allocations from the device's pool (kept, not returned to the
// OS between steps).
#include <cstdint>

#include "cuda/cuda_check.h"
#include "cuda/cuda_launch.cuh"
#include "cuda/cuda_kernels.h"

namespace ds4::cuda {

namespace {

__global__ void splitk_reduce_kernel(const float *__restrict__ part, int splits, int64_t n_tok, int64_t out, float *__restrict__ y,
                                     int64_t ys) {
    pdl_enter();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, n = n_tok * out;
    if (i >= n) return;
    float v = part[i];
    for (int z = 1; z < splits; ++z) v += part[(int64_t)z * n + i];
    y[(i / out) * ys + i % out] = v;
}

int sm_count() {
    static const int n = [] {
        int dev = 0, v = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
        cudaMemPool_t pool;
        if (cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess) {
            uint64_t keep = UINT64_MAX;
            cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
        }
        return v > 0 ? v : 1;
    }();
    return n;
}

}  // namespace

int splitk_count(int64_t blocks, int64_t ksteps) {
    const int64_t want = 2 * (int64_t)sm_count();   // two blocks per SM
    if (blocks >= want || ksteps < 8) return 1;
    int64_t z = (want + blocks - 1) / blocks;
    if (z > ksteps / 4) z = ksteps / 4;   // at least 4 steps a split
    return z > 1 ? (int)z : 1;
}

float *splitk_alloc(cudaStream_t s, int splits, int64_t n_tok, int64_t out) {
    void *p = nullptr;
    settle(s);
    DS4_CUDA_CHECK(cudaMallocAsync(&p, sizeof(float) * (size_t)splits * (size_t)n_tok * (size_t)out, s));
    return static_cast<float *>(p);
}

void splitk_finish(cudaStream_t s, float *part, int splits, int64_t n_tok, int64_t out, float *y, int64_t ys) {
    const int64_t n = n_tok * out;
    launch_pdl(splitk_reduce_kernel, (unsigned)((n + 255) / 256), 256, 0, s, part, splits, n_tok, out, y, ys);
    DS4_CUDA_LAUNCHED();
    settle(s);
    DS4_CUDA_CHECK(cudaFreeAsync(part, s));
}

}  // namespace ds4::cuda
