// Live sessions: lookup by id and owner, the pool of idle bridge sessions for one-shot
// requests, and moving a session into a larger context.
#include <algorithm>
#include <ctime>

#include "daemon/log.h"
#include "daemon/worker_impl.h"

namespace ds4::daemon {

LiveSession *Worker::Impl::lookup(const std::shared_ptr<ConnShared> &conn, uint64_t id, fb::ErrorCode *code,
                                  std::string *msg) {
    auto it = sessions.find(id);
    if (it == sessions.end()) {
        if (!parked.count(id)) return nullptr;
        fb::ErrorCode c = fb::ErrorCode::None;
        std::string m;
        LiveSession *s = unpark(id, &c, &m);
        if (!s) {
            log_line("released session %llu could not be reloaded: %s", static_cast<unsigned long long>(id), m.c_str());
            // The session exists (parked): say why it cannot run now, not that it is unknown.
            *code = c == fb::ErrorCode::None ? fb::ErrorCode::Internal : c;
            *msg = "session " + std::to_string(id) + " is stored but cannot be reloaded now: " + m;
        }
        return s;
    }
    LiveSession *s = it->second.get();
    if (s->owner != 0 && s->owner != conn->id) return nullptr;
    touch(s);
    return s;
}

LiveSession *Worker::Impl::release_candidate(const LiveSession *keep, bool with_cache) {
    LiveSession *victim = nullptr;
    for (auto &[id, sp] : sessions) {
        LiveSession *s = sp.get();
        // Only what the store holds whole may leave memory: named, idle, saved, no failed save.
        if (s == keep || s->name.empty() || s->busy || !saver || s->saved_len != s->history.size() ||
            !saver->last_error(s->name).empty() || (with_cache && !s->bridge))
            continue;
        if (!victim || s->touched < victim->touched) victim = s;
    }
    return victim;
}

void Worker::Impl::release(LiveSession *victim, const char *why) {
    log_line("session '%s' (%zu tokens) released from memory %s; it reloads from the store on use",
             victim->name.c_str(), victim->history.size(), why);
    parked[victim->id] = Parked{victim->name, victim->ctx};
    parked_names[victim->name] = victim->id;
    ++sessions_released;
    erase_session(victim);
}

bool Worker::Impl::make_room(std::string *why) {
    if (sessions.size() < cfg.max_sessions) return true;
    LiveSession *victim = others_waiting() ? nullptr : release_candidate(nullptr, false);   // in order
    if (!victim) {
        *why = std::to_string(sessions.size()) + " sessions are live (--max-sessions " + std::to_string(cfg.max_sessions) +
               ") and none can be released to the store (" +
               (cfg.store ? "they are anonymous, generating or not saved yet" : "ds4d runs without a store") + ")";
        defer("a session slot: " + *why);   // the request waits for one (kv_budget.cpp)
        return false;
    }
    release(victim, "to make room for another session");
    return true;
}

LiveSession *Worker::Impl::unpark(uint64_t id, fb::ErrorCode *code, std::string *msg) {
    auto it = parked.find(id);
    if (it == parked.end()) return nullptr;
    if (!make_room(msg)) {
        *code = fb::ErrorCode::SessionLimit;
        return nullptr;
    }
    const Parked p = it->second;
    auto s = std::make_unique<LiveSession>();
    s->id = id;
    s->name = p.name;
    s->ctx = p.ctx;
    s->created_unix = s->used_unix = uint64_t(std::time(nullptr));
    // Absent: it was released before anything was stored (an empty session): it stays empty.
    if (load_stored(p.name, p.ctx, *s, code, msg) == Loaded::Failed) return nullptr;
    s->ctx = std::max(s->ctx, p.ctx);
    s->saved_len = s->history.size();
    parked.erase(id);
    parked_names.erase(p.name);
    ++sessions_reloaded;
    LiveSession *raw = s.get();
    touch(raw);
    sessions.emplace(id, std::move(s));
    names.emplace(raw->name, id);
    return raw;
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
