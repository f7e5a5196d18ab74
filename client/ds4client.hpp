// libds4client: the C++ client of ds4d. One Client is one socket connection; calls are
// synchronous and not thread-safe, except cancel(), which may be called from another
// thread while generate() runs. Nothing reconnects behind the caller's back.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ds4::client {

// The daemon could not be reached (no socket, refused, path too long).
struct ConnectError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The connection broke or the daemon sent something this client cannot use.
struct ProtocolError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The daemon answered with an Error message. code is the wire ErrorCode value.
struct ServerError : std::runtime_error {
    ServerError(int code, std::string code_name, std::string message, uint64_t request_id);
    int code;
    std::string code_name;
    std::string server_message;
    uint64_t request_id;
};

struct ModelInfo {
    std::string family, name, backend;
    uint32_t n_layer = 0, n_embd = 0, n_vocab = 0, n_ctx_max = 0, n_head = 0, n_expert = 0;
    // The model's GGUF has a chat template: prompts are meant as chat messages. false: a
    // model of plain text completion (ds4 run then sends the prompt as text).
    bool chat_template = true;
};

struct ServerInfo {
    uint32_t protocol_version = 0;
    std::string server;
    ModelInfo model;
    uint32_t default_ctx = 0;
    uint32_t max_frame = 0;
};

struct SessionInfo {
    uint64_t id = 0;
    std::string name;
    uint32_t ctx = 0;
    uint32_t n_tokens = 0;
    bool created = false;
    // Non-empty when the session's latest save failed (disk full, I/O error, budget): its
    // stored version is older than the live state, which a daemon restart would lose.
    std::string save_error;
    // Non-empty when a stored session of this name was evicted earlier to keep the store's
    // budget (when, why): this session is new and empty, the old conversation is gone.
    std::string evicted;
};

struct ChatMessage {
    std::string role, content;
};

// The prompt is one of: text (plain completion), tokens, or chat messages (rendered with
// the model's template; a continuation when the session has history).
struct GenerateRequest {
    uint64_t session = 0;   // 0: one-shot session
    enum class Prompt { Text, Tokens, Chat } kind = Prompt::Text;
    std::string text;
    std::vector<int32_t> tokens;
    std::vector<ChatMessage> messages;
    bool add_generation_prompt = true;
    bool thinking = false;
    float temperature = 0.0f;   // 0: greedy
    int32_t top_k = 0;
    float top_p = 1.0f;
    float min_p = 0.0f;
    uint64_t seed = 0;
    uint32_t max_tokens = 256;
    std::vector<std::string> stop_strings;
    std::vector<int32_t> stop_tokens;
    bool ignore_eos = false;
    bool progress = false;      // ask for prefill progress reports
    bool speculate = true;      // decode with ds4d's drafter when it has one
    // Repetition controls (ds4.fbs Sampling says the order and formulas): repeat_penalty over
    // the last repeat_last_n context tokens (1: off; 0: off, -1: whole context), frequency
    // and presence penalties over the generated tokens (0: off).
    float repeat_penalty = 1.0f;
    int32_t repeat_last_n = 64;
    float frequency_penalty = 0.0f;
    float presence_penalty = 0.0f;
    std::vector<std::pair<int32_t, float>> logit_bias;  // token id -> bias in [-100, 100]
    bool logprobs = false;      // each chunk's token's log-probability (Chunk::logprobs)
    uint32_t top_logprobs = 0;  // 0..20 alternatives with each (needs logprobs)
    // Constrained decoding: the output is one JSON object, and the request ends (Stop) when it
    // closes; ds4d keeps it closable within max_tokens (>= 2) and the context.
    bool json_object = false;
};

enum class FinishReason { Stop = 0, StopString, Length, Context, Cancelled };
const char *finish_reason_name(FinishReason r);

// log-softmax of the logits after bias and penalties, divided by the temperature when it
// is above 0 (before top-k/top-p/min-p truncation).
struct TokenLogprob {
    float logprob = 0;
    std::vector<std::pair<int32_t, float>> top;  // most likely first
};

