#include "cuda/cuda_state.h"

namespace ds4::cuda {

CudaSessionState::CudaSessionState(const CacheGeometry &g) : SessionState(g) {
    layers.resize(g.layers.size());
    for (size_t l = 0; l < g.layers.size(); ++l) {
        const LayerGeometry &lg = g.layers[l];
        DevLayer &L = layers[l];
        L.cap_kv = lg.cap_kv;
        L.kv.zeros((size_t)lg.cap_kv * g.head_dim);
        for (auto [cg, c] : {std::pair{&lg.comp, &L.comp}, std::pair{&lg.icomp, &L.icomp}}) {
            c->g = *cg;
            if (!cg->present()) continue;
            c->kv.zeros((size_t)cg->cap * cg->width);
            c->gate.zeros((size_t)cg->cap * cg->width);
        }
    }
}

void CudaSessionState::need_entries(DevComp &c, int n, cudaStream_t stream) {
    if ((size_t)n * c.g.dim <= c.entries.size()) return;
    if (n > c.g.max_entries) failf("internal: compressed entries exceed capacity (%d > %d)", n, c.g.max_entries);
    settle(stream);
    DS4_CUDA_CHECK(cudaStreamSynchronize(stream));
    c.entries.need((size_t)entry_capacity(n, c.g.max_entries) * c.g.dim, true);
}

uint64_t CudaSessionState::memory_bytes() const {
    uint64_t b = 0;
    for (const DevLayer &L : layers) {
        b += L.kv.bytes();
        for (const DevComp *c : {&L.comp, &L.icomp}) b += c->kv.bytes() + c->gate.bytes() + c->entries.bytes();
    }
    return b;
}

namespace {

struct Span {
    float *base;
    int cap;     // ring rows; 0 for an entry array
    int width;
    int limit;   // entries: capacity
};

Span locate(const DevLayer &L, const CacheGeometry &g, int layer, Cache which) {
    float *base = nullptr;
    switch (which) {
    case Cache::Kv: base = L.kv.get(); break;
    case Cache::CompKv: base = L.comp.kv.get(); break;
    case Cache::CompGate: base = L.comp.gate.get(); break;
    case Cache::CompEntries: base = L.comp.entries.get(); break;
    case Cache::IcompKv: base = L.icomp.kv.get(); break;
    case Cache::IcompGate: base = L.icomp.gate.get(); break;
    case Cache::IcompEntries: base = L.icomp.entries.get(); break;
    }
    const CacheShape sh = cache_shape(g, layer, which);
    int limit = sh.limit;
    if (sh.cap == 0 && sh.width)   // entry arrays: only the rows grown so far exist
        limit = (int)((which == Cache::CompEntries ? L.comp : L.icomp).entries.size() / (size_t)sh.width);
    return {base, sh.cap, sh.width, limit};
}

// Visits the contiguous pieces of rows [first, first+n) of a ring (or entry array).
template <class F>
void pieces(const Span &s, int64_t first, int64_t n, F &&f) {
    if (s.cap == 0) {
        if (first < 0 || first + n > s.limit) failf("internal: entries [%lld, +%lld) out of range", (long long)first, (long long)n);
        if (n) f(s.base + first * s.width, (int64_t)0, n);
        return;
    }
    if (n > s.cap) failf("internal: %lld ring rows, the ring holds %d", (long long)n, s.cap);
    int64_t done = 0;
    while (done < n) {
        const int64_t slot = (first + done) % s.cap, run = std::min<int64_t>(n - done, s.cap - slot);
        f(s.base + slot * s.width, done, run);
        done += run;
    }
}

}  // namespace

void CudaSessionState::read(int layer, Cache which, int64_t first, int64_t n, float *dst) const {
    const Span s = locate(layers.at(layer), geometry(), layer, which);
    if (s.width == 0) failf("internal: layer %d has no such cache", layer);
    settle_thread();
    pieces(s, first, n, [&](float *dev, int64_t off, int64_t rows) {
        DS4_CUDA_CHECK(cudaMemcpy(dst + off * s.width, dev, sizeof(float) * rows * s.width, cudaMemcpyDeviceToHost));
    });
}

void CudaSessionState::write(int layer, Cache which, int64_t first, int64_t n, const float *src) {
    if (which == Cache::CompEntries || which == Cache::IcompEntries) {
        DevComp &c = which == Cache::CompEntries ? layers.at(layer).comp : layers.at(layer).icomp;
        if (c.g.present() && first >= 0 && n >= 0 && first + n <= c.g.max_entries) need_entries(c, (int)(first + n), 0);
    }
    const Span s = locate(layers.at(layer), geometry(), layer, which);
    if (s.width == 0) failf("internal: layer %d has no such cache", layer);
    settle_thread();
    pieces(s, first, n, [&](float *dev, int64_t off, int64_t rows) {
        DS4_CUDA_CHECK(cudaMemcpy(dev, src + off * s.width, sizeof(float) * rows * s.width, cudaMemcpyHostToDevice));
    });
}

void CudaSessionState::will_write(float *ring, int cap, int width, int64_t n0, int n, cudaStream_t stream) {
    if (!journaling_) return;
    settle(stream);
    const size_t need = saved_used_ + (size_t)n * width;
    saved_.need(need, true);
    for (int i = 0; i < n; ++i) {
        const int64_t pos = n0 + i;
        float *row = ring + (pos % cap) * width;
        DS4_CUDA_CHECK(cudaMemcpyAsync(saved_.get() + saved_used_, row, sizeof(float) * width, cudaMemcpyDeviceToDevice, stream));
        journal_.push_back({row, pos, saved_used_, width});
        saved_used_ += width;
    }
}

void CudaSessionState::journal_begin() {
    journal_.clear();
    saved_used_ = 0;
    journaling_ = true;
}

void CudaSessionState::journal_undo_from(int64_t pos) {
    settle_thread();
    DS4_CUDA_CHECK(cudaDeviceSynchronize());
    for (size_t i = journal_.size(); i-- > 0;) {
        const Saved &s = journal_[i];
        if (s.pos >= pos)
            DS4_CUDA_CHECK(cudaMemcpy(s.row, saved_.get() + s.off, sizeof(float) * s.width, cudaMemcpyDeviceToDevice));
    }
    journal_end();
}

void CudaSessionState::journal_end() {
    journaling_ = false;
    journal_.clear();
    saved_used_ = 0;
}

}  // namespace ds4::cuda
