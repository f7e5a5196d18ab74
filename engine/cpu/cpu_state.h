// A session's caches in host memory: f32 rings and entry arrays laid out as the geometry
// says, plus the trial journal (session_state.h explains both).
#pragma once
#include <cstring>
#include <vector>

#include "engine/backend/session_state.h"
#include "engine/quant/cache_aligned.h"

namespace ds4 {

// Host float arrays start on a cache line: from malloc (16 bytes past one) every other
// 256-bit load and every 512-bit load of a row straddles two lines, and issues at half rate.
using FloatVec = quant::CacheAlignedVector<float>;

struct CpuComp {
    CompGeometry g;
    FloatVec kv, gate;             // [cap][width]
    // [entry_capacity(closed entries)][dim], grown by need_entries; blocked (the indexer's
    // entries where ops::indexer_score16_kt takes them): blocks of 16 entries stored
    // position-major, element i of entry 16 B + e at B * 16 * dim + i * 16 + e, the layout
    // the scoring kernel reads. Laid out once as entries close; before, every step
    // transposed every entry it scored (an 8-head model's 16K decode: ~8% of its time).
    FloatVec entries;
    bool blocked = false;
    const float *kv_row(int64_t pos) const { return kv.data() + (pos % g.cap) * g.width; }
    const float *gate_row(int64_t pos) const { return gate.data() + (pos % g.cap) * g.width; }
    // Row-major entries only.
    float *entry(int w) { return entries.data() + (size_t)w * g.dim; }
    const float *entry(int w) const { return entries.data() + (size_t)w * g.dim; }
    // Blocked entries only: block b (entries 16 b .. 16 b + 15), and one entry in or out.
    const float *block(int b) const { return entries.data() + (size_t)b * 16 * g.dim; }
    void put_entry(int w, const float *row) {
        float *d = entries.data() + (size_t)(w / 16) * 16 * g.dim + w % 16;
        for (int i = 0; i < g.dim; ++i) d[(size_t)i * 16] = row[i];
    }
    void get_entry(int w, float *row) const {
        const float *s = entries.data() + (size_t)(w / 16) * 16 * g.dim + w % 16;
        for (int i = 0; i < g.dim; ++i) row[i] = s[(size_t)i * 16];
    }
};

struct CpuLayer {
    int cap_kv = 0, hd = 0;
    FloatVec kv;             // [cap_kv][head_dim]: normed, rotated K=V rows
    CpuComp comp, icomp;
    const float *kv_row(int64_t pos) const { return kv.data() + (pos % cap_kv) * hd; }
};

class CpuSessionState final : public SessionState {
public:
    explicit CpuSessionState(const CacheGeometry &g);
    std::vector<CpuLayer> layers;

    // Ring rows about to be overwritten go through these, so the journal sees them.
    float *kv_row_w(int l, int64_t pos) { return ring_w(layers[l].kv, layers[l].cap_kv, layers[l].hd, pos); }
    float *comp_kv_w(CpuComp &c, int64_t pos) { return ring_w(c.kv, c.g.cap, c.g.width, pos); }
    float *comp_gate_w(CpuComp &c, int64_t pos) { return ring_w(c.gate, c.g.cap, c.g.width, pos); }

    // Room for entries [0, n) of c (grows the array by session_state.h's policy; the
    // contents so far are kept). Called before a step writes entries, never inside one.
    void need_entries(CpuComp &c, int n);

    uint64_t memory_bytes() const override;
    void read(int layer, Cache which, int64_t first, int64_t n, float *dst) const override;
    void write(int layer, Cache which, int64_t first, int64_t n, const float *src) override;
    void journal_begin() override;
    void journal_undo_from(int64_t pos) override;
    void journal_end() override;

private:
    float *ring_w(FloatVec &ring, int cap, int width, int64_t pos) {
        float *row = ring.data() + (pos % cap) * width;
        if (journaling_) record(row, width, pos);
        return row;
    }
    void record(float *row, int width, int64_t pos);

    struct Saved {
        float *row;
        int64_t pos;
        size_t off;   // into saved_
        int width;
    };
    bool journaling_ = false;
    std::vector<Saved> journal_;
    std::vector<float> saved_;
};

}  // namespace ds4
