#include "daemon/worker.h"

#include <algorithm>
#include <condition_variable>
#include <ctime>
#include <future>
#include <list>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include "bridge/payload_header.h"
#include "daemon/log.h"
#include "daemon/replies.h"
#include "daemon/session_saver.h"
#include "daemon/text_stream.h"

namespace ds4::daemon {

namespace fb = ipc::fb;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kPoolMax = 4;  // idle bridge sessions kept for one-shot requests

uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

size_t common_prefix(const std::vector<int32_t> &a, const std::vector<int32_t> &b) {
    const size_t n = std::min(a.size(), b.size());
    size_t i = 0;
    while (i < n && a[i] == b[i]) ++i;
    return i;
}

uint64_t ns_since(Clock::time_point t0) {
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
}

struct Job;

struct Session {
    uint64_t id = 0;
    std::string name;         // empty: anonymous
    uint64_t owner = 0;       // connection owning an anonymous session; 0 for named
    uint32_t ctx = 0;
    bool ephemeral = false;   // one-shot: freed when its request ends
    std::vector<int32_t> history;    // the whole conversation
    std::unique_ptr<BridgeSession> bridge;
    std::vector<int32_t> evaluated;  // the tokens the bridge session holds
    Job *busy = nullptr;
    uint64_t created_unix = 0, used_unix = 0;
};

struct Job {
    std::shared_ptr<ConnShared> conn;
    uint64_t rid = 0;
    Session *session = nullptr;
    std::unique_ptr<Session> ephemeral;
    GenerateParams p;
    std::vector<int32_t> full;   // history + prompt: what prefill must reach
    size_t base_len = 0;         // history length before this request
    uint32_t prompt_tokens = 0;
    size_t cached = 0;
    size_t synced = 0;
    bool started = false;
    bool decoding = false;
    int32_t pending = -1;        // sampled, streamed, not yet evaluated
    uint32_t generated = 0;
    uint64_t rng = 0;
    TextStream text;
    uint64_t prefill_ns = 0, decode_ns = 0;
    size_t last_checkpoint = 0;  // prefill frontier of the last checkpoint (or the cached start)
    uint32_t checkpoints = 0;
};

struct Pooled {
    std::unique_ptr<BridgeSession> bridge;
    std::vector<int32_t> evaluated;
};

struct Command {
    enum class Kind { Request, Cancel, Disconnect, Shutdown } kind;
    Request request;
    std::shared_ptr<ConnShared> conn;
    uint64_t target = 0;
    std::chrono::milliseconds grace{0};
};

}  // namespace

struct Worker::Impl {
    WorkerConfig cfg;
    OutQueue &out;
    std::thread thread;

    // Shared with other threads.
    std::mutex mu;
    std::condition_variable cv;
    std::vector<Command> commands;
    bool woken = false;

    // Worker thread only (model_summary/default_ctx are read-only after start()).
    std::unique_ptr<BridgeModel> model;
    ModelSummary model_summary;
    uint32_t default_ctx = 0;
    std::vector<int32_t> template_prefix;
    std::unordered_map<uint64_t, std::unique_ptr<Session>> sessions;
    std::unordered_map<std::string, uint64_t> names;
    uint64_t next_session = 1;
    std::list<std::unique_ptr<Job>> jobs;  // run queue, round-robin
    std::vector<Pooled> pool;
    bool stopping = false;
    Clock::time_point deadline;
    Clock::time_point started_at = Clock::now();

    // Persistence (cfg.store non-null).
    std::unique_ptr<SessionSaver> saver;
    uint64_t fingerprint = 0;
    std::set<std::string> quarantined;  // names whose stored payload failed its checks
    kvstore::LoadedPayload loadbuf;     // reused across loads
    bool saving_suppressed = false;     // the session is being deleted

    // Counters for Stats.
    uint64_t requests_total = 0, tokens_in = 0, tokens_cached = 0, tokens_out = 0;
    uint64_t prefill_tokens = 0, prefill_ns_total = 0, decode_ns_total = 0;

    Impl(WorkerConfig c, OutQueue &o) : cfg(std::move(c)), out(o) {}

    // ---- output ----

    void emit(const std::shared_ptr<ConnShared> &conn, uint64_t rid, Frame &&bytes, bool final) {
        if (!conn || conn->closed.load(std::memory_order_acquire)) return;
        // A client refuses frames above its limit (and drops the connection), so an oversized
        // reply becomes this request's error instead.
        if (bytes.size() > cfg.max_reply + 4) {
            log_line("request %llu: a reply of %zu bytes exceeds the frame limit of %zu; sent an error instead",
                     static_cast<unsigned long long>(rid), bytes.size() - 4, cfg.max_reply);
            bytes = error_frame(rid, fb::ErrorCode::BadRequest,
                                "the reply (" + std::to_string(bytes.size() - 4) + " bytes) would exceed the frame limit of " +
                                    std::to_string(cfg.max_reply) + " bytes (--max-frame); ask for less at a time");
            final = true;
        }
        conn->queued_bytes.fetch_add(bytes.size(), std::memory_order_relaxed);
        out.push(Outgoing{conn->id, std::move(bytes), rid, final});
    }

