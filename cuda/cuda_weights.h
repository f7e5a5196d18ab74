// The model's weights placed in device memory, in their GGUF encodings: every tensor of the
// file, and the small f32 vectors the binding made (norms, biases, sinks). The engine hands
// the backend host views (WeightView, const float *); device() translates any pointer into
// one of those host ranges to the same byte of its device copy.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "engine/gguf/gguf.h"
#include "engine/model/weights.h"

namespace ds4::cuda {

class DeviceWeights {
public:
    // skip_experts: the routed experts (`*_exps` tensors) stay on the host (SSD streaming:
    // the VRAM expert cache holds them); a pointer into them does not translate.
    DeviceWeights(const gguf::Reader &r, const ModelWeights &w, const std::function<void(uint64_t, uint64_t)> &progress = {},
                  bool skip_experts = false);
    static bool is_routed_expert(const gguf::TensorInfo &t);
    static uint64_t routed_expert_bytes(const gguf::Reader &r);
    // Places one more host range (e.g. rope tables) and makes it translatable.
    void place(const void *host, uint64_t n);
    ~DeviceWeights();
    DeviceWeights(const DeviceWeights &) = delete;
    DeviceWeights &operator=(const DeviceWeights &) = delete;

    // Device address of host byte p (p must lie inside a placed range).
    const void *device(const void *p) const;
    template <class T> const T *device(const T *p) const { return static_cast<const T *>(device((const void *)p)); }
    uint64_t bytes() const { return bytes_; }

private:
    struct Range {
        uint64_t n;
        void *dev;
    };
    std::map<const uint8_t *, Range> ranges_;   // by host start
    std::vector<void *> allocs_;
    uint64_t bytes_ = 0;
};

}  // namespace ds4::cuda
