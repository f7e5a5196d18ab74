// Speculative decoding with a drafter (ARCHITECTURE.md §7, "Speculation"). The decoder owns
// nothing: it borrows the target's Session and a Session of a smaller drafter model with the
// same vocabulary, and keeps the drafter in step with the target.
//
// The caller's decoding loop holds a *pending* token: chosen after the target's history and
// already given out, not yet evaluated (the daemon's convention). One speculative step:
//   1. the drafter catches up to history + pending and drafts k tokens (greedy, or sampled
//      from its own transformed distribution q when temperature > 0);
//   2. the target evaluates [pending, d1..dk] as one journaled trial: k+1 rows of logits,
//      row i being the target's distribution p_i after pending, d1..di;
//   3. greedy: d(i+1) is accepted while it equals argmax(p_i); sampled: accepted with
//      probability min(1, p_i(d)/q(d)), and the first rejection draws from
//      norm(max(p_i - q, 0)); after k acceptances a bonus token is drawn from p_k. This
//      keeps the output distribution exactly the target's (same transform as sampling.h);
//   4. commit(n) keeps pending and n-1 accepted drafts through the journal (no re-forward);
//      next()[n-1] becomes the caller's new pending token.
// trial()/commit() are split so a caller can stop inside the accepted run (stop tokens, a
// length limit) and keep only what it used; step() does both for a plain loop.
//
// k adapts to the recent acceptance rate a (an average over the recent drafts' outcomes):
// the largest k <= draft_max with a^k >= min_gain, i.e. the last draft still has at least
// that estimated chance of being used; never below 1.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "engine/model/sampling.h"
#include "engine/model/session.h"

namespace ds4 {

struct SpecOptions {
    int draft_max = 4;        // drafts per trial at most (1..64)
    float min_gain = 0.3f;    // see above; in (0, 1)
    float rate_decay = 0.1f;  // weight of each new draft outcome in the acceptance average
    float initial_rate = 0.6f;
};

// Cumulative; "accepted" counts drafts the target agreed with, whether or not the caller
// kept them all.
struct SpecCounters {
    uint64_t trials = 0;     // target trials run
    uint64_t drafted = 0;    // draft tokens proposed
    uint64_t accepted = 0;   // drafts accepted by the target
    uint64_t fallbacks = 0;  // trial() calls that declined (ordinary decoding instead)
    uint64_t committed = 0;  // trial tokens kept by commits (each trial's pending included)
    SpecCounters &operator+=(const SpecCounters &o);
};

class SpeculativeDecoder {
public:
    // target and drafter: sessions on models of the same vocabulary size (the caller checks
    // the tokenizers), different sessions, the drafter's context at least the target's.
    SpeculativeDecoder(Session &target, Session &drafter, const SpecOptions &opt = {});

    // Runs steps 1-3 for the pending token. max_new: how many more tokens the caller can
    // take (drafts past max_new - 1 would be thrown away). Returns the trial's width w =
    // 1 + k (>= 2) with the trial pending on the target, or 0 when speculation does not
    // apply here (max_new < 2, no room in the context or the step) and nothing changed: the
    // caller evaluates pending and samples as usual. Everything is validated before
    // anything runs. A failure in the drafter leaves the target unchanged (the drafter is
    // rebuilt on the next trial); one in the target invalidates it (Session's rule).
    int trial(int32_t pending, const SamplingParams &p, uint64_t *rng, int max_new);
    // trial() in two halves, so several sessions' verifications share one forward_batch step:
    // draft() runs step 1 and returns the width w (0: declined, as trial()) with tokens()
    // holding pending and the drafts and nothing changed on the target; the caller then runs
    // tokens() on the target as a trial (BatchRow::trial) and hands its w rows of logits to
    // verify(), with the same p and rng, which runs step 3. A trial() equals draft() +
    // verify() of the same rows, random draws included.
    int draft(int32_t pending, const SamplingParams &p, uint64_t *rng, int max_new);
    void verify(std::span<const float> rows, const SamplingParams &p, uint64_t *rng);
    // The pending trial: tokens()[0..w) = pending, d1..dk; next()[i] = the target's choice
    // after tokens()[0..i] (greedy: the argmax of row i; sampled: the accepted draft, the
    // residual draw at the first rejection, or the bonus), -1 past the first rejection when
    // sampling. accepted() = j, the drafts accepted; next()[i] == tokens()[i+1] for i < j.
    std::span<const int32_t> tokens() const { return toks_; }
    std::span<const int32_t> next() const { return next_; }
    int accepted() const { return accepted_; }
    bool in_trial() const { return target_.in_trial() && !toks_.empty(); }
    // Keeps the first n trial tokens, 0 <= n <= accepted() + 1: the target then holds its
    // history + tokens()[0..n) and its logits are row n-1 (n > 0); the new pending token is
    // next()[n-1]. n = 0 drops the whole trial (pending included).
    void commit(int n);
    // trial() + commit(accepted() + 1), or on fallback target.eval(pending) + sample; appends
    // the tokens produced (the last is the new pending token) to *out and returns how many.
    int step(int32_t pending, const SamplingParams &p, uint64_t *rng, int max_new, std::vector<int32_t> *out);

    int draft_width() const;   // the k the next trial will use (before room limits)
    // Forgets the acceptance history: the next width is a fresh decoder's (counters kept).
    void reset_rate() { rate_ = opt_.initial_rate; }
    double acceptance_rate() const { return rate_; }
    const SpecCounters &counters() const { return c_; }
    const SpecOptions &options() const { return opt_; }
    Session &target() const { return target_; }
    Session &drafter() const { return drafter_; }

private:
    void catch_up_drafter(int32_t pending);
    int32_t draft_one(const SamplingParams &p, uint64_t *rng, int i);
    void note_outcomes(int accepted, int drafted);
    bool drafted_ = false;   // draft() succeeded, verify() not yet run

    Session &target_;
    Session &drafter_;
    SpecOptions opt_;
    SpecCounters c_;
    double rate_;
    std::vector<int32_t> toks_, next_, want_;
    int accepted_ = 0;
    std::vector<std::vector<double>> q_;   // the drafter's distributions (sampling)
    std::vector<double> pdist_;
    std::vector<float> rows_;
};

}  // namespace ds4
