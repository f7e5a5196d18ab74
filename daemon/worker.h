// The worker thread: owns the model and every bridge session, keeps the session table,
// and schedules generation fairly: each step is one prefill chunk or one decode token of
// one request, taken round-robin, so many sessions stream at once and a long prompt does
// not stall the others. Commands (new requests, cancels, disconnects) are taken between
// steps, so cancelling frees work within one step.
//
// With a store, a named session is persisted after every completed turn: the worker first
// evaluates the turn's last sampled token (so the state holds the whole history; this runs
// after Done is queued), copies the payload into memory and hands it to the store thread
// (SessionSaver), which makes it durable. Done therefore does not wait for the fsync; a
// SaveSession reply, a ListSessions reply or a clean shutdown does. A named session not in
// memory is loaded from the store when opened. Long prefills leave prefix checkpoints, and
// a request whose uncached part is long looks for the longest stored prefix first.
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "daemon/bridge_host.h"
#include "daemon/out_queue.h"
#include "daemon/requests.h"
#include "kvstore/store.h"

namespace ds4::daemon {

struct WorkerConfig {
    ModelOpenConfig model;
    bool backend_auto = false;   // try CUDA, fall back to CPU
    uint32_t ctx = 0;            // default session context; 0: min(4096, model limit)
    uint32_t max_sessions = 64;
    uint64_t kv_budget = ~0ull;     // bytes of session caches (reserved growth included)
    std::chrono::milliseconds kv_wait{120000};   // longest wait for memory or a session slot
    uint32_t prefill_chunk = 256;  // prefill tokens of one request per step while others decode
    uint32_t solo_prefill_chunk = 0;  // ... while none decodes (0: the session's prefill cap)
    uint32_t max_batch = 16;       // requests sharing one forward step (1: time slicing)
    uint32_t step_tokens = 512;    // rows per step: decode tokens + prefill chunks
    size_t queue_bytes = 1u << 20;
    // Persistent sessions: null runs without a store. The store outlives the worker.
    kvstore::Store *store = nullptr;
    uint32_t checkpoint_every = 1024;
    uint32_t max_checkpoints = 8;
    uint32_t prefix_min = 256;
    // Largest reply frame (after the length prefix): --max-frame, the limit clients apply too.
    size_t max_reply = 16u << 20;
    // The worker writes a frame to the socket itself when nothing of the connection waits
    // in the loop (env DS4D_DIRECT_WRITES=0 turns it off, for comparisons).
    bool direct_writes = true;
};

class Worker {
public:
    Worker(WorkerConfig cfg, OutQueue &out);
    ~Worker();  // stops and joins if still running
    Worker(const Worker &) = delete;
    Worker &operator=(const Worker &) = delete;

    // Starts the thread; returns once the model is open, prewarmed and has run one forward.
    // Throws the failure otherwise.
    void start();

    // Valid after start().
    const ModelSummary &model() const;
    uint32_t default_ctx() const;

    void submit(Request r);
    void cancel(const std::shared_ptr<ConnShared> &conn, uint64_t target);
    void disconnect(const std::shared_ptr<ConnShared> &conn);
    // Running requests get `grace` to finish, then are cancelled; new ones are refused.
    // When nothing is left the worker frees everything and pushes Outgoing{conn = 0}.
    void shutdown(std::chrono::milliseconds grace);
    // A connection drained below its output bound: paused requests may run again.
    void wake();
    void join();

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

}  // namespace ds4::daemon
