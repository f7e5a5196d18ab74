#include "daemon/options.h"

#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "ipc/protocol.h"
#include "ipc/socket_path.h"

namespace ds4::daemon {
namespace {

uint64_t parse_uint(const std::string &opt, const char *s, uint64_t lo, uint64_t hi) {
    errno = 0;
    char *end = nullptr;
    if (!*s || *s == '-' || *s == '+') throw UsageError(opt + " needs an integer, got \"" + s + "\"");
    unsigned long long v = std::strtoull(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        throw UsageError(opt + " needs an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                         "], got \"" + s + "\"");
    return v;
}

}  // namespace

uint64_t parse_size(const std::string &opt, const std::string &s) {
    const auto bad = [&] {
        return UsageError(opt + " needs a size such as 8589934592, 512MiB or 8GiB, got \"" + s + "\"");
    };
    size_t i = 0;
    while (i < s.size() && (std::isdigit((unsigned char)s[i]) || s[i] == '.')) ++i;
    if (i == 0) throw bad();
    const std::string num = s.substr(0, i), unit = s.substr(i);
    char *end = nullptr;
    errno = 0;
    const double v = std::strtod(num.c_str(), &end);
    if (errno || *end || !(v >= 0)) throw bad();
    struct U { const char *name; double mul; };
    static const U units[] = {{"", 1}, {"B", 1}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
                              {"TiB", 1099511627776.0}, {"kB", 1e3}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}};
    for (const U &u : units)
        if (unit == u.name) {
            if (u.mul == 1 && num.find('.') != std::string::npos) throw bad();
            const double b = std::floor(v * u.mul);
            if (b >= 18446744073709551615.0) throw bad();
            return uint64_t(b);
        }
    throw bad();
}

uint64_t default_kv_budget() {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return 4ull << 30;
    return uint64_t(pages) * uint64_t(page) / 2;
}

