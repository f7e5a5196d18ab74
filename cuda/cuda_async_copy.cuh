// Asynchronous copies from global to shared memory (cp.async, sm_80+): a copy in flight holds
// no registers, so a block can have the next tile's loads outstanding while it computes on
// the current one. Groups are committed and waited for in order.
#pragma once

namespace ds4::cuda {
namespace {

// n <= 16 bytes from a 16-byte aligned source; the rest of the 16 destination bytes are zeroed.
__device__ __forceinline__ void cp16(void *dst, const void *src, int n) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src),
                 "r"(n));
}
__device__ __forceinline__ void cp4(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

}  // namespace
}  // namespace ds4::cuda
