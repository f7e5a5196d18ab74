#include "engine/model/speculative.h"

#include <algorithm>
#include <cmath>

#include "engine/common/error.h"

namespace ds4 {

SpecCounters &SpecCounters::operator+=(const SpecCounters &o) {
    trials += o.trials;
    drafted += o.drafted;
    accepted += o.accepted;
    fallbacks += o.fallbacks;
    committed += o.committed;
    return *this;
}

SpeculativeDecoder::SpeculativeDecoder(Session &target, Session &drafter, const SpecOptions &opt)
    : target_(target), drafter_(drafter), opt_(opt), rate_(opt.initial_rate) {
    if (&target == &drafter) fail("speculative decoding: the drafter must be a session of its own");
    if (opt.draft_max < 1 || opt.draft_max > 64) failf("speculative decoding: draft_max %d must be in 1..64", opt.draft_max);
    if (!(opt.min_gain > 0.f && opt.min_gain < 1.f)) failf("speculative decoding: min_gain %g must be in (0, 1)", opt.min_gain);
    if (!(opt.rate_decay > 0.f && opt.rate_decay <= 1.f))
        failf("speculative decoding: rate_decay %g must be in (0, 1]", opt.rate_decay);
    if (!(opt.initial_rate >= 0.f && opt.initial_rate <= 1.f))
        failf("speculative decoding: initial_rate %g must be in [0, 1]", opt.initial_rate);
    const int vt = target.model().config().n_vocab, vd = drafter.model().config().n_vocab;
    if (vt != vd) failf("speculative decoding: the drafter's vocabulary has %d tokens, the target's %d", vd, vt);
    if (drafter.ctx() < target.ctx())
        failf("speculative decoding: the drafter's context %d is smaller than the target's %d", drafter.ctx(), target.ctx());
}

int SpeculativeDecoder::draft_width() const {
    int k = 1;
    while (k < opt_.draft_max && std::pow(rate_, k + 1) >= opt_.min_gain) ++k;
    return k;
}

void SpeculativeDecoder::note_outcomes(int accepted, int drafted) {
    const double l = opt_.rate_decay;
    for (int i = 0; i < accepted; ++i) rate_ = (1 - l) * rate_ + l;
    if (accepted < drafted) rate_ = (1 - l) * rate_;   // drafts after the first rejection say nothing
}

// The drafter must hold the target's history plus the pending token. After our own trials
// it differs only in the last few positions (a rewind inside its rings); after the caller
// moved the target elsewhere, sync finds the common prefix and re-evaluates the rest.
void SpeculativeDecoder::catch_up_drafter(int32_t pending) {
    const std::vector<int32_t> &h = target_.tokens();
    want_.assign(h.begin(), h.end());
    want_.push_back(pending);
    drafter_.sync(want_);
}

int32_t SpeculativeDecoder::draft_one(const SamplingParams &p, uint64_t *rng, int i) {
    const std::vector<float> &l = drafter_.logits();
    if (p.temperature <= 0.f) return argmax(l);
    if ((int)q_.size() <= i) q_.resize(i + 1);
    sampling_probs(l, p, &q_[i]);
    return sample_from(q_[i], rng);
}

int SpeculativeDecoder::draft(int32_t pending, const SamplingParams &p, uint64_t *rng, int max_new) {
    if (target_.in_trial()) fail("speculative trial: a trial is pending on the target; commit it first");
    const int V = target_.model().config().n_vocab;
    if (pending < 0 || pending >= V) failf("speculative trial: pending token %d is out of range (vocabulary has %d tokens)", pending, V);
    if (max_new < 1) failf("speculative trial: max_new %d must be >= 1", max_new);
    if (p.temperature > 0.f) {
        if (!rng) fail("speculative trial: rng state is required when temperature > 0");
        check_sampling(p);
    }
    toks_.clear();
    next_.clear();
    accepted_ = 0;
    drafted_ = false;
    // Room: the trial's rows and, after them, a position for the new pending token.
    const int room = std::min(target_.ctx() - target_.pos() - 2, target_.ring_rows() - 1);
    const int k = std::min({draft_width(), max_new - 1, room});
    if (k < 1) {
        ++c_.fallbacks;
        return 0;
    }
    toks_.push_back(pending);
    try {
        catch_up_drafter(pending);
        for (int i = 0; i < k; ++i) {
            const int32_t d = draft_one(p, rng, i);
            toks_.push_back(d);
            if (i + 1 < k) drafter_.eval(d);
        }
    } catch (...) {
        toks_.clear();
        drafter_.invalidate();
        throw;
    }
    drafted_ = true;
    return k + 1;
}

int SpeculativeDecoder::trial(int32_t pending, const SamplingParams &p, uint64_t *rng, int max_new) {
    const int w = draft(pending, p, rng, max_new);
    if (w == 0) return 0;
    try {
        target_.trial(toks_, &rows_);
    } catch (...) {
        toks_.clear();
        drafted_ = false;
        throw;
    }
    verify(rows_, p, rng);
    return w;
}

void SpeculativeDecoder::verify(std::span<const float> rows, const SamplingParams &p, uint64_t *rng) {
    const int V = target_.model().config().n_vocab;
    const int w = (int)toks_.size(), k = w - 1;
    if (!drafted_ || !target_.in_trial()) fail("speculative verify: no drafted trial is pending on the target");
    if (rows.size() != (size_t)w * V) failf("speculative verify: %zu logits given, the trial has %d rows of %d", rows.size(), w, V);
    drafted_ = false;
    next_.assign(w, -1);
    std::vector<float> row(V);
    auto load_row = [&](int i) { std::copy(rows.begin() + (size_t)i * V, rows.begin() + (size_t)(i + 1) * V, row.begin()); };
    int j = 0;
    if (p.temperature <= 0.f) {
        for (int i = 0; i < w; ++i) {
            load_row(i);
            next_[i] = argmax(row);
        }
        while (j < k && next_[j] == toks_[j + 1]) ++j;
    } else {
        for (; j < k; ++j) {
            load_row(j);
            sampling_probs(row, p, &pdist_);
            const int32_t d = toks_[j + 1];
            const double pd = pdist_[d], qd = q_[j][d];
            // Accept with probability min(1, p/q): u < p/q, written without dividing.
            if (uniform01(rng) * qd < pd) {
                next_[j] = d;
                continue;
            }
            double left = 0;
            for (int t = 0; t < V; ++t) left += pdist_[t] = std::max(0.0, pdist_[t] - q_[j][t]);
            if (!(left > 0)) sampling_probs(row, p, &pdist_);   // p == q up to rounding: the residual is p
            next_[j] = sample_from(pdist_, rng);
            break;
        }
        if (j == k) {
            load_row(k);
            sampling_probs(row, p, &pdist_);
            next_[k] = sample_from(pdist_, rng);
        }
    }
    accepted_ = j;
    ++c_.trials;
    c_.drafted += k;
    c_.accepted += j;
    note_outcomes(j, k);
}

void SpeculativeDecoder::commit(int n) {
    if (!in_trial()) fail("speculative commit: no trial is pending");
    if (n < 0 || n > accepted_ + 1)
        failf("speculative commit: %d tokens asked, the trial can keep 0..%d (pending and %d accepted drafts)", n, accepted_ + 1,
              accepted_);
    target_.commit(n);
    c_.committed += n;
    toks_.clear();
}

int SpeculativeDecoder::step(int32_t pending, const SamplingParams &p, uint64_t *rng, int max_new, std::vector<int32_t> *out) {
    if (!out) fail("speculative step: out is null");
    const int w = trial(pending, p, rng, max_new);
    if (w == 0) {
        target_.eval(pending);
        out->push_back(target_.sample(p, rng));
        return 1;
    }
    const int n = accepted_ + 1;
    out->insert(out->end(), next_.begin(), next_.begin() + n);
    commit(n);
    return n;
}

}  // namespace ds4
