#include "cuda/cuda_weight_layout.h"

#include <cstring>

namespace ds4::cuda {

namespace {

// FNV-1a over 8-byte words (the derived ranges are small: norms, rope tables).
struct LayoutHash {
    uint64_t h = 1469598103934665603ull;
    void word(uint64_t v) { h = (h ^ v) * 1099511628211ull; }
    void bytes(const uint8_t *p, uint64_t n) {
        uint64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            uint64_t v;
            std::memcpy(&v, p + i, 8);
            word(v);
        }
        uint64_t tail = 0;
        if (i < n) std::memcpy(&tail, p + i, size_t(n - i));
        word(tail);
    }
};

}  // namespace

bool is_routed_expert(const gguf::TensorInfo &t) { return t.name.find("_exps.") != std::string::npos; }

uint64_t routed_expert_bytes(const gguf::Reader &r) {
    uint64_t n = 0;
    for (const gguf::TensorInfo &t : r.tensors())
        if (is_routed_expert(t)) n += t.nbytes;
    return n;
}

WeightLayout plan_weight_layout(const gguf::Reader &r, const ModelWeights &w, const std::vector<HostRange> &extra,
                                bool skip_routed_experts) {
    WeightLayout L;
    uint64_t off = 0;
    auto add = [&](const void *p, uint64_t n, bool derived) {
        if (!p || !n) return;
        L.ranges.push_back({static_cast<const uint8_t *>(p), n, off, derived});
        off = (off + n + WeightLayout::kAlign - 1) / WeightLayout::kAlign * WeightLayout::kAlign;
    };
    for (const gguf::TensorInfo &t : r.tensors())
        if (!skip_routed_experts || !is_routed_expert(t)) add(t.data, t.nbytes, false);
    auto vec = [&](const std::vector<float> &v) { add(v.data(), v.size() * sizeof(float), true); };
    vec(w.output_norm), vec(w.output_hc_base), vec(w.output_hc_scale);
    for (const LayerWeights &Lw : w.layers) {
        for (const std::vector<float> *v : {&Lw.attn_norm, &Lw.ffn_norm, &Lw.hc_attn_base, &Lw.hc_attn_scale,
                                            &Lw.hc_ffn_base, &Lw.hc_ffn_scale, &Lw.q_a_norm, &Lw.kv_norm, &Lw.sinks,
                                            &Lw.probs_b, &Lw.comp.ape, &Lw.comp.norm, &Lw.icomp.ape, &Lw.icomp.norm})
            vec(*v);
    }
    for (const HostRange &e : extra) add(e.p, e.n, true);
    L.bytes = off;
    // A library that binds differently (another version) gets another hash and is refused.
    LayoutHash lh;
    lh.word(L.ranges.size());
    lh.word(skip_routed_experts);
    lh.word(L.bytes);
    for (const WeightLayout::Range &p : L.ranges) {
        lh.word(p.n), lh.word(p.offset), lh.word(p.derived);
        if (p.derived) lh.bytes(p.host, p.n);
    }
    L.hash = lh.h;
    return L;
}

}  // namespace ds4::cuda