struct Chunk {
    std::span<const int32_t> tokens;
    std::string_view text;
    std::span<const TokenLogprob> logprobs;  // one per token when GenerateRequest::logprobs
};

struct DoneInfo {
    uint64_t request_id = 0;
    FinishReason reason = FinishReason::Stop;
    uint32_t prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
    uint64_t prefill_us = 0, decode_us = 0;
    int32_t stop_token = -1;
};

struct GenerateCallbacks {
    // Return false to cancel the request (generate() still returns its Done).
    std::function<bool(const Chunk &)> on_chunk;
    std::function<void(uint32_t current, uint32_t total)> on_progress;
    // Called once the request id is known, before any chunk (so another thread can cancel).
    std::function<void(uint64_t request_id)> on_start;
};

struct MemoryStats {
    uint64_t weights_bytes = 0, cache_bytes = 0, scratch_bytes = 0, device_free = 0, device_total = 0;
    uint64_t device_weights_bytes = 0;
    std::string device;   // the GPU's name, or "cpu"
    // The drafter's weights (part of weights_bytes); weights whose pages other processes map
    // too (ds4d's drafter while an importer maps it); the rest, ds4d's alone.
    uint64_t drafter_bytes = 0, shared_bytes = 0, private_bytes = 0;
};

// A process that received ds4d's drafter (ds4.fbs DrafterImporter).
struct DrafterImporter {
    int32_t pid = 0;
    uint32_t uid = 0;
    uint64_t first_unix = 0, last_unix = 0;
    uint32_t shares = 0;
    uint64_t bytes = 0;
    bool mapped = false;  // maps the drafter now
};

// SSD expert streaming counters since ds4d started (ds4.fbs ExpertStats).
struct ExpertStats {
    uint64_t acquired = 0, misses = 0, late = 0, prefetched = 0, prefetch_used = 0, bytes_read = 0;
    uint64_t store_reads = 0, store_corrupt = 0;
    double wait_s = 0, io_busy_s = 0;
    uint64_t resident = 0, capacity = 0, capacity_bytes = 0;
    double hit_rate() const { return acquired ? 1.0 - double(misses) / double(acquired) : 0.0; }
    double read_gb_s() const { return io_busy_s > 0 ? double(bytes_read) / io_busy_s / 1e9 : 0.0; }
    // Read time the steps did not wait for (the prefetch's share).
    double hidden() const { return io_busy_s > 0 ? std::max(0.0, 1.0 - wait_s / io_busy_s) : 0.0; }
};

struct Stats {
    double uptime_s = 0;
    ModelInfo model;
    uint32_t sessions = 0, connections = 0, active_requests = 0, queued_requests = 0;
    uint64_t requests_total = 0, tokens_in = 0, tokens_cached = 0, tokens_out = 0;
    double prefill_tok_s = 0, decode_tok_s = 0;
    MemoryStats memory;
    uint64_t saves_failed = 0;   // session saves that failed since the daemon started
    // Continuous batching: forward steps, the tokens and requests they carried, their time.
    uint64_t steps = 0, step_rows = 0, step_requests = 0;
    double step_seconds = 0;
    uint32_t max_batch = 0, step_tokens = 0;
    // Session-cache budget (--kv-budget): bytes held now (reservations included), requests
    // waiting for that memory or for a session slot, requests refused for either.
    uint64_t kv_budget = 0, kv_in_use = 0, kv_refused = 0;
    uint32_t kv_waiting = 0, slot_waiting = 0;
    struct Stream {
        uint64_t request_id = 0;
        std::string session;
        bool prefilling = false;
        uint32_t prompt_tokens = 0, prefilled = 0, generated = 0;
        double tok_s = 0;        // since its first token
        uint64_t drafted = 0, accepted = 0;  // speculative decoding: its drafts, accepted
    };
    std::vector<Stream> streams;  // requests running now
    // Speculative decoding (ds4d --drafter; draft_max 0: none): trials, drafts proposed and
    // accepted, trials declined, tokens taken from trials; trials and plain one-row decode
    // steps that ran alone in their step: tokens and engine time (the measured speedup).
    uint32_t draft_max = 0;
    uint64_t spec_trials = 0, spec_drafted = 0, spec_accepted = 0, spec_fallbacks = 0, spec_tokens = 0;
    uint64_t spec_solo_tokens = 0;
    double spec_solo_seconds = 0;
    uint64_t solo_steps = 0;
    double solo_seconds = 0;
    // ds4d --drafter sharing its drafter (drafter_offered): its bytes, descriptors passed,
    // and the latest importing processes, most recent first.
    bool drafter_offered = false;
    uint64_t drafter_share_bytes = 0, drafter_shares = 0;
    std::vector<DrafterImporter> drafter_importers;
    bool streaming = false;  // ds4d --ssd-streaming: the counters in `experts`
    ExpertStats experts;
};

