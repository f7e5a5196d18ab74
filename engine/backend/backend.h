// The backend interface: how the engine's layer schedule (engine/model/step.cpp) runs
// DeepSeek-V4 on a CPU, a GPU or anything else.
//
// Contract
//  - A Backend is made once per opened model and is immutable: it can make session states
//    and executors from any thread.
//  - A SessionState (session_state.h) holds one session's caches in the backend's memory.
//  - An Executor runs steps. It owns everything a step needs that is not the model or a
//    session: the thread pool or stream, activation buffers and scratch, counters. Use
//    one executor from one thread at a time; give each worker thread its own.
//  - A step is batch-first. Its rows are (session state, token, position); rows of one
//    session form one contiguous segment at consecutive positions starting where that
//    session's caches end. One decode token from each of N sessions and a prefill chunk
//    of one session are the same call.
//  - The operations are coarse DeepSeek-V4 pieces, not a general graph. Activations are
//    the executor's own named buffers (Act); each operation documents what it reads and
//    writes. The schedule calls them in order between begin() and head(); nothing is
//    visible to the host before head() except through download() (tests).
//  - Weights are passed as the bound views of ModelWeights (GGUF encodings, never
//    converted); a device backend maps them to its placed copies.
//  - Errors are thrown as ds4::Error. A step that throws leaves the sessions it touched
//    in an unknown state: the engine invalidates them.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "engine/backend/expert_source.h"
#include "engine/backend/session_state.h"
#include "engine/model/rope.h"
#include "engine/model/weights.h"

namespace ds4 {

struct StepSegment {
    SessionState *state = nullptr;
    int64_t n0 = 0;      // absolute position of the segment's first row
    int row0 = 0, n = 0; // its rows [row0, row0 + n)
};

struct StepLayout {
    std::span<const int32_t> tokens;    // [rows]
    std::span<const int64_t> pos;       // [rows]
    std::span<const int> seg;           // [rows] segment of each row
    std::span<const StepSegment> segs;
    int rows() const { return (int)tokens.size(); }
};

// The executor's activation buffers, per row unless stated.
enum class Act : uint8_t {
    H,      // [hc][n_embd] residual streams
    X,      // [n_embd] hyper-connection collapse
    XN,     // [n_embd] normed sublayer input
    A,      // [n_embd] sublayer output
    Post,   // [hc] where the sublayer output goes
    Comb,   // [hc][hc] stream mixer
    QR,     // [q_lora] normed low-rank query
    Q,      // [n_head][head_dim] normed, rotated queries
    O,      // [n_head][head_dim] attention output, rotated back
};

// Floats per row of an activation (every backend lays them out [rows][width]).
size_t act_width(const ModelConfig &c, Act a);

// The visibility rules of one layer's attention, decided by the schedule.
struct AttnSpec {
    int window = 0;      // sliding-window rows (including the query's own)
    int ratio = 0;       // 0: no compressed entries
    bool indexed = false;// CSA: only the indexer's top-k entries; HCA: every closed entry
};

struct ExecutorStats {
    uint64_t weight_bytes = 0;   // weight bytes read by products since creation
    uint64_t steps = 0, rows = 0;
};

class Executor {
public:
    virtual ~Executor() = default;

    // Starts a step: sizes buffers for the layout's rows. The layout (and the states it
    // names) must stay alive until head() returns.
    virtual void begin(const StepLayout &lay) = 0;
    // H <- token embedding, copied into every stream.
    virtual void embed(const WeightView &token_embd) = 0;
    // H -> X, Post, Comb: collapse weights, placement and the Sinkhorn-balanced mixer.
    virtual void hc_pre(const WeightView &fn, const float *base, const float *scale) = 0;
    // XN <- RMSNorm(X) * w.
    virtual void norm(const float *w) = 0;
    // H <- Post * A + Comb^T H.
    virtual void hc_post() = 0;
    // Restricts q_kv, compress, indexer_topk and attend to rows [r0, r1) until the next call
    // or begin(). A segment longer than its session's rings hold (CacheGeometry::chunk_cap)
    // runs its attention in pieces of at most that many rows, in order; the schedule then
    // restores the whole step, [0, rows), before out_proj. Everything else runs on all rows.
    virtual void attention_rows(int r0, int r1) = 0;
    // XN -> QR, Q; the K=V row of every row (normed, rotated) into its session's window ring.
    virtual void q_kv(int layer, const LayerWeights &L, const Rope &rope) = 0;
    // XN -> one compressor's rings (which 0: main, 1: indexer's); emits every entry whose
    // window closes in the step, normed and rotated at the window's first position.
    virtual void compress(int layer, int which, const CompressorWeights &cw, const Rope &rope) = 0;
    // QR, XN + indexer entries -> each row's top-k visible entries (kept for attend()).
    virtual void indexer_topk(int layer, const LayerWeights &L, const Rope &rope, int topk) = 0;
    // Q + window rows + visible/selected entries, softmax with the head's sink -> O,
    // rotated back at the query position.
    virtual void attend(int layer, const AttnSpec &spec, const float *sinks, const Rope &rope) = 0;
    // O -> A through the grouped low-rank output projection.
    virtual void out_proj(const LayerWeights &L) = 0;
    // XN -> each row's experts and weights: sqrt-softplus scores, chosen by the token's
    // hash-table row or by top-k of score + correction bias, renormalised and scaled.
    virtual void route(int layer, const LayerWeights &L, bool hash_routed) = 0;
    // A <- the chosen routed experts applied to XN, weighted; experts come from the source,
    // acquired once for the layer.
    virtual void routed_experts(int layer, const LayerWeights &L, ExpertSource &experts) = 0;
    // A += shared expert(XN).
    virtual void shared_expert(int layer, const LayerWeights &L) = 0;
    // H of the rows listed -> logits [rows.size()][n_vocab] in host memory.
    virtual void head(const ModelWeights &w, std::span<const int> rows, float *logits) = 0;

