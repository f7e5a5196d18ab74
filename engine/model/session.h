// A conversation on one model: its cache state (held by the backend, session_state.h), the
// token history and the logits of the last position. Steps run on an Executor: either one
// the caller shares between its sessions (one per thread), or a private one.
//
// Caches are rings indexed by absolute position. A ring holds the last `cap` positions,
// where cap covers the window/overlap the math needs plus one prefill chunk plus some
// slack, so rewinding a few tokens (speculative decoding, regenerate) is free; a rewind
// further back than the rings reach rebuilds from the token history. A trial (speculative
// decoding) evaluates k tokens with the cache writes journaled; commit(j) keeps j of them
// and puts back what the others overwrote, without running the forward again.
//
// Validation happens before mutation: a rejected call leaves the session unchanged. A
// failure after the forward pass started invalidates the session and bumps generation().
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "engine/model/sampling.h"

namespace ds4 {

struct BatchRow;

class Session {
public:
    // prefill_cap: tokens per forward chunk, and the rows the rings hold beyond the window.
    // 0: the rings hold the backend's prefill_chunk() (256 on the CPU, 2048 on a GPU) and a
    // step takes up to its prefill_step_rows() (1024 on the CPU, whose executor runs the
    // attention of a longer chunk in ring-sized pieces; 2048 on a GPU).
    // rewind_slack: extra positions the rings keep beyond what the math needs.
    static constexpr int kDefaultRewindSlack = 64;
    Session(const Model &m, int ctx, int prefill_cap = 0, int rewind_slack = kDefaultRewindSlack);
    // Runs on `ex`, which the caller keeps alive and uses from one thread at a time.
    Session(const Model &m, Executor &ex, int ctx, int prefill_cap = 0, int rewind_slack = kDefaultRewindSlack);
    ~Session();
    Session(const Session &) = delete;
    Session &operator=(const Session &) = delete;

    const Model &model() const { return m_; }
    int ctx() const { return ctx_; }
    int pos() const { return (int)tokens_.size(); }
    // Most tokens of this session in one forward step (prefill chunks, forward_batch rows).
    int prefill_cap() const { return prefill_cap_; }
    // Rows one attention pass writes into the rings; a trial has at most this many tokens.
    int ring_rows() const { return state_->geometry().chunk_cap; }
    // Sets prefill_cap() (1..ctx). More than ring_rows() needs a backend whose executor
    // splits the attention (Backend::attention_in_pieces()); otherwise this throws.
    void set_prefill_cap(int rows);
    uint64_t generation() const { return generation_; }
    uint64_t memory_bytes() const;    // caches
    // memory_bytes() of a session Session(m, ctx) once it has held n tokens (defaults for
    // prefill_cap and rewind_slack).
    static uint64_t cache_bytes_for(const Model &m, int ctx, int64_t n);
    uint64_t scratch_bytes() const;   // the private executor's buffers (0 with a shared one)
    Executor &executor() const { return *ex_; }
    SessionState &state() const { return *state_; }
    const std::vector<int32_t> &tokens() const { return tokens_; }

    using Progress = std::function<void(int done, int total)>;
    // Makes the session hold exactly `toks`: keeps the longest common prefix with the
    // current state when the caches allow, then prefills the rest in chunks. progress(done,
    // total) runs after each chunk (a durable frontier). all_logits, when given, receives
    // the logits after every token that this call evaluates (rows in order).
    void sync(std::span<const int32_t> toks, const Progress &progress = {}, std::vector<float> *all_logits = nullptr);
    void eval(int32_t token);
    // Drops positions >= pos. Logits are unavailable until a token is evaluated.
    void rewind(int pos);
    void invalidate();
    // Whether rewind(pos) keeps the caches (otherwise it rebuilds on the next sync).
    bool can_rewind_in_place(int pos) const;

