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
// stream_experts: the routed experts (`*_exps` tensors) are not copied; they come from
// make_device_expert_cache's tier.
std::unique_ptr<Backend> make_cuda_backend(const ModelConfig &c, const gguf::Reader &r, const ModelWeights &w,
                                           const Rope &rope_main, const Rope &rope_compress,
                                           const std::function<void(uint64_t, uint64_t)> &progress = {},
                                           const DeviceShareOptions &share = {}, bool stream_experts = false);
// Routed experts in a bounded cache of VRAM slots filled from `host` (cuda_expert_cache.h);
// the budget (cache_experts, or cache_bytes; both 0: 4 GiB) is VRAM.
std::unique_ptr<ExpertSource> make_device_expert_cache(const ModelConfig &c, const ModelWeights &w,
                                                       std::unique_ptr<ExpertSource> host, uint64_t cache_experts,
                                                       uint64_t cache_bytes, bool prefetch);

}  // namespace ds4::cuda
