// A device buffer that grows on demand and keeps its capacity (like the CPU scratch vectors).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/cuda_check.h"
#include "cuda/cuda_graph.h"

namespace ds4::cuda {

template <class T>
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    ~DeviceBuffer() { cudaFree(p_); }
    DeviceBuffer(const DeviceBuffer &) = delete;
    DeviceBuffer &operator=(const DeviceBuffer &) = delete;
    DeviceBuffer(DeviceBuffer &&o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }

    // Makes room for n elements; contents are kept only when keep is set.
    T *need(size_t n, bool keep = false) {
        if (n <= n_) return p_;
        settle_thread();   // recorded kernels may use the old memory
        T *q = nullptr;
        DS4_CUDA_CHECK(cudaMalloc(&q, n * sizeof(T)));
        if (keep && n_) DS4_CUDA_CHECK(cudaMemcpy(q, p_, n_ * sizeof(T), cudaMemcpyDeviceToDevice));
        cudaFree(p_);
        p_ = q, n_ = n;
        return p_;
    }
    // Zero-filled allocation of exactly n elements.
    T *zeros(size_t n) {
        need(n);
        settle_thread();
        if (n) DS4_CUDA_CHECK(cudaMemset(p_, 0, n * sizeof(T)));
        return p_;
    }
    T *get() const { return p_; }
    size_t size() const { return n_; }
    size_t bytes() const { return n_ * sizeof(T); }

private:
    T *p_ = nullptr;
    size_t n_ = 0;
};

}  // namespace ds4::cuda
