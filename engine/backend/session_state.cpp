#include "engine/backend/session_state.h"

namespace ds4 {

CacheGeometry CacheGeometry::make(const ModelConfig &c, int ctx, int chunk_cap, int slack) {
    CacheGeometry g;
    g.head_dim = c.head_dim;
    g.ctx = ctx;
    g.chunk_cap = std::min(ctx, chunk_cap);
    g.layers.resize(c.n_layer);
    for (int l = 0; l < c.n_layer; ++l) {
        LayerGeometry &L = g.layers[l];
        // The window's older rows, plus a whole chunk written in one step, plus the slack.
        L.cap_kv = std::min(ctx, c.sliding_window - 1 + chunk_cap + slack);
        const int r = c.compress_ratio[l];
        if (!r) continue;
        auto init = [&](CompGeometry &cg, int dim, bool overlap) {
            cg.ratio = r;
            cg.dim = dim;
            cg.overlap = overlap;
            cg.width = overlap ? 2 * dim : dim;
            // An open window and the one before it (the overlap), plus a chunk, plus slack.
            cg.cap = std::min(ctx, 2 * r + chunk_cap + slack);
            cg.max_entries = ctx / r;
        };
        init(L.comp, c.head_dim, c.is_csa(l));
        if (c.is_csa(l)) init(L.icomp, c.indexer_dim, true);
    }
    return g;
}

CacheShape cache_shape(const CacheGeometry &g, int layer, Cache which) {
    const LayerGeometry &L = g.layers.at(layer);
    switch (which) {
    case Cache::Kv: return {L.cap_kv, g.head_dim, 0};
    case Cache::CompKv:
    case Cache::CompGate: return {L.comp.cap, L.comp.width, 0};
    case Cache::CompEntries: return {0, L.comp.dim, L.comp.max_entries};
    case Cache::IcompKv:
    case Cache::IcompGate: return {L.icomp.cap, L.icomp.width, 0};
    case Cache::IcompEntries: return {0, L.icomp.dim, L.icomp.max_entries};
    }
    return {};
}

int entry_capacity(int needed, int max_entries) {
    if (needed <= 0) return 0;
    int64_t top = 1;
    while (top * 2 <= needed) top *= 2;
    const int64_t step = std::max<int64_t>(64, top / 8);
    return (int)std::min<int64_t>(max_entries, (needed + step - 1) / step * step);
}

uint64_t CacheGeometry::bytes_holding(int64_t n) const {
    n = std::clamp<int64_t>(n, 0, ctx);
    uint64_t b = 0;
    for (const LayerGeometry &L : layers) {
        b += (uint64_t)L.cap_kv * head_dim;
        for (const CompGeometry *cg : {&L.comp, &L.icomp})
            if (cg->present())
                b += 2ull * cg->cap * cg->width + (uint64_t)entry_capacity((int)(n / cg->ratio), cg->max_entries) * cg->dim;
    }
    return b * sizeof(float);
}

uint64_t CacheGeometry::bytes() const {
    uint64_t b = 0;
    for (const LayerGeometry &L : layers) {
        b += (uint64_t)L.cap_kv * head_dim;
        for (const CompGeometry *cg : {&L.comp, &L.icomp})
            if (cg->present()) b += 2ull * cg->cap * cg->width + (uint64_t)cg->max_entries * cg->dim;
    }
    return b * sizeof(float);
}

}  // namespace ds4
