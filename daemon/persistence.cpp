// The worker's side of the session store: loading named sessions, saving them after each
// turn (through SessionSaver), prefix checkpoints during long prefills and stored-prefix
// reuse before them.
#include <algorithm>
#include <ctime>

#include "bridge/payload_header.h"
#include "daemon/log.h"
#include "daemon/worker_impl.h"

namespace ds4::daemon {

// Loads the stored session `name` into s (bridge, history, ctx). Failed: code/msg say why.
Worker::Impl::Loaded Worker::Impl::load_stored(const std::string &name, uint32_t ctx_req, LiveSession &s, fb::ErrorCode *code, std::string *msg) {
    if (!cfg.store) return Loaded::Absent;
    if (quarantined.count(name)) {
        *code = fb::ErrorCode::SessionCorrupt;
        *msg = "stored session '" + name +
               "' failed its checks and was quarantined (see the ds4d log); delete it to start it afresh";
        return Loaded::Failed;
    }
    saver->flush();  // a save of this name may still be on its way (after a delete + reopen)
    const kvstore::Status st = cfg.store->load(name, &loadbuf);
    if (st.code() == kvstore::Code::kNotFound) return Loaded::Absent;
    if (!st) {
        if (st.code() == kvstore::Code::kCorrupt) quarantined.insert(name);
        *code = st.code() == kvstore::Code::kCorrupt ? fb::ErrorCode::SessionCorrupt : fb::ErrorCode::Store;
        *msg = "cannot load stored session '" + name + "': " + st.to_string();
        return Loaded::Failed;
    }
    const payload::Header &h = loadbuf.header;
    if (h.fingerprint != fingerprint) {
        *code = fb::ErrorCode::BadRequest;
        char fp[64];
        std::snprintf(fp, sizeof fp, "%016llx, this model is %016llx", static_cast<unsigned long long>(h.fingerprint),
                      static_cast<unsigned long long>(fingerprint));
        *msg = "stored session '" + name + "' was saved by another model (fingerprint " + fp + ")";
        return Loaded::Failed;
    }
    // A session may fill its context exactly (generation stops there); it still loads.
    const uint32_t ctx = ctx_req ? ctx_req : std::max({default_ctx, h.ctx_size, h.n_tokens});
    if (h.n_tokens > ctx) {
        *code = fb::ErrorCode::ContextOverflow;
        *msg = "stored session '" + name + "' holds " + std::to_string(h.n_tokens) +
               " tokens, more than fit the requested context of " + std::to_string(ctx) +
               "; open it with a context of at least " + std::to_string(h.n_tokens) + " (or 0 for its own)";
        return Loaded::Failed;
    }
    if (model_summary.n_ctx_max && ctx > model_summary.n_ctx_max) {
        *code = fb::ErrorCode::ContextOverflow;
        *msg = "stored session '" + name + "' needs a context of " + std::to_string(ctx) +
               ", more than the model's limit of " + std::to_string(model_summary.n_ctx_max);
        return Loaded::Failed;
    }
    std::vector<int32_t> toks;
    std::string err;
    if (!payload::read_tokens(loadbuf.bytes.data(), loadbuf.bytes.size(), h, &toks, &err)) {
        *code = fb::ErrorCode::SessionCorrupt;
        *msg = "stored session '" + name + "': " + err;
        return Loaded::Failed;
    }
    // Its caches count against --kv-budget: make room for them, or wait.
    const uint64_t need = model->cache_bytes_for(ctx, h.n_tokens);
    if (need > cfg.kv_budget || !release_for(need, &s)) {
        *code = fb::ErrorCode::SessionLimit;
        *msg = "stored session '" + name + "' needs " + std::to_string(need >> 20) + " MiB of session cache; " +
               (need > cfg.kv_budget ? "more than the whole budget (--kv-budget " + std::to_string(cfg.kv_budget >> 20) + " MiB)"
                                     : "the budget (--kv-budget) is held by running requests and sessions that cannot be released");
        if (need <= cfg.kv_budget) defer(*msg);
        return Loaded::Failed;
    }
    try {
        auto b = std::make_unique<BridgeSession>(*model, int(ctx));
        b->load_payload(std::span<const uint8_t>(loadbuf.bytes.data(), loadbuf.bytes.size()));
        s.bridge = std::move(b);
    } catch (const BridgeFailure &e) {
        *code = fb::ErrorCode::SessionCorrupt;
        *msg = "stored session '" + name + "' was refused by the engine: " + e.what();
        return Loaded::Failed;
    }
    s.ctx = ctx;
    s.history = toks;
    s.evaluated = std::move(toks);
    s.created_unix = loadbuf.info.created_ms / 1000;
    s.used_unix = uint64_t(std::time(nullptr));
    log_line("loaded session '%s' from the store: %u tokens, %llu bytes", name.c_str(), h.n_tokens,
             static_cast<unsigned long long>(loadbuf.bytes.size()));
    return Loaded::Yes;
}

// Brings the bridge up to the whole history when only the turn's last sampled token is
// missing, so a payload of it resumes exactly where the conversation stands.
void Worker::Impl::settle(LiveSession *s) {
    if (!s->bridge || s->history.size() != s->evaluated.size() + 1 || s->evaluated.size() >= s->ctx) return;
    if (!std::equal(s->evaluated.begin(), s->evaluated.end(), s->history.begin())) return;
    s->bridge->eval(s->history.back());
    s->evaluated.push_back(s->history.back());
}

// After a turn of a named session: queue its state for the store thread.
void Worker::Impl::persist(LiveSession *s) {
    if (!saver || s->name.empty() || s->ephemeral || saving_suppressed || !s->bridge) return;
    try {
        settle(s);
        if (s->evaluated.empty()) return;
        saver->save(s->name, s->bridge->save_payload());
        s->saved_len = s->history.size();
    } catch (const BridgeFailure &e) {
        log_line("session '%s' not saved: %s", s->name.c_str(), e.what());
    } catch (const std::bad_alloc &) {
        log_line("session '%s' not saved: out of memory for its payload", s->name.c_str());
    }
}

// Before a prefill: when much of it is uncached, start from the longest stored prefix.
void Worker::Impl::reuse_stored_prefix(Job &j) {
    LiveSession *s = j.session;
    const size_t common = common_prefix(s->evaluated, j.full);
    if (!cfg.store || j.full.size() - common < cfg.prefix_min) return;
    kvstore::PrefixMatch m;
    if (!cfg.store->find_longest_prefix(fingerprint, j.full.data(), j.full.size(), &m) || m.n_tokens <= common)
        return;
    const kvstore::Status st = cfg.store->load_longest_prefix(fingerprint, j.full.data(), j.full.size(), &loadbuf);
    if (!st) {
        if (st.code() != kvstore::Code::kNotFound) log_line("stored prefix not used: %s", st.to_string().c_str());
        return;
    }
    const uint32_t n = loadbuf.header.n_tokens;
    if (n <= common || n > j.full.size() || n >= s->ctx) return;
    try {
        s->bridge->load_payload(std::span<const uint8_t>(loadbuf.bytes.data(), loadbuf.bytes.size()));
        s->evaluated.assign(j.full.begin(), j.full.begin() + ptrdiff_t(n));
    } catch (const BridgeFailure &e) {
        log_line("stored prefix of %u tokens refused by the engine: %s", n, e.what());
        s->bridge = std::make_unique<BridgeSession>(*model, int(s->ctx));
        s->evaluated.clear();
    }
}

// At a prefill chunk frontier: the session holds exactly full[0, target).
void Worker::Impl::maybe_checkpoint(Job &j, size_t target) {
    if (!saver || !cfg.checkpoint_every || j.full.size() < cfg.checkpoint_every) return;
    if (j.checkpoints >= cfg.max_checkpoints || target - j.last_checkpoint < cfg.checkpoint_every) return;
    // A named session's final frontier is covered by its turn save.
    if (target == j.full.size() && !j.session->name.empty()) return;
    try {
        if (saver->checkpoint(j.session->bridge->save_payload())) {
            j.last_checkpoint = target;
            ++j.checkpoints;
        }
    } catch (const std::exception &e) {
        log_line("prefix checkpoint at %zu tokens not taken: %s", target, e.what());
    }
}

}  // namespace ds4::daemon
