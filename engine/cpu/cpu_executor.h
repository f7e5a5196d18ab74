// The CPU executor: the backend operations (backend.h) as loops over host floats on a
// thread pool. Matrix products go through kernels/matmul (GGUF encodings decoded in the
// kernels); everything else is per-row vector math from kernels/ops.h. Every buffer is
// grown on demand and reused, so a warm decode step allocates nothing.
#pragma once
#include <memory>
#include <utility>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/cpu/cpu_profile.h"
#include "engine/cpu/cpu_state.h"
#include "engine/kernels/matmul.h"
#include "engine/kernels/ops.h"
#include "engine/kernels/threadpool.h"

namespace ds4 {

using IndexScore = ops::IndexScore;

// The executor's step-sized scratch (huge pages from 4 MB, cache_aligned.h); a session's
// caches stay FloatVec.
using ScratchVec = quant::ScratchVector<float>;

// Scratch of one pool thread inside a parallel loop (indexed by the loop's thread index).
struct TaskScratch {
    ScratchVec cos, sin;           // RoPE tables at one position
    void need_rope(size_t n_pairs) {
        if (cos.size() < n_pairs) cos.resize(n_pairs), sin.resize(n_pairs);
    }
    ScratchVec f;                  // one loop body's working floats
    std::vector<const float *> rows;
    std::vector<int> order;        // the router's ranking of the experts
};

template <class V>
inline void grow(V &v, size_t n) {
    if (v.size() < n) v.resize(n);
}

// What one expert's products need besides the weights: its quantised input, the gate and
// up outputs.
struct FfnScratch {
    quant::ScratchVector<uint8_t> xq;
    ScratchVec g, u;
    size_t bytes() const { return xq.capacity() + (g.capacity() + u.capacity()) * sizeof(float); }
};

// A pool thread's own products: whole routed experts run on one thread each in a prefill
// step (CpuExecutor::routed_experts), with a one-thread pool of their own.
struct ExpertLane {
    ExpertLane() : mm(one) {}
    ThreadPool one{1, false};
    MatmulCtx mm;
    FfnScratch ffn;
    ScratchVec in;           // the expert's input rows
};

class CpuExecutor final : public Executor {
public:
    CpuExecutor(const ModelConfig &c, int n_threads);

    void begin(const StepLayout &lay) override;
    void embed(const WeightView &token_embd) override;
    void hc_pre(const WeightView &fn, const float *base, const float *scale) override;
    void norm(const float *w) override;
    void hc_post() override;
    void attention_rows(int r0, int r1) override;
    void q_kv(int layer, const LayerWeights &L, const Rope &rope) override;
    void compress(int layer, int which, const CompressorWeights &cw, const Rope &rope) override;
    void indexer_topk(int layer, const LayerWeights &L, const Rope &rope, int topk) override;
    void attend(int layer, const AttnSpec &spec, const float *sinks, const Rope &rope) override;
    void out_proj(const LayerWeights &L) override;
    void route(int layer, const LayerWeights &L, bool hash_routed) override;
    void routed_experts(int layer, const LayerWeights &L, ExpertSource &experts) override;
    void shared_expert(int layer, const LayerWeights &L) override;
    void head(const ModelWeights &w, std::span<const int> rows, float *logits) override;
    void upload(Act a, const float *src, size_t n) override;
    void download(Act a, float *dst, size_t n) const override;
    const ExecutorStats &stats() const override;
    uint64_t scratch_bytes() const override;

private:
    // Row r of the attention's rows (attention_rows).
    CpuSessionState &state_of_row(int r) const { return *static_cast<CpuSessionState *>(alay_.segs[alay_.seg[r]].state); }
    ScratchVec &act(Act a);
    static void expert_ffn(ThreadPool &pool, MatmulCtx &mm, FfnScratch &s, const WeightView &gate, const WeightView &up,
                           const WeightView &down, const float *in, int m, float *out, float lim);
    void experts_by_thread(size_t u0, size_t n, float lim);

    const ModelConfig &c_;
    ThreadPool pool_;
    MatmulCtx mm_;
    mutable ExecutorStats stats_;
    CpuProfile prof_;   // DS4_CPU_PROFILE
    StepLayout lay_;
    int R_ = 0;   // rows of the current step
    // The rows q_kv, compress, indexer_topk and attend run on: rows [ar0_, ar0_ + rows) of
    // the step, as a layout of their own (row 0 is the step's row ar0_; every segment kept,
    // clipped to the range, so the rows' segment indices stay valid).
    StepLayout alay_;
    std::vector<StepSegment> asegs_;
    int ar0_ = 0;

    // Activations (Act) and scratch.
    ScratchVec H_, X_, XN_, A_, post_, comb_, qr_, q_, o_;
    ScratchVec flat_, mix_, p1_, p2_, kvb_, iq_, iw_, oa_, head_, ein_, eout_, router_, expert_w_;
    std::vector<int> expert_ids_, expert_order_, used_;   // expert_order_: predict_next's ranking
    std::vector<ExpertView> views_;
    std::vector<int> pred_ids_, pred_top_;   // predict_next: the guessed experts, one token's top K
    std::vector<char> pred_mark_;
    ScratchVec pred_scores_;
    void predict_next(int layer, ExpertSource &experts);
    std::vector<std::vector<int>> sel_;                         // indexer picks per row
    std::vector<IndexScore> iscore_;                            // indexer scores of a group of rows
    std::vector<int64_t> ioff_;                                 // each row's first score in iscore_
    // Rows of one session whose entries' blocks of 16 are transposed once for all of them.
    static constexpr int kKeyBlockRows = 16;
    struct KeyChunk {
        int t_begin, t_end;
        int64_t items_end;   // (chunk, block) items before the next chunk's
    };
    std::vector<KeyChunk> key_chunks_;
    void score_key_blocks(int layer, int t0, int t1, float qscale);
    void score_rows(int layer, int t0, int t1, float qscale);
    std::vector<std::vector<std::pair<int, float>>> by_expert_; // (row, weight) per expert
    FfnScratch ffn_;
    std::vector<TaskScratch> tasks_;
    std::vector<std::unique_ptr<ExpertLane>> lanes_;   // one per pool thread, made on first use
    std::vector<int> by_size_;                           // experts (indices into used_) by rows, most first
    std::vector<std::pair<int64_t, float>> token_rows_;  // per token, K (output row, weight) in expert order
    std::vector<int> filled_;                            // token_rows_ filled per token
    std::vector<size_t> first_row_;                      // expert u's first output row (by thread)
};

}  // namespace ds4
