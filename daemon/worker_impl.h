// The worker's internals, shared by the files that implement it: worker.cpp (thread,
// commands, the loop), handlers.cpp (requests), generation.cpp (batched steps and the job
// lifecycle), session_table.cpp (live sessions) and persistence.cpp (the store). Only
// those include this header; everything here runs on the worker thread unless marked.
#pragma once
#include <chrono>
#include <condition_variable>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "daemon/bridge_host.h"
#include "daemon/json_constraint.h"
#include "daemon/replies.h"
#include "daemon/scheduler.h"
#include "daemon/session_saver.h"
#include "daemon/text_stream.h"
#include "daemon/worker.h"

namespace ds4::daemon {

namespace fb = ipc::fb;
using Clock = std::chrono::steady_clock;

constexpr size_t kPoolMax = 4;  // idle bridge sessions kept for one-shot requests

inline uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

inline size_t common_prefix(const std::vector<int32_t> &a, const std::vector<int32_t> &b) {
    const size_t n = std::min(a.size(), b.size());
    size_t i = 0;
    while (i < n && a[i] == b[i]) ++i;
    return i;
}

inline uint64_t ns_since(Clock::time_point t0) {
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
}

struct Job;

// A session the worker holds in memory: its conversation and the bridge state of it.
struct LiveSession {
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
    uint64_t touched = 0;     // use order, for releasing the least recently used
    size_t saved_len = 0;     // history length its latest queued save covers
};

// A named session released from memory to the store (LRU, --max-sessions): its id stays
// valid, and the next use loads it back.
struct Parked {
    std::string name;
    uint32_t ctx = 0;
};

// One Generate request from arrival to Done: prefill (in chunks), then decode.
struct Job {
    std::shared_ptr<ConnShared> conn;
    uint64_t rid = 0;
    uint64_t arrival = 0;        // order of arrival: prefills are served oldest first
    LiveSession *session = nullptr;
    std::unique_ptr<LiveSession> ephemeral;
    GenerateParams p;
    std::vector<int32_t> full;   // history + prompt: what prefill must reach
    size_t base_len = 0;         // history length before this request
    uint32_t prompt_tokens = 0;
    size_t cached = 0;
    size_t synced = 0;           // prefill frontier: the session holds full[0, synced)
    bool started = false;
    bool decoding = false;
    int32_t pending = -1;        // sampled, streamed, not yet evaluated
    uint32_t generated = 0;
    uint64_t rng = 0;
    TokenCounts generated_counts;  // for frequency/presence penalties (daemon/sampling.h)
    std::unique_ptr<JsonState> json;  // output constrained to a JSON object (Generate.output_format)
    TextStream text;
    uint64_t prefill_ns = 0, decode_ns = 0;
    Clock::time_point first_token_at{};
    size_t last_checkpoint = 0;  // prefill frontier of the last checkpoint (or the cached start)
    uint32_t checkpoints = 0;
    uint64_t drafted = 0, accepted = 0;  // speculative decoding (speculation.cpp)
    uint32_t spec_steps = 0;             // steps where it could speculate
    bool spec_started = false;
    // KV budget (kv_budget.cpp): a job runs once admitted; until then it waits in arrival order.
    bool admitted = false;
    uint64_t reserved = 0;       // cache bytes its session may reach (history + prompt + max_tokens)
    Clock::time_point queued_at = Clock::now();
};

// A request that waits for a session slot or cache memory (kv_budget.cpp), retried in order.
struct Deferred {
    Request request;
    Clock::time_point since;
    std::string why;             // what it waits for, for the error if it times out
};

// The speculative rows of one step and the arrays the bridge fills for them.
struct SpecStep {
    std::vector<ds4_bridge_spec_row> rows;
    std::vector<std::vector<int32_t>> tokens, argmax;
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
    std::unique_ptr<ds4::bridge::Batch> batch;
    int32_t draft_max = 0;              // > 0: a drafter is loaded (speculation.cpp)
    ModelSummary model_summary;
    uint32_t default_ctx = 0;
    std::vector<int32_t> template_prefix;
    std::vector<float> row_scratch;  // a logits row for requests with sampling controls
    std::unique_ptr<JsonVocab> json_vocab;  // the vocabulary's bytes, made at the first JSON request
    std::unordered_map<uint64_t, std::unique_ptr<LiveSession>> sessions;
    std::unordered_map<std::string, uint64_t> names;
    uint64_t next_session = 1;
    uint64_t next_arrival = 1;
    uint64_t use_clock = 0;
    std::unordered_map<uint64_t, Parked> parked;            // by session id
    std::unordered_map<std::string, uint64_t> parked_names; // name -> id
    uint64_t sessions_released = 0, sessions_reloaded = 0;
    std::list<Deferred> deferred;       // requests waiting for a slot or memory, oldest first
    bool retrying = false;              // handle() is re-running deferred.front()
    uint64_t retry_state = 0;           // what room looked like when the front last had to wait
    std::string defer_why;              // set by a handler that must wait: handle() defers it
    uint64_t kv_refused = 0;            // requests refused for memory or slots (never fit / timed out)
    std::list<std::unique_ptr<Job>> jobs;  // round-robin order: those that ran go to the back
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
    uint64_t steps = 0, step_rows = 0, step_sessions = 0, step_ns_total = 0;
    // Speculative decoding: tokens taken from trials and the time the trials took, against
    // plain one-row decode steps (the baseline a trial replaces) for the measured speedup.
    uint64_t spec_tokens = 0, spec_solo_tokens = 0, spec_solo_ns = 0, solo_steps = 0, solo_ns = 0;