    // Evaluates toks (at most ring_rows()) as a trial: logits of every position into
    // *all_logits (rows in order), cache writes journaled. Until commit(), other calls
    // that change the session fail.
    void trial(std::span<const int32_t> toks, std::vector<float> *all_logits);
    // Keeps the first j trial tokens (0 <= j <= k) and undoes the rest: afterwards the
    // session equals one that only evaluated those j tokens.
    void commit(int j);
    bool in_trial() const { return trial_k_ > 0; }
    // The pending trial's logits, every position's (rows in order); empty without a trial.
    std::span<const float> trial_logits() const {
        return trial_k_ ? std::span<const float>(trial_logits_) : std::span<const float>();
    }

    bool has_logits() const { return has_logits_; }
    const std::vector<float> &logits() const;
    int argmax() const { return ds4::argmax(logits()); }
    int sample(const SamplingParams &p, uint64_t *rng) const { return ds4::sample(logits(), p, rng); }
    std::vector<std::pair<int, float>> top_logprobs(int n) const { return ds4::top_logprobs(logits(), n); }

    // The engine's part of a session payload (ARCHITECTURE.md §4): everything needed to continue
    // bit-exactly from pos(). Token ids are saved by the host alongside.
    std::vector<uint8_t> save_tail() const;
    // Validates the tail fully (sizes, counts) against this model and ctx before touching
    // the session; throws with a clear message otherwise.
    void load_tail(const uint8_t *data, size_t n, std::span<const int32_t> toks);
    uint64_t tail_bytes() const;

    friend void forward_batch(Executor &ex, std::span<const BatchRow> rows, std::vector<float> *logits);

private:
    Session(const Model &m, Executor *ex, int ctx, int prefill_cap, int rewind_slack, int);   // ex null: private
    void check_tokens(std::span<const int32_t> toks) const;
    void check_idle(const char *what) const;
    // last_logits false (no all_logits): a chunk that more chunks follow, whose logits
    // nobody reads; the output head is skipped and the session has no logits after it.
    void forward(std::span<const int32_t> toks, std::vector<float> *all_logits, bool last_logits = true);
    void reset_state();

    const Model &m_;
    std::unique_ptr<Executor> own_ex_;
    Executor *ex_;
    std::unique_ptr<SessionState> state_;
    int ctx_;
    int prefill_cap_;
    int slack_;
    std::vector<int32_t> tokens_;
    std::vector<float> logits_;
    bool has_logits_ = false;
    uint64_t generation_ = 1;
    int64_t valid_from_ = 0;   // ring rows below this absolute position are not held
    int trial_k_ = 0;          // tokens of a pending trial
    std::vector<float> trial_logits_, pre_trial_logits_;
    bool pre_trial_has_logits_ = false;
    // Step layout scratch.
    std::vector<int64_t> pos_;
    std::vector<int> seg_, logit_rows_;
    std::vector<StepSegment> segs_;
    std::vector<float> out_;
};

// The tail's trailing checksum, over its first n bytes (for tools and fuzzers that rewrite
// tails; the tail codec itself checks it on load).
uint64_t session_tail_checksum(const uint8_t *p, size_t n);

// One row of a batch-first step across sessions (like llama_batch): the session, its next
// token and that token's position (the session's length plus the rows of it before this
// one), and whether its logits are wanted.
struct BatchRow {
    Session *session;
    int32_t token;
    int64_t pos;
    bool logits;
    // The session's rows are a trial (Session::trial in this step): every row wants logits,
    // every row of the session says so, and its cache writes are journaled until commit().
    bool trial = false;
};

// Runs one step over rows of several sessions on `ex`. Rows of one session must be
// contiguous, at consecutive positions from its current length, at most its prefill_cap
// (a trial at most its ring_rows).
// Each session's last row must want logits (they become its logits()); *logits, when
// given, receives the rows that want them, in order, n_vocab each. Trial rows leave their
// session in a trial, exactly as Session::trial of those tokens would. Everything is checked
// before anything runs; a failure inside the step invalidates every session in it.
void forward_batch(Executor &ex, std::span<const BatchRow> rows, std::vector<float> *logits);

}  // namespace ds4
