// Speculative decoding in the daemon (docs/ARCHITECTURE.md §5, "Speculation in ds4d"). With a
// drafter loaded (--drafter), every decoding request asks the scheduler for 1 + draft_max
// rows per step; given more than one, its row becomes a speculative row of the step
// (ds4_bridge_batch_eval_spec): the drafter proposes k tokens and the model verifies pending
// + drafts within the same forward step as everything else. The request then takes the
// model's choices one by one, exactly as plain decoding would take them, until a stop rule
// ends it or the accepted run ends, and the trial is committed with what was taken (the
// rest restored from the journal) before the step is over. No trial is pending between
// steps: cancels, disconnects, saves and failures never see one.
#include "daemon/log.h"
#include "daemon/worker_impl.h"

namespace ds4::daemon {
namespace {

// Every this many decode steps of a request one runs plain: the one-row baseline the stats'
// measured speedup is against (a loaded drafter otherwise leaves none).
constexpr uint32_t kBaselineEvery = 16;

}  // namespace

uint32_t Worker::Impl::spec_rows_wanted(const Job &j) const {
    if (draft_max <= 0 || !j.p.speculate) return 1;
    if (j.spec_steps % kBaselineEvery == kBaselineEvery - 1) return 1;
    // k drafts are only worth drafting when k + 1 tokens can still be taken.
    return std::min<uint32_t>(uint32_t(draft_max) + 1, j.p.max_tokens - j.generated);
}

void Worker::Impl::prepare_trials(const std::vector<Job *> &js, const std::vector<uint32_t> &rows, SpecStep *out) {
    out->rows.resize(js.size());
    out->tokens.resize(js.size());
    out->argmax.resize(js.size());
    for (size_t i = 0; i < js.size(); ++i) {
        Job &j = *js[i];
        // A request's draft widths depend only on the request (a fresh acceptance estimate at
        // its start), so a sampled request is reproducible from its seed.
        if (!j.spec_started) {
            j.session->bridge->spec_reset();
            j.spec_started = true;
        }
        out->tokens[i].assign(rows[i], 0);
        out->argmax[i].assign(rows[i], 0);
        ds4_bridge_spec_row &r = out->rows[i];
        r = ds4_bridge_spec_row{};
        r.session = j.session->bridge->handle();
        r.pending = j.pending;
        r.temperature = j.p.temperature;
        r.top_k = j.p.top_k;
        r.top_p = j.p.top_p;
        r.min_p = j.p.min_p;
        r.rng = &j.rng;
        r.max_new = int32_t(rows[i]);   // <= what j can still take (spec_rows_wanted)
        r.tokens = out->tokens[i].data();
        r.argmax = out->argmax[i].data();
        r.cap = int32_t(rows[i]);
    }
}

void Worker::Impl::take_trial(Job &j, const ds4_bridge_spec_row &r, uint64_t step_ns, bool alone) {
    LiveSession *s = j.session;
    try {
        j.decode_ns += step_ns;
        j.drafted += uint64_t(r.width - 1);
        j.accepted += uint64_t(r.accepted);
        // argmax[i] is the model's token after tokens[0..i]; taking it needs tokens[0..i] in
        // the session, so n tokens taken keep n trial tokens (pending and n - 1 drafts).
        fb::FinishReason why{};
        int32_t stop = -1;
        bool ended = false;
        int n = 0;
        while (n < r.accepted + 1) {
            const int32_t tok = r.argmax[n];
            ++n;
            if (!deliver(j, tok, Clock::now(), &why, &stop)) {
                ended = true;
                break;
            }
        }
        const auto t1 = Clock::now();
        s->bridge->spec_commit(n);
        s->evaluated.insert(s->evaluated.end(), r.tokens, r.tokens + n);
        spec_tokens += uint64_t(n);
        if (alone) {
            spec_solo_tokens += uint64_t(n);
            spec_solo_ns += step_ns + ns_since(t1);   // the engine's part, as a plain step's time is
        }
        if (ended) finish_job(j, why, stop);
    } catch (const BridgeFailure &e) {
        fail_job(j, fb::ErrorCode::Engine, e.what());  // drops the bridge session, trial and all
    } catch (const std::exception &e) {
        fail_job(j, fb::ErrorCode::Internal, e.what());
    }
}

}  // namespace ds4::daemon
