// Requests as the worker sees them: parsed and validated from verified frames by the loop
// thread, so the worker never touches wire buffers.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "daemon/drafter_export.h"
#include "daemon/sampling.h"
#include "ipc/protocol.h"

namespace ds4::daemon {

// Shared by the loop thread and the worker for one connection.
struct ConnShared {
    explicit ConnShared(uint64_t id_) : id(id_) {}
    const uint64_t id;
    // Output the worker produced that the loop has not finished writing: the worker does not
    // step this connection's requests while it is above the limit.
    std::atomic<size_t> queued_bytes{0};
    std::atomic<bool> closed{false};   // set under wmu, before the loop closes the socket

    // Direct writes: the worker writes a frame to the socket itself, without waking the loop
    // thread, while nothing of this connection is with the loop (queued or being written),
    // so frames stay in order. Everything below is guarded by wmu.
    std::mutex wmu;
    int fd = -1;                   // the socket (valid while !closed)
    size_t loop_frames = 0;        // frames handed to the loop and not yet written by it
    bool remainder_queued = false; // the rest of a partly written frame waits in the queue:
                                   // the loop's own replies queue behind it
    bool write_shut = false;       // the loop ended the write side: only the loop writes
};

struct ChatTurn {
    std::string role, content;
};

struct GenerateParams {
    uint64_t session = 0;
    enum class Prompt { None, Text, Tokens, Chat } kind = Prompt::None;
    std::string text;
    std::vector<int32_t> tokens;
    std::vector<ChatTurn> messages;
    bool add_generation_prompt = true;
    bool thinking = false;
    float temperature = 0.0f;
    int32_t top_k = 0;
    float top_p = 1.0f;
    float min_p = 0.0f;
    uint64_t seed = 0;
    uint32_t max_tokens = 256;
    std::vector<std::string> stop_strings;
    std::vector<int32_t> stop_tokens;
    bool ignore_eos = false;
    bool progress = false;
    bool speculate = true;   // use ds4d's drafter when it has one
    SamplingControls controls;  // bias, penalties, logprobs (daemon/sampling.h)
    bool json_object = false;   // constrained to one JSON object (daemon/json_constraint.h)
};

struct OpenSessionParams {
    std::string name;
    uint32_t ctx = 0;
};
struct CloseParams {
    uint64_t session = 0;
};
struct TokenizeParams {
    std::string text;
    bool special = false;
};
struct DetokenizeParams {
    std::vector<int32_t> tokens;
};
struct StatsParams {
    uint32_t connections = 0;  // filled in by the loop, which owns the connections
    DrafterSharing drafter;    // and the drafter export
};
struct ListSessionsParams {};
struct DeleteSessionParams {
    std::string name;
};
struct SaveSessionParams {
    uint64_t session = 0;   // 0: the named session `name`
    std::string name;       // empty: the session's own name
};
struct LoadSessionParams {
    std::string name;
    uint32_t ctx = 0;
};
struct PinSessionParams {
    std::string name;
    bool pinned = true;
};

using RequestBody = std::variant<GenerateParams, OpenSessionParams, CloseParams, TokenizeParams, DetokenizeParams,
                                 StatsParams, ListSessionsParams, DeleteSessionParams, SaveSessionParams,
                                 LoadSessionParams, PinSessionParams>;

struct Request {
    std::shared_ptr<ConnShared> conn;
    uint64_t id = 0;
    RequestBody body;
};

// What the loop does with a verified envelope.
struct ParseResult {
    enum class Kind {
        Request,   // forward `body` to the worker
        Hello,     // answer from the loop
        Cancel,    // forward `cancel_target` to the worker
        Reject,    // answer Error{code, message}
    } kind = Kind::Reject;
    RequestBody body;
    uint32_t hello_version = 0;
    uint64_t cancel_target = 0;
    ipc::fb::ErrorCode code = ipc::fb::ErrorCode::None;
    std::string message;
};

struct ParseLimits {
    size_t max_stop_strings = 16;
    size_t max_stop_string_bytes = 256;
    uint32_t max_tokens = 1u << 24;
    size_t max_logit_bias = 300;   // entries (OpenAI's bound); ids are checked against the vocabulary later
};

ParseResult parse_request(const ipc::fb::Envelope *env, const ParseLimits &limits = {});

// s quoted for a message: printable ASCII as is, every other byte as \xNN (so a reply never
// carries invalid UTF-8 or control characters), cut after max_bytes.
std::string printable_quoted(std::string_view s, size_t max_bytes);

}  // namespace ds4::daemon
