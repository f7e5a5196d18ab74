// Error checking for CUDA runtime calls and launches: a failure becomes a ds4::Error that
// names the call and the CUDA error, like every other engine failure.
#pragma once
#include <cuda_runtime.h>

#include "engine/common/error.h"

#define DS4_CUDA_CHECK(call)                                                                             \
    do {                                                                                                 \
        const cudaError_t ds4_err_ = (call);                                                             \
        if (ds4_err_ != cudaSuccess)                                                                     \
            ::ds4::failf("CUDA: %s failed: %s (%s:%d)", #call, cudaGetErrorString(ds4_err_), __FILE__, __LINE__); \
    } while (0)

// After a kernel launch: launch-configuration errors surface here, faults at the next sync.
#define DS4_CUDA_LAUNCHED() DS4_CUDA_CHECK(cudaGetLastError())
