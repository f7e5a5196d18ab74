// Routed experts streamed from disk into a bounded cache (ARCHITECTURE.md §7, "SSD expert
// streaming"). The model's other weights stay in the mapping; an expert's three matrices
// (gate, up, down) are read with io_uring O_DIRECT into one aligned slot of the cache,
// either from the GGUF (three extents, widened to the alignment) or, when an expert store
// is linked, as one record laid out for direct reads. Misses of one acquire() are one batch
// of reads, many in flight. Prefetches (the caller's prediction of the next layer's experts)
// run on a background I/O thread with its own ring while the current layer computes.
//
// Eviction is least recently used among slots that are loaded and not held. A thread holds
// the slots of its last acquire() until its next acquire() or release().
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/backend/expert_source.h"
#include "io/aligned_buffer.h"
#include "io/extent_reader.h"

namespace ds4 {

namespace gguf {
class Reader;
}
struct ModelConfig;

// A persistent copy of the experts laid out for direct reads (the expert store), consulted
// before the GGUF. Defined here, implemented above the engine (the bridge adapts the store
// library to it), so the engine does not depend on the store. Calls come from the thread
// that acquires and from the I/O thread: implementations are thread-safe.
class ExpertStoreLink {
public:
    struct Record {
        int fd = -1;          // readable with O_DIRECT where the file system allows
        uint64_t offset = 0;  // aligned
        uint64_t length = 0;
    };
    virtual ~ExpertStoreLink() = default;
    virtual bool find(int layer, int expert, Record *out) = 0;
    // False when the bytes read for find()'s record are not what was stored.
    virtual bool verify(int layer, int expert, const uint8_t *data, uint64_t length) = 0;
    // Stores (or replaces) an expert's record: gate, up and down, each at an offset
    // aligned to the I/O block, `length` a multiple of it.
    virtual void put(int layer, int expert, const uint8_t *data, uint64_t length) = 0;
    // Adds use counts (counts[layer * n_expert + e]) to the persisted statistics.
    virtual void add_usage(const std::vector<uint32_t> &counts, int n_expert) = 0;
    // The most used experts first, at most `max`, as (layer, expert).
    virtual std::vector<std::pair<int, int>> hot_set(size_t max) = 0;
};

struct ExpertStreamingOptions {
    bool enabled = false;
    bool cold = false;              // start with an empty cache (no prewarm of the hot set)
    uint64_t cache_experts = 0;     // budget in experts, or
    uint64_t cache_bytes = 0;       // in bytes (both 0: kDefaultCacheBytes)
    // With the CUDA backend the budget above is VRAM and the RAM tier the VRAM slots are
    // filled from holds this many bytes (0: kDefaultHostTierBytes).
    uint64_t host_cache_bytes = 0;
    bool prefetch = true;
    unsigned queue_depth = 64;      // reads in flight per batch
    std::shared_ptr<ExpertStoreLink> store;  // optional, or made by open_store(model fingerprint)
    std::function<std::shared_ptr<ExpertStoreLink>(uint64_t fingerprint)> open_store;
    static constexpr uint64_t kDefaultCacheBytes = uint64_t(4) << 30;
    static constexpr uint64_t kDefaultHostTierBytes = uint64_t(2) << 30;
};

class StreamingExperts final : public ExpertSource {
public:
    // Throws ds4::Error when the files cannot be opened or the budget holds fewer experts
    // than one token uses in one layer.
    StreamingExperts(const ModelWeights &w, const ModelConfig &c, const gguf::Reader &r,
                     const ExpertStreamingOptions &opt);
    ~StreamingExperts() override;

    void acquire(int layer, std::span<const int> ids, ExpertView *out) override;
    void release() override;
    size_t max_acquire() const override { return capacity_; }
    void prefetch(int layer, std::span<const int> ids) override;
    const LayerWeights *predictor(int layer) const override;
    void prewarm() override;
    ExpertSourceStats stats() const override;

    // Bytes of one record in the store layout (gate, up, down each rounded to the block).
    uint64_t record_bytes(int layer) const;
    // Whether the expert is loaded in the cache now (what a prewarm brought in, for tests).
    bool cached(int layer, int expert) const;
    // Hands the use counts gathered so far to the store (also done every so many tokens
    // and on destruction).
    void flush_usage();

private:
    enum class State : uint8_t { Empty, Loading, Ready };
    struct Slot {
        int key = -1;           // layer * n_expert + expert
        State state = State::Empty;
        bool prefetched = false;
        bool from_store = false;
        int pins = 0;
        uint64_t tick = 0;
        uint64_t piece[3] = {0, 0, 0};  // offsets of gate/up/down inside the slot
    };
    struct Piece {            // one expert matrix of one layer
        int fd = -1;
        uint64_t base = 0;     // file offset of expert 0
        uint64_t bytes = 0;    // per expert
    };
    struct Load {
        int slot;
        int key;
        bool store = false;
        ExpertStoreLink::Record rec{};
    };

    uint8_t *slot_data(int s) { return buf_.data() + (uint64_t)s * slot_bytes_; }
    // Takes a free or evictable slot (lock held); -1 when none and !wait.
    int take_slot(std::unique_lock<std::mutex> &lk, bool wait);
    // Reads the loads' experts into their slots (no lock held); throws on I/O errors.
    void load(io::ExtentReader &reader, std::vector<Load> &loads, bool prefetch);
    void unpin_thread_locked(std::thread::id t);
    // Returns the slots of failed loads to the free pool (lock not held).
    void abandon(const std::vector<Load> &loads);
    void io_thread();

    const ModelWeights &w_;
    const int n_layer_, n_expert_, n_used_;
    std::vector<std::string> files_;
    std::vector<int> fds_;
    std::vector<Piece> pieces_;  // [layer * 3 + which]
    uint64_t slot_bytes_ = 0;
    size_t capacity_ = 0;
    ExpertStreamingOptions opt_;
    io::AlignedBuffer buf_;

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<Slot> slots_;
    std::vector<int> slot_of_;  // [key] -> slot or -1
    std::vector<uint32_t> usage_;      // since the last flush
    std::vector<uint64_t> layer_epoch_;  // acquires per layer (stale prefetches are dropped)
    std::unordered_map<std::thread::id, std::vector<int>> held_;
    uint64_t tick_ = 0;
    ExpertSourceStats st_;
    uint64_t tokens_since_flush_ = 0;
    int reading_ = 0;            // batches in flight (demand and prefetch)
    uint64_t busy_since_ = 0;

    std::mutex demand_mu_;  // one demand reader
    io::ExtentReader demand_reader_;

    struct Job {
        int layer;
        uint64_t epoch;
        std::vector<int> ids;
    };
    std::deque<Job> jobs_;
    bool stop_ = false;
    std::thread io_;
};

}  // namespace ds4
