// Generation: each loop iteration runs one forward step over every request that is
// ready (continuous batching, planned by scheduler.h), then samples, streams and applies
// stop conditions per row. Also the job lifecycle (finish, fail, end).
#include <algorithm>

#include "daemon/log.h"
#include "daemon/worker_impl.h"

namespace ds4::daemon {

bool Worker::Impl::runnable(const Job &j) const {
    return j.conn->closed.load(std::memory_order_acquire) ||
           j.conn->queued_bytes.load(std::memory_order_acquire) < cfg.queue_bytes;
}

void Worker::Impl::finish_job(Job &j, fb::FinishReason reason, int32_t stop_token) {
    std::string rest = j.text.flush();
    if (!rest.empty()) emit(j.conn, j.rid, token_chunk_frame(j.rid, {}, rest), false);
    DoneFields d;
    d.reason = reason;
    d.prompt_tokens = j.prompt_tokens;
    d.cached_tokens = uint32_t(j.cached);
    d.generated_tokens = j.generated;
    d.prefill_us = j.prefill_ns / 1000;
    d.decode_us = j.decode_ns / 1000;
    d.stop_token = stop_token;
    emit(j.conn, j.rid, done_frame(j.rid, d), true);
    LiveSession *s = j.session;
    const bool named = !s->ephemeral && !s->name.empty();  // ephemeral ones die with the job
    end_job(j);
    if (named) persist(s);
}

void Worker::Impl::fail_job(Job &j, fb::ErrorCode code, const std::string &msg) {
    log_line("request %llu failed: %s", static_cast<unsigned long long>(j.rid), msg.c_str());
    emit(j.conn, j.rid, error_frame(j.rid, code, msg), true);
    // The engine may have mutated the session: drop its state and the request's tokens.
    LiveSession *s = j.session;
    s->history.resize(j.base_len);
    s->bridge.reset();
    s->evaluated.clear();
    end_job(j);
}

void Worker::Impl::end_job(Job &j) {
    prefill_ns_total += j.prefill_ns;
    decode_ns_total += j.decode_ns;
    LiveSession *s = j.session;
    s->busy = nullptr;
    if (s->ephemeral) release_to_pool(s);
    jobs.remove_if([&](const std::unique_ptr<Job> &p) { return p.get() == &j; });
}

bool Worker::Impl::in_stop_tokens(const Job &j, int32_t t) const {
    return std::binary_search(j.p.stop_tokens.begin(), j.p.stop_tokens.end(), t);
}

// Before j's first step: its bridge session exists and holds exactly full[0, synced), the
// cached part (the longest prefix it or the store already had). False when j ended here.
bool Worker::Impl::prepare(Job &j) {
    if (j.started) return true;
    LiveSession *s = j.session;
    try {
        ensure_bridge(j);
        j.started = true;
        reuse_stored_prefix(j);
        // The engine keeps the common prefix but re-evaluates at least the last prompt
        // token (its logits are needed), unless it already holds exactly this.
        const size_t common = common_prefix(s->evaluated, j.full);
        j.cached = (common == j.full.size() && s->evaluated.size() == j.full.size()) ? common
                                                                                    : std::min(common, j.full.size() - 1);
        if (s->evaluated.size() != j.cached) {
            const auto t0 = Clock::now();
            const uint64_t gen = s->bridge->generation();
            if (j.cached == 0) s->bridge->rewind(0);
            else s->bridge->sync(std::span<const int32_t>(j.full.data(), j.cached));
            // Rings that could not be rewound in place were rebuilt: nothing was reused.
            if (s->bridge->generation() != gen) {
                prefill_tokens += j.cached;
                j.cached = 0;
            }
            s->evaluated.assign(j.full.begin(), j.full.begin() + ptrdiff_t(s->bridge->pos()));
            j.prefill_ns += ns_since(t0);
        }
        tokens_cached += j.cached;
        j.synced = s->evaluated.size();
        j.last_checkpoint = j.synced;
        if (j.synced < j.full.size()) return true;
        // It already holds the whole prompt with its logits: the first token needs no step.
        j.decoding = true;
        return take_token(j);
    } catch (const BridgeFailure &e) {
        fail_job(j, fb::ErrorCode::Engine, e.what());
    } catch (const std::exception &e) {
        fail_job(j, fb::ErrorCode::Internal, e.what());
    }
    return false;
}

bool Worker::Impl::out_of_room(const Job &j, fb::FinishReason *why) const {
    if (j.generated >= j.p.max_tokens) {
        *why = fb::FinishReason::Length;
        return true;
    }
    // The history (the pending token included) fills the context: a token sampled now
    // could never be evaluated, and a session holding it could not be reloaded.
    if (j.session->history.size() >= j.session->ctx) {
        *why = fb::FinishReason::Context;
        return true;
    }
    return false;
}

bool Worker::Impl::deliver(Job &j, int32_t t, Clock::time_point t0, fb::FinishReason *why, int32_t *stop_token,
                           const TokenLogprob *lp) {
    LiveSession *s = j.session;
    s->history.push_back(t);
    if ((!j.p.ignore_eos && model->is_stop(t)) || in_stop_tokens(j, t)) {
        j.decode_ns += ns_since(t0);
        *why = fb::FinishReason::Stop;
        *stop_token = t;
        return false;
    }
    if (j.generated == 0) j.first_token_at = Clock::now();
    ++j.generated;
    ++tokens_out;
    if (j.p.controls.frequency_penalty != 0.0f || j.p.controls.presence_penalty != 0.0f) ++j.generated_counts[t];
    const std::string delta = j.text.push(model->token_text(t));
    j.decode_ns += ns_since(t0);
    emit(j.conn, j.rid, token_chunk_frame(j.rid, std::span<const int32_t>(&t, 1), delta, lp), false);
    if (j.text.stopped()) {
        *why = fb::FinishReason::StopString;
        return false;
    }
    // The mask let only tokens through that keep the JSON valid; it ends once the object closes.
    if (j.json && j.json->feed(json_vocab->bytes(t)) && j.json->done()) {
        *why = fb::FinishReason::Stop;
        return false;
    }
    if (out_of_room(j, why)) return false;
    j.pending = t;
    return true;
}

// j's session has fresh logits: sample a token, stream it, apply the stop conditions. False
// when j ended (and was removed).
bool Worker::Impl::take_token(Job &j) {
    LiveSession *s = j.session;
    try {
        fb::FinishReason why{};
        if (out_of_room(j, &why)) {
            finish_job(j, why);
            return false;
        }
        const auto t0 = Clock::now();
        const SamplingControls &c = j.p.controls;
        int32_t t;
        TokenLogprob lp;
        if (!c.active() && !j.json) {
            t = j.p.temperature == 0.0f ? s->bridge->argmax()
                                        : s->bridge->sample(j.p.temperature, j.p.top_k, j.p.top_p, j.p.min_p, &j.rng);
        } else {
            // A copy of the row with the request's bias and penalties, sampled by the engine's
            // sampler (the same rng use), so only the changed logits change the outcome.
            s->bridge->logits_into(row_scratch, model->vocab());
            if (c.changes_logits()) apply_controls(row_scratch, c, s->history, j.generated_counts);
            if (j.json) {
                // out_of_room() above leaves at least one token to take.
                const size_t by_length = j.p.max_tokens - j.generated, by_context = s->ctx - s->history.size();
                if (json_vocab->mask(*j.json, std::min(by_length, by_context), row_scratch) == 0) {
                    // Too few tokens left to close the object (a prompt that nearly fills the context).
                    finish_job(j, by_length <= by_context ? fb::FinishReason::Length : fb::FinishReason::Context);
                    return false;
                }
            }
            t = j.p.temperature == 0.0f
                    ? row_argmax(row_scratch)
                    : ds4::bridge::sample_logits(row_scratch, j.p.temperature, j.p.top_k, j.p.top_p, j.p.min_p, &j.rng);
            if (c.logprobs) lp = logprob_of(row_scratch, j.p.temperature, t, c.top_logprobs);
        }
        int32_t stop = -1;
        if (!deliver(j, t, t0, &why, &stop, c.logprobs ? &lp : nullptr)) {
            finish_job(j, why, stop);
            return false;
        }
        return true;
    } catch (const BridgeFailure &e) {
        fail_job(j, fb::ErrorCode::Engine, e.what());
    } catch (const std::exception &e) {
        fail_job(j, fb::ErrorCode::Internal, e.what());
    }
    return false;
}

// One forward step over every ready request (daemon/scheduler.h says who gets rows), then
// per-row sampling. False when nothing could run.
bool Worker::Impl::run_step() {
    bool progressed = admit_jobs();   // --kv-budget: waiting jobs start in order when they fit
    std::vector<Job *> ready;
    for (auto it = jobs.begin(); it != jobs.end();) {
        Job &j = **it++;
        if (j.conn->closed.load(std::memory_order_acquire)) {
            end_job(j);  // output would go nowhere
            progressed = true;
        } else if (j.admitted && runnable(j)) {
            ready.push_back(&j);
        }
    }
    std::vector<StepCandidate> cands;
    std::vector<Job *> cjobs;
    for (Job *j : ready) {
        if (!prepare(*j)) {
            progressed = true;
            continue;
        }
        const uint32_t cap = uint32_t(std::max(1, j->session->bridge->prefill_cap()));
        cands.push_back({j->decoding, uint32_t(j->full.size() - j->synced), cap, j->arrival,
                         j->decoding ? spec_rows_wanted(*j) : 1u});
        cjobs.push_back(j);
    }
    const std::vector<PlannedSegment> plan =
        plan_step(cands, StepLimits{cfg.max_batch, cfg.step_tokens, cfg.prefill_chunk, cfg.solo_prefill_chunk});
    if (plan.empty()) return progressed;

    // Plain segments (prefill chunks, one-row decodes) and speculative rows (a decoder given
    // more than one row: pending and drafts, speculation.cpp) run in one step.
    std::vector<Job *> in_step;   // plain segments first, in `counts` order, then speculative
    std::vector<ds4_bridge_session *> handles;
    std::vector<int32_t> counts, toks;
    std::vector<Job *> spec_jobs;
    std::vector<uint32_t> spec_rows;
    for (const PlannedSegment &sg : plan) {
        Job &j = *cjobs[sg.candidate];
        if (j.decoding && sg.rows > 1) {
            spec_jobs.push_back(&j);
            spec_rows.push_back(sg.rows);
            continue;
        }
        in_step.push_back(&j);
        handles.push_back(j.session->bridge->handle());
        counts.push_back(int32_t(sg.rows));
        if (j.decoding) toks.push_back(j.pending);
        else toks.insert(toks.end(), j.full.begin() + ptrdiff_t(j.synced), j.full.begin() + ptrdiff_t(j.synced + sg.rows));
    }
    const size_t n_plain = in_step.size();
    in_step.insert(in_step.end(), spec_jobs.begin(), spec_jobs.end());
    // Those that run go to the back of the round-robin order.
    auto it = jobs.begin();
    for (size_t n = jobs.size(); n > 0; --n) {
        auto cur = it++;
        if (std::find(in_step.begin(), in_step.end(), cur->get()) != in_step.end()) jobs.splice(jobs.end(), jobs, cur);
    }
    SpecStep spec;
    const auto t0 = Clock::now();
    try {
        if (spec_jobs.empty()) batch->eval(handles, counts, toks);
        else {
            prepare_trials(spec_jobs, spec_rows, &spec);
            batch->eval_spec(handles, counts, toks, spec.rows);
        }
    } catch (const std::exception &e) {
        // A failed step may have touched every session in it: each request in it fails.
        const std::string why = e.what();
        const bool engine = dynamic_cast<const BridgeFailure *>(&e) != nullptr;
        for (Job *j : in_step) fail_job(*j, engine ? fb::ErrorCode::Engine : fb::ErrorCode::Internal, why);
        return true;
    }
    const uint64_t step_ns = ns_since(t0);
    ++steps;
    step_sessions += in_step.size();
    step_ns_total += step_ns;
    for (int32_t c : counts) step_rows += uint64_t(c);
    for (const ds4_bridge_spec_row &r : spec.rows) step_rows += uint64_t(r.width);
    const bool alone = in_step.size() == 1;
    if (alone && n_plain == 1 && in_step[0]->decoding) {
        ++solo_steps;
        solo_ns += step_ns;
    }

    // The step's frames (a token per decoding row) reach the loop as one batch.
    struct HeldOutput {
        OutQueue &q;
        explicit HeldOutput(OutQueue &o) : q(o) { q.hold(); }
        ~HeldOutput() { q.release(); }
    } held(out);
    for (size_t k = 0; k < in_step.size(); ++k) {
        Job &j = *in_step[k];
        LiveSession *s = j.session;
        if (j.decoding) {
            if (draft_max > 0 && j.p.speculate) ++j.spec_steps;
            if (k >= n_plain && spec.rows[k - n_plain].width > 1) {
                take_trial(j, spec.rows[k - n_plain], step_ns, alone);
                continue;
            }
            s->evaluated.push_back(j.pending);
            j.pending = -1;
            j.decode_ns += step_ns;
            take_token(j);
            continue;
        }
        const size_t n = size_t(counts[k]);
        s->evaluated.insert(s->evaluated.end(), j.full.begin() + ptrdiff_t(j.synced),
                            j.full.begin() + ptrdiff_t(j.synced + n));
        j.synced += n;
        prefill_tokens += n;
        j.prefill_ns += step_ns;
        maybe_checkpoint(j, j.synced);
        if (j.p.progress)
            emit(j.conn, j.rid, progress_frame(j.rid, uint32_t(j.synced), uint32_t(j.full.size())), false);
        if (j.synced < j.full.size()) continue;
        j.decoding = true;  // the first token comes from this step's logits
        take_token(j);
    }
    return true;
}

}  // namespace ds4::daemon