std::string daemon_usage() {
    return "usage: ds4d --model PATH [--socket PATH] [--state-dir DIR] [--ctx N] [--threads N]\n"
           "            [--backend auto|cpu|cuda] [--max-sessions N] [options]\n"
           "\n"
           "Serves a ds4 model to local clients over a Unix socket. Runs in the foreground and\n"
           "logs to stderr; SIGTERM or SIGINT shuts it down cleanly. Under systemd it takes the\n"
           "socket passed by socket activation (ds4d.socket; --socket is then ignored), reports\n"
           "readiness after the model is prewarmed (Type=notify) and logs with journal priorities.\n"
           "\n"
           "  --model PATH           GGUF model file (required; default $DS4_MODEL)\n"
           "  --drafter PATH         speculative decoding: a smaller sibling GGUF with the model's\n"
           "                         tokenizer (default $DS4_DRAFTER; \"\": none). Each decoding\n"
           "                         request drafts tokens with it and the model verifies them\n"
           "                         within the batched step; greedy output is unchanged, sampled\n"
           "                         output keeps the model's distribution. ds4d refuses to start\n"
           "                         when its vocabulary differs. --mtp PATH is an older name\n"
           "  --draft-max K          drafts per trial at most, 1..64; the width adapts to the\n"
           "                         recent acceptance rate (default $DS4_DRAFT_MAX, else 4)\n"
           "  --no-share-drafter     keep the drafter private. By default ds4d holds it in a\n"
           "                         sealed read-only memfd and hands that to processes of its\n"
           "                         user that ask (the bridge's drafter_import), so one copy of\n"
           "                         the drafter's weights serves all of them\n"
           "  --socket PATH          socket to listen on (default $DS4_SOCKET, else\n"
           "                         $XDG_RUNTIME_DIR/ds4.sock, else\n"
           "                         /tmp/ds4-$UID/ds4.sock in a directory ds4d creates with mode\n"
           "                         0700 and refuses when another user owns it; here: " +
           ipc::default_socket_path() +
           ")\n"
           "  --state-dir DIR        persistent session store (default $XDG_STATE_HOME/ds4, else\n"
           "                         ~/.local/state/ds4). Named sessions are saved there after\n"
           "                         every turn and on SIGTERM, and reloaded on first use\n"
           "  --no-store             keep sessions in memory only (no state dir)\n"
           "  --store-budget BYTES   payload bytes the store keeps; least recently used unpinned\n"
           "                         sessions and checkpoints are evicted beyond it (default 0: no limit)\n"
           "  --checkpoint-every N   during a prefill of at least N tokens, store a prefix\n"
           "                         checkpoint every N tokens at a chunk frontier (default 1024;\n"
           "                         0: never)\n"
           "  --max-checkpoints N    checkpoints per prefill at most (default 8)\n"
           "  --prefix-min N         look for a stored prefix when a request has at least N\n"
           "                         tokens the session does not hold (default 256)\n"
           "  --ctx N                default context size of a session (default min(4096, model limit))\n"
           "  --threads N            CPU threads (default 0: all cores)\n"
           "  --backend B            auto (default: CUDA, else CPU), cpu or cuda\n"
           "  --ssd-streaming        read routed experts from disk (io_uring, O_DIRECT) into a\n"
           "                         bounded cache instead of keeping the whole model mapped; the\n"
           "                         expert store (experts re-laid out for direct reads, with use\n"
           "                         counts so a restart loads the hot set first) lives in\n"
           "                         STATE_DIR/experts\n"
           "  --expert-cache-bytes N | --expert-cache-experts N\n"
           "                         the expert cache budget (default 4 GiB); one that cannot\n"
           "                         hold a token's experts of one layer is refused; with the\n"
           "                         CUDA backend it is VRAM, filled from a RAM tier of 2 GiB\n"
           "  --cold                 start with an empty expert cache (no prewarm)\n"
           "  --max-sessions N       sessions live in memory at once (default 64); beyond that the\n"
           "                         least recently used idle named session whose turns are all\n"
           "                         stored is released and reloads from the store on its next use;\n"
           "                         an open beyond it with nothing to release waits (--kv-wait)\n"
           "  --kv-budget SIZE       memory for session caches (KV and compressed caches, which\n"
           "                         grow with the tokens a session holds), e.g. 8GiB or 512MiB\n"
           "                         (default: half of physical memory). A request reserves what its\n"
           "                         session will hold (history + prompt + max_tokens, within its\n"
           "                         context); beyond the budget idle one-shot contexts and the least\n"
           "                         recently used idle stored sessions are released, then it waits\n"
           "                         in order; one that can never fit is refused\n"
           "  --kv-wait S            longest a request waits for cache memory or a session slot\n"
           "                         before it is refused (default 120)\n"
           "  --max-batch N          requests that share one forward step: every generating\n"
           "                         request decodes a token per step, waiting prompts get a\n"
           "                         prefill chunk in it (default 16; 1: one request per step)\n"
           "  --step-tokens N        tokens per forward step, decode rows and prefill chunks\n"
           "                         together (default 512; more than --max-batch)\n"
           "  --prefill-chunk N      prefill tokens of one request per step while others decode,\n"
           "                         so they keep streaming during a long prompt (default 256)\n"
           "  --solo-prefill-chunk N prefill tokens per step while no request decodes; the step\n"
           "                         may then exceed --step-tokens (default: --prefill-chunk if\n"
           "                         given, else the engine's step size: 1024 on the CPU, 2048\n"
           "                         on a GPU, which reads each weight once for more tokens)\n"
           "  --max-frame BYTES      largest request frame accepted (default 16777216)\n"
           "  --queue-bytes BYTES    unsent output per connection before its generation pauses\n"
           "                         (default 1048576)\n"
           "  --max-inflight N       requests per connection at once (default 64)\n"
           "  --max-connections N    client connections at once; more are refused with an error\n"
           "                         and a log line (default 256; lowered, with a log line, to fit\n"
           "                         the open-file limit)\n"
           "  --client-timeout S     drop a connection that sends no Hello within S seconds of\n"
           "                         connecting, or takes longer than S seconds to send one frame\n"
           "                         (default 30)\n"
           "  --input-budget BYTES   unfinished request frames held across all connections; the\n"
           "                         connection that goes over is refused (default 67108864; at\n"
           "                         least --max-frame)\n"
           "  --shutdown-grace-ms MS time running requests get to finish on SIGTERM (default 2000)\n"
           "  -h, --help             this help\n"
           "  --version              version, git revision and backends built in\n"
           "\n"
           "Exit status: 0 after a clean shutdown, 1 start-up or runtime failure, 2 usage error.\n";
}

