// Session internals shared by session.cpp (API, caches, payload tail) and forward.cpp
// (the math). Not part of the engine's public surface.
#pragma once
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "engine/model/session.h"

namespace ds4 {

// One compressor's state: projections of recent tokens (a ring by absolute position, the
// gate already including the position bias) and the compressed entries emitted so far
// (entry w covers tokens [w*r, (w+1)*r)).
struct CompState {
    int ratio = 0, width = 0, dim = 0, cap = 0, max_entries = 0;
    bool overlap = false;          // CSA: entry w also mixes window w-1's first-half channels
    std::vector<float> kv, gate;   // [cap][width]
    std::vector<float> entries;    // [max_entries][dim]
    int n_entries = 0;

    float *kv_row(int64_t pos) { return kv.data() + (pos % cap) * width; }
    float *gate_row(int64_t pos) { return gate.data() + (pos % cap) * width; }
    float *entry(int w) { return entries.data() + (size_t)w * dim; }
    // First position whose projections are still needed once n tokens are processed.
    int64_t needed_from(int64_t n) const {
        int64_t start = (n / ratio) * ratio;
        if (overlap) start = std::max<int64_t>(0, start - ratio);
        return start;
    }
};

struct LayerState {
    int cap_kv = 0;
    std::vector<float> kv;   // [cap_kv][head_dim]: normed, RoPE'd K=V rows
    CompState comp, icomp;
    float *kv_row(int64_t pos, int hd) { return kv.data() + (pos % cap_kv) * hd; }
};

struct IndexScore {
    float score;
    int idx;
};

// Scratch of one pool thread inside the forward pass's parallel loops (indexed by the
// loop's thread index): reused, so a decode step does not allocate.
struct TaskScratch {
    std::vector<float> cos, sin;   // RoPE tables at one position
    void need_rope(size_t n_pairs) {
        if (cos.size() < n_pairs) cos.resize(n_pairs), sin.resize(n_pairs);
    }
    std::vector<float> f;          // one loop body's working floats
    std::vector<const float *> rows;
    std::vector<IndexScore> scores;
};

struct Session::Impl {
    std::vector<LayerState> layers;
    // Scratch, grown on demand and reused across calls.
    std::vector<float> H, flat, mix, post, comb, X, XN, A;
    std::vector<float> qr, q, o, oa, p1, p2, iq, iw, head, g, u, ein, eout;
    std::vector<float> kvb, router, expert_w, logits_out;
    std::vector<int> expert_ids, expert_order;
    std::vector<std::vector<int>> sel;                         // indexer picks per token
    std::vector<std::vector<std::pair<int, float>>> by_expert; // (token, weight) per expert
    std::vector<uint8_t> xq;
    std::vector<TaskScratch> tasks;
};

template <class V>
inline void grow(V &v, size_t n) {
    if (v.size() < n) v.resize(n);
}

}  // namespace ds4
