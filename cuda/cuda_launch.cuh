// Kernel launches that may overlap the previous kernel's tail (programmatic dependent launch,
// sm_90). Every kernel of the backend begins with pdl_enter(): it waits until the grid before
// it in the stream has completed and its writes are visible, then lets the next grid be
// scheduled once all of this grid's blocks have begun. A decode step is ~40 small kernels a
// layer; without this each one's launch and ramp starts only after the previous one's last
// block has ended. DS4_CUDA_PDL=0 launches them plainly (for comparisons).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <utility>

#include "cuda/cuda_check.h"
#include "cuda/cuda_graph.h"

namespace ds4::cuda {
namespace {

__device__ __forceinline__ void pdl_enter() {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// Weights never change, so a kernel may ask for its weight bytes before pdl_enter and have
// the fetch from HBM overlap the tail of the kernel before it. Thread i of n prefetches the
// 128-byte lines i, i + n, ... of [p, p + bytes) into L2.
__device__ __forceinline__ void prefetch_l2(const void *p, uint64_t bytes, int i, int n) {
    const uintptr_t a = (uintptr_t)p, b = a & ~(uintptr_t)127, e = a + bytes;
    for (uintptr_t q = b + (uintptr_t)i * 128; q < e; q += (uintptr_t)n * 128)
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(q));
}

inline bool pdl_enabled() {
    static const bool on = [] {
        const char *e = std::getenv("DS4_CUDA_PDL");
        return !(e && *e == '0');
    }();
    return on;
}

// While s records a step (cuda_graph.h) the launch is stored, its arguments converted to the
// kernel's parameter types as a launch converts them, and issued at the next cut.
template <class... P, class... A>
void launch_pdl(void (*kernel)(P...), dim3 grid, dim3 block, size_t shm, cudaStream_t s, A &&...args) {
    if (StepGraphs *g = recording(s)) {
        [&](P... c) {
            const void *ptr[] = {&c..., nullptr};
            const size_t size[] = {sizeof(c)..., 0};
            g->add(reinterpret_cast<const void *>(kernel), grid, block, shm, pdl_enabled(), ptr, size, (int)sizeof...(P));
        }(std::forward<A>(args)...);
        return;
    }
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = shm, cfg.stream = s;
    cfg.attrs = at, cfg.numAttrs = pdl_enabled() ? 1 : 0;
    DS4_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...));
}

}  // namespace
}  // namespace ds4::cuda