    Impl(WorkerConfig c, OutQueue &o) : cfg(std::move(c)), out(o) {}

    // ---- output (worker.cpp) ----

    void emit(const std::shared_ptr<ConnShared> &conn, uint64_t rid, Frame &&bytes, bool final);

    void reply_error(const Request &r, fb::ErrorCode code, const std::string &msg);

    // ---- start-up (worker.cpp) ----

    void open_model();

    // ---- persistence (persistence.cpp) ----

    enum class Loaded { Yes, Absent, Failed };

    // Loads the stored session `name` into s (bridge, history, ctx). Failed: code/msg say why.
    Loaded load_stored(const std::string &name, uint32_t ctx_req, LiveSession &s, fb::ErrorCode *code, std::string *msg);

    // Brings the bridge up to the whole history when only the turn's last sampled token is
    // missing, so a payload of it resumes exactly where the conversation stands.
    void settle(LiveSession *s);

    // After a turn of a named session: queue its state for the store thread.
    void persist(LiveSession *s);

    // Before a prefill: when much of it is uncached, start from the longest stored prefix.
    void reuse_stored_prefix(Job &j);

    // At a prefill chunk frontier: the session holds exactly full[0, target).
    void maybe_checkpoint(Job &j, size_t target);

    // ---- KV memory budget and waiting (kv_budget.cpp) ----

    // Cache bytes held now: live sessions, running jobs (their reservations), the pool.
    uint64_t kv_in_use() const;
    // What a job's session may hold at most, in cache bytes.
    uint64_t job_need(const Job &j);
    // The same for a request on a session of ctx reaching `most` tokens: with the drafter's
    // session (its drafts included) when it speculates.
    uint64_t request_need(uint32_t ctx, uint64_t most, bool speculate);
    // Frees cache memory until `need` more bytes fit the budget: idle pooled contexts first,
    // then the least recently used idle stored sessions (not `keep`). False when it cannot.
    bool release_for(uint64_t need, const LiveSession *keep);
    // Admits waiting jobs in arrival order while they fit; refuses those that never can or
    // waited past --kv-wait. True when a job was admitted or refused.
    bool admit_jobs();
    // Marks the request being handled as waiting (handle() keeps it and retries it later).
    void defer(const std::string &why) { defer_why = why; }
    // Whether a new request that needs a slot or memory must queue behind waiting ones.
    bool others_waiting() const { return !retrying && !deferred.empty(); }
    // Re-runs waiting requests in order until one must still wait (only once room may have
    // changed since it last had to); times out the old ones.
    void retry_deferred();
    uint64_t room_state() const;   // changes when sessions, jobs, the pool or memory held change
    // When the loop must look again even without commands (the next --kv-wait expiry).
    Clock::time_point next_wait_deadline() const;

    // ---- sessions (session_table.cpp) ----

    // Null when absent, or when a released session cannot be reloaded: then *code/*msg say
    // why (SessionLimit, a store error), else they keep the caller's UnknownSession.
    LiveSession *lookup(const std::shared_ptr<ConnShared> &conn, uint64_t id, fb::ErrorCode *code, std::string *msg);

    void erase_session(LiveSession *s);