    void reply_error(const Request &r, fb::ErrorCode code, const std::string &msg) {
        emit(r.conn, r.id, error_frame(r.id, code, msg), true);
    }

    // ---- start-up ----

    void open_model() {
        ModelOpenConfig mc = cfg.model;
        if (cfg.backend_auto) {
            mc.backend = ModelOpenConfig::Backend::Cuda;
            try {
                model = std::make_unique<BridgeModel>(mc);
            } catch (const BridgeFailure &e) {
                log_line("CUDA backend unavailable (%s); using the CPU backend", e.what());
                mc.backend = ModelOpenConfig::Backend::Cpu;
            }
        }
        if (!model) model = std::make_unique<BridgeModel>(mc);
        model_summary = model->summary();
        const uint32_t limit = model_summary.n_ctx_max;
        if (cfg.ctx) {
            if (limit && cfg.ctx > limit)
                throw BridgeFailure("--ctx " + std::to_string(cfg.ctx) + " exceeds the model's context limit of " +
                                    std::to_string(limit));
            default_ctx = cfg.ctx;
        } else {
            default_ctx = limit ? std::min<uint32_t>(4096, limit) : 4096;
        }
        try {
            template_prefix = model->render_chat({}, false, false);
        } catch (const BridgeFailure &) {
            template_prefix.clear();
        }
        // One real forward before the socket exists: failures show up now, and the first
        // client does not pay for lazy allocation. The session is kept for reuse.
        std::vector<int32_t> warm = model->tokenize("Hello", false);
        if (warm.empty()) warm.push_back(0);
        auto bs = std::make_unique<BridgeSession>(*model, int(default_ctx));
        bs->sync(warm);
        (void)bs->argmax();
        pool.push_back(Pooled{std::move(bs), warm});
        fingerprint = model->fingerprint();
        if (cfg.store) {
            saver = std::make_unique<SessionSaver>(*cfg.store);
            for (const std::string &n : cfg.store->recovery_report().quarantined_sessions) quarantined.insert(n);
        }
    }

    // ---- persistence ----

    enum class Loaded { Yes, Absent, Failed };

