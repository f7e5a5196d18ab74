#include "engine/model/session.h"

#include <algorithm>
#include <cstring>

#include "engine/common/error.h"
#include "engine/model/step.h"

namespace ds4 {

Session::Session(const Model &m, int ctx, int prefill_cap, int rewind_slack)
    : Session(m, nullptr, ctx, prefill_cap, rewind_slack, 0) {}

Session::Session(const Model &m, Executor &ex, int ctx, int prefill_cap, int rewind_slack)
    : Session(m, &ex, ctx, prefill_cap, rewind_slack, 0) {}

Session::Session(const Model &m, Executor *ex, int ctx, int prefill_cap, int rewind_slack, int)
    : m_(m), ex_(ex), ctx_(ctx), slack_(std::max(0, rewind_slack)) {
    if (ctx <= 0) failf("context size must be positive (got %d)", ctx);
    if (ctx > (1 << 24)) failf("context size %d is too large", ctx);
    const Backend &b = m.backend();
    const int ring = std::min(prefill_cap > 0 ? prefill_cap : b.prefill_chunk(), ctx);
    prefill_cap_ = prefill_cap > 0 ? ring : std::min(std::max(ring, b.prefill_step_rows()), ctx);
    if (!ex_) {
        own_ex_ = m.make_executor();
        ex_ = own_ex_.get();
    }
    state_ = b.make_state(CacheGeometry::make(m.config(), ctx, ring, slack_));
    logits_.assign(m.config().n_vocab, 0.f);
}

Session::~Session() = default;

void Session::set_prefill_cap(int rows) {
    if (rows < 1 || rows > ctx_) failf("prefill cap %d: must be in 1..%d (the context)", rows, ctx_);
    if (rows > ring_rows() && !m_.backend().attention_in_pieces())
        failf("prefill cap %d: the %s backend runs a step's attention whole, so at most the %d rows its rings hold",
              rows, m_.backend().name().c_str(), ring_rows());
    prefill_cap_ = rows;
}

uint64_t Session::memory_bytes() const { return state_->memory_bytes() + logits_.size() * sizeof(float); }

uint64_t Session::cache_bytes_for(const Model &m, int ctx, int64_t n) {
    if (ctx <= 0 || ctx > (1 << 24)) failf("context size %d is out of range", ctx);
    // The geometry the constructor makes with its defaults.
    return CacheGeometry::make(m.config(), ctx, std::min(m.backend().prefill_chunk(), ctx), kDefaultRewindSlack).bytes_holding(n) +
           (uint64_t)m.config().n_vocab * sizeof(float);
}

uint64_t Session::scratch_bytes() const { return own_ex_ ? own_ex_->scratch_bytes() : 0; }

void Session::reset_state() {
    tokens_.clear();
    has_logits_ = false;
    valid_from_ = 0;
    state_->truncate_entries(0);
}

void Session::invalidate() {
    if (trial_k_) {
        state_->journal_end();
        trial_k_ = 0;
    }
    reset_state();
    ++generation_;
}

void Session::check_tokens(std::span<const int32_t> toks) const {
    const int V = m_.config().n_vocab;
    for (size_t i = 0; i < toks.size(); ++i)
        if (toks[i] < 0 || toks[i] >= V)
            failf("token id %d at index %zu is out of range (vocabulary has %d tokens)", toks[i], i, V);
}

void Session::check_idle(const char *what) const {
    if (trial_k_) failf("%s: a trial of %d tokens is pending; commit it first", what, trial_k_);
}

bool Session::can_rewind_in_place(int p) const {
    const int64_t n = pos();
    if (p < 0 || p > n) return false;
    if (p == n) return true;
    const ModelConfig &c = m_.config();
    for (const LayerGeometry &L : state_->geometry().layers) {
        const int64_t kv_need = std::max<int64_t>(0, p - c.sliding_window + 1);
        if (kv_need < p && kv_need < std::max<int64_t>(valid_from_, n - L.cap_kv)) return false;
        for (const CompGeometry *cg : {&L.comp, &L.icomp}) {
            if (!cg->present()) continue;
            const int64_t need = cg->needed_from(p);
            if (need < p && need < std::max<int64_t>(valid_from_, n - cg->cap)) return false;
        }
    }
    return true;
}

void Session::rewind(int p) {
    check_idle("rewind");
    if (p < 0 || p > pos()) failf("rewind to %d: position must be in 0..%d", p, pos());
    if (p == pos()) return;
    ++generation_;
    if (!can_rewind_in_place(p)) {
        // The rings no longer hold what position p needs: rebuild from the history.
        std::vector<int32_t> keep(tokens_.begin(), tokens_.begin() + p);
        reset_state();
        if (!keep.empty()) {
            try {
                for (size_t s = 0; s < keep.size(); s += prefill_cap_)
                    forward(std::span<const int32_t>(keep).subspan(s, std::min<size_t>(prefill_cap_, keep.size() - s)), nullptr,
                            s + prefill_cap_ >= keep.size());
            } catch (...) {
                invalidate();
                throw;
            }
        }
        return;
    }
    tokens_.resize(p);
    state_->truncate_entries(p);
    has_logits_ = false;
}

void Session::sync(std::span<const int32_t> toks, const Progress &progress, std::vector<float> *all_logits) {
    check_idle("sync");
    if (toks.empty()) fail("sync: empty prompt");
    if ((int64_t)toks.size() > ctx_)
        failf("prompt of %zu tokens does not fit the context of %d tokens", toks.size(), ctx_);
    check_tokens(toks);
    size_t common = 0;
    while (common < tokens_.size() && common < toks.size() && tokens_[common] == toks[common]) ++common;
    if (!all_logits && common == toks.size() && common == tokens_.size() && has_logits_) return;
    // Re-evaluate at least the last token so its logits are fresh. all_logits receives one
    // row per token evaluated here, i.e. for positions keep..toks.size()-1.
    size_t keep = std::min(common, toks.size() - 1);
    if (keep != tokens_.size()) {
        if (can_rewind_in_place((int)keep)) {
            rewind((int)keep);
        } else {
            reset_state();
            ++generation_;
            keep = 0;
        }
    }
    if (all_logits) all_logits->clear();
    const int total = (int)toks.size();
    try {
        for (size_t s = keep; s < toks.size(); s += prefill_cap_) {
            const size_t n = std::min<size_t>(prefill_cap_, toks.size() - s);
            // A progress callback may save a checkpoint (logits included) at any chunk's end.
            forward(toks.subspan(s, n), all_logits, s + n == toks.size() || progress);
            if (progress) progress((int)(s + n), total);
        }
    } catch (...) {
        invalidate();
        throw;
    }
}

void Session::eval(int32_t token) {
    check_idle("eval");
    if (pos() >= ctx_) failf("context full: the session holds %d tokens (context %d)", pos(), ctx_);
    const int32_t t[1] = {token};
    check_tokens(t);
    try {
        forward(t, nullptr);
    } catch (...) {
        invalidate();
        throw;
    }
}

// One step of this session alone: rows are its next T tokens.
void Session::forward(std::span<const int32_t> toks, std::vector<float> *all_logits, bool last_logits) {
    const int T = (int)toks.size(), V = m_.config().n_vocab;
    if (T == 0) return;
    if (T > prefill_cap_) failf("internal: chunk of %d tokens exceeds the prefill cap %d", T, prefill_cap_);
    if (pos() + T > ctx_) failf("context full: %d + %d tokens exceed the context of %d", pos(), T, ctx_);
    const int64_t n0 = pos();
    pos_.resize(T);
    seg_.assign(T, 0);
    for (int t = 0; t < T; ++t) pos_[t] = n0 + t;
    segs_.assign(1, StepSegment{state_.get(), n0, 0, T});
    // The head of a 129K vocabulary reads ~530 MB a step: a long prompt's middle chunks skip it.
    const int t0 = all_logits ? 0 : last_logits ? T - 1 : T;
    logit_rows_.resize(T - t0);
    for (int t = t0; t < T; ++t) logit_rows_[t - t0] = t;
    if (out_.size() < logit_rows_.size() * (size_t)V) out_.resize(logit_rows_.size() * (size_t)V);
    run_step(m_, *ex_, StepLayout{toks, pos_, seg_, segs_}, logit_rows_, out_.data());
    tokens_.insert(tokens_.end(), toks.begin(), toks.end());
    has_logits_ = !logit_rows_.empty();
    if (has_logits_) std::memcpy(logits_.data(), out_.data() + (logit_rows_.size() - 1) * V, sizeof(float) * V);
    if (all_logits) all_logits->insert(all_logits->end(), out_.begin(), out_.begin() + logit_rows_.size() * V);
}

void Session::trial(std::span<const int32_t> toks, std::vector<float> *all_logits) {
    check_idle("trial");
    const int k = (int)toks.size();
    if (k == 0) fail("trial: no tokens");
    if (k > ring_rows()) failf("trial of %d tokens exceeds the step size %d", k, ring_rows());
    if (pos() + k > ctx_) failf("context full: %d + %d tokens exceed the context of %d", pos(), k, ctx_);
    check_tokens(toks);
    pre_trial_logits_ = logits_;
    pre_trial_has_logits_ = has_logits_;
    trial_logits_.clear();
    state_->journal_begin();
    trial_k_ = k;
    try {
        forward(toks, &trial_logits_);
    } catch (...) {
        invalidate();
        throw;
    }
    if (all_logits) *all_logits = trial_logits_;
}

void Session::commit(int j) {
    if (!trial_k_) fail("commit: no trial is pending");
    if (j < 0 || j > trial_k_) failf("commit: %d tokens asked, the trial evaluated %d", j, trial_k_);
    const int V = m_.config().n_vocab;
    const int64_t n0 = pos() - trial_k_, keep = n0 + j;
    if (j < trial_k_) {
        state_->journal_undo_from(keep);
        tokens_.resize(keep);
        state_->truncate_entries(keep);
        ++generation_;
        if (j > 0) {
            std::memcpy(logits_.data(), trial_logits_.data() + (size_t)(j - 1) * V, sizeof(float) * V);
            has_logits_ = true;
        } else {
            logits_ = pre_trial_logits_;
            has_logits_ = pre_trial_has_logits_;
        }
    } else {
        state_->journal_end();
    }
    trial_k_ = 0;
}

const std::vector<float> &Session::logits() const {
    if (!has_logits_) fail("no logits: evaluate a token first");
    return logits_;
}

void forward_batch(Executor &ex, std::span<const BatchRow> rows, std::vector<float> *logits) {
    if (rows.empty()) fail("forward_batch: no rows");
    const Model *model = rows[0].session ? &rows[0].session->model() : nullptr;
    std::vector<int32_t> tokens(rows.size());
    std::vector<int64_t> pos(rows.size());
    std::vector<int> seg(rows.size()), want;
    std::vector<StepSegment> segs;
    std::vector<Session *> sessions;
    // Validate everything before anything runs.
    for (size_t r = 0; r < rows.size(); ++r) {
        const BatchRow &b = rows[r];
        if (!b.session) failf("forward_batch: row %zu has no session", r);
        Session &s = *b.session;
        if (&s.model() != model) failf("forward_batch: row %zu belongs to another model", r);
        if (r == 0 || rows[r - 1].session != b.session) {
            if (std::find(sessions.begin(), sessions.end(), &s) != sessions.end())
                failf("forward_batch: rows of one session must be contiguous (row %zu)", r);
            s.check_idle("forward_batch");
            if (b.pos != s.pos()) failf("forward_batch: row %zu is at position %lld, its session holds %d tokens", r, (long long)b.pos, s.pos());
            sessions.push_back(&s);
            segs.push_back(StepSegment{s.state_.get(), b.pos, (int)r, 0});
        } else if (b.pos != rows[r - 1].pos + 1) {
            failf("forward_batch: row %zu is not at the position after the previous row of its session", r);
        }
        if (r > 0 && rows[r - 1].session == b.session && rows[r - 1].trial != b.trial)
            failf("forward_batch: rows of one session must all be trial rows or none (row %zu)", r);
        if (b.trial && !b.logits) failf("forward_batch: trial row %zu must want logits", r);
        StepSegment &sg = segs.back();
        ++sg.n;
        if (sg.n > s.prefill_cap_) failf("forward_batch: more than %d rows of one session", s.prefill_cap_);
        if (b.trial && sg.n > s.ring_rows()) failf("forward_batch: a trial of more than %d rows of one session", s.ring_rows());
        if (b.pos >= s.ctx_) failf("context full: row %zu at position %lld, the session's context is %d", r, (long long)b.pos, s.ctx_);
        const int32_t t[1] = {b.token};
        s.check_tokens(t);
        const bool last = r + 1 == rows.size() || rows[r + 1].session != b.session;
        if (last && !b.logits) failf("forward_batch: the last row of each session must want logits (row %zu)", r);
        tokens[r] = b.token;
        pos[r] = b.pos;
        seg[r] = (int)segs.size() - 1;
        if (b.logits) want.push_back((int)r);
    }
    const int V = model->config().n_vocab;
    // The step's logits: a batch of 8 on a 129K vocabulary is 4 MB, which a fresh vector
    // would map, fault in and zero every step, so a thread's steps reuse one (the head
    // writes every value) unless the caller takes them.
    thread_local std::vector<float> scratch;
    std::vector<float> taken;
    std::vector<float> &out = logits ? taken : scratch;
    out.resize(want.size() * (size_t)V);
    for (size_t i = 0; i < segs.size(); ++i) {
        if (!rows[size_t(segs[i].row0)].trial) continue;
        Session &s = *sessions[i];   // as Session::trial
        s.pre_trial_logits_ = s.logits_;
        s.pre_trial_has_logits_ = s.has_logits_;
        s.trial_logits_.clear();
        s.state_->journal_begin();
        s.trial_k_ = segs[i].n;
    }
    try {
        run_step(*model, ex, StepLayout{tokens, pos, seg, segs}, want, out.data());
    } catch (...) {
        for (Session *s : sessions) s->invalidate();
        throw;
    }
    size_t w = 0;
    for (size_t i = 0; i < segs.size(); ++i) {
        Session &s = *sessions[i];
        const StepSegment &sg = segs[i];
        s.tokens_.insert(s.tokens_.end(), tokens.begin() + sg.row0, tokens.begin() + sg.row0 + sg.n);
        while (want[w] < sg.row0 + sg.n - 1) ++w;   // the segment's last row wants logits
        std::memcpy(s.logits_.data(), out.data() + w * V, sizeof(float) * V);
        s.has_logits_ = true;
        if (rows[size_t(sg.row0)].trial)   // every row wanted logits: the last sg.n up to w
            s.trial_logits_.assign(out.begin() + (w + 1 - sg.n) * V, out.begin() + (w + 1) * V);
    }
    if (logits) *logits = std::move(out);
}

}  // namespace ds4
