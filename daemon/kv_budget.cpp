// The session-cache memory budget (--kv-budget) and the requests that wait for it or for a
// session slot (--max-sessions). Caches grow with the tokens a session holds, so a running
// request reserves what its session may reach (history + prompt + max_tokens, within the
// context); idle sessions count what they hold. When a request does not fit, idle one-shot
// contexts in the pool go first, then the least recently used idle sessions whose turns are
// all stored; then it waits, in arrival order, up to --kv-wait. Only a request that can never
// fit (more than the whole budget) is refused at once.
#include <algorithm>

#include "daemon/log.h"
#include "daemon/worker_impl.h"

namespace ds4::daemon {

namespace {

std::string mib(uint64_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / 1048576.0);
    return buf;
}

}  // namespace

uint64_t Worker::Impl::kv_in_use() const {
    auto held = [](const LiveSession &s) {
        uint64_t b = s.bridge ? s.bridge->cache_bytes() : 0;
        if (s.busy && s.busy->admitted) b = std::max(b, s.busy->reserved);
        return b;
    };
    uint64_t sum = 0;
    for (const auto &[id, s] : sessions) sum += held(*s);
    for (const auto &j : jobs)
        if (j->ephemeral) sum += held(*j->ephemeral);
    for (const Pooled &p : pool) sum += p.bridge ? p.bridge->cache_bytes() : 0;
    return sum;
}

uint64_t Worker::Impl::request_need(uint32_t ctx, uint64_t most, bool speculate) {
    uint64_t need = model->cache_bytes_for(ctx, most);
    if (draft_max > 0 && speculate) need += model->drafter_cache_bytes_for(ctx, most + uint64_t(draft_max));
    return need;
}

uint64_t Worker::Impl::job_need(const Job &j) {
    const uint32_t ctx = j.session->ctx;
    const uint64_t most = std::min<uint64_t>(ctx, uint64_t(j.full.size()) + j.p.max_tokens);
    return request_need(ctx, most, j.p.speculate);
}

bool Worker::Impl::release_for(uint64_t need, const LiveSession *keep) {
    while (kv_in_use() + need > cfg.kv_budget) {
        if (!pool.empty()) {
            pool.erase(pool.begin());   // the oldest idle one-shot context
            continue;
        }
        LiveSession *v = release_candidate(keep, true);
        if (!v) return false;
        release(v, "to free cache memory (--kv-budget)");
    }
    return true;
}

bool Worker::Impl::admit_jobs() {
    std::vector<Job *> waiting;
    for (auto &j : jobs)
        if (!j->admitted && !j->conn->closed.load(std::memory_order_acquire)) waiting.push_back(j.get());
    std::sort(waiting.begin(), waiting.end(), [](const Job *a, const Job *b) { return a->arrival < b->arrival; });
    bool changed = false;
    const auto now = Clock::now();
    for (Job *j : waiting) {
        const uint64_t need = job_need(*j);
        auto refuse = [&](const std::string &msg) {
            ++kv_refused;
            log_line("request %llu refused: %s", static_cast<unsigned long long>(j->rid), msg.c_str());
            emit(j->conn, j->rid, error_frame(j->rid, fb::ErrorCode::SessionLimit, msg), true);
            j->session->history.resize(j->base_len);   // it never ran: the session is as it was
            end_job(*j);
            changed = true;
        };
        const std::string what = "this request's session cache needs " + mib(need) + " (context " +
                                 std::to_string(j->session->ctx) + ", up to " +
                                 std::to_string(std::min<uint64_t>(j->session->ctx, j->full.size() + j->p.max_tokens)) +
                                 " tokens)";
        if (need > cfg.kv_budget) {
            refuse(what + ", more than the whole session-cache budget of " + mib(cfg.kv_budget) +
                   " (--kv-budget); ask for fewer tokens or a smaller context");
            continue;
        }
        const uint64_t cur = j->session->bridge ? j->session->bridge->cache_bytes() : 0;
        if (release_for(need > cur ? need - cur : 0, j->session)) {
            j->admitted = true;
            j->reserved = need;
            changed = true;
            continue;
        }
        if (now - j->queued_at >= cfg.kv_wait) {
            refuse(what + "; waited " + std::to_string(cfg.kv_wait.count() / 1000) + " s (--kv-wait) but " +
                   mib(kv_in_use()) + " of the " + mib(cfg.kv_budget) +
                   " budget stay held by running requests and sessions that cannot be released");
            continue;
        }
        break;   // in order: later requests wait behind this one
    }
    return changed;
}

uint64_t Worker::Impl::room_state() const {
    uint64_t h = splitmix64(sessions.size());
    h = splitmix64(h ^ jobs.size());
    h = splitmix64(h ^ pool.size());
    h = splitmix64(h ^ parked.size());
    for (const auto &[id, s] : sessions) h = splitmix64(h ^ (s->busy ? 1 : 0) ^ (uint64_t(s->saved_len) << 1));
    return splitmix64(h ^ kv_in_use());
}

void Worker::Impl::retry_deferred() {
    // Re-handling costs a lookup or two: only when room may have changed since the front last
    // had to wait, or when the front changed.
    bool changed = deferred.empty() || room_state() != retry_state;
    while (!deferred.empty()) {
        Deferred &d = deferred.front();
        if (stopping) {
            emit(d.request.conn, d.request.id, error_frame(d.request.id, fb::ErrorCode::ShuttingDown, "ds4d is shutting down"),
                 true);
            deferred.pop_front();
            continue;
        }
        if (d.request.conn->closed.load(std::memory_order_acquire)) {
            deferred.pop_front();
            changed = true;
            continue;
        }
        if (Clock::now() - d.since >= cfg.kv_wait) {
            ++kv_refused;
            const std::string msg = "waited " + std::to_string(cfg.kv_wait.count() / 1000) + " s (--kv-wait): " + d.why;
            log_line("request %llu refused: %s", static_cast<unsigned long long>(d.request.id), msg.c_str());
            emit(d.request.conn, d.request.id, error_frame(d.request.id, fb::ErrorCode::SessionLimit, msg), true);
            deferred.pop_front();
            changed = true;
            continue;
        }
        if (!changed) return;
        retrying = true;
        handle(d.request);
        retrying = false;
        if (!defer_why.empty()) {   // still waiting: so do the ones behind it
            d.why = defer_why;
            defer_why.clear();
            retry_state = room_state();
            return;
        }
        deferred.pop_front();
    }
}

Clock::time_point Worker::Impl::next_wait_deadline() const {
    Clock::time_point t = Clock::time_point::max();
    if (!deferred.empty()) t = deferred.front().since + cfg.kv_wait;
    for (const auto &j : jobs)
        if (!j->admitted) t = std::min(t, j->queued_at + cfg.kv_wait);
    return t;
}

}  // namespace ds4::daemon
