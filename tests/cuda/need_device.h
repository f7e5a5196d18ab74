// The CUDA tests skip (loudly, with the reason) where no usable GPU is present: CI builds
// them on a machine without one; scripts/gpu-test.sh runs them where there is one.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "cuda/cuda_backend.h"

#define NEED_DEVICE()                                                                       \
    do {                                                                                    \
        std::string why;                                                                    \
        if (!ds4::cuda::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why; \
    } while (0)