    // Tests: host copies of activations ([rows][width] floats).
    virtual void upload(Act a, const float *src, size_t n) = 0;
    virtual void download(Act a, float *dst, size_t n) const = 0;

    virtual const ExecutorStats &stats() const = 0;
    virtual uint64_t scratch_bytes() const = 0;
};

// What a backend runs on, for memory reports.
struct DeviceInfo {
    std::string name;               // "cpu", or the GPU's name
    uint64_t total = 0, free = 0;   // device memory (0 for the CPU)
    uint64_t weight_bytes = 0;      // weights placed in device memory (0 for the CPU)
};

// A model's device weights placed in one allocation another process can import (the CUDA
// backend: VMM with a POSIX file-descriptor handle; ARCHITECTURE.md §5, "Shared drafter").
// Both sides place the same ranges in the same order at the same offsets, so the layout is
// checked by its hash, not sent range by range.
struct DeviceWeightsLayout {
    uint64_t bytes = 0;         // the allocation's size (a multiple of granularity)
    uint64_t granularity = 0;   // the device's allocation granularity
    uint8_t uuid[16] = {};      // the GPU the allocation lives on
    uint64_t layout_hash = 0;   // each range's size and offset, and the bytes the binding made
};

// How a device backend places its weights (ModelOptions::device_share).
struct DeviceShareOptions {
    bool exportable = false;    // in one allocation that device_share() can export
    int import_fd = -1;         // >= 0: the exporter's handle (borrowed for the open): use its
    DeviceWeightsLayout import_layout;   // allocation, with this layout, instead of uploading
};

// What became of DeviceShareOptions. A refused import or export is not an error of the open:
// the weights are uploaded privately and `why` says why.
struct DeviceShareState {
    int export_fd = -1;         // the exportable allocation's handle (owned by the backend)
    DeviceWeightsLayout layout; // of the exported or imported allocation
    bool imported = false;      // the weights are the exporter's device memory
    bool read_only = false;     // imported and mapped read-only (else read-write, never written)
    std::string why;            // an export or import that was asked for and not done
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;
    virtual DeviceInfo device_info() const = 0;
    virtual std::unique_ptr<SessionState> make_state(const CacheGeometry &g) const = 0;
    // n_threads: CPU workers (0 = all cores); ignored where it means nothing.
    virtual std::unique_ptr<Executor> make_executor(int n_threads) const = 0;
    // Rows a session's rings hold beyond the window when the session does not choose: a
    // GPU fills its tensor cores and groups routed experts only with long chunks; a CPU
    // keeps the rings small and takes longer steps through prefill_step_rows().
    virtual int prefill_chunk() const = 0;
    // Prompt tokens per forward step when a session does not choose: at least
    // prefill_chunk(). More where the executor runs the attention of a longer segment in
    // ring-sized pieces (Executor::attention_rows), so the products, the routed experts'
    // above all, see more rows a step without every session's rings growing.
    virtual int prefill_step_rows() const { return prefill_chunk(); }
    // Whether its executors take segments longer than their sessions' rings hold and run
    // their attention in pieces (Executor::attention_rows); without it a segment of a step
    // has at most the rows its session's rings were made for.
    virtual bool attention_in_pieces() const { return false; }
    // The device weights' sharing (DeviceShareOptions); nothing on backends without a device.
    virtual DeviceShareState device_share() const { return {}; }
    // The device memory's copy rate measured now (bytes read plus bytes written per second by
    // a device-to-device copy): the ceiling a benchmark's achieved rate is set against. 0 on
    // backends without device memory of their own, or when the measurement could not run.
    virtual double device_copy_bytes_per_s() const { return 0; }
};

}  // namespace ds4
