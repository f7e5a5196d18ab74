// Live sessions: lookup by id and owner, the pool of idle bridge sessions for one-shot
// requests, and moving a session into a larger context.
#include <algorithm>

#include "daemon/log.h"
#include "daemon/worker_impl.h"

namespace ds4::daemon {

LiveSession *Worker::Impl::lookup(const std::shared_ptr<ConnShared> &conn, uint64_t id) {
    auto it = sessions.find(id);
    if (it == sessions.end()) return nullptr;
    LiveSession *s = it->second.get();
    if (s->owner != 0 && s->owner != conn->id) return nullptr;
    return s;
}

void Worker::Impl::erase_session(LiveSession *s) {
    if (!s->name.empty()) names.erase(s->name);
    sessions.erase(s->id);
}

void Worker::Impl::ensure_bridge(Job &j) {
    LiveSession *s = j.session;
    if (s->bridge) return;
    // Only one-shot requests draw on the pool (best shared prefix); a session opened by
    // a client starts from an empty state, so what it computes never depends on which
    // requests ran before.
    if (s->ephemeral && s->ctx == default_ctx && !pool.empty()) {
        size_t best = 0, best_len = 0;
        for (size_t i = 0; i < pool.size(); ++i) {
            size_t l = common_prefix(pool[i].evaluated, j.full);
            if (l > best_len) best = i, best_len = l;
        }
        s->bridge = std::move(pool[best].bridge);
        s->evaluated = std::move(pool[best].evaluated);
        pool.erase(pool.begin() + ptrdiff_t(best));
        return;
    }
    s->bridge = std::make_unique<BridgeSession>(*model, int(s->ctx));
    s->evaluated.clear();
}

void Worker::Impl::release_to_pool(LiveSession *s) {
    if (!s->bridge || s->ctx != default_ctx) return;
    if (pool.size() >= kPoolMax) pool.erase(pool.begin());
    pool.push_back(Pooled{std::move(s->bridge), std::move(s->evaluated)});
}

// A live session asked for a larger context (e.g. because it filled its own): its state
// moves into a bigger bridge session through a payload. Empty on success, else why not.
std::string Worker::Impl::grow_ctx(LiveSession *s, uint32_t ctx) {
    if (s->busy) return "session " + s->name + " is generating; enlarge its context after its turn";
    try {
        if (s->bridge) {
            settle(s);
            const std::vector<uint8_t> bytes = s->bridge->save_payload();
            auto b = std::make_unique<BridgeSession>(*model, int(ctx));
            b->load_payload(std::span<const uint8_t>(bytes.data(), bytes.size()));
            s->bridge = std::move(b);
        }
    } catch (const BridgeFailure &e) {
        return "cannot enlarge the context of session " + s->name + ": " + e.what();
    }
    log_line("session '%s': context %u -> %u", s->name.c_str(), s->ctx, ctx);
    s->ctx = ctx;
    return {};
}

}  // namespace ds4::daemon
