// The CPU backend: session caches in host memory, executors that run the operations on a
// thread pool over the mapped GGUF weights.
#pragma once
#include <memory>

#include "engine/backend/backend.h"

namespace ds4 {

std::unique_ptr<Backend> make_cpu_backend(const ModelConfig &c);

}  // namespace ds4
