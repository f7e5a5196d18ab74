// CPU executor: the mixture of experts. Router, routed experts grouped by expert (each
// expert's weights read once per step whatever the number of rows using it), shared expert.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>

#include "engine/cpu/cpu_executor.h"
#include "engine/cpu/cpu_grain.h"
#include "engine/kernels/matmul.h"
#include "engine/kernels/ops.h"

namespace ds4 {

namespace {
// The K experts of highest score + bias, ties to the lower id, best first (order: scratch).
void top_experts(const float *sc, const float *bias, int E, int K, std::vector<int> &order, int *id) {
    grow(order, (size_t)E);
    for (int e = 0; e < E; ++e) order[e] = e;
    std::partial_sort(order.begin(), order.begin() + K, order.begin() + E, [&](int a, int b) {
        const float sa = sc[a] + bias[a], sb = sc[b] + bias[b];
        return sa > sb || (sa == sb && a < b);
    });
    for (int k = 0; k < K; ++k) id[k] = order[k];
}
}  // namespace

void CpuExecutor::route(int layer, const LayerWeights &L, bool hash_routed) {
    CpuOpTimer timer(prof_, CpuOp::Route, mm_.weight_bytes);
    const ModelConfig &c = c_;
    const int T = R_, D = c.n_embd, E = c.n_expert, K = c.n_expert_used;
    (void)layer;
    grow(router_, (size_t)T * E);
    matmul(mm_, L.gate_inp, XN_.data(), T, D, router_.data(), E);
    grow(expert_ids_, (size_t)T * K);
    grow(expert_w_, (size_t)T * K);
    // Tokens split over the pool (each writes only its own rows): serial, the softplus and the
    // ranking of 256 experts were ~2 ms of a 256-row flash-shape prefill step.
    pool_.parallel_for(T, cpu_grain((int64_t)E * 64), [&](int64_t b, int64_t e_end, int th) {
        for (int64_t t = b; t < e_end; ++t) {
            float *sc = router_.data() + (size_t)t * E;
            for (int e = 0; e < E; ++e) sc[e] = std::sqrt(ops::softplus(sc[e]));
            int *id = expert_ids_.data() + (size_t)t * K;
            if (hash_routed) {
                for (int k = 0; k < K; ++k) id[k] = L.tid2eid[(size_t)lay_.tokens[t] * K + k];
            } else {
                top_experts(sc, L.probs_b.data(), E, K, tasks_[th].order, id);
            }
            double sum = 0;
            for (int k = 0; k < K; ++k) sum += sc[id[k]];
            for (int k = 0; k < K; ++k) expert_w_[(size_t)t * K + k] = (float)(sc[id[k]] / (sum + 1e-20) * c.expert_scale);
        }
    });
}

// y[m][D] = expert(x[m][D]) for m rows: gate/up share one quantisation of x.
void CpuExecutor::expert_ffn(ThreadPool &pool, MatmulCtx &mm, FfnScratch &s, const WeightView &gate,
                             const WeightView &up, const WeightView &down, const float *in, int m, float *out,
                             float lim) {
    const int D = (int)gate.in, F = (int)gate.out;
    grow(s.g, (size_t)m * F);
    grow(s.u, (size_t)m * F);
    const uint64_t row = quantize_rows(pool, gate.type, in, m, D, D, s.xq);
    matmul_q(mm, gate, s.xq.data(), m, row, s.g.data(), F);
    if (up.type == gate.type) {
        matmul_q(mm, up, s.xq.data(), m, row, s.u.data(), F);
    } else {
        matmul(mm, up, in, m, D, s.u.data(), F);
    }
    // The rows are contiguous: one elementwise pass over m * F values, split over the pool
    // (a serial pass cost ~9 ms of a 256-row flash-shape prefill step, for all experts).
    pool.parallel_for((int64_t)m * F, cpu_grain(24), [&](int64_t b, int64_t e, int) {
        ops::swiglu(s.g.data() + b, s.u.data() + b, e - b, lim);
    });
    matmul(mm, down, s.g.data(), m, F, out, D);
}

// Steps of at least this many rows run whole experts on one thread each (experts_by_thread);
// smaller steps (decode, small batches) split each expert's rows over the pool.
constexpr int kExpertsByThreadRows = 32;

void CpuExecutor::routed_experts(int layer, const LayerWeights &L, ExpertSource &experts) {
    CpuOpTimer timer(prof_, CpuOp::Experts, mm_.weight_bytes);
    (void)L;
    const int T = R_, D = c_.n_embd, E = c_.n_expert, K = c_.n_expert_used;
    float *out = A_.data();
    by_expert_.resize(E);
    for (auto &list : by_expert_) list.clear();  // keeps each list's capacity
    for (int t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k) by_expert_[expert_ids_[(size_t)t * K + k]].push_back({t, expert_w_[(size_t)t * K + k]});
    used_.clear();
    for (int e = 0; e < E; ++e)
        if (!by_expert_[e].empty()) used_.push_back(e);
    views_.resize(used_.size());
    prof_.add_experts((int)used_.size());
    const float lim = c_.swiglu_limit[layer];
    const bool by_thread = T >= kExpertsByThreadRows && pool_.size() > 1;
    // By thread, every expert's output rows go to their own place (expert u's from
    // first_row[u]) and are summed into the tokens' rows at the end, so the sums keep the
    // order of the one-expert-at-a-time loop: each token's experts by id, from zero.
    std::vector<size_t> &first_row = first_row_;
    if (by_thread) {
        first_row.assign(used_.size() + 1, 0);
        for (size_t u = 0; u < used_.size(); ++u) first_row[u + 1] = first_row[u] + by_expert_[used_[u]].size();
        grow(eout_, first_row.back() * D);
    } else {
        std::fill(out, out + (size_t)T * D, 0.f);
    }
    // A bounded source (SSD streaming) may hold fewer experts than a big batch uses in one
    // layer: acquire them in groups. The output is the same sum in the same order.
    const size_t group = std::max<size_t>(experts.max_acquire(), 1);
    for (size_t u0 = 0; u0 < used_.size(); u0 += group) {
        const size_t n = std::min(group, used_.size() - u0);
        experts.acquire(layer, std::span<const int>(used_.data() + u0, n), views_.data() + u0);
        if (u0 == 0) predict_next(layer, experts);
        if (by_thread) {
            experts_by_thread(u0, n, lim);
            continue;
        }
        for (size_t u = u0; u < u0 + n; ++u) {
            const auto &list = by_expert_[used_[u]];
            const int m = (int)list.size();
            grow(ein_, (size_t)m * D);
            grow(eout_, (size_t)m * D);
            for (int i = 0; i < m; ++i) std::memcpy(ein_.data() + (size_t)i * D, XN_.data() + (size_t)list[i].first * D, sizeof(float) * D);
            const ExpertView &v = views_[u];
            expert_ffn(pool_, mm_, ffn_, v.gate, v.up, v.down, ein_.data(), m, eout_.data(), lim);
            for (int i = 0; i < m; ++i) ops::axpy(list[i].second, eout_.data() + (size_t)i * D, out + (size_t)list[i].first * D, D);
        }
    }
    experts.release();
    if (!by_thread) return;
    // Each token's K output rows in expert order (used_ is by id), then the sums.
    std::vector<int> &filled = filled_;
    filled.assign(T, 0);
    token_rows_.resize((size_t)T * K);
    for (size_t u = 0; u < used_.size(); ++u) {
        const auto &list = by_expert_[used_[u]];
        for (size_t i = 0; i < list.size(); ++i) {
            const int t = list[i].first;
            token_rows_[(size_t)t * K + filled[t]++] = {(int64_t)(first_row[u] + i), list[i].second};
        }
    }
    pool_.parallel_for(T, cpu_grain((int64_t)K * D), [&](int64_t b, int64_t e, int) {
        for (int64_t t = b; t < e; ++t) {
            float *o = out + (size_t)t * D;
            std::fill(o, o + D, 0.f);
            for (int k = 0; k < filled[t]; ++k) {
                const auto &[r, w] = token_rows_[(size_t)t * K + k];
                ops::axpy(w, eout_.data() + (size_t)r * D, o, D);
            }
        }
    });
}

// Experts [u0, u0 + n) of used_, each on one thread: a prefill step's small experts wait on
// memory (their weights are read for a few rows) and its big ones on the multiply-adds, so
// while one thread works through the big experts (largest first) another takes the small
// ones (smallest first) and the two kinds of wait overlap. Split over the pool instead,
// every expert had both threads waiting on the same thing: on the 1-layer flash-shape model
// the routed experts of a 256-row step took ~110 ms, about their multiply-adds at the
// tile's speed plus their weight bytes at the read bandwidth.
void CpuExecutor::experts_by_thread(size_t u0, size_t n, float lim) {
    const int D = c_.n_embd;
    while (lanes_.size() < (size_t)pool_.size()) lanes_.push_back(std::make_unique<ExpertLane>());
    by_size_.resize(n);
    for (size_t i = 0; i < n; ++i) by_size_[i] = (int)(u0 + i);
    std::stable_sort(by_size_.begin(), by_size_.end(),
                     [&](int a, int b) { return by_expert_[used_[a]].size() > by_expert_[used_[b]].size(); });
    // [front, back): experts not yet taken; even lanes take from the front, odd from the back.
    std::mutex take;
    size_t front = 0, back = n;
    for (auto &l : lanes_) l->mm.weight_bytes = 0;
    pool_.parallel_for(pool_.size(), 1, [&](int64_t, int64_t, int th) {
        ExpertLane &lane = *lanes_[(size_t)th];
        for (;;) {
            int u;
            {
                std::lock_guard<std::mutex> lock(take);
                if (front == back) return;
                u = th % 2 == 0 ? by_size_[front++] : by_size_[--back];
            }
            const auto &list = by_expert_[used_[(size_t)u]];
            const int m = (int)list.size();
            grow(lane.in, (size_t)m * D);
            for (int i = 0; i < m; ++i)
                std::memcpy(lane.in.data() + (size_t)i * D, XN_.data() + (size_t)list[i].first * D, sizeof(float) * D);
            const ExpertView &v = views_[(size_t)u];
            expert_ffn(lane.one, lane.mm, lane.ffn, v.gate, v.up, v.down, lane.in.data(), m,
                       eout_.data() + first_row_[(size_t)u] * D, lim);
        }
    });
    for (const auto &l : lanes_) mm_.weight_bytes += l->mm.weight_bytes;
}

// When the source asks for it, the next layer's experts are guessed from this layer's MoE
// input (hash-routed layers: exactly, from the tokens) and prefetched while this layer
// computes. The guess only moves reads earlier; it never changes what is computed.
void CpuExecutor::predict_next(int layer, ExpertSource &experts) {
    const LayerWeights *N = experts.predictor(layer);
    if (!N) return;
    const int T = R_, D = c_.n_embd, E = c_.n_expert, K = c_.n_expert_used;
    pred_ids_.clear();
    grow(pred_mark_, (size_t)E);
    std::fill(pred_mark_.begin(), pred_mark_.begin() + E, 0);
    if (c_.is_hash(layer + 1)) {
        for (int t = 0; t < T; ++t)
            for (int k = 0; k < K; ++k) pred_mark_[N->tid2eid[(size_t)lay_.tokens[t] * K + k]] = 1;
    } else {
        grow(pred_scores_, (size_t)T * E);
        matmul(mm_, N->gate_inp, XN_.data(), T, D, pred_scores_.data(), E);
        grow(pred_top_, (size_t)K);
        for (int t = 0; t < T; ++t) {
            float *sc = pred_scores_.data() + (size_t)t * E;
            for (int e = 0; e < E; ++e) sc[e] = std::sqrt(ops::softplus(sc[e]));
            top_experts(sc, N->probs_b.data(), E, K, expert_order_, pred_top_.data());
            for (int k = 0; k < K; ++k) pred_mark_[pred_top_[k]] = 1;
        }
    }
    for (int e = 0; e < E; ++e)
        if (pred_mark_[e]) pred_ids_.push_back(e);
    experts.prefetch(layer + 1, pred_ids_);
}

void CpuExecutor::shared_expert(int layer, const LayerWeights &L) {
    CpuOpTimer timer(prof_, CpuOp::Shared, mm_.weight_bytes);
    const size_t n = (size_t)R_ * c_.n_embd;
    grow(eout_, n);
    expert_ffn(pool_, mm_, ffn_, L.gate_sh, L.up_sh, L.down_sh, XN_.data(), R_, eout_.data(), c_.swiglu_limit[layer]);
    for (size_t i = 0; i < n; ++i) A_[i] += eout_[i];
}

}  // namespace ds4
