// The CUDA backend (engine/backend/backend.h): weights copied to device memory in their GGUF
// encodings, session caches in device memory, executors on their own streams. Reached only
// from engine/model (Model::open with the cuda backend).
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "engine/backend/backend.h"
#include "engine/gguf/gguf.h"

namespace ds4::cuda {

// Whether a CUDA device can be used; why says what is missing otherwise.
bool cuda_device_available(std::string *why);
// The rope tables must outlive the backend (they are the Model's).
// Fails with the numbers (needed vs free) when the weights do not fit, and leaves nothing
// allocated. progress(done, total) follows the copy to the device. `share`: the weights in
// one allocation exportable to other processes, or imported from one (cuda_weights.h).
std::unique_ptr<Backend> make_cuda_backend(const ModelConfig &c, const gguf::Reader &r, const ModelWeights &w,
                                           const Rope &rope_main, const Rope &rope_compress,
                                           const std::function<void(uint64_t, uint64_t)> &progress = {},
                                           const DeviceShareOptions &share = {});

}  // namespace ds4::cuda
