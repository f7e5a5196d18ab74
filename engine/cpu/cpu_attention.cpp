// CPU executor: attention. Q/KV projections into the session rings, the compressors,
// the lightning indexer, sparse/windowed attention with sinks and the grouped output
// projection. Per-row state comes from each row's segment (several sessions per step).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/common/error.h"
#include "engine/cpu/cpu_executor.h"
#include "engine/cpu/cpu_grain.h"
#include "engine/kernels/attend8.h"
#include "engine/kernels/matmul.h"
#include "engine/kernels/ops.h"

namespace ds4 {

void CpuExecutor::attention_rows(int r0, int r1) {
    if (r0 < 0 || r1 <= r0 || r1 > R_) failf("internal: attention rows [%d, %d) outside the step's %d", r0, r1, R_);
    ar0_ = r0;
    asegs_.assign(lay_.segs.begin(), lay_.segs.end());
    for (StepSegment &sg : asegs_) {
        const int b = std::clamp(sg.row0, r0, r1), e = std::clamp(sg.row0 + sg.n, r0, r1);
        sg.n0 += b - sg.row0;
        sg.row0 = b - r0;
        sg.n = e - b;
    }
    const size_t n = size_t(r1 - r0);
    alay_ = StepLayout{lay_.tokens.subspan(r0, n), lay_.pos.subspan(r0, n), lay_.seg.subspan(r0, n), asegs_};
}

void CpuExecutor::q_kv(int layer, const LayerWeights &L, const Rope &rope) {
    CpuOpTimer timer(prof_, CpuOp::QKv, mm_.weight_bytes);
    const ModelConfig &c = c_;
    const int T = alay_.rows(), H = c.n_head, hd = c.head_dim, D = c.n_embd;
    const float *xn = XN_.data() + (size_t)ar0_ * D;
    float *qr = qr_.data() + (size_t)ar0_ * c.q_lora, *qh = q_.data() + (size_t)ar0_ * H * hd;
    matmul(mm_, L.q_a, xn, T, D, qr, c.q_lora);
    for (int t = 0; t < T; ++t)
        ops::rmsnorm(qr + (size_t)t * c.q_lora, c.q_lora, L.q_a_norm.data(), c.rms_eps, qr + (size_t)t * c.q_lora);
    matmul(mm_, L.q_b, qr, T, c.q_lora, qh, (int64_t)H * hd);
    grow(kvb_, (size_t)T * hd);
    matmul(mm_, L.kv, xn, T, D, kvb_.data(), hd);
    pool_.parallel_for(T, cpu_grain((int64_t)H * hd * 4), [&](int64_t b, int64_t e, int th) {
        TaskScratch &ts = tasks_[th];
        ts.need_rope(rope.n_pairs);
        for (int64_t t = b; t < e; ++t) {
            rope.cos_sin(alay_.pos[t], ts.cos.data(), ts.sin.data());
            for (int h = 0; h < H; ++h) {
                float *q = qh + ((size_t)t * H + h) * hd;
                ops::rmsnorm(q, hd, nullptr, c.rms_eps, q);
                ops::rope_apply(q, hd, rope.n_pairs, ts.cos.data(), ts.sin.data(), 1.f);
            }
            float *kv = kvb_.data() + (size_t)t * hd;
            ops::rmsnorm(kv, hd, L.kv_norm.data(), c.rms_eps, kv);
            ops::rope_apply(kv, hd, rope.n_pairs, ts.cos.data(), ts.sin.data(), 1.f);
        }
    });
    for (int t = 0; t < T; ++t)
        std::memcpy(state_of_row(t).kv_row_w(layer, alay_.pos[t]), kvb_.data() + (size_t)t * hd, sizeof(float) * hd);
}

// Per channel, a softmax over the window's slots (gate + learned position bias) weights
// the projected values; CSA entries also take window w-1's first-half channels as extra
// slots (the overlap), which the ring still holds, also across steps.
void CpuExecutor::compress(int layer, int which, const CompressorWeights &cw, const Rope &rope) {
    CpuOpTimer timer(prof_, CpuOp::Compress, mm_.weight_bytes);
    const int T = alay_.rows();
    const float *xn = XN_.data() + (size_t)ar0_ * c_.n_embd;
    grow(p1_, (size_t)T * cw.width);
    grow(p2_, (size_t)T * cw.width);
    matmul(mm_, cw.kv, xn, T, c_.n_embd, p1_.data(), cw.width);
    matmul(mm_, cw.gate, xn, T, c_.n_embd, p2_.data(), cw.width);
    for (const StepSegment &sg : alay_.segs) {
        if (sg.n == 0) continue;   // outside the attention's rows
        CpuSessionState &st = *static_cast<CpuSessionState *>(sg.state);
        CpuComp &cs = which ? st.layers[layer].icomp : st.layers[layer].comp;
        const int r = cs.g.ratio, wd = cs.g.width, dim = cs.g.dim;
        if (wd != cw.width || dim != cw.dim) fail("internal: compressor shape differs from the session's");
        for (int i = 0; i < sg.n; ++i) {
            const int t = sg.row0 + i;
            const int64_t pos = sg.n0 + i;
            std::memcpy(st.comp_kv_w(cs, pos), p1_.data() + (size_t)t * wd, sizeof(float) * wd);
            const float *ape = cw.ape.data() + (size_t)(pos % r) * wd;
            const float *src = p2_.data() + (size_t)t * wd;
            float *g = st.comp_gate_w(cs, pos);
            for (int k = 0; k < wd; ++k) g[k] = src[k] + ape[k];
        }
        const int first = st.n_entries(layer, which), last = (int)((sg.n0 + sg.n) / r);   // entries closing now
        if (last > cs.g.max_entries) failf("internal: compressed entries exceed capacity (%d > %d)", last, cs.g.max_entries);
        st.need_entries(cs, last);   // before the tasks take entry pointers
        pool_.parallel_for(last - first, cpu_grain((int64_t)dim * r * 4), [&](int64_t b, int64_t e, int th) {
            TaskScratch &ts = tasks_[th];
            ts.rows.resize(4 * (size_t)r);   // the slots' gate rows, then their value rows
            ts.need_rope(rope.n_pairs);
            const float **gate = ts.rows.data(), **val = gate + 2 * r;
            alignas(64) float row[ops::kIndexerKeysMaxDim];   // a blocked entry, before it is laid out
            for (int64_t wi = first + b; wi < first + e; ++wi) {
                float *out = cs.blocked ? row : cs.entry((int)wi);
                const int64_t start = wi * r;
                const bool prev = cs.g.overlap && wi > 0;
                // Per channel, a softmax over the slots (window wi - 1's first-half channels
                // first, where it overlaps), pooling the slots' values.
                int n = 0;
                if (prev)
                    for (int j = 0; j < r; ++j, ++n) {
                        gate[n] = cs.gate_row(start - r + j);
                        val[n] = cs.kv_row(start - r + j);
                    }
                const int off = cs.g.overlap ? dim : 0;
                for (int j = 0; j < r; ++j, ++n) {
                    gate[n] = cs.gate_row(start + j) + off;
                    val[n] = cs.kv_row(start + j) + off;
                }
                ops::softmax_pool(gate, val, n, dim, out);
                ops::rmsnorm(out, dim, cw.norm.data(), c_.rms_eps, out);
                rope.cos_sin(start, ts.cos.data(), ts.sin.data());
                ops::rope_apply(out, dim, rope.n_pairs, ts.cos.data(), ts.sin.data(), 1.f);
                if (cs.blocked) cs.put_entry((int)wi, out);
            }
        });
        st.set_n_entries(layer, which, last);
    }
}

// Lightning indexer: score every compressed entry visible to each query by
// sum_h w_h * ReLU(q_h . k) and keep the top-k (ties: lower entry index first). Each score
// is computed exactly as a per-row loop would (score_rows, score_key_blocks), so the picks do
// not depend on how the scores are split.
void CpuExecutor::indexer_topk(int layer, const LayerWeights &L, const Rope &rope, int topk) {
    CpuOpTimer timer(prof_, CpuOp::Indexer, mm_.weight_bytes);
    const ModelConfig &c = c_;
    const int T = alay_.rows(), IH = c.indexer_heads, Id = c.indexer_dim;
    grow(iq_, (size_t)T * IH * Id);
    grow(iw_, (size_t)T * IH);
    matmul(mm_, L.i_q_b, qr_.data() + (size_t)ar0_ * c.q_lora, T, c.q_lora, iq_.data(), (int64_t)IH * Id);
    matmul(mm_, L.i_proj, XN_.data() + (size_t)ar0_ * c.n_embd, T, c.n_embd, iw_.data(), IH);
    const float qscale = 1.f / std::sqrt((float)Id), wscale = 1.f / std::sqrt((float)IH);
    grow(sel_, (size_t)T);  // the inner vectors keep their capacity across steps
    pool_.parallel_for(T, cpu_grain((int64_t)IH * rope.n_pairs * 4), [&](int64_t b, int64_t e, int th) {
        TaskScratch &ts = tasks_[th];
        ts.need_rope(rope.n_pairs);
        for (int64_t t = b; t < e; ++t) {
            rope.cos_sin(alay_.pos[t], ts.cos.data(), ts.sin.data());
            float *q = iq_.data() + (size_t)t * IH * Id;
            for (int h = 0; h < IH; ++h)
                ops::rope_apply(q + (size_t)h * Id, Id, rope.n_pairs, ts.cos.data(), ts.sin.data(), 1.f);
            float *wt = iw_.data() + (size_t)t * IH;
            for (int h = 0; h < IH; ++h) wt[h] *= wscale;
        }
    });
    // Rows in groups of at most kGroupScores scores (a prefill chunk at long context would
    // otherwise hold rows x entries of them at once).
    constexpr int64_t kGroupScores = int64_t(1) << 20;
    grow(ioff_, (size_t)T + 1);
    for (int t0 = 0; t0 < T;) {
        int t1 = t0;
        int64_t total = 0;
        ioff_[0] = 0;
        while (t1 < T) {
            const CpuSessionState &st = state_of_row(t1);
            const int n_vis = std::min<int>(st.n_entries(layer, 1), (int)((alay_.pos[t1] + 1) / st.layers[layer].icomp.g.ratio));
            if (t1 > t0 && total + n_vis > kGroupScores) break;
            total += n_vis;
            ioff_[++t1 - t0] = total;
        }
        grow(iscore_, (size_t)total);
        if (Id % 8 == 0 && Id <= ops::kIndexerKeysMaxDim && t1 - t0 >= kKeyBlockRows) {
            score_key_blocks(layer, t0, t1, qscale);
        } else {
            score_rows(layer, t0, t1, qscale);
        }
        pool_.parallel_for(t1 - t0, cpu_grain(ioff_[t1 - t0] / (t1 - t0) * 8 + 1), [&](int64_t b, int64_t e, int) {
            for (int64_t r = b; r < e; ++r) {
                IndexScore *first = iscore_.data() + ioff_[r], *last = iscore_.data() + ioff_[r + 1];
                const size_t k = std::min<size_t>(topk, last - first);
                ops::top_k_scores(first, last, k);
                std::vector<int> &out = sel_[t0 + r];
                out.resize(k);
                for (size_t i = 0; i < k; ++i) out[i] = first[i].idx;
            }
        });
        t0 = t1;
    }
}

// The scores of rows [t0, t1) (laid out by ioff_) as one flat list split over the pool by
// entries, not by rows: a decode step has one row and, at long context, thousands of entries.
void CpuExecutor::score_rows(int layer, int t0, int t1, float qscale) {
    const int IH = c_.indexer_heads, Id = c_.indexer_dim;
    pool_.parallel_for(ioff_[t1 - t0], cpu_grain((int64_t)IH * Id * 2), [&](int64_t b, int64_t e, int) {
        int r = (int)(std::upper_bound(ioff_.begin(), ioff_.begin() + (t1 - t0) + 1, b) - ioff_.begin()) - 1;
        for (int64_t i = b; i < e;) {
            while (i >= ioff_[r + 1]) ++r;
            const int t = t0 + r, s = (int)(i - ioff_[r]);
            const float *q = iq_.data() + (size_t)t * IH * Id, *w = iw_.data() + (size_t)t * IH;
            const CpuComp &ic = state_of_row(t).layers[layer].icomp;
            const int64_t row_end = std::min<int64_t>(e, ioff_[r + 1]);
            if (ic.blocked) {
                // The block holding entry s, whole (lanes past the entries are not kept):
                // each lane has the bits of scoring its entry alone.
                const int j0 = s % 16, n = (int)std::min<int64_t>(16 - j0, row_end - i);
                float sc[16];
                ops::indexer_score16_kt(q, w, IH, Id, ic.block(s / 16), qscale, sc);
                for (int j = 0; j < n; ++j) iscore_[i + j] = {sc[j0 + j], s + j};
                i += n;
                continue;
            }
            // Runs of sixteen or eight entries of one row: the same bits as one by one.
            const int run = i + 16 <= row_end ? 16 : i + 8 <= row_end ? 8 : 0;
            if (run) {
                const float *k[16];
                float sc[16];
                for (int j = 0; j < run; ++j) k[j] = ic.entry(s + j);
                (run == 16 ? ops::indexer_score16 : ops::indexer_score8)(q, w, IH, Id, k, qscale, sc);
                for (int j = 0; j < run; ++j) iscore_[i + j] = {sc[j], s + j};
                i += run;
            } else {
                iscore_[i] = {ops::indexer_score(q, w, IH, Id, ic.entry(s), qscale), s};
                ++i;
            }
        }
    });
}

// The scores of rows [t0, t1) (laid out by ioff_) by blocks of 16 entries: rows of one
// session go in chunks of up to kKeyBlockRows, and each block of a chunk's entries is
// transposed once for all the chunk's rows (row by row, every row transposed every block
// again: the default model's indexer at a 4K prompt 3.28-3.39 -> 2.92-2.97 ms a 256-row
// step). A score is indexer_score16's lane, so the bits are the row-by-row path's.
void CpuExecutor::score_key_blocks(int layer, int t0, int t1, float qscale) {
    const int IH = c_.indexer_heads, Id = c_.indexer_dim;
    key_chunks_.clear();
    for (int t = t0; t < t1;) {
        const CpuSessionState *st = &state_of_row(t);
        int e = t + 1;
        while (e < t1 && e - t < kKeyBlockRows && &state_of_row(e) == st) ++e;
        int64_t most = 0;
        for (int r = t; r < e; ++r) most = std::max(most, ioff_[r + 1 - t0] - ioff_[r - t0]);
        const int64_t first = key_chunks_.empty() ? 0 : key_chunks_.back().items_end;
        key_chunks_.push_back({t, e, first + (most + 15) / 16});
        t = e;
    }
    const int64_t n_items = key_chunks_.back().items_end;
    pool_.parallel_for(n_items, cpu_grain((int64_t)kKeyBlockRows * 16 * IH * Id), [&](int64_t b, int64_t e, int) {
        size_t c = 0;
        for (int64_t item = b; item < e; ++item) {
            while (item >= key_chunks_[c].items_end) ++c;
            const KeyChunk &ch = key_chunks_[c];
            const int64_t s0 = 16 * (item - (c ? key_chunks_[c - 1].items_end : 0));
            // The entries' block as the session lays them out (lanes past the last entry are
            // not kept).
            const float *kt = state_of_row(ch.t_begin).layers[layer].icomp.block((int)(s0 / 16));
            for (int t = ch.t_begin; t < ch.t_end; ++t) {
                const int64_t n = std::min<int64_t>(16, ioff_[t + 1 - t0] - ioff_[t - t0] - s0);
                if (n <= 0) continue;
                float sc[16];
                ops::indexer_score16_kt(iq_.data() + (size_t)t * IH * Id, iw_.data() + (size_t)t * IH, IH, Id, kt,
                                        qscale, sc);
                IndexScore *out = iscore_.data() + ioff_[t - t0] + s0;
                for (int j = 0; j < n; ++j) out[j] = {sc[j], (int)(s0 + j)};
            }
        }
    });
}

void CpuExecutor::attend(int layer, const AttnSpec &spec, const float *sinks, const Rope &rope) {
    CpuOpTimer timer(prof_, CpuOp::Attend, mm_.weight_bytes);
    const ModelConfig &c = c_;
    const int T = alay_.rows(), H = c.n_head, hd = c.head_dim, W = spec.window, r = spec.ratio;
    const float scale = 1.f / std::sqrt((float)hd);
    float *const qh = q_.data() + (size_t)ar0_ * H * hd, *const oh = o_.data() + (size_t)ar0_ * H * hd;
    int64_t most = 0;
    if (r)
        for (const StepSegment &sg : alay_.segs) most = std::max<int64_t>(most, sg.state->n_entries(layer, 0));
    const int64_t n_keys = W + (spec.indexed ? std::min<int64_t>(most, c.indexer_topk) : most);
    // Heads in groups of 8 where attend8 applies (each key row read once for 8 heads on
    // AVX-512, twice on AVX2; the same floats as the per-head loop), unless that leaves most
    // threads idle: the per-head loop is 3-5x slower a thread (an 8-head model's decode row
    // at 16K context on the Zen 3 VM: 0.12-0.14 ms a step on two threads one head at a time
    // against 0.05-0.09 on one thread by groups), so it pays only from ~4 threads a group.
    const int G = (H % 8 == 0 && ops::attend8_usable(hd) && (int64_t)T * (H / 8) * 4 >= pool_.active()) ? 8 : 1;
    pool_.parallel_for((int64_t)T * (H / G), cpu_grain(n_keys * hd * 2 * G), [&](int64_t b, int64_t e, int th) {
        ScratchVec &lg = tasks_[th].f;
        std::vector<const float *> &rows = tasks_[th].rows;
        for (int64_t i = b; i < e; ++i) {
            const int t = (int)(i / (H / G)), h = (int)(i % (H / G)) * G;
            const CpuSessionState &st = state_of_row(t);
            const CpuLayer &ls = st.layers[layer];
            const int64_t pos = alay_.pos[t];
            const float *q = qh + ((size_t)t * H + h) * hd;
            rows.clear();
            for (int64_t j = std::max<int64_t>(0, pos - W + 1); j <= pos; ++j) rows.push_back(ls.kv_row(j));
            if (r) {
                if (spec.indexed) {
                    for (int s : sel_[t]) rows.push_back(ls.comp.entry(s));
                } else {
                    const int n_vis = std::min<int>(st.n_entries(layer, 0), (int)((pos + 1) / r));
                    for (int s = 0; s < n_vis; ++s) rows.push_back(ls.comp.entry(s));
                }
            }
            const size_t nk = rows.size();
            float *o = oh + ((size_t)t * H + h) * hd;
            lg.resize(nk * G);
            if (G == 8) ops::attend8_scores(q, rows.data(), (int64_t)nk, hd, scale, lg.data());
            else
                for (size_t k = 0; k < nk; ++k) lg[k] = ops::dot(q, rows[k], hd) * scale;
            for (int g = 0; g < G; ++g) {
                // Softmax with the head's sink; lg becomes the weights of the output sum.
                float *l = lg.data() + (size_t)g * nk;
                const float mx = ops::max_of(l, (int64_t)nk, sinks[h + g]);
                const double den = std::exp((double)sinks[h + g] - mx) + ops::exp_shift(l, (int64_t)nk, mx);
                const float inv = (float)(1.0 / den);
                for (size_t k = 0; k < nk; ++k) l[k] *= inv;
            }
            if (G == 8) {
                ops::attend8_output(lg.data(), rows.data(), (int64_t)nk, hd, o);
            } else {
                std::fill(o, o + hd, 0.f);
                for (size_t k = 0; k < nk; ++k) ops::axpy(lg[k], rows[k], o, hd);
            }
        }
    });
    // K = V carried RoPE into the output's rope slice: rotate it back at the query position.
    pool_.parallel_for(T, cpu_grain((int64_t)H * rope.n_pairs * 4), [&](int64_t b, int64_t e, int th) {
        TaskScratch &ts = tasks_[th];
        ts.need_rope(rope.n_pairs);
        for (int64_t t = b; t < e; ++t) {
            rope.cos_sin(alay_.pos[t], ts.cos.data(), ts.sin.data());
            for (int h = 0; h < H; ++h)
                ops::rope_apply(oh + ((size_t)t * H + h) * hd, hd, rope.n_pairs, ts.cos.data(), ts.sin.data(), -1.f);
        }
    });
}

// Grouped low-rank output: group g's heads -> o_lora via its own block of o_a, then o_b.
void CpuExecutor::out_proj(const LayerWeights &L) {
    CpuOpTimer timer(prof_, CpuOp::OutProj, mm_.weight_bytes);
    const ModelConfig &c = c_;
    const int T = R_, H = c.n_head, hd = c.head_dim, G = c.o_groups, gin = H * hd / G, gl = c.o_lora;
    grow(oa_, (size_t)T * G * gl);
    for (int g = 0; g < G; ++g)
        matmul(mm_, L.o_a.rows((int64_t)g * gl, gl), o_.data() + (size_t)g * gin, T, (int64_t)H * hd,
               oa_.data() + (size_t)g * gl, (int64_t)G * gl);
    matmul(mm_, L.o_b, oa_.data(), T, (int64_t)G * gl, A_.data(), c.n_embd);
}

}  // namespace ds4
