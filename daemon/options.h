// ds4d command line.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace ds4::daemon {

struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct DaemonOptions {
    std::string model_path;
    std::string drafter_path;         // speculative decoding (--drafter, $DS4_DRAFTER); empty: none
    uint32_t draft_max = 0;           // drafts per trial at most (0: the bridge's default, 4)
    bool share_drafter = true;        // offer the drafter to other processes (--no-share-drafter)
    std::string socket_path;          // resolved: never empty after parse
    std::string state_dir;            // resolved by resolve_state_dir() unless no_store
    bool no_store = false;            // sessions live in memory only
    uint64_t store_budget = 0;        // payload bytes the store keeps (0: unlimited)
    uint32_t checkpoint_every = 1024; // prefix checkpoint interval during long prefills (0: none)
    uint32_t max_checkpoints = 8;     // checkpoints taken per prefill at most
    uint32_t prefix_min = 256;        // look up a stored prefix when this many tokens are uncached
    uint32_t ctx = 0;                 // 0: min(4096, the model's limit)
    int32_t threads = 0;              // 0: all cores
    enum class Backend { Auto, Cpu, Cuda } backend = Backend::Auto;
    bool ssd_streaming = false;       // routed experts read from SSD into a bounded cache
    bool ssd_cold = false;            // no prewarm of the expert store's hot set
    uint32_t expert_cache_experts = 0;
    uint64_t expert_cache_bytes = 0;  // both 0: the bridge's default (4 GiB)
    uint32_t max_sessions = 64;
    uint64_t kv_budget = 0;           // bytes of session caches; 0: half of physical memory
    uint32_t kv_wait_s = 120;         // a request waits this long for memory or a session slot
    uint32_t prefill_chunk = 256;     // prefill tokens of one request per step while others decode
    uint32_t solo_prefill_chunk = 0;  // ... while none decodes (0: the session's step size)
    uint32_t max_batch = 16;          // requests sharing one forward step
    uint32_t step_tokens = 512;       // tokens per forward step
    size_t max_frame = 16u << 20;     // largest accepted request frame
    size_t queue_bytes = 1u << 20;    // per-connection output bound (back-pressure)
    uint32_t max_inflight = 64;       // requests per connection at once
    uint32_t max_connections = 256;   // client connections served at once; more are refused
    uint32_t client_timeout_s = 30;   // Hello, and each frame once begun, must arrive within this
    size_t input_budget = 64u << 20;  // bytes of unfinished request frames held across all connections
    uint32_t shutdown_grace_ms = 2000;
    bool help = false;
    bool version = false;
};

// argv[0] is the program name. Throws UsageError naming the bad argument. --model defaults to
// $DS4_MODEL, --drafter to $DS4_DRAFTER, --draft-max to $DS4_DRAFT_MAX; the socket to
// $DS4_SOCKET (ipc::default_socket_path).
DaemonOptions parse_daemon_args(int argc, const char *const *argv);

std::string daemon_usage();

// "123", "512MiB", "8GiB", "1.5GiB" (also KiB/TiB, and kB/MB/GB/TB as powers of 1000) in bytes.
// Throws UsageError naming opt.
uint64_t parse_size(const std::string &opt, const std::string &s);
// Half of physical memory (the --kv-budget default); 4 GiB when it cannot be read.
uint64_t default_kv_budget();

// --state-dir, else $XDG_STATE_HOME/ds4, else $HOME/.local/state/ds4. Empty when none resolves.
std::string resolve_state_dir(const std::string &given);

}  // namespace ds4::daemon
