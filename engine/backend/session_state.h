// A session's cache state as the backends hold it, and its geometry.
//
// The geometry (how many rows each ring keeps, how many compressed entries fit) follows
// from the model and the session's limits and is worked out once, here, above the
// backends. The bytes live in the backend's memory (host vectors on the CPU, device
// memory on a GPU); the host sees them only through read()/write(), which the payload
// tail codec and the tests use, so a payload saved by one backend loads on another.
//
// Rings are indexed by absolute position: position p of a ring with `cap` rows lives in
// row p % cap. Compressed entries are a plain array: entry w covers tokens [w*r, (w+1)*r).
// The rings are sized once (they do not depend on how many tokens are held); the entry
// arrays grow as entries close (entry_capacity), so a session's memory follows the tokens
// it has held, not its context: bytes_holding(n) is what a session that has held n tokens
// occupies, whatever the backend.
//
// Journal (speculative trial/commit): between journal_begin() and journal_end(), every
// ring row a step overwrites is recorded with its old contents first, so
// journal_undo_from(p) can put back the rows that positions >= p replaced, without
// running the forward again. Entries need no journal: entries past p / ratio are ignored
// once the counts are rolled back, and earlier ones depend only on kept positions.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/model/config.h"

namespace ds4 {

struct CompGeometry {
    int ratio = 0, width = 0, dim = 0, cap = 0, max_entries = 0;
    bool overlap = false;   // CSA: entry w also mixes window w-1's first-half channels
    bool present() const { return ratio != 0; }
    // First position whose projections are still needed once n tokens are processed.
    int64_t needed_from(int64_t n) const {
        int64_t start = (n / ratio) * ratio;
        if (overlap) start = std::max<int64_t>(0, start - ratio);
        return start;
    }
};

struct LayerGeometry {
    int cap_kv = 0;           // sliding-window K=V ring rows
    CompGeometry comp;        // CSA and HCA layers
    CompGeometry icomp;       // CSA: the indexer's compressor
};

struct CacheGeometry {
    int head_dim = 0;
    int ctx = 0;
    int chunk_cap = 0;   // most rows of this session one attention pass writes (make's chunk_cap)
    std::vector<LayerGeometry> layers;
    // chunk_cap: most rows of this session in one step; slack: extra ring rows kept so
    // short rewinds stay in place.
    static CacheGeometry make(const ModelConfig &c, int ctx, int chunk_cap, int slack);
    uint64_t bytes() const;   // f32 bytes of every ring and entry array at full context
    // f32 bytes once the session has held n tokens (rings + entry arrays grown for them).
    uint64_t bytes_holding(int64_t n) const;
};

// Rows an entry array holds once `needed` entries exist: steps of 1/8 of the largest power
// of two <= needed (at least 64 rows), capped at max_entries. Memory follows use within an
// eighth, and growing copies each entry a bounded number of times on average.
int entry_capacity(int needed, int max_entries);

// Which of a layer's caches a read/write addresses.
enum class Cache : uint8_t { Kv, CompKv, CompGate, CompEntries, IcompKv, IcompGate, IcompEntries };

// Where rows of one cache go: a ring of cap rows by absolute position, or (cap 0) an entry
// array of limit rows. width 0: the layer has no such cache.
struct CacheShape {
    int cap = 0, width = 0, limit = 0;
};
CacheShape cache_shape(const CacheGeometry &g, int layer, Cache which);

class SessionState {
public:
    explicit SessionState(CacheGeometry g) : geo_(std::move(g)), n_entries_(2 * geo_.layers.size(), 0) {}
    virtual ~SessionState() = default;
    SessionState(const SessionState &) = delete;
    SessionState &operator=(const SessionState &) = delete;

    const CacheGeometry &geometry() const { return geo_; }
    // Compressed entries emitted so far (which: 0 = main compressor, 1 = indexer's).
    int n_entries(int layer, int which) const { return n_entries_[2 * layer + which]; }
    void set_n_entries(int layer, int which, int n) { n_entries_[2 * layer + which] = n; }
    // Rolls the entry counts back to what n processed tokens have closed.
    void truncate_entries(int64_t n) {
        for (size_t l = 0; l < geo_.layers.size(); ++l) {
            const LayerGeometry &g = geo_.layers[l];
            if (g.comp.present()) n_entries_[2 * l] = (int)(n / g.comp.ratio);
            if (g.icomp.present()) n_entries_[2 * l + 1] = (int)(n / g.icomp.ratio);
        }
    }

    virtual uint64_t memory_bytes() const = 0;   // what the caches occupy now
    // Rows [first, first+n) of a cache (absolute positions for rings, entry indices for
    // entries) to or from host floats. Ring reads must name positions the ring still holds.
    virtual void read(int layer, Cache which, int64_t first, int64_t n, float *dst) const = 0;
    virtual void write(int layer, Cache which, int64_t first, int64_t n, const float *src) = 0;

    virtual void journal_begin() = 0;
    virtual void journal_undo_from(int64_t pos) = 0;
    virtual void journal_end() = 0;

private:
    CacheGeometry geo_;
    std::vector<int> n_entries_;
};

}  // namespace ds4
