// The model's weights placed in device memory, in their GGUF encodings: every tensor of the
// file, the small f32 vectors the binding made (norms, biases, sinks) and the rope tables.
// The engine hands the backend host views (WeightView, const float *); device() translates
// any pointer into one of those host ranges to the same byte of its device copy.
//
// Placement (DeviceShareOptions): privately (one cudaMalloc per range), or all ranges at
// fixed offsets (cuda_weight_layout.h) in one VMM allocation that is exported to other processes, or on such an
// allocation imported from another process (nothing uploaded). A refused export or import
// falls back to the private placement with the reason in share().why.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "cuda/cuda_weight_layout.h"
#include "engine/backend/backend.h"
#include "engine/gguf/gguf.h"
#include "engine/model/weights.h"

namespace ds4::cuda {

class VmmAllocation;

class DeviceWeights {
public:
    // `extra`: host ranges beyond the file's tensors and the bound f32 vectors (rope tables).
    DeviceWeights(const gguf::Reader &r, const ModelWeights &w, const std::vector<HostRange> &extra,
                  const DeviceShareOptions &share = {}, const std::function<void(uint64_t, uint64_t)> &progress = {},
                  bool skip_routed_experts = false);
    ~DeviceWeights();
    DeviceWeights(const DeviceWeights &) = delete;
    DeviceWeights &operator=(const DeviceWeights &) = delete;

    // Device address of host byte p (p must lie inside a placed range).
    const void *device(const void *p) const;
    template <class T> const T *device(const T *p) const { return static_cast<const T *>(device((const void *)p)); }
    // Device bytes this process placed (0 when the weights are imported).
    uint64_t bytes() const { return bytes_; }
    const DeviceShareState &share() const { return share_; }

private:
    struct Range {
        uint64_t n;
        void *dev;
    };
    using Planned = WeightLayout::Range;
    void place_private(const std::vector<Planned> &plan, const std::function<void(uint64_t, uint64_t)> &progress);
    bool place_exported(const std::vector<Planned> &plan, uint64_t total, uint64_t hash,
                        const std::function<void(uint64_t, uint64_t)> &progress);
    bool place_imported(const std::vector<Planned> &plan, uint64_t total, uint64_t hash, const DeviceShareOptions &s);
    void free_all();

    std::map<const uint8_t *, Range> ranges_;   // by host start
    std::vector<void *> allocs_;                // private placement
    std::unique_ptr<VmmAllocation> vmm_;        // exported or imported placement
    uint64_t bytes_ = 0;
    DeviceShareState share_;
};

}  // namespace ds4::cuda
