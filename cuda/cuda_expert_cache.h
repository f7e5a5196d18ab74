// Routed experts in a bounded cache of VRAM slots, for the CUDA backend with SSD streaming on
// (ARCHITECTURE.md §7, "SSD expert streaming on the GPU"). The slots are filled from a host
// tier (StreamingExperts: a RAM cache filled from disk with io_uring) through pinned staging
// buffers, by cudaMemcpyAsync on a copy stream of the cache's own, so an upload overlaps the
// kernels already queued on the executor's stream.
//
// Every slot has the same layout (gate at 0, up and down at fixed offsets, sized for the
// largest layer), so a layer's experts in VRAM are "base + slot * slot_bytes" like the
// resident stacked tensors are "base + expert * expert_bytes": the executor's expert kernels
// take the same arguments plus a table expert -> slot, and compute the same bits.
//
// Ordering without host waits: an upload into a slot waits (on the copy stream) for the
// event recorded after the last kernels that read it; kernels wait (on their stream) for the
// event recorded after the upload of each slot they read. Slots an executor is about to use
// are held from acquire_slots() to done(); eviction is least recently used among the rest.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/backend/expert_source.h"

namespace ds4 {
struct ModelConfig;
struct ModelWeights;
}  // namespace ds4

namespace ds4::cuda {

class DeviceExpertCache final : public ExpertSource {
public:
    // Budget: cache_experts slots, or cache_bytes / slot_bytes() (both 0: 4 GiB). Throws
    // ds4::Error when it holds fewer experts than one token uses in a layer or VRAM lacks it.
    DeviceExpertCache(const ModelConfig &c, const ModelWeights &w, std::unique_ptr<ExpertSource> host, uint64_t cache_experts,
                      uint64_t cache_bytes, bool prefetch);
    ~DeviceExpertCache() override;
    DeviceExpertCache(const DeviceExpertCache &) = delete;
    DeviceExpertCache &operator=(const DeviceExpertCache &) = delete;

    const uint8_t *arena() const { return arena_; }
    uint64_t slot_bytes() const { return slot_bytes_; }
    uint64_t piece_offset(int which) const { return piece_off_[which]; }   // 0 gate, 1 up, 2 down
    bool contains(const void *p) const {
        const uint8_t *b = static_cast<const uint8_t *>(p);
        return b >= arena_ && b < arena_ + (uint64_t)capacity_ * slot_bytes_;
    }

    // The slots of `layer`'s experts ids (at most max_acquire()), uploaded where missing; the
    // kernels queued on `compute` from now on see their bytes. Held until done().
    void acquire_slots(int layer, std::span<const int> ids, cudaStream_t compute, int *slots);
    // The kernels reading the held slots are queued on `compute`: records that, ends the hold.
    void done(cudaStream_t compute);

    // The generic view interface is not how the CUDA executor reads experts: fails.
    void acquire(int layer, std::span<const int> ids, ExpertView *out) override;
    size_t max_acquire() const override { return capacity_; }
    // Uploads (on the copy stream, not held) the ones not in VRAM, at most half the slots; the
    // host tier reads them first, on the calling thread, while queued kernels run.
    void prefetch(int layer, std::span<const int> ids) override;
    const LayerWeights *predictor(int layer) const override;
    void prewarm() override { host_->prewarm(); }
    // The VRAM tier's counters (bytes_read: bytes uploaded; io_busy_ns: time the copy stream
    // spent on upload batches; demand/prefetch_read_ns: host time filling them) and the host
    // tier's disk reads (host_*).
    ExpertSourceStats stats() const override;

private:
    struct Tag {   // an event recording: ring index and generation
        int i = -1;
        uint64_t gen = 0;
    };
    struct Slot {
        int key = -1;   // layer * n_expert + expert
        int pins = 0;
        uint64_t tick = 0;
        bool prefetched = false;
        Tag ready, used;   // after its upload; after the last kernels that read it
    };
    struct Timing {
        cudaEvent_t start, end;
        uint64_t bytes;
    };

    void free_all();
    Tag record(cudaStream_t s);
    void wait(cudaStream_t s, Tag t);
    int take_slot();   // lock held; -1 when every slot is held
    // Uploads experts (expert, slot) of `layer` from the host tier (lock held).
    void upload(int layer, const std::vector<std::pair<int, int>> &todo, bool prefetch);
    void harvest(bool all) const;   // adds finished batches' copy times (lock held)

    const int n_layer_, n_expert_, n_used_;
    const ModelWeights &w_;
    std::unique_ptr<ExpertSource> host_;
    const bool prefetch_;
    uint64_t piece_off_[3] = {0, 0, 0};
    uint64_t slot_bytes_ = 0;
    size_t capacity_ = 0;
    uint8_t *arena_ = nullptr;
    cudaStream_t copy_ = nullptr;

    std::vector<cudaEvent_t> ring_;
    std::vector<uint64_t> ring_gen_;
    size_t ring_next_ = 0;
    std::vector<uint8_t *> stage_;
    std::vector<cudaEvent_t> stage_ev_;
    std::vector<bool> stage_busy_;
    size_t stage_next_ = 0;
    mutable std::vector<Timing> timing_;      // batches in flight
    mutable std::vector<cudaEvent_t> spare_;  // timing events to reuse

    mutable std::mutex mu_;
    std::vector<Slot> slots_;
    std::vector<int> slot_of_;   // [key] -> slot or -1
    std::unordered_map<std::thread::id, std::vector<int>> held_;
    uint64_t tick_ = 0;
    mutable ExpertSourceStats st_;
    std::vector<ExpertView> views_;
};

}  // namespace ds4::cuda