    // Loads the stored session `name` into s (bridge, history, ctx). Failed: code/msg say why.
    Loaded load_stored(const std::string &name, uint32_t ctx_req, Session &s, fb::ErrorCode *code, std::string *msg) {
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
    void settle(Session *s) {
        if (!s->bridge || s->history.size() != s->evaluated.size() + 1 || s->evaluated.size() >= s->ctx) return;
        if (!std::equal(s->evaluated.begin(), s->evaluated.end(), s->history.begin())) return;
        s->bridge->eval(s->history.back());
        s->evaluated.push_back(s->history.back());
    }

    // After a turn of a named session: queue its state for the store thread.
    void persist(Session *s) {
        if (!saver || s->name.empty() || s->ephemeral || saving_suppressed || !s->bridge) return;
        try {
            settle(s);
            if (s->evaluated.empty()) return;
            saver->save(s->name, s->bridge->save_payload());
        } catch (const BridgeFailure &e) {
            log_line("session '%s' not saved: %s", s->name.c_str(), e.what());
        } catch (const std::bad_alloc &) {
            log_line("session '%s' not saved: out of memory for its payload", s->name.c_str());
        }
    }

    // Before a prefill: when much of it is uncached, start from the longest stored prefix.
    void reuse_stored_prefix(Job &j) {
        Session *s = j.session;
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
    void maybe_checkpoint(Job &j, size_t target) {
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

    // ---- sessions ----

    Session *lookup(const std::shared_ptr<ConnShared> &conn, uint64_t id) {
        auto it = sessions.find(id);
        if (it == sessions.end()) return nullptr;
        Session *s = it->second.get();
        if (s->owner != 0 && s->owner != conn->id) return nullptr;
        return s;
    }

    void erase_session(Session *s) {
        if (!s->name.empty()) names.erase(s->name);
        sessions.erase(s->id);
    }

    void ensure_bridge(Job &j) {
        Session *s = j.session;
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

    void release_to_pool(Session *s) {
        if (!s->bridge || s->ctx != default_ctx) return;
        if (pool.size() >= kPoolMax) pool.erase(pool.begin());
        pool.push_back(Pooled{std::move(s->bridge), std::move(s->evaluated)});
    }

    // A live session asked for a larger context (e.g. because it filled its own): its state
    // moves into a bigger bridge session through a payload. Empty on success, else why not.
    std::string grow_ctx(Session *s, uint32_t ctx) {
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

    // ---- requests ----

    // When a stored session `name` was evicted to keep the store's budget (and not stored
    // since): a note saying so; empty otherwise.
    std::string eviction_note(const std::string &name) const {
        kvstore::EvictedInfo ev;
        if (!cfg.store || name.empty() || !cfg.store->evicted(name, &ev)) return {};
        return "stored session '" + name + "' was evicted on " + utc_time(ev.evicted_ms / 1000) + " " + ev.why;
    }

    static std::string utc_time(uint64_t unix_s) {
        const time_t t = time_t(unix_s);
        tm g;
        gmtime_r(&t, &g);
        char buf[32];
        std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &g);
        return buf;
    }

    // Why the latest save of this session failed (its stored version is behind); empty if
    // it did not. Does not wait for queued saves.
    std::string save_error_of(const std::string &name) const {
        return saver && !name.empty() ? saver->last_error(name) : std::string();
    }

    // Any failure inside a handler (std::bad_alloc included) fails only its own request;
    // the worker, and every other request, goes on.
    void handle(Request &r) {
        try {
            std::visit([&](auto &p) { on(r, p); }, r.body);
        } catch (const std::exception &e) {
            const bool oom = dynamic_cast<const std::bad_alloc *>(&e) != nullptr;
            log_line("request %llu failed: %s", static_cast<unsigned long long>(r.id), oom ? "out of memory" : e.what());
            try {
                reply_error(r, fb::ErrorCode::Internal, oom ? "ds4d ran out of memory for this request" : e.what());
            } catch (const std::exception &) {
                log_line("request %llu: the error reply could not be sent either", static_cast<unsigned long long>(r.id));
            }
        }
    }

    void on(Request &r, OpenSessionParams &p) {
        if (stopping) return reply_error(r, fb::ErrorCode::ShuttingDown, "ds4d is shutting down");
        const uint32_t ctx = p.ctx ? p.ctx : default_ctx;
        if (ctx < 16 || (model_summary.n_ctx_max && ctx > model_summary.n_ctx_max))
            return reply_error(r, fb::ErrorCode::BadRequest,
                               "context " + std::to_string(ctx) + " is outside [16, " +
                                   std::to_string(model_summary.n_ctx_max) + "]");
        if (!p.name.empty()) {
            auto it = names.find(p.name);
            if (it != names.end()) {
                Session *s = sessions.at(it->second).get();
                if (p.ctx > s->ctx) {
                    if (std::string err = grow_ctx(s, p.ctx); !err.empty())
                        return reply_error(r, fb::ErrorCode::BadRequest, err);
                }
                return emit(r.conn, r.id,
                            session_opened_frame(r.id, s->id, s->name, s->ctx, uint32_t(s->history.size()), false,
                                                 save_error_of(s->name)),
                            true);
            }
        }
        if (sessions.size() >= cfg.max_sessions)
            return reply_error(r, fb::ErrorCode::SessionLimit,
                               std::to_string(sessions.size()) + " sessions are open (--max-sessions " +
                                   std::to_string(cfg.max_sessions) + ")");
        auto s = std::make_unique<Session>();
        s->id = next_session++;
        s->name = p.name;
        s->owner = p.name.empty() ? r.conn->id : 0;
        s->ctx = ctx;
        s->created_unix = s->used_unix = uint64_t(std::time(nullptr));
        bool created = true;
        std::string evicted;
        if (!p.name.empty()) {
            fb::ErrorCode code = fb::ErrorCode::None;
            std::string msg;
            switch (load_stored(p.name, p.ctx, *s, &code, &msg)) {
            case Loaded::Yes: created = false; break;
            case Loaded::Absent: evicted = eviction_note(p.name); break;
            case Loaded::Failed: log_line("%s", msg.c_str()); return reply_error(r, code, msg);
            }
        }
        if (!evicted.empty()) log_line("%s; session '%s' starts empty", evicted.c_str(), p.name.c_str());
        Session *raw = s.get();
        sessions.emplace(raw->id, std::move(s));
        if (!raw->name.empty()) names.emplace(raw->name, raw->id);
        emit(r.conn, r.id,
             session_opened_frame(r.id, raw->id, raw->name, raw->ctx, uint32_t(raw->history.size()), created, {},
                                  evicted),
             true);
    }

    void on(Request &r, LoadSessionParams &p) {
        if (!cfg.store) return reply_error(r, fb::ErrorCode::NoStore, "ds4d runs without a session store (--no-store)");
        if (!names.count(p.name) && !quarantined.count(p.name)) {
            saver->flush();
            kvstore::EntryInfo info;
            if (cfg.store->info(p.name, &info).code() == kvstore::Code::kNotFound) {
                const std::string evicted = eviction_note(p.name);
                return reply_error(r, fb::ErrorCode::UnknownSession,
                                   "no stored session named " + p.name + (evicted.empty() ? "" : " (" + evicted + ")"));
            }
        }
        OpenSessionParams o{p.name, p.ctx};
        on(r, o);
    }

    void on(Request &r, SaveSessionParams &p) {
        if (!cfg.store) return reply_error(r, fb::ErrorCode::NoStore, "ds4d runs without a session store (--no-store)");
        Session *s = nullptr;
        if (p.session) {
            s = lookup(r.conn, p.session);
            if (!s) return reply_error(r, fb::ErrorCode::UnknownSession, "no session " + std::to_string(p.session));
        } else {
            auto it = names.find(p.name);
            if (it != names.end()) s = sessions.at(it->second).get();
        }
        const std::string target = p.name.empty() ? (s ? s->name : std::string()) : p.name;
        if (target.empty())
            return reply_error(r, fb::ErrorCode::BadRequest, "an anonymous session needs a name to be saved under");
        if (!s) {
            // Not in memory: what the store holds is already durable.
            saver->flush();
            kvstore::EntryInfo info;
            const kvstore::Status st = cfg.store->info(target, &info);
            if (!st)
                return reply_error(r, st.code() == kvstore::Code::kNotFound ? fb::ErrorCode::UnknownSession
                                                                          : fb::ErrorCode::Store,
                                   "no session named " + target + " (" + st.to_string() + ")");
            return emit(r.conn, r.id, session_saved_frame(r.id, target, info.n_tokens, info.bytes), true);
        }
        if (s->busy)
            return reply_error(r, fb::ErrorCode::SessionBusy, "session " + target + " is generating; save it after its turn");
        if (!s->bridge || s->evaluated.empty())
            return reply_error(r, fb::ErrorCode::BadRequest, "session " + target + " holds no tokens yet");
        std::vector<uint8_t> bytes;
        try {
            settle(s);
            bytes = s->bridge->save_payload();
        } catch (const BridgeFailure &e) {
            return reply_error(r, fb::ErrorCode::Engine, e.what());
        }
        const uint32_t n = uint32_t(s->evaluated.size());
        const uint64_t len = bytes.size();
        std::shared_ptr<ConnShared> conn = r.conn;
        const uint64_t rid = r.id;
        saver->save(target, std::move(bytes), [this, conn, rid, target, n, len](const kvstore::Status &st) {
            if (st) emit(conn, rid, session_saved_frame(rid, target, n, len), true);
            else
                emit(conn, rid,
                     error_frame(rid, fb::ErrorCode::Store,
                                 "saving session " + target + " failed; the previous stored version is kept: " +
                                     st.to_string()),
                     true);
        });
    }

    void on(Request &r, PinSessionParams &p) {
        if (!cfg.store) return reply_error(r, fb::ErrorCode::NoStore, "ds4d runs without a session store (--no-store)");
        saver->flush();
        const kvstore::Status st = cfg.store->pin(p.name, p.pinned);
        if (st.code() == kvstore::Code::kNotFound)
            return reply_error(r, fb::ErrorCode::UnknownSession,
                               names.count(p.name) ? "session " + p.name + " is not stored yet (it is saved after its first turn)"
                                                   : "no stored session named " + p.name);
        if (!st) return reply_error(r, fb::ErrorCode::Store, st.to_string());
        emit(r.conn, r.id, ok_frame(r.id), true);
    }

    void on(Request &r, CloseParams &p) {
        Session *s = lookup(r.conn, p.session);
        if (!s) return reply_error(r, fb::ErrorCode::UnknownSession, "no session " + std::to_string(p.session));
        if (s->name.empty()) {
            if (s->busy) finish_job(*s->busy, fb::FinishReason::Cancelled);
            erase_session(s);
        }
        // Named sessions outlive connections; DeleteSession removes them.
        emit(r.conn, r.id, ok_frame(r.id), true);
    }

    void on(Request &r, DeleteSessionParams &p) {
        bool found = false;
        auto it = names.find(p.name);
        if (it != names.end()) {
            Session *s = sessions.at(it->second).get();
            saving_suppressed = true;
            if (s->busy) finish_job(*s->busy, fb::FinishReason::Cancelled);
            saving_suppressed = false;
            erase_session(s);
            found = true;
        }
        if (cfg.store) {
            found = quarantined.erase(p.name) > 0 || found;
            saver->flush();
            saver->forget(p.name);
            const kvstore::Status st = cfg.store->remove(p.name);
            if (st) found = true;
            else if (st.code() != kvstore::Code::kNotFound)
                return reply_error(r, fb::ErrorCode::Store, "deleting stored session " + p.name + ": " + st.to_string());
        }
        if (!found) return reply_error(r, fb::ErrorCode::UnknownSession, "no session named " + p.name);
        emit(r.conn, r.id, ok_frame(r.id), true);
    }

    // The store's remembered evictions of names neither stored (`stored`) nor live now.
    std::vector<EvictedEntry> evicted_entries(const std::unordered_map<std::string, size_t> &stored) const {
        std::vector<EvictedEntry> out;
        std::vector<kvstore::EvictedInfo> all;
        if (!cfg.store) return out;
        if (const kvstore::Status st = cfg.store->list_evicted(&all); !st) {
            log_line("listing evicted sessions: %s", st.to_string().c_str());
            return out;
        }
        for (const auto &e : all)
            if (!stored.count(e.name) && !names.count(e.name)) out.push_back({e.name, e.evicted_ms / 1000, e.why});
        return out;
    }

    void on(Request &r, ListSessionsParams &) {
        std::vector<SessionListEntry> v;
        std::unordered_map<std::string, size_t> at;
        if (cfg.store) {
            saver->flush();  // turns that ended before this request are listed as stored
            std::vector<kvstore::EntryInfo> stored;
            const kvstore::Status st = cfg.store->list(&stored);
            if (!st) return reply_error(r, fb::ErrorCode::Store, "listing stored sessions: " + st.to_string());
            for (const auto &e : stored) {
                at[e.name] = v.size();
                v.push_back({e.name, e.n_tokens, e.bytes, e.created_ms / 1000, e.last_used_ms / 1000, e.pinned, false,
                             e.n_tokens, save_error_of(e.name)});
            }
        }
        for (auto &[id, s] : sessions) {
            if (s->name.empty()) continue;
            auto f = at.find(s->name);
            if (f == at.end()) {
                v.push_back({s->name, uint32_t(s->history.size()), 0, s->created_unix, s->used_unix, false, true, 0,
                             save_error_of(s->name)});
            } else {
                SessionListEntry &e = v[f->second];
                e.live = true;
                e.n_tokens = uint32_t(s->history.size());
                e.last_used_unix = std::max(e.last_used_unix, s->used_unix);
            }
        }
        std::sort(v.begin(), v.end(), [](auto &a, auto &b) { return a.name < b.name; });
        emit(r.conn, r.id, session_list_frame(r.id, v, evicted_entries(at)), true);
    }

    void on(Request &r, TokenizeParams &p) {
        try {
            auto toks = model->tokenize(p.text, p.special);
            emit(r.conn, r.id, tokenize_result_frame(r.id, toks), true);
        } catch (const BridgeFailure &e) {
            reply_error(r, fb::ErrorCode::Engine, e.what());
        }
    }

    void on(Request &r, DetokenizeParams &p) {
        for (size_t i = 0; i < p.tokens.size(); ++i)
            if (p.tokens[i] < 0 || p.tokens[i] >= model->vocab())
                return reply_error(r, fb::ErrorCode::BadRequest,
                                   "token " + std::to_string(i) + " (" + std::to_string(p.tokens[i]) +
                                       ") is outside the vocabulary of " + std::to_string(model->vocab()));
        try {
            emit(r.conn, r.id, detokenize_result_frame(r.id, model->detokenize(p.tokens)), true);
        } catch (const BridgeFailure &e) {
            reply_error(r, fb::ErrorCode::Engine, e.what());
        }
    }

    void on(Request &r, StatsParams &p) {
        StatsFields s;
        s.uptime_s = std::chrono::duration<double>(Clock::now() - started_at).count();
        s.sessions = uint32_t(sessions.size());
        s.connections = p.connections;
        s.active_requests = uint32_t(jobs.size());
        for (auto &j : jobs) s.queued_requests += j->decoding ? 0 : 1;
        s.requests_total = requests_total;
        s.tokens_in = tokens_in;
        s.tokens_cached = tokens_cached;
        s.tokens_out = tokens_out;
        s.prefill_tok_s = prefill_ns_total ? double(prefill_tokens) * 1e9 / double(prefill_ns_total) : 0.0;
        s.decode_tok_s = decode_ns_total ? double(tokens_out) * 1e9 / double(decode_ns_total) : 0.0;
        s.memory = model->memory();
        s.saves_failed = saver ? saver->saves_failed() : 0;
        emit(r.conn, r.id, stats_result_frame(r.id, model_summary, s), true);
    }

    void on(Request &r, GenerateParams &p) {
        if (stopping) return reply_error(r, fb::ErrorCode::ShuttingDown, "ds4d is shutting down");
        for (auto &j : jobs)
            if (j->conn->id == r.conn->id && j->rid == r.id)
                return reply_error(r, fb::ErrorCode::BadRequest,
                                   "request id " + std::to_string(r.id) + " is already running on this connection");
        auto job = std::make_unique<Job>();
        if (p.session == 0) {
            job->ephemeral = std::make_unique<Session>();
            job->ephemeral->ctx = default_ctx;
            job->ephemeral->ephemeral = true;
            job->session = job->ephemeral.get();
        } else {
            job->session = lookup(r.conn, p.session);
            if (!job->session) return reply_error(r, fb::ErrorCode::UnknownSession, "no session " + std::to_string(p.session));
            if (job->session->busy)
                return reply_error(r, fb::ErrorCode::SessionBusy,
                                   "session " + std::to_string(p.session) + " is already generating");
        }
        Session *s = job->session;
        std::vector<int32_t> prompt;
        try {
            switch (p.kind) {
            case GenerateParams::Prompt::None: break;
            case GenerateParams::Prompt::Text: prompt = model->tokenize(p.text, false); break;
            case GenerateParams::Prompt::Tokens:
                for (size_t i = 0; i < p.tokens.size(); ++i)
                    if (p.tokens[i] >= model->vocab())
                        return reply_error(r, fb::ErrorCode::BadRequest,
                                           "token " + std::to_string(i) + " (" + std::to_string(p.tokens[i]) +
                                               ") is outside the vocabulary of " + std::to_string(model->vocab()));
                prompt = p.tokens;
                break;
            case GenerateParams::Prompt::Chat:
                prompt = model->render_chat(p.messages, p.add_generation_prompt, p.thinking);
                // A later turn continues the conversation: drop the template's opening
                // (the beginning-of-sequence part) that the history already has.
                if (!s->history.empty() && prompt.size() >= template_prefix.size() &&
                    std::equal(template_prefix.begin(), template_prefix.end(), prompt.begin()))
                    prompt.erase(prompt.begin(), prompt.begin() + ptrdiff_t(template_prefix.size()));
                break;
            }
        } catch (const BridgeFailure &e) {
            return reply_error(r, fb::ErrorCode::Engine, e.what());
        }
        std::vector<int32_t> full = s->history;
        full.insert(full.end(), prompt.begin(), prompt.end());
        if (full.empty()) return reply_error(r, fb::ErrorCode::BadRequest, "empty prompt on an empty session");
        if (s->history.size() >= s->ctx)
            return reply_error(r, fb::ErrorCode::ContextOverflow,
                               "the session's context of " + std::to_string(s->ctx) + " tokens is full (" +
                                   std::to_string(s->history.size()) +
                                   " tokens of history); open it again with a larger context, or delete it");
        if (full.size() >= s->ctx)
            return reply_error(r, fb::ErrorCode::ContextOverflow,
                               "history " + std::to_string(s->history.size()) + " + prompt " +
                                   std::to_string(prompt.size()) + " tokens do not fit the session's context of " +
                                   std::to_string(s->ctx));
        job->conn = r.conn;
        job->rid = r.id;
        job->p = std::move(p);
        job->text = TextStream(job->p.stop_strings);
        std::sort(job->p.stop_tokens.begin(), job->p.stop_tokens.end());
        job->rng = splitmix64(job->p.seed);
        job->base_len = s->history.size();
        job->prompt_tokens = uint32_t(prompt.size());
        job->full = std::move(full);
        // The allocations come before the session changes: if one fails, handle() answers
        // with an error and the session is as it was (not busy with a job that never ran).
        std::vector<int32_t> history = job->full;
        Job *raw = job.get();
        jobs.push_back(std::move(job));
        s->history = std::move(history);
        s->busy = raw;
        s->used_unix = uint64_t(std::time(nullptr));
        ++requests_total;
        tokens_in += prompt.size();
    }

    // ---- scheduling ----

    bool runnable(const Job &j) const {
        return j.conn->closed.load(std::memory_order_acquire) ||
               j.conn->queued_bytes.load(std::memory_order_acquire) < cfg.queue_bytes;
    }

    void finish_job(Job &j, fb::FinishReason reason, int32_t stop_token = -1) {
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
        Session *s = j.session;
        const bool named = !s->ephemeral && !s->name.empty();  // ephemeral ones die with the job
        end_job(j);
        if (named) persist(s);
    }

    void fail_job(Job &j, fb::ErrorCode code, const std::string &msg) {
        log_line("request %llu failed: %s", static_cast<unsigned long long>(j.rid), msg.c_str());
        emit(j.conn, j.rid, error_frame(j.rid, code, msg), true);
        // The engine may have mutated the session: drop its state and the request's tokens.
        Session *s = j.session;
        s->history.resize(j.base_len);
        s->bridge.reset();
        s->evaluated.clear();
        end_job(j);
    }

    void end_job(Job &j) {
        prefill_ns_total += j.prefill_ns;
        decode_ns_total += j.decode_ns;
        Session *s = j.session;
        s->busy = nullptr;
        if (s->ephemeral) release_to_pool(s);
        jobs.remove_if([&](const std::unique_ptr<Job> &p) { return p.get() == &j; });
    }

    bool in_stop_tokens(const Job &j, int32_t t) const {
        return std::binary_search(j.p.stop_tokens.begin(), j.p.stop_tokens.end(), t);
    }

    // One scheduling step of j: a prefill chunk, or one decoded token. Returns false when
    // the job ended (and was removed).
    bool step(Job &j) {
        Session *s = j.session;
        try {
            ensure_bridge(j);
            bool first_sync = false;
            if (!j.started) {
                j.started = true;
                first_sync = true;
                reuse_stored_prefix(j);
                // The engine keeps the common prefix but re-evaluates at least the last
                // prompt token (its logits are needed), unless it already holds exactly this.
                const size_t common = common_prefix(s->evaluated, j.full);
                j.cached = (common == j.full.size() && s->evaluated.size() == j.full.size())
                               ? common
                               : std::min(common, j.full.size() - 1);
                j.synced = j.cached;
                j.last_checkpoint = j.cached;
            }
            if (!j.decoding) {
                const auto t0 = Clock::now();
                const uint64_t gen = s->bridge->generation();
                const size_t target = std::min(j.full.size(), j.synced + cfg.prefill_chunk);
                s->bridge->sync(std::span<const int32_t>(j.full.data(), target));
                if (first_sync && s->bridge->generation() != gen) {
                    j.cached = 0;  // the state was rebuilt: nothing was reused
                    j.synced = 0;
                }
                if (first_sync) tokens_cached += j.cached;
                s->evaluated.assign(j.full.begin(), j.full.begin() + ptrdiff_t(target));
                prefill_tokens += target - j.synced;
                j.synced = target;
                j.prefill_ns += ns_since(t0);
                maybe_checkpoint(j, target);
                if (j.p.progress) emit(j.conn, j.rid, progress_frame(j.rid, uint32_t(target), uint32_t(j.full.size())), false);
                if (target < j.full.size()) return true;
                j.decoding = true;
                // Sample the first token in this step: time to first token is one step.
            }
            if (j.generated >= j.p.max_tokens) {
                finish_job(j, fb::FinishReason::Length);
                return false;
            }
            // The history (the pending token included) fills the context: a token sampled
            // now could never be evaluated, and a session holding it could not be reloaded.
            if (s->history.size() >= s->ctx) {
                finish_job(j, fb::FinishReason::Context);
                return false;
            }
            const auto t0 = Clock::now();
            if (j.pending >= 0) {
                s->bridge->eval(j.pending);
                s->evaluated.push_back(j.pending);
                j.pending = -1;
            }
            const int32_t t = j.p.temperature == 0.0f
                                  ? s->bridge->argmax()
                                  : s->bridge->sample(j.p.temperature, j.p.top_k, j.p.top_p, j.p.min_p, &j.rng);
            s->history.push_back(t);
            if ((!j.p.ignore_eos && model->is_stop(t)) || in_stop_tokens(j, t)) {
                j.decode_ns += ns_since(t0);
                finish_job(j, fb::FinishReason::Stop, t);
                return false;
            }
            ++j.generated;
            ++tokens_out;
            const std::string delta = j.text.push(model->token_text(t));
            j.decode_ns += ns_since(t0);
            emit(j.conn, j.rid, token_chunk_frame(j.rid, std::span<const int32_t>(&t, 1), delta), false);
            if (j.text.stopped()) {
                finish_job(j, fb::FinishReason::StopString);
                return false;
            }
            if (j.generated >= j.p.max_tokens) {
                finish_job(j, fb::FinishReason::Length);
                return false;
            }
            j.pending = t;
            return true;
        } catch (const BridgeFailure &e) {
            fail_job(j, fb::ErrorCode::Engine, e.what());
            return false;
        } catch (const std::exception &e) {
            fail_job(j, fb::ErrorCode::Internal, e.what());
            return false;
        }
    }

    // Steps the first runnable job and moves it to the back. False when none could run.
    bool run_one() {
        for (auto it = jobs.begin(); it != jobs.end(); ++it) {
            Job &j = **it;
            if (!runnable(j)) continue;
            if (j.conn->closed.load(std::memory_order_acquire)) {
                end_job(j);  // output would go nowhere
                return true;
            }
            auto node = std::move(*it);
            jobs.erase(it);
            jobs.push_back(std::move(node));
            step(*jobs.back());
            return true;
        }
        return false;
    }

    // ---- commands ----

    void on_cancel(const std::shared_ptr<ConnShared> &conn, uint64_t target) {
        for (auto &j : jobs)
            if (j->conn->id == conn->id && j->rid == target) {
                finish_job(*j, fb::FinishReason::Cancelled);
                return;
            }
    }

    void on_disconnect(const std::shared_ptr<ConnShared> &conn) {
        for (auto it = jobs.begin(); it != jobs.end();) {
            Job &j = **it++;
            if (j.conn->id == conn->id) end_job(j);
        }
        for (auto it = sessions.begin(); it != sessions.end();) {
            Session *s = it->second.get();
            ++it;
            if (s->owner == conn->id) erase_session(s);
        }
    }

    void cancel_all() {
        while (!jobs.empty()) finish_job(*jobs.front(), fb::FinishReason::Cancelled);
    }

    void process(std::vector<Command> &cmds) {
        for (Command &c : cmds) {
            switch (c.kind) {
            case Command::Kind::Request: handle(c.request); break;
            case Command::Kind::Cancel: on_cancel(c.conn, c.target); break;
            case Command::Kind::Disconnect: on_disconnect(c.conn); break;
            case Command::Kind::Shutdown:
                if (!stopping) {
                    stopping = true;
                    deadline = Clock::now() + c.grace;
                } else {
                    deadline = std::min(deadline, Clock::now() + c.grace);
                }
                break;
            }
        }
    }

    void loop() {
        for (;;) {
            std::vector<Command> cmds;
            {
                std::lock_guard<std::mutex> lk(mu);
                cmds.swap(commands);
                woken = false;
            }
            process(cmds);
            if (stopping && !jobs.empty() && Clock::now() >= deadline) cancel_all();
            if (stopping && jobs.empty()) return;
            if (run_one()) continue;
            std::unique_lock<std::mutex> lk(mu);
            auto ready = [&] { return !commands.empty() || woken; };
            if (stopping)
                cv.wait_until(lk, deadline, ready);
            else
                cv.wait(lk, ready);
        }
    }

    void teardown() {
        saver.reset();  // every queued save becomes durable (or is logged as failed) first
        jobs.clear();
        sessions.clear();
        names.clear();
        pool.clear();
        model.reset();
    }

    void main(std::promise<void> &ready) {
        try {
            open_model();
        } catch (...) {
            teardown();
            ready.set_exception(std::current_exception());
            return;
        }
        ready.set_value();
        try {
            loop();
        } catch (const std::exception &e) {
            log_line("worker stopped on an unexpected error: %s", e.what());
        }
        teardown();
        out.push(Outgoing{});  // conn 0: the worker is done
    }

    void push(Command &&c) {
        {
            std::lock_guard<std::mutex> lk(mu);
            commands.push_back(std::move(c));
        }
        cv.notify_one();
    }
};

Worker::Worker(WorkerConfig cfg, OutQueue &out) : impl_(std::make_unique<Impl>(std::move(cfg), out)) {}

Worker::~Worker() {
    if (impl_->thread.joinable()) {
        shutdown(std::chrono::milliseconds(0));
        impl_->thread.join();
    }
}

void Worker::start() {
    std::promise<void> ready;
    auto fut = ready.get_future();
    impl_->thread = std::thread([this, &ready] { impl_->main(ready); });
    try {
        fut.get();
    } catch (...) {
        impl_->thread.join();
        throw;
    }
}

const ModelSummary &Worker::model() const { return impl_->model_summary; }
uint32_t Worker::default_ctx() const { return impl_->default_ctx; }

void Worker::submit(Request r) {
    Command c{Command::Kind::Request, std::move(r), nullptr, 0, {}};
    impl_->push(std::move(c));
}

void Worker::cancel(const std::shared_ptr<ConnShared> &conn, uint64_t target) {
    impl_->push(Command{Command::Kind::Cancel, {}, conn, target, {}});
}

void Worker::disconnect(const std::shared_ptr<ConnShared> &conn) {
    impl_->push(Command{Command::Kind::Disconnect, {}, conn, 0, {}});
}

void Worker::shutdown(std::chrono::milliseconds grace) {
    impl_->push(Command{Command::Kind::Shutdown, {}, nullptr, 0, grace});
}

void Worker::wake() {
    {
        std::lock_guard<std::mutex> lk(impl_->mu);
        impl_->woken = true;
    }
    impl_->cv.notify_one();
}

void Worker::join() {
    if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace ds4::daemon
