// Speculative decoding in the daemon (docs/ARCHITECTURE.md §5, "Speculation in ds4d"). With a
// drafter loaded (--drafter), a step that would be one decode row of one request (latency
// mode: it decodes alone, nothing else is ready) becomes a bridge trial instead: the drafter
// proposes k tokens, the model verifies pending + drafts in one k+1-row step, and the
// request takes the model's own choices one by one, exactly as plain decoding would take
// them, until a stop rule ends it or the accepted run ends. The trial is committed (keeping
// what was taken, the rest restored from the journal) before the step returns, so no trial
// is ever pending between steps: cancels, disconnects, saves and failures never see one.
//
// Batched steps (several requests, or prefill waiting) stay one row per decoder: the bridge's
// trial runs one session, and on the CPU a k+1-row verification costs about k+1 one-row
// steps, so it only pays where a step is bound by reading weights, which a batch already
// shares among its rows.
#include "daemon/log.h"
#include "daemon/worker_impl.h"

namespace ds4::daemon {
namespace {

// Every this many trial-eligible steps of a request one runs plain: the one-row baseline the
// stats' measured speedup is against (a loaded drafter otherwise leaves none).
constexpr uint32_t kBaselineEvery = 16;

}  // namespace

bool Worker::Impl::may_speculate(const Job &j) const {
    if (draft_max <= 0 || !j.p.speculate) return false;
    // j.generated < max_tokens and room in the context hold for a decoding job (deliver).
    return j.spec_steps % kBaselineEvery != kBaselineEvery - 1;
}

bool Worker::Impl::speculative_step(Job &j) {
    LiveSession *s = j.session;
    ++j.spec_steps;
    try {
        // A request's draft widths depend only on the request (a fresh acceptance estimate at
        // its start), so a sampled request that decodes alone is reproducible from its seed.
        if (!j.spec_started) {
            s->bridge->spec_reset();
            j.spec_started = true;
        }
        const auto t0 = Clock::now();
        const int max_new = int(std::min<uint32_t>(j.p.max_tokens - j.generated, 65));
        const ds4::bridge::SpecTrial t =
            s->bridge->spec_trial(j.pending, j.p.temperature, j.p.top_k, j.p.top_p, j.p.min_p, &j.rng, max_new);
        if (t.width == 0) return false;  // no room for drafts: the plain step decodes pending
        const uint64_t trial_ns = ns_since(t0);
        ++steps;
        step_sessions += 1;
        step_rows += uint64_t(t.width);
        step_ns_total += trial_ns;
        j.decode_ns += trial_ns;
        j.drafted += uint64_t(t.width - 1);
        j.accepted += uint64_t(t.accepted);
        // argmax[i] is the model's token after tokens[0..i]; taking it needs tokens[0..i] in
        // the session, so n tokens taken keep n trial tokens (pending and n - 1 drafts).
        fb::FinishReason why{};
        int32_t stop = -1;
        bool ended = false;
        int n = 0;
        while (n < t.accepted + 1) {
            const int32_t tok = t.argmax[size_t(n)];
            ++n;
            if (!deliver(j, tok, Clock::now(), &why, &stop)) {
                ended = true;
                break;
            }
        }
        const auto t1 = Clock::now();
        s->bridge->spec_commit(n);
        s->evaluated.insert(s->evaluated.end(), t.tokens.begin(), t.tokens.begin() + n);
        spec_tokens += uint64_t(n);
        spec_ns += trial_ns + ns_since(t1);  // the engine's part, as a plain step's time is
        if (ended) finish_job(j, why, stop);
    } catch (const BridgeFailure &e) {
        fail_job(j, fb::ErrorCode::Engine, e.what());  // drops the bridge session, trial and all
    } catch (const std::exception &e) {
        fail_job(j, fb::ErrorCode::Internal, e.what());
    }
    return true;
}

}  // namespace ds4::daemon
