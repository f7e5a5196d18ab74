// Where a step finds the weights of routed experts.
//
// Routed experts are most of a DeepSeek-V4 model's bytes but a token uses a handful per
// layer, so the engine never walks expert tensors directly: the MoE operation groups the
// step's rows by expert and asks the source once per layer for the experts it needs.
// Views from acquire() stay valid until the same thread's next acquire() or release(). The resident source (every expert in the mapped file or the
// device arena) is the first implementation; StreamingExperts (streaming_experts.h) reads
// them from SSD into a bounded cache behind the same calls.
#pragma once
#include <atomic>
#include <cstdint>
#include <span>

#include "engine/kernels/matmul.h"

namespace ds4 {

struct ModelWeights;
struct LayerWeights;

struct ExpertView {
    WeightView gate, up, down;
};

struct ExpertSourceStats {
    uint64_t acquired = 0;     // experts handed out
    uint64_t misses = 0;       // of which had to be fetched first (not resident, not in flight)
    uint64_t bytes_read = 0;   // bytes fetched (demand and prefetch)
    uint64_t late = 0;         // acquired while their prefetch was still in flight
    uint64_t prefetched = 0;   // experts read by prefetch
    uint64_t prefetch_used = 0;  // of which were acquired before being evicted
    uint64_t store_reads = 0;    // experts read from the expert store (not the GGUF)
    uint64_t store_corrupt = 0;  // store records that failed their checksum (read again from the GGUF)
    uint64_t demand_read_ns = 0;   // time spent in demand reads
    uint64_t prefetch_read_ns = 0; // time spent in prefetch reads (on the I/O thread)
    uint64_t wait_ns = 0;          // time acquire() blocked on I/O (demand or in-flight prefetch)
    uint64_t io_busy_ns = 0;       // wall time with at least one read in flight
    uint64_t resident = 0;         // experts in the cache now
    uint64_t capacity = 0;         // experts the cache holds (0: unbounded, every expert resident)
    uint64_t capacity_bytes = 0;   // bytes of the cache
    // A two-tier source (the CUDA VRAM cache over a RAM cache): the lower tier's reads from
    // disk and its size; the fields above are then the upper tier's (bytes_read: uploaded).
    uint64_t host_misses = 0, host_bytes_read = 0, host_capacity_bytes = 0;
};

class ExpertSource {
public:
    virtual ~ExpertSource() = default;
    // Fills out[i] with the views of expert ids[i] of `layer`. Thread-safe.
    virtual void acquire(int layer, std::span<const int> ids, ExpertView *out) = 0;
    // Ends the calling thread's hold on the views of its last acquire().
    virtual void release() {}
    // The most experts one acquire() may ask for (a bounded cache); callers split bigger sets.
    virtual size_t max_acquire() const { return SIZE_MAX; }
    // A hint that these experts are wanted soon (e.g. the next layer's likely picks).
    virtual void prefetch(int layer, std::span<const int> ids) = 0;
    // When the source wants predictions for `layer`: the weights of the router to predict
    // with (the caller applies them to the current activations and calls prefetch()).
    virtual const LayerWeights *predictor(int layer) const {
        (void)layer;
        return nullptr;
    }
    // Loads what the source expects to be used first (e.g. the persisted hot set).
    virtual void prewarm() {}
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
