// The DeepSeek-V4 forward pass over a chunk of tokens (prefill) or one token (decode),
// reading and updating a Session's caches. Every matrix product goes through matmul();
// everything else is per-token vector math from ops.h. Shapes come from ModelConfig.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/common/error.h"
#include "engine/kernels/matmul.h"
#include "engine/kernels/ops.h"
#include "engine/model/session.h"
#include "engine/model/session_impl.h"
#include "engine/quant/quants.h"

namespace ds4 {

namespace {

// Items per task so that a task is worth a wake-up (~64K multiply-adds).
int64_t grain_for(int64_t cost_per_item) { return std::max<int64_t>(1, (64 << 10) / std::max<int64_t>(1, cost_per_item)); }

struct Ctx {
    const ModelConfig &c;
    const ModelWeights &w;
    const Model &m;
    ThreadPool &pool;
    Session::Impl &S;
    const int32_t *tok;
    int T;
    int64_t n0;   // absolute position of the chunk's first token
};

// Hyper-connection "pre": from each token's hc streams compute the collapse weights (pre),
// the output placement (post) and the doubly stochastic mixer (comb, by Sinkhorn), and
// collapse the streams into X. H: [T][hc][D]; comb[t][j][k].
void hc_pre(Ctx &x, const WeightView &fn, const std::vector<float> &base, const std::vector<float> &scale,
            const float *H, float *post, float *comb, float *X) {
    const ModelConfig &c = x.c;
    const int hc = c.hc_mult, D = c.n_embd, nmix = (2 + hc) * hc;
    Session::Impl &S = x.S;
    grow(S.flat, (size_t)x.T * hc * D);
    grow(S.mix, (size_t)x.T * nmix);
    x.pool.parallel_for(x.T, grain_for((int64_t)hc * D), [&](int64_t b, int64_t e, int) {
        for (int64_t t = b; t < e; ++t)
            ops::rmsnorm(H + t * hc * D, (int64_t)hc * D, nullptr, c.rms_eps, S.flat.data() + t * hc * D);
    });
    matmul(x.pool, fn, S.flat.data(), x.T, (int64_t)hc * D, S.mix.data(), nmix);
    x.pool.parallel_for(x.T, grain_for((int64_t)hc * D + 40 * hc * hc * c.hc_iters), [&](int64_t b, int64_t e, int) {
        for (int64_t t = b; t < e; ++t) {
            const float *m = S.mix.data() + (size_t)t * nmix;
            float pre[16];
            for (int k = 0; k < hc; ++k) {
                pre[k] = ops::sigmoid(m[k] * scale[0] + base[k]) + c.hc_eps;
                post[t * hc + k] = 2.f * ops::sigmoid(m[hc + k] * scale[1] + base[hc + k]);
            }
            float *cb = comb + (size_t)t * hc * hc;
            for (int j = 0; j < hc; ++j) {
                for (int k = 0; k < hc; ++k) cb[j * hc + k] = m[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
                ops::softmax(cb + j * hc, hc);
                for (int k = 0; k < hc; ++k) cb[j * hc + k] += c.hc_eps;
            }
            auto norm_cols = [&] {
                for (int k = 0; k < hc; ++k) {
                    float s = 0;
                    for (int j = 0; j < hc; ++j) s += cb[j * hc + k];
                    for (int j = 0; j < hc; ++j) cb[j * hc + k] /= s + c.hc_eps;
                }
            };
            auto norm_rows = [&] {
                for (int j = 0; j < hc; ++j) {
                    float s = 0;
                    for (int k = 0; k < hc; ++k) s += cb[j * hc + k];
                    for (int k = 0; k < hc; ++k) cb[j * hc + k] /= s + c.hc_eps;
                }
            };
            norm_cols();
            for (int it = 1; it < c.hc_iters; ++it) {
                norm_rows();
                norm_cols();
            }
            float *xo = X + (size_t)t * D;
            const float *h = H + (size_t)t * hc * D;
            for (int d = 0; d < D; ++d) xo[d] = 0;
            for (int k = 0; k < hc; ++k) ops::axpy(pre[k], h + (size_t)k * D, xo, D);
        }
    });
}

// Hyper-connection "post": new stream k = post[k] * out + sum_j comb[j][k] * old stream j.
void hc_post(Ctx &x, const float *post, const float *comb, const float *out, float *H) {
    const int hc = x.c.hc_mult, D = x.c.n_embd;
    x.pool.parallel_for(x.T, grain_for((int64_t)hc * hc * D), [&](int64_t b, int64_t e, int th) {
        std::vector<float> &old = x.S.tasks[th].f;
        grow(old, (size_t)hc * D);
        for (int64_t t = b; t < e; ++t) {
            float *h = H + t * hc * D;
            std::memcpy(old.data(), h, sizeof(float) * hc * D);
            const float *cb = comb + t * hc * hc;
            const float *o = out + t * D;
            for (int k = 0; k < hc; ++k) {
                float *hk = h + (size_t)k * D;
                const float pk = post[t * hc + k];
                for (int d = 0; d < D; ++d) hk[d] = pk * o[d];
                for (int j = 0; j < hc; ++j) ops::axpy(cb[j * hc + k], old.data() + (size_t)j * D, hk, D);
            }
        }
    });
}

// Projects the chunk into a compressor's ring and emits the entry of every window that
// closes inside the chunk: per channel, a softmax over the window's slots (gate + learned
// position bias) weights the projected values; then RMSNorm and RoPE at the window's
// first position. CSA entries also take window w-1's first-half channels as extra slots
// (the overlap); the ring still holds them, also across calls.
void compress(Ctx &x, CompState &cs, const CompressorWeights &cw, const float *XN) {
    const int r = cs.ratio, wd = cs.width, dim = cs.dim, T = x.T;
    Session::Impl &S = x.S;
    grow(S.p1, (size_t)T * wd);
    grow(S.p2, (size_t)T * wd);
    matmul(x.pool, cw.kv, XN, T, x.c.n_embd, S.p1.data(), wd);
    matmul(x.pool, cw.gate, XN, T, x.c.n_embd, S.p2.data(), wd);
    for (int t = 0; t < T; ++t) {
        const int64_t pos = x.n0 + t;
        std::memcpy(cs.kv_row(pos), S.p1.data() + (size_t)t * wd, sizeof(float) * wd);
        const float *ape = cw.ape.data() + (size_t)(pos % r) * wd;
        const float *src = S.p2.data() + (size_t)t * wd;
        float *g = cs.gate_row(pos);
        for (int i = 0; i < wd; ++i) g[i] = src[i] + ape[i];
    }
    const int first = cs.n_entries, last = (int)((x.n0 + T) / r);   // entries [first, last) close now
    if (last > cs.max_entries) failf("internal: compressed entries exceed capacity (%d > %d)", last, cs.max_entries);
    const Rope &rope = x.m.rope(true);
    x.pool.parallel_for(last - first, grain_for((int64_t)dim * r * 4), [&](int64_t b, int64_t e, int th) {
        TaskScratch &ts = S.tasks[th];
        grow(ts.f, 2 * r);
        ts.need_rope(rope.n_pairs);
        float *lg = ts.f.data();
        for (int64_t wi = first + b; wi < first + e; ++wi) {
            float *out = cs.entry((int)wi);
            const int64_t start = wi * r;
            const bool prev = cs.overlap && wi > 0;
            for (int ch = 0; ch < dim; ++ch) {
                int n = 0;
                float mx = -INFINITY;
                if (prev)
                    for (int j = 0; j < r; ++j) mx = std::max(mx, lg[n++] = cs.gate_row(start - r + j)[ch]);
                const int off = cs.overlap ? dim : 0;
                for (int j = 0; j < r; ++j) mx = std::max(mx, lg[n++] = cs.gate_row(start + j)[off + ch]);
                double den = 0;
                for (int i = 0; i < n; ++i) den += lg[i] = std::exp(lg[i] - mx);
                double acc = 0;
                n = 0;
                if (prev)
                    for (int j = 0; j < r; ++j) acc += (double)lg[n++] * cs.kv_row(start - r + j)[ch];
                for (int j = 0; j < r; ++j) acc += (double)lg[n++] * cs.kv_row(start + j)[off + ch];
                out[ch] = (float)(acc / den);
            }
            ops::rmsnorm(out, dim, cw.norm.data(), x.c.rms_eps, out);
            rope.cos_sin(start, ts.cos.data(), ts.sin.data());
            ops::rope_apply(out, dim, rope.n_pairs, ts.cos.data(), ts.sin.data(), 1.f);
        }
    });
    cs.n_entries = last;
}

// Lightning indexer: score every compressed entry visible to each query by
// sum_h w_h * ReLU(q_h . k) and keep the top-k (ties: lower entry index first).
void indexer_select(Ctx &x, const LayerWeights &L, CompState &ics, const float *QR, const float *XN,
                    std::vector<std::vector<int>> &sel) {
    const ModelConfig &c = x.c;
    const int T = x.T, IH = c.indexer_heads, Id = c.indexer_dim, r = ics.ratio;
    Session::Impl &S = x.S;
    grow(S.iq, (size_t)T * IH * Id);
    grow(S.iw, (size_t)T * IH);
    matmul(x.pool, L.i_q_b, QR, T, c.q_lora, S.iq.data(), (int64_t)IH * Id);
    matmul(x.pool, L.i_proj, XN, T, c.n_embd, S.iw.data(), IH);
    const Rope &rope = x.m.rope(true);
    const float qscale = 1.f / std::sqrt((float)Id), wscale = 1.f / std::sqrt((float)IH);
    grow(sel, (size_t)T);  // the inner vectors keep their capacity across calls
    x.pool.parallel_for(T, grain_for((int64_t)ics.n_entries * IH * Id + 1), [&](int64_t b, int64_t e, int th) {
        TaskScratch &ts = S.tasks[th];
        ts.need_rope(rope.n_pairs);
        std::vector<IndexScore> &sc = ts.scores;
        for (int64_t t = b; t < e; ++t) {
            const int64_t pos = x.n0 + t;
            float *q = S.iq.data() + (size_t)t * IH * Id;
            rope.cos_sin(pos, ts.cos.data(), ts.sin.data());
            for (int h = 0; h < IH; ++h)
                ops::rope_apply(q + (size_t)h * Id, Id, rope.n_pairs, ts.cos.data(), ts.sin.data(), 1.f);
            const float *wt = S.iw.data() + (size_t)t * IH;
            const int n_vis = std::min<int>(ics.n_entries, (int)((pos + 1) / r));
            sc.clear();
            for (int s = 0; s < n_vis; ++s) {
                const float *k = ics.entry(s);
                float score = 0;
                for (int h = 0; h < IH; ++h) {
                    const float d = ops::dot(q + (size_t)h * Id, k, Id);
                    score += (d > 0 ? d * qscale : 0.f) * (wt[h] * wscale);
                }
                sc.push_back({score, s});
            }
            const size_t k = std::min<size_t>(c.indexer_topk, sc.size());
            std::partial_sort(sc.begin(), sc.begin() + k, sc.end(), [](const IndexScore &a, const IndexScore &b) {
                return a.score > b.score || (a.score == b.score && a.idx < b.idx);
            });
            std::vector<int> &out = sel[t];
            out.resize(k);
            for (size_t i = 0; i < k; ++i) out[i] = sc[i].idx;
        }
    });
}

void attention(Ctx &x, int l, const float *XN, float *A) {
    const ModelConfig &c = x.c;
    const LayerWeights &L = x.w.layers[l];
    LayerState &ls = x.S.layers[l];
    Session::Impl &S = x.S;
    const int T = x.T, H = c.n_head, hd = c.head_dim, D = c.n_embd;
    const bool compressed = c.compress_ratio[l] != 0;
    const Rope &rope = x.m.rope(compressed);

    grow(S.qr, (size_t)T * c.q_lora);
    grow(S.q, (size_t)T * H * hd);
    grow(S.p1, (size_t)T * hd);
    matmul(x.pool, L.q_a, XN, T, D, S.qr.data(), c.q_lora);
    for (int t = 0; t < T; ++t) ops::rmsnorm(S.qr.data() + (size_t)t * c.q_lora, c.q_lora, L.q_a_norm.data(), c.rms_eps, S.qr.data() + (size_t)t * c.q_lora);
    matmul(x.pool, L.q_b, S.qr.data(), T, c.q_lora, S.q.data(), (int64_t)H * hd);
    grow(S.kvb, (size_t)T * hd);
    std::vector<float> &kvb = S.kvb;
    matmul(x.pool, L.kv, XN, T, D, kvb.data(), hd);
    x.pool.parallel_for(T, grain_for((int64_t)H * hd * 4), [&](int64_t b, int64_t e, int th) {
        TaskScratch &ts = S.tasks[th];
        ts.need_rope(rope.n_pairs);
        for (int64_t t = b; t < e; ++t) {
            const int64_t pos = x.n0 + t;
            rope.cos_sin(pos, ts.cos.data(), ts.sin.data());
            for (int h = 0; h < H; ++h) {
                float *q = S.q.data() + ((size_t)t * H + h) * hd;
                ops::rmsnorm(q, hd, nullptr, c.rms_eps, q);
                ops::rope_apply(q, hd, rope.n_pairs, ts.cos.data(), ts.sin.data(), 1.f);
            }
            float *kv = kvb.data() + (size_t)t * hd;
            ops::rmsnorm(kv, hd, L.kv_norm.data(), c.rms_eps, kv);
            ops::rope_apply(kv, hd, rope.n_pairs, ts.cos.data(), ts.sin.data(), 1.f);
        }
    });
    for (int t = 0; t < T; ++t) std::memcpy(ls.kv_row(x.n0 + t, hd), kvb.data() + (size_t)t * hd, sizeof(float) * hd);

    std::vector<std::vector<int>> &sel = S.sel;
    if (compressed) {
        compress(x, ls.comp, L.comp, XN);
        if (c.is_csa(l)) {
            compress(x, ls.icomp, L.icomp, XN);
            indexer_select(x, L, ls.icomp, S.qr.data(), XN, sel);
        }
    }

    // Core attention: per (query, head), softmax over the sliding window rows and the
    // visible (HCA) or selected (CSA) compressed entries, plus the head's sink logit.
    grow(S.o, (size_t)T * H * hd);
    const float scale = 1.f / std::sqrt((float)hd);
    const int W = c.sliding_window, r = c.compress_ratio[l];
    const int64_t n_keys = W + (compressed ? std::min<int64_t>(ls.comp.n_entries, c.is_csa(l) ? c.indexer_topk : ls.comp.n_entries) : 0);
    x.pool.parallel_for((int64_t)T * H, grain_for(n_keys * hd * 2), [&](int64_t b, int64_t e, int th) {
        std::vector<float> &lg = S.tasks[th].f;
        std::vector<const float *> &rows = S.tasks[th].rows;
        for (int64_t i = b; i < e; ++i) {
            const int t = (int)(i / H), h = (int)(i % H);
            const int64_t pos = x.n0 + t;
            const float *q = S.q.data() + ((size_t)t * H + h) * hd;
            rows.clear();
            for (int64_t j = std::max<int64_t>(0, pos - W + 1); j <= pos; ++j) rows.push_back(ls.kv_row(j, hd));
            if (compressed) {
                if (c.is_csa(l)) {
                    for (int s : sel[t]) rows.push_back(ls.comp.entry(s));
                } else {
                    const int n_vis = std::min<int>(ls.comp.n_entries, (int)((pos + 1) / r));
                    for (int s = 0; s < n_vis; ++s) rows.push_back(ls.comp.entry(s));
                }
            }
            lg.resize(rows.size());
            float mx = L.sinks[h];
            for (size_t k = 0; k < rows.size(); ++k) mx = std::max(mx, lg[k] = ops::dot(q, rows[k], hd) * scale);
            double den = std::exp((double)L.sinks[h] - mx);
            for (size_t k = 0; k < rows.size(); ++k) den += lg[k] = std::exp(lg[k] - mx);
            float *o = S.o.data() + ((size_t)t * H + h) * hd;
            std::fill(o, o + hd, 0.f);
            const float inv = (float)(1.0 / den);
            for (size_t k = 0; k < rows.size(); ++k) ops::axpy(lg[k] * inv, rows[k], o, hd);
        }
    });
    // K = V carried RoPE into the output's rope slice: rotate it back at the query position.
    x.pool.parallel_for(T, grain_for((int64_t)H * rope.n_pairs * 4), [&](int64_t b, int64_t e, int th) {
        TaskScratch &ts = S.tasks[th];
        ts.need_rope(rope.n_pairs);
        for (int64_t t = b; t < e; ++t) {
            rope.cos_sin(x.n0 + t, ts.cos.data(), ts.sin.data());
            for (int h = 0; h < H; ++h)
                ops::rope_apply(S.o.data() + ((size_t)t * H + h) * hd, hd, rope.n_pairs, ts.cos.data(), ts.sin.data(),
                                -1.f);
        }
    });
    // Grouped low-rank output: group g's heads -> o_lora via its own block of o_a, then o_b.
    const int G = c.o_groups, gin = H * hd / G, gl = c.o_lora;
    grow(S.oa, (size_t)T * G * gl);
    for (int g = 0; g < G; ++g)
        matmul(x.pool, L.o_a.rows((int64_t)g * gl, gl), S.o.data() + (size_t)g * gin, T, (int64_t)H * hd,
               S.oa.data() + (size_t)g * gl, (int64_t)G * gl);
    matmul(x.pool, L.o_b, S.oa.data(), T, (int64_t)G * gl, A, D);
}

// SwiGLU with the reference's clamping: silu(min(g, L)) * clamp(u, -L, L).
void swiglu(float *g, const float *u, int64_t n, float lim) {
    for (int64_t i = 0; i < n; ++i) {
        const float a = std::min(g[i], lim);
        const float b = std::clamp(u[i], -lim, lim);
        g[i] = ops::silu(a) * b;
    }
}

// y[m][D] = expert(x[m][D]) for m rows: gate/up share one quantisation of x.
void expert_ffn(Ctx &x, const WeightView &gate, const WeightView &up, const WeightView &down, const float *in, int m,
                float *out, float lim) {
    Session::Impl &S = x.S;
    const int D = x.c.n_embd, F = (int)gate.out;
    grow(S.g, (size_t)m * F);
    grow(S.u, (size_t)m * F);
    const uint64_t row = quantize_rows(x.pool, gate.type, in, m, D, D, S.xq);
    matmul_q(x.pool, gate, S.xq.data(), m, row, S.g.data(), F);
    if (up.type == gate.type) {
        matmul_q(x.pool, up, S.xq.data(), m, row, S.u.data(), F);
    } else {
        matmul(x.pool, up, in, m, D, S.u.data(), F);
    }
    for (int i = 0; i < m; ++i) swiglu(S.g.data() + (size_t)i * F, S.u.data() + (size_t)i * F, F, lim);
    matmul(x.pool, down, S.g.data(), m, F, out, D);
}

void moe(Ctx &x, int l, const float *XN, float *out) {
    const ModelConfig &c = x.c;
    const LayerWeights &L = x.w.layers[l];
    Session::Impl &S = x.S;
    const int T = x.T, D = c.n_embd, E = c.n_expert, K = c.n_expert_used;
    grow(S.router, (size_t)T * E);
    std::vector<float> &logits = S.router;
    matmul(x.pool, L.gate_inp, XN, T, D, logits.data(), E);
    // Router: scores sqrt(softplus(logit)); selection by tid2eid (hash layers) or by top-k of
    // score + correction bias; weights are the chosen scores renormalised and scaled.
    grow(S.expert_ids, (size_t)T * K);
    grow(S.expert_w, (size_t)T * K);
    grow(S.expert_order, (size_t)E);
    std::vector<int> &ids = S.expert_ids, &order = S.expert_order;
    std::vector<float> &wts = S.expert_w;
    for (int t = 0; t < T; ++t) {
        float *sc = logits.data() + (size_t)t * E;
        for (int e = 0; e < E; ++e) sc[e] = std::sqrt(ops::softplus(sc[e]));
        int *id = ids.data() + (size_t)t * K;
        if (c.is_hash(l)) {
            for (int k = 0; k < K; ++k) id[k] = L.tid2eid[(size_t)x.tok[t] * K + k];
        } else {
            for (int e = 0; e < E; ++e) order[e] = e;
            std::partial_sort(order.begin(), order.begin() + K, order.begin() + E, [&](int a, int b) {
                const float sa = sc[a] + L.probs_b[a], sb = sc[b] + L.probs_b[b];
                return sa > sb || (sa == sb && a < b);
            });
            for (int k = 0; k < K; ++k) id[k] = order[k];
        }
        double sum = 0;
        for (int k = 0; k < K; ++k) sum += sc[id[k]];
        for (int k = 0; k < K; ++k) wts[(size_t)t * K + k] = (float)(sc[id[k]] / (sum + 1e-20) * c.expert_scale);
    }
    std::fill(out, out + (size_t)T * D, 0.f);
    const float lim = c.swiglu_limit[l];
    // Group the chunk's tokens by expert so each expert's weights are read once per chunk.
    std::vector<std::vector<std::pair<int, float>>> &by_e = S.by_expert;
    by_e.resize(E);
    for (auto &list : by_e) list.clear();  // keeps each list's capacity
    for (int t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k) by_e[ids[(size_t)t * K + k]].push_back({t, wts[(size_t)t * K + k]});
    for (int e = 0; e < E; ++e) {
        const auto &list = by_e[e];
        if (list.empty()) continue;
        const int m = (int)list.size();
        grow(S.ein, (size_t)m * D);
        grow(S.eout, (size_t)m * D);
        for (int i = 0; i < m; ++i) std::memcpy(S.ein.data() + (size_t)i * D, XN + (size_t)list[i].first * D, sizeof(float) * D);
        expert_ffn(x, L.gate_exps.expert(e), L.up_exps.expert(e), L.down_exps.expert(e), S.ein.data(), m, S.eout.data(), lim);
        for (int i = 0; i < m; ++i) ops::axpy(list[i].second, S.eout.data() + (size_t)i * D, out + (size_t)list[i].first * D, D);
    }
    if (c.n_expert_shared) {
        grow(S.eout, (size_t)T * D);
        expert_ffn(x, L.gate_sh, L.up_sh, L.down_sh, XN, T, S.eout.data(), lim);
        for (size_t i = 0; i < (size_t)T * D; ++i) out[i] += S.eout[i];
    }
}

}  // namespace

void Session::forward(std::span<const int32_t> toks, std::vector<float> *all_logits) {
    const ModelConfig &c = m_.config();
    const ModelWeights &w = m_.weights();
    Impl &S = *impl_;
    const int T = (int)toks.size(), D = c.n_embd, hc = c.hc_mult;
    if (T == 0) return;
    if (T > prefill_cap_) failf("internal: chunk of %d tokens exceeds the prefill cap %d", T, prefill_cap_);
    if (pos() + T > ctx_) failf("context full: %d + %d tokens exceed the context of %d", pos(), T, ctx_);
    Ctx x{c, w, m_, m_.pool(), S, toks.data(), T, (int64_t)pos()};
    grow(S.tasks, (size_t)m_.pool().size());

    grow(S.H, (size_t)T * hc * D);
    for (int t = 0; t < T; ++t) {
        float *h = S.H.data() + (size_t)t * hc * D;
        quant::dequantize_row(w.token_embd.type, w.token_embd.row(toks[t]), h, D);
        for (int k = 1; k < hc; ++k) std::memcpy(h + (size_t)k * D, h, sizeof(float) * D);
    }
    grow(S.post, (size_t)T * hc);
    grow(S.comb, (size_t)T * hc * hc);
    grow(S.X, (size_t)T * D);
    grow(S.XN, (size_t)T * D);
    grow(S.A, (size_t)T * D);
    for (int l = 0; l < c.n_layer; ++l) {
        const LayerWeights &L = w.layers[l];
        hc_pre(x, L.hc_attn_fn, L.hc_attn_base, L.hc_attn_scale, S.H.data(), S.post.data(), S.comb.data(), S.X.data());
        for (int t = 0; t < T; ++t) ops::rmsnorm(S.X.data() + (size_t)t * D, D, L.attn_norm.data(), c.rms_eps, S.XN.data() + (size_t)t * D);
        attention(x, l, S.XN.data(), S.A.data());
        hc_post(x, S.post.data(), S.comb.data(), S.A.data(), S.H.data());
        hc_pre(x, L.hc_ffn_fn, L.hc_ffn_base, L.hc_ffn_scale, S.H.data(), S.post.data(), S.comb.data(), S.X.data());
        for (int t = 0; t < T; ++t) ops::rmsnorm(S.X.data() + (size_t)t * D, D, L.ffn_norm.data(), c.rms_eps, S.XN.data() + (size_t)t * D);
        moe(x, l, S.XN.data(), S.A.data());
        hc_post(x, S.post.data(), S.comb.data(), S.A.data(), S.H.data());
    }
    // Hyper-head: collapse the streams with sigmoid weights, final norm, output head. Only
    // the rows whose logits are wanted are projected.
    const int t0 = all_logits ? 0 : T - 1, nt = T - t0;
    grow(S.flat, (size_t)nt * hc * D);
    grow(S.mix, (size_t)nt * hc);
    for (int i = 0; i < nt; ++i)
        ops::rmsnorm(S.H.data() + (size_t)(t0 + i) * hc * D, (int64_t)hc * D, nullptr, c.rms_eps, S.flat.data() + (size_t)i * hc * D);
    matmul(m_.pool(), w.output_hc_fn, S.flat.data(), nt, (int64_t)hc * D, S.mix.data(), hc);
    grow(S.head, (size_t)nt * D);
    for (int i = 0; i < nt; ++i) {
        float *y = S.head.data() + (size_t)i * D;
        const float *h = S.H.data() + (size_t)(t0 + i) * hc * D;
        std::fill(y, y + D, 0.f);
        for (int k = 0; k < hc; ++k) {
            const float p = ops::sigmoid(S.mix[(size_t)i * hc + k] * w.output_hc_scale[0] + w.output_hc_base[k]) + c.hc_eps;
            ops::axpy(p, h + (size_t)k * D, y, D);
        }
        ops::rmsnorm(y, D, w.output_norm.data(), c.rms_eps, y);
    }
    grow(S.logits_out, (size_t)nt * c.n_vocab);
    const float *lg = S.logits_out.data();
    matmul(m_.pool(), w.output, S.head.data(), nt, D, S.logits_out.data(), c.n_vocab);
    tokens_.insert(tokens_.end(), toks.begin(), toks.end());
    std::memcpy(logits_.data(), lg + (size_t)(nt - 1) * c.n_vocab, sizeof(float) * c.n_vocab);
    has_logits_ = true;
    if (all_logits) all_logits->insert(all_logits->end(), lg, lg + (size_t)nt * c.n_vocab);
}

}  // namespace ds4