    // Room for one more live session: when --max-sessions are live, releases the least
    // recently used idle named session whose whole history is saved. False (why in *why)
    // when none can go.
    bool make_room(std::string *why);
    // The least recently used idle named session whose whole history is stored, other than
    // `keep` (and holding cache memory when `with_cache`), or null.
    LiveSession *release_candidate(const LiveSession *keep, bool with_cache);
    // Releases it from memory to the store (it reloads under its id on use).
    void release(LiveSession *s, const char *why);
    // Loads a released session back under its id. Null when it cannot (code/msg say why).
    LiveSession *unpark(uint64_t id, fb::ErrorCode *code, std::string *msg);
    void touch(LiveSession *s) { s->touched = ++use_clock; }

    void ensure_bridge(Job &j);

    void release_to_pool(LiveSession *s);

    // A live session asked for a larger context (e.g. because it filled its own): its state
    // moves into a bigger bridge session through a payload. Empty on success, else why not.
    std::string grow_ctx(LiveSession *s, uint32_t ctx);

    // ---- requests (handlers.cpp) ----

    // When a stored session `name` was evicted to keep the store's budget (and not stored
    // since): a note saying so; empty otherwise.
    std::string eviction_note(const std::string &name) const;

    static std::string utc_time(uint64_t unix_s);

    // Why the latest save of this session failed (its stored version is behind); empty if
    // it did not. Does not wait for queued saves.
    std::string save_error_of(const std::string &name) const;

    // Any failure inside a handler (std::bad_alloc included) fails only its own request;
    // the worker, and every other request, goes on.
    void handle(Request &r);

    void on(Request &r, OpenSessionParams &p);

    void on(Request &r, LoadSessionParams &p);

    void on(Request &r, SaveSessionParams &p);

    void on(Request &r, PinSessionParams &p);

    void on(Request &r, CloseParams &p);

    void on(Request &r, DeleteSessionParams &p);

    // The store's remembered evictions of names neither stored (`stored`) nor live now.
    std::vector<EvictedEntry> evicted_entries(const std::unordered_map<std::string, size_t> &stored) const;

    void on(Request &r, ListSessionsParams &);

    void on(Request &r, TokenizeParams &p);

    void on(Request &r, DetokenizeParams &p);

    void on(Request &r, StatsParams &p);

    void on(Request &r, GenerateParams &p);

    // ---- generation (generation.cpp) ----

    bool runnable(const Job &j) const;

    void finish_job(Job &j, fb::FinishReason reason, int32_t stop_token = -1);

    void fail_job(Job &j, fb::ErrorCode code, const std::string &msg);

    void end_job(Job &j);

    bool in_stop_tokens(const Job &j, int32_t t) const;

    bool prepare(Job &j);
    bool take_token(Job &j);
    // A stop rule that holds before any token is taken (length, context): true with *why set.
    bool out_of_room(const Job &j, fb::FinishReason *why) const;
    // t is j's next token (sampled after its session's history, from time t0): history,
    // streaming, stop rules. False when a rule ends j (*why, *stop_token); the caller then
    // finishes it. True: t is j's pending token.
    // lp: t's log-probabilities, sent with it (Generate.logprobs), or null.
    bool deliver(Job &j, int32_t t, Clock::time_point t0, fb::FinishReason *why, int32_t *stop_token,
                 const TokenLogprob *lp = nullptr);
    bool run_step();

    // ---- speculative decoding (speculation.cpp) ----

    // Rows a decode step of j asks the scheduler for: 1 + draft_max when it speculates.
    uint32_t spec_rows_wanted(const Job &j) const;
    // The speculative rows of a step: jobs[i] was given rows[i] rows (>= 2).
    void prepare_trials(const std::vector<Job *> &jobs, const std::vector<uint32_t> &rows, SpecStep *out);
    // After the step: j's trial (width >= 2) is pending; j takes the model's tokens one by one
    // as plain decoding would, then the trial is committed with exactly those. alone: the
    // step ran only j (the measured speedup's figures).
    void take_trial(Job &j, const ds4_bridge_spec_row &r, uint64_t step_ns, bool alone);

    // ---- commands and the loop (worker.cpp) ----

    void on_cancel(const std::shared_ptr<ConnShared> &conn, uint64_t target);

    void on_disconnect(const std::shared_ptr<ConnShared> &conn);

    void cancel_all();

    void process(std::vector<Command> &cmds);

    void loop();

    void teardown();

    void main(std::promise<void> &ready);

    void push(Command &&c);
};

}  // namespace ds4::daemon
