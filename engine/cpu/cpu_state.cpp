#include "engine/cpu/cpu_state.h"

#include "engine/common/error.h"
#include "engine/kernels/ops.h"

namespace ds4 {

CpuSessionState::CpuSessionState(const CacheGeometry &g) : SessionState(g) {
    layers.resize(g.layers.size());
    for (size_t l = 0; l < g.layers.size(); ++l) {
        const LayerGeometry &lg = g.layers[l];
        CpuLayer &L = layers[l];
        L.cap_kv = lg.cap_kv;
        L.hd = g.head_dim;
        L.kv.assign((size_t)lg.cap_kv * g.head_dim, 0.f);
        for (auto [cg, c] : {std::pair{&lg.comp, &L.comp}, std::pair{&lg.icomp, &L.icomp}}) {
            c->g = *cg;
            if (!cg->present()) continue;
            c->kv.assign((size_t)cg->cap * cg->width, 0.f);
            c->gate.assign((size_t)cg->cap * cg->width, 0.f);
        }
        L.icomp.blocked = lg.icomp.present() && lg.icomp.dim % 8 == 0 && lg.icomp.dim <= ops::kIndexerKeysMaxDim;
    }
}

void CpuSessionState::need_entries(CpuComp &c, int n) {
    if ((size_t)n * c.g.dim <= c.entries.size()) return;
    if (n > c.g.max_entries) failf("internal: compressed entries exceed capacity (%d > %d)", n, c.g.max_entries);
    int cap = entry_capacity(n, c.g.max_entries);
    if (c.blocked) cap = (cap + 15) / 16 * 16;   // whole blocks
    const size_t rows = (size_t)cap * c.g.dim;
    c.entries.reserve(rows);   // exactly: resize alone would double the capacity
    c.entries.resize(rows, 0.f);
}

uint64_t CpuSessionState::memory_bytes() const {
    uint64_t b = 0;
    for (const CpuLayer &L : layers) {
        b += L.kv.size() * sizeof(float);
        for (const CpuComp *c : {&L.comp, &L.icomp}) b += (c->kv.size() + c->gate.size() + c->entries.size()) * sizeof(float);
    }
    return b;
}

namespace {

struct Span {
    float *base;
    CacheShape shape;
};

Span locate(CpuLayer &L, const CacheGeometry &g, int layer, Cache which) {
    float *base = nullptr;
    switch (which) {
    case Cache::Kv: base = L.kv.data(); break;
    case Cache::CompKv: base = L.comp.kv.data(); break;
    case Cache::CompGate: base = L.comp.gate.data(); break;
    case Cache::CompEntries: base = L.comp.entries.data(); break;
    case Cache::IcompKv: base = L.icomp.kv.data(); break;
    case Cache::IcompGate: base = L.icomp.gate.data(); break;
    case Cache::IcompEntries: base = L.icomp.entries.data(); break;
    }
    CacheShape sh = cache_shape(g, layer, which);
    // Entry arrays: only the rows grown so far exist.
    if (sh.cap == 0 && sh.width) {
        const CpuComp &c = (which == Cache::CompEntries) ? L.comp : L.icomp;
        sh.limit = (int)(c.entries.size() / (size_t)sh.width);
    }
    return {base, sh};
}

}  // namespace

void CpuSessionState::read(int layer, Cache which, int64_t first, int64_t n, float *dst) const {
    const Span s = locate(const_cast<CpuLayer &>(layers.at(layer)), geometry(), layer, which);
    const int cap = s.shape.cap, w = s.shape.width;
    if (w == 0) failf("internal: layer %d has no such cache", layer);
    if (cap == 0) {
        if (first < 0 || first + n > s.shape.limit) failf("internal: entries [%lld, +%lld) out of range", (long long)first, (long long)n);
        if (which == Cache::IcompEntries && layers.at(layer).icomp.blocked) {
            for (int64_t i = 0; i < n; ++i) layers.at(layer).icomp.get_entry((int)(first + i), dst + i * w);
            return;
        }
        if (n) std::memcpy(dst, s.base + first * w, sizeof(float) * n * w);
        return;
    }
    if (n > cap) failf("internal: %lld ring rows requested, the ring holds %d", (long long)n, cap);
    for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * w, s.base + ((first + i) % cap) * w, sizeof(float) * w);
}

void CpuSessionState::write(int layer, Cache which, int64_t first, int64_t n, const float *src) {
    if (which == Cache::CompEntries || which == Cache::IcompEntries) {
        CpuComp &c = which == Cache::CompEntries ? layers.at(layer).comp : layers.at(layer).icomp;
        if (c.g.present() && first >= 0 && n >= 0 && first + n <= c.g.max_entries) need_entries(c, (int)(first + n));
    }
    const Span s = locate(layers.at(layer), geometry(), layer, which);
    const int cap = s.shape.cap, w = s.shape.width;
    if (w == 0) failf("internal: layer %d has no such cache", layer);
    if (cap == 0) {
        if (first < 0 || first + n > s.shape.limit) failf("internal: entries [%lld, +%lld) out of range", (long long)first, (long long)n);
        if (which == Cache::IcompEntries && layers.at(layer).icomp.blocked) {
            for (int64_t i = 0; i < n; ++i) layers.at(layer).icomp.put_entry((int)(first + i), src + i * w);
            return;
        }
        if (n) std::memcpy(s.base + first * w, src, sizeof(float) * n * w);
        return;
    }
    if (n > cap) failf("internal: %lld ring rows written, the ring holds %d", (long long)n, cap);
    for (int64_t i = 0; i < n; ++i) std::memcpy(s.base + ((first + i) % cap) * w, src + i * w, sizeof(float) * w);
}

void CpuSessionState::record(float *row, int width, int64_t pos) {
    const size_t off = saved_.size();
    saved_.insert(saved_.end(), row, row + width);
    journal_.push_back({row, pos, off, width});
}

void CpuSessionState::journal_begin() {
    journal_.clear();
    saved_.clear();
    journaling_ = true;
}

void CpuSessionState::journal_undo_from(int64_t pos) {
    // Newest first, so a row written twice ends with its oldest contents.
    for (size_t i = journal_.size(); i-- > 0;) {
        const Saved &s = journal_[i];
        if (s.pos >= pos) std::memcpy(s.row, saved_.data() + s.off, sizeof(float) * s.width);
    }
    journal_end();
}

void CpuSessionState::journal_end() {
    journaling_ = false;
    journal_.clear();
    saved_.clear();
}

}  // namespace ds4