DaemonOptions parse_daemon_args(int argc, const char *const *argv) {
    DaemonOptions o;
    bool drafter_given = false, chunk_given = false, solo_given = false;
    auto value = [&](int &i, const std::string &opt) -> const char * {
        if (i + 1 >= argc) throw UsageError(opt + " needs a value");
        return argv[++i];
    };
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "-h" || a == "--help") {
            o.help = true;
            return o;
        } else if (a == "--version") {
            o.version = true;
            return o;
        } else if (a == "--model") {
            o.model_path = value(i, a);
        } else if (a == "--drafter" || a == "--mtp") {
            o.drafter_path = value(i, a);
            drafter_given = true;
        } else if (a == "--no-share-drafter") {
            o.share_drafter = false;
        } else if (a == "--draft-max") {
            o.draft_max = uint32_t(parse_uint(a, value(i, a), 1, 64));
        } else if (a == "--socket") {
            o.socket_path = value(i, a);
        } else if (a == "--state-dir") {
            o.state_dir = value(i, a);
        } else if (a == "--no-store") {
            o.no_store = true;
        } else if (a == "--store-budget") {
            o.store_budget = parse_uint(a, value(i, a), 0, ~0ull);
        } else if (a == "--checkpoint-every") {
            o.checkpoint_every = uint32_t(parse_uint(a, value(i, a), 0, 1u << 24));
        } else if (a == "--max-checkpoints") {
            o.max_checkpoints = uint32_t(parse_uint(a, value(i, a), 0, 1024));
        } else if (a == "--prefix-min") {
            o.prefix_min = uint32_t(parse_uint(a, value(i, a), 1, 1u << 24));
        } else if (a == "--ctx") {
            o.ctx = uint32_t(parse_uint(a, value(i, a), 16, 1u << 24));
        } else if (a == "--threads") {
            o.threads = int32_t(parse_uint(a, value(i, a), 0, 4096));
        } else if (a == "--backend") {
            const std::string b = value(i, a);
            if (b == "auto") o.backend = DaemonOptions::Backend::Auto;
            else if (b == "cpu") o.backend = DaemonOptions::Backend::Cpu;
            else if (b == "cuda") o.backend = DaemonOptions::Backend::Cuda;
            else throw UsageError("--backend must be auto, cpu or cuda, got \"" + b + "\"");
        } else if (a == "--ssd-streaming") {
            o.ssd_streaming = true;
        } else if (a == "--cold") {
            o.ssd_cold = true;
        } else if (a == "--expert-cache-bytes") {
            o.expert_cache_bytes = parse_uint(a, value(i, a), 1, ~0ull);
        } else if (a == "--expert-cache-experts") {
            o.expert_cache_experts = uint32_t(parse_uint(a, value(i, a), 1, 1u << 30));
        } else if (a == "--max-sessions") {
            o.max_sessions = uint32_t(parse_uint(a, value(i, a), 1, 100000));
        } else if (a == "--kv-budget") {
            o.kv_budget = parse_size(a, value(i, a));
            if (o.kv_budget == 0) throw UsageError("--kv-budget must be positive");
        } else if (a == "--kv-wait") {
            o.kv_wait_s = uint32_t(parse_uint(a, value(i, a), 0, 86400));
        } else if (a == "--max-batch") {
            o.max_batch = uint32_t(parse_uint(a, value(i, a), 1, 1024));
        } else if (a == "--step-tokens") {
            o.step_tokens = uint32_t(parse_uint(a, value(i, a), 1, 1u << 20));
        } else if (a == "--prefill-chunk") {
            o.prefill_chunk = uint32_t(parse_uint(a, value(i, a), 1, 1u << 20));
            chunk_given = true;
        } else if (a == "--solo-prefill-chunk") {
            o.solo_prefill_chunk = uint32_t(parse_uint(a, value(i, a), 1, 1u << 20));
            solo_given = true;
        } else if (a == "--max-frame") {
            o.max_frame = size_t(parse_uint(a, value(i, a), 1024, ipc::kMaxFrameCeiling));
        } else if (a == "--queue-bytes") {
            o.queue_bytes = size_t(parse_uint(a, value(i, a), 4096, 1ull << 32));
        } else if (a == "--max-inflight") {
            o.max_inflight = uint32_t(parse_uint(a, value(i, a), 1, 100000));
        } else if (a == "--max-connections") {
            o.max_connections = uint32_t(parse_uint(a, value(i, a), 1, 100000));
        } else if (a == "--client-timeout") {
            o.client_timeout_s = uint32_t(parse_uint(a, value(i, a), 1, 86400));
        } else if (a == "--input-budget") {
            o.input_budget = size_t(parse_uint(a, value(i, a), 1024, 1ull << 40));
        } else if (a == "--shutdown-grace-ms") {
            o.shutdown_grace_ms = uint32_t(parse_uint(a, value(i, a), 0, 600000));
        } else {
            throw UsageError("unknown argument \"" + a + "\"");
        }
    }
    if (o.model_path.empty()) {
        const char *env = std::getenv("DS4_MODEL");
        if (env && *env) o.model_path = env;
    }
    if (o.model_path.empty()) throw UsageError("--model PATH is required (or set DS4_MODEL)");
    if (!drafter_given) {
        const char *env = std::getenv("DS4_DRAFTER");
        if (env) o.drafter_path = env;
    }
    if (o.draft_max == 0 && !o.drafter_path.empty()) {
        const char *env = std::getenv("DS4_DRAFT_MAX");
        if (env && *env) o.draft_max = uint32_t(parse_uint("DS4_DRAFT_MAX", env, 1, 64));
    }
    if (o.draft_max && o.drafter_path.empty())
        throw UsageError("--draft-max needs a drafter (--drafter PATH or DS4_DRAFTER)");
    if (o.no_store && !o.state_dir.empty()) throw UsageError("--no-store and --state-dir exclude each other");
    if (!o.ssd_streaming && (o.ssd_cold || o.expert_cache_bytes || o.expert_cache_experts))
        throw UsageError("--cold, --expert-cache-bytes and --expert-cache-experts need --ssd-streaming");
    if (o.expert_cache_bytes && o.expert_cache_experts)
        throw UsageError("give --expert-cache-bytes or --expert-cache-experts, not both");
    if (o.input_budget < o.max_frame)
        throw UsageError("--input-budget (" + std::to_string(o.input_budget) + ") must be at least --max-frame (" +
                         std::to_string(o.max_frame) + "), or no frame of full size could be received");
    if (o.step_tokens <= o.max_batch && o.max_batch > 1)
        throw UsageError("--step-tokens (" + std::to_string(o.step_tokens) + ") must exceed --max-batch (" +
                         std::to_string(o.max_batch) + "): every step keeps room for a prefill chunk");
    if (chunk_given && !solo_given) o.solo_prefill_chunk = o.prefill_chunk;
    if (o.socket_path.empty()) o.socket_path = ipc::default_socket_path();
    if (o.socket_path.size() > ipc::kMaxSocketPath)
        throw UsageError("socket path is longer than " + std::to_string(ipc::kMaxSocketPath) +
                         " bytes: " + o.socket_path);
    return o;
}

std::string resolve_state_dir(const std::string &given) {
    if (!given.empty()) return given;
    const char *x = std::getenv("XDG_STATE_HOME");
    if (x && *x == '/') return std::string(x) + "/ds4";
    const char *h = std::getenv("HOME");
    if (h && *h == '/') return std::string(h) + "/.local/state/ds4";
    return {};
}

}  // namespace ds4::daemon
