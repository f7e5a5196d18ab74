// Where a step finds the weights of routed experts.
//
// Routed experts are most of a DeepSeek-V4 model's bytes but a token uses a handful per
// layer, so the engine never walks expert tensors directly: the MoE operation groups the
// step's rows by expert and asks the source once per layer for the experts it needs.
// Views from acquire() stay valid until the same executor's next acquire() on this layer
// or the end of the step. The resident source (every expert in the mapped file or the
// device arena) is the first implementation; streaming from SSD into a bounded cache is
// another behind the same calls.
#pragma once
#include <atomic>
#include <cstdint>
#include <span>

#include "engine/kernels/matmul.h"

namespace ds4 {

struct ModelWeights;

struct ExpertView {
    WeightView gate, up, down;
};

struct ExpertSourceStats {
    uint64_t acquired = 0;     // experts handed out
    uint64_t misses = 0;       // of which had to be fetched first
    uint64_t bytes_read = 0;   // bytes fetched to fill misses
};

class ExpertSource {
public:
    virtual ~ExpertSource() = default;
    // Fills out[i] with the views of expert ids[i] of `layer`. Thread-safe.
    virtual void acquire(int layer, std::span<const int> ids, ExpertView *out) = 0;
    // A hint that these experts are wanted soon (e.g. the next layer's likely picks).
    virtual void prefetch(int layer, std::span<const int> ids) = 0;
    virtual ExpertSourceStats stats() const = 0;
};

// Every expert resident in the model's mapping: acquire() is a lookup, nothing misses.
class ResidentExperts final : public ExpertSource {
public:
    explicit ResidentExperts(const ModelWeights &w) : w_(w) {}
    void acquire(int layer, std::span<const int> ids, ExpertView *out) override;
    void prefetch(int, std::span<const int>) override {}
    ExpertSourceStats stats() const override;

private:
    const ModelWeights &w_;
    std::atomic<uint64_t> acquired_{0};
};

}  // namespace ds4
