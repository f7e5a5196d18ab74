// A conversation's engine state on one model: the caches of every layer (sliding-window
// K=V rows, compressor and indexer projections of recent tokens, compressed entries), the
// token history and the logits of the last position.
//
// Caches are rings indexed by absolute position. A ring holds the last `cap` positions,
// where cap covers the window/overlap the math needs plus one prefill chunk plus some
// slack, so rewinding a few tokens (speculative decoding, regenerate) is free; a rewind
// further back than the rings reach rebuilds from the token history.
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

namespace ds4 {

struct SamplingParams {
    float temperature = 0.f;   // 0 = greedy
    int top_k = 0;             // 0 = off
    float top_p = 1.f;
    float min_p = 0.f;
};

class Session {
public:
    // prefill_cap: tokens per forward chunk (0 = default). rewind_slack: extra positions the
    // rings keep beyond what the math needs.
    Session(const Model &m, int ctx, int prefill_cap = 0, int rewind_slack = 64);
    ~Session();
    Session(const Session &) = delete;
    Session &operator=(const Session &) = delete;

    const Model &model() const { return m_; }
    int ctx() const { return ctx_; }
    int pos() const { return (int)tokens_.size(); }
    int prefill_cap() const { return prefill_cap_; }
    uint64_t generation() const { return generation_; }
    uint64_t memory_bytes() const;    // caches
    uint64_t scratch_bytes() const;   // per-call work buffers (grow with the largest chunk)
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

    bool has_logits() const { return has_logits_; }
    const std::vector<float> &logits() const;
    int argmax() const;
    int sample(const SamplingParams &p, uint64_t *rng) const;
    std::vector<std::pair<int, float>> top_logprobs(int n) const;

    // The engine's part of a session payload (DESIGN.md §4): everything needed to continue
    // bit-exactly from pos(). Token ids are saved by the host alongside.
    std::vector<uint8_t> save_tail() const;
    // Validates the tail fully (sizes, counts) against this model and ctx before touching
    // the session; throws with a clear message otherwise.
    void load_tail(const uint8_t *data, size_t n, std::span<const int32_t> toks);
    uint64_t tail_bytes() const;

    struct Impl;

private:
    void check_tokens(std::span<const int32_t> toks) const;
    void forward(std::span<const int32_t> toks, std::vector<float> *all_logits);
    void reset_state();

    const Model &m_;
    int ctx_;
    int prefill_cap_;
    int slack_;
    std::vector<int32_t> tokens_;
    std::vector<float> logits_;
    bool has_logits_ = false;
    uint64_t generation_ = 1;
    int64_t valid_from_ = 0;   // ring rows below this absolute position are not held
    Impl *impl_;
};

}  // namespace ds4
