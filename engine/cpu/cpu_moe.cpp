// CPU executor: the mixture of experts. Router, routed experts grouped by expert (each
// expert's weights read once per step whatever the number of rows using it), shared expert.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/cpu/cpu_executor.h"
#include "engine/cpu/cpu_grain.h"
#include "engine/kernels/matmul.h"
#include "engine/kernels/ops.h"

namespace ds4 {

namespace {

// SwiGLU with the reference's clamping: silu(min(g, L)) * clamp(u, -L, L).
void swiglu(float *g, const float *u, int64_t n, float lim) {
    for (int64_t i = 0; i < n; ++i) {
        const float a = std::min(g[i], lim);
        const float b = std::clamp(u[i], -lim, lim);
        g[i] = ops::silu(a) * b;
    }
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
    grow(expert_order_, (size_t)E);
    for (int t = 0; t < T; ++t) {
        float *sc = router_.data() + (size_t)t * E;
        for (int e = 0; e < E; ++e) sc[e] = std::sqrt(ops::softplus(sc[e]));
        int *id = expert_ids_.data() + (size_t)t * K;
        if (hash_routed) {
            for (int k = 0; k < K; ++k) id[k] = L.tid2eid[(size_t)lay_.tokens[t] * K + k];
        } else {
            std::vector<int> &order = expert_order_;
            for (int e = 0; e < E; ++e) order[e] = e;
            std::partial_sort(order.begin(), order.begin() + K, order.begin() + E, [&](int a, int b) {
                const float sa = sc[a] + L.probs_b[a], sb = sc[b] + L.probs_b[b];
                return sa > sb || (sa == sb && a < b);
            });
            for (int k = 0; k < K; ++k) id[k] = order[k];
        }
        double sum = 0;
        for (int k = 0; k < K; ++k) sum += sc[id[k]];
        for (int k = 0; k < K; ++k) expert_w_[(size_t)t * K + k] = (float)(sc[id[k]] / (sum + 1e-20) * c.expert_scale);
    }
}

// y[m][D] = expert(x[m][D]) for m rows: gate/up share one quantisation of x.
void CpuExecutor::expert_ffn(const WeightView &gate, const WeightView &up, const WeightView &down, const float *in, int m,
                             float *out, float lim) {
    const int D = c_.n_embd, F = (int)gate.out;
    grow(g_, (size_t)m * F);
    grow(u_, (size_t)m * F);
    const uint64_t row = quantize_rows(pool_, gate.type, in, m, D, D, xq_ffn_);
    matmul_q(mm_, gate, xq_ffn_.data(), m, row, g_.data(), F);
    if (up.type == gate.type) {
        matmul_q(mm_, up, xq_ffn_.data(), m, row, u_.data(), F);
    } else {
        matmul(mm_, up, in, m, D, u_.data(), F);
    }
    // The rows are contiguous: one elementwise pass over m * F values, split over the pool
    // (a serial pass cost ~9 ms of a 256-row flash-shape prefill step, for all experts).
    pool_.parallel_for((int64_t)m * F, cpu_grain(24), [&](int64_t b, int64_t e, int) {
        swiglu(g_.data() + b, u_.data() + b, e - b, lim);
    });
    matmul(mm_, down, g_.data(), m, F, out, D);
}

void CpuExecutor::routed_experts(int layer, const LayerWeights &L, ExpertSource &experts) {
    CpuOpTimer timer(prof_, CpuOp::Experts, mm_.weight_bytes);
    (void)L;
    const int T = R_, D = c_.n_embd, E = c_.n_expert, K = c_.n_expert_used;
    float *out = A_.data();
    std::fill(out, out + (size_t)T * D, 0.f);
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
    // A bounded source (SSD streaming) may hold fewer experts than a big batch uses in one
    // layer: acquire them in groups. The output is the same sum in the same order.
    const size_t group = std::max<size_t>(experts.max_acquire(), 1);
    for (size_t u0 = 0; u0 < used_.size(); u0 += group) {
        const size_t n = std::min(group, used_.size() - u0);
        experts.acquire(layer, std::span<const int>(used_.data() + u0, n), views_.data() + u0);
        if (u0 == 0) predict_next(layer, experts);
        for (size_t u = u0; u < u0 + n; ++u) {
            const auto &list = by_expert_[used_[u]];
            const int m = (int)list.size();
            grow(ein_, (size_t)m * D);
            grow(eout_, (size_t)m * D);
            for (int i = 0; i < m; ++i) std::memcpy(ein_.data() + (size_t)i * D, XN_.data() + (size_t)list[i].first * D, sizeof(float) * D);
            const ExpertView &v = views_[u];
            expert_ffn(v.gate, v.up, v.down, ein_.data(), m, eout_.data(), lim);
            for (int i = 0; i < m; ++i) ops::axpy(list[i].second, eout_.data() + (size_t)i * D, out + (size_t)list[i].first * D, D);
        }
    }
    experts.release();
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
        std::vector<int> &order = expert_order_;
        for (int t = 0; t < T; ++t) {
            float *sc = pred_scores_.data() + (size_t)t * E;
            for (int e = 0; e < E; ++e) sc[e] = std::sqrt(ops::softplus(sc[e])) + N->probs_b[e];
            for (int e = 0; e < E; ++e) order[e] = e;
            std::partial_sort(order.begin(), order.begin() + K, order.begin() + E,
                              [&](int a, int b) { return sc[a] > sc[b] || (sc[a] == sc[b] && a < b); });
            for (int k = 0; k < K; ++k) pred_mark_[order[k]] = 1;
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
    expert_ffn(L.gate_sh, L.up_sh, L.down_sh, XN_.data(), R_, eout_.data(), c_.swiglu_limit[layer]);
    for (size_t i = 0; i < n; ++i) A_[i] += eout_[i];
}

}  // namespace ds4