// One entry of ListSessions: stored sessions and named sessions held in memory.
struct StoredSession {
    std::string name;
    uint32_t n_tokens = 0;
    uint64_t bytes = 0;          // payload size in the store; 0 when not stored yet
    uint64_t created_unix = 0, last_used_unix = 0;
    bool pinned = false;
    bool live = false;           // held in daemon memory
    uint32_t stored_tokens = 0;  // tokens in the stored version (n_tokens: the live history's)
    std::string save_error;      // the latest save failed: why (empty once one succeeds)
};

// A named session the store evicted to keep its budget, not stored again since.
struct EvictedSession {
    std::string name;
    uint64_t evicted_unix = 0;
    std::string reason;
};

struct SavedSession {
    std::string name;
    uint32_t n_tokens = 0;
    uint64_t bytes = 0;
};

class Client {
public:
    // Connects to socket_path (empty: the default path) and performs the Hello exchange.
    explicit Client(std::string socket_path = {}, std::string client_name = "libds4client");
    ~Client();
    Client(const Client &) = delete;
    Client &operator=(const Client &) = delete;

    // Drops the connection (if any) and connects again, Hello included. Sessions owned by
    // the old connection are gone; named sessions survive.
    void reconnect();
    void disconnect();
    bool connected() const;
    const std::string &socket_path() const;

    ServerInfo hello();
    const ServerInfo &server_info() const;

    // name empty: an anonymous session owned by this connection.
    SessionInfo open_session(const std::string &name = {}, uint32_t ctx = 0);
    void close_session(uint64_t session);

    // Persistent sessions (a daemon with a store; ServerError NoStore otherwise).
    // evicted (optional): the recently evicted names, newest first.
    std::vector<StoredSession> list_sessions(std::vector<EvictedSession> *evicted = nullptr);
    // Durable when this returns. session 0: the named session `name`; a session id with a
    // name saves that session under the name.
    SavedSession save_session(const std::string &name, uint64_t session = 0);
    // Opens the stored session `name` (UnknownSession when it is not stored or live).
    SessionInfo load_session(const std::string &name, uint32_t ctx = 0);
    void delete_session(const std::string &name);
    void pin_session(const std::string &name, bool pinned = true);

    DoneInfo generate(const GenerateRequest &req, const GenerateCallbacks &cb = {});

    // Thread-safe. Asks the daemon to stop request_id; no reply of its own.
    void cancel(uint64_t request_id);

    // While generate() waits, a readable interrupt fd (e.g. the read end of a self-pipe that
    // a SIGINT handler writes to) is drained and the current request cancelled. -1: none.
    void set_interrupt_fd(int fd);

    std::vector<int32_t> tokenize(const std::string &text, bool special = false);
    std::string detokenize(std::span<const int32_t> tokens);
    Stats stats();

    // Sends one raw frame (length prefix included), for tests of the daemon's error paths.
    void send_raw(std::span<const uint8_t> bytes);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace ds4::client
