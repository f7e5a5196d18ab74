#include "engine/model/step.h"

#include <algorithm>
#include <vector>

#include "engine/model/model.h"

namespace ds4 {

namespace {

// Ends of the row ranges whose attention runs in one pass: a segment longer than its
// session's rings hold (chunk_cap rows beyond the window) is cut into pieces of that many
// rows, in order, each piece a range of its own together with the neighbouring short
// segments. Each piece then sees the ring as a step of chunk_cap rows would.
void attention_ends(const StepLayout &lay, std::vector<int> &ends) {
    ends.clear();
    for (const StepSegment &sg : lay.segs) {
        const int cap = std::max(1, sg.state->geometry().chunk_cap);
        for (int a = sg.row0 + cap; a < sg.row0 + sg.n; a += cap) ends.push_back(a);
    }
    ends.push_back(lay.rows());
}

}  // namespace

void run_step(const Model &m, Executor &ex, const StepLayout &lay, std::span<const int> logit_rows, float *logits) {
    const ModelConfig &c = m.config();
    const ModelWeights &w = m.weights();
    thread_local std::vector<int> ends;
    attention_ends(lay, ends);
    ex.begin(lay);
    ex.embed(w.token_embd);
    for (int l = 0; l < c.n_layer; ++l) {
        const LayerWeights &L = w.layers[l];
        // Attention sublayer. Layer kinds: sliding window only (ratio 0); CSA (the smallest
        // ratio, overlapping windows, the indexer picks top-k entries); HCA (every closed
        // entry visible). Compressed layers use the compressed-rope tables throughout.
        const bool compressed = c.compress_ratio[l] != 0;
        const Rope &rope = m.rope(compressed);
        ex.hc_pre(L.hc_attn_fn, L.hc_attn_base.data(), L.hc_attn_scale.data());
        ex.norm(L.attn_norm.data());
        for (size_t i = 0; i < ends.size(); ++i) {
            if (ends.size() > 1) ex.attention_rows(i ? ends[i - 1] : 0, ends[i]);
            ex.q_kv(l, L, rope);
            if (compressed) {
                ex.compress(l, 0, L.comp, m.rope(true));
                if (c.is_csa(l)) {
                    ex.compress(l, 1, L.icomp, m.rope(true));
                    ex.indexer_topk(l, L, m.rope(true), c.indexer_topk);
                }
            }
            ex.attend(l, AttnSpec{c.sliding_window, c.compress_ratio[l], c.is_csa(l)}, L.sinks.data(), rope);
        }
        if (ends.size() > 1) ex.attention_rows(0, lay.rows());
        ex.out_proj(L);
        ex.hc_post();
        // Feed-forward sublayer: routed experts (hash-routed in the first layers) + shared.
        ex.hc_pre(L.hc_ffn_fn, L.hc_ffn_base.data(), L.hc_ffn_scale.data());
        ex.norm(L.ffn_norm.data());
        ex.route(l, L, c.is_hash(l));
        ex.routed_experts(l, L, m.experts());
        if (c.n_expert_shared) ex.shared_expert(l, L);
        ex.hc_post();
    }
    ex.head(w, logit_rows, logits);
}

}  // namespace ds4
