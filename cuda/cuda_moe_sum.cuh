// The routed experts' weighted sum of one output element, shared by moe_combine_kernel
// (cuda_moe.cu) and hc_post_moe_kernel (cuda_ops.cu): the fused path gives the unfused one's
// bits only while both add the same products in the same order, so the loop is written once.
#pragma once
#include <cstdint>

#include "cuda/cuda_kernels.h"

namespace ds4::cuda {

// sum over row r's pairs, in pair order, of pw * y[p][i]
__device__ __forceinline__ float moe_row_sum(const float *__restrict__ y, int D, int P, const MoeGroups &g, int r,
                                             int i) {
    float acc = 0.f;
    for (int p = 0; p < P; ++p)
        if (g.prow[p] == r) acc += g.pw[p] * y[(int64_t)p * D + i];
    return acc;
}

}  // namespace ds4::cuda
