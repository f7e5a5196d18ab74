// Where each of a model's weight ranges sits in one device allocation (the shared drafter's,
// ARCHITECTURE.md §5): the file's tensors, then the f32 vectors the binding made, then extra
// host ranges (rope tables), in that order, each at a 256-byte aligned offset. An exporter and
// an importer of the same file compute the same layout; its hash (sizes, offsets and the bytes
// made at open) is how they check it. Host code only: testable without a GPU.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/gguf/gguf.h"
#include "engine/model/weights.h"

namespace ds4::cuda {

struct HostRange {
    const void *p;
    uint64_t n;
};

struct WeightLayout {
    struct Range {
        const uint8_t *host;
        uint64_t n, offset;
        bool derived;   // made at open (f32 vectors, rope tables), not the file's bytes
    };
    std::vector<Range> ranges;
    uint64_t bytes = 0;   // end of the last range, aligned
    uint64_t hash = 0;
    static constexpr uint64_t kAlign = 256;
};

// skip_routed_experts: the `*_exps` tensors are left out (SSD streaming: the VRAM expert cache
// holds them, cuda_expert_cache.h).
WeightLayout plan_weight_layout(const gguf::Reader &r, const ModelWeights &w, const std::vector<HostRange> &extra,
                                bool skip_routed_experts = false);
bool is_routed_expert(const gguf::TensorInfo &t);
uint64_t routed_expert_bytes(const gguf::Reader &r);

}  // namespace ds4::cuda
