// ds4-gateway: the OpenAI- and Anthropic-compatible HTTP front of ds4d (ARCHITECTURE.md §8).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "gateway/api_key.h"
#include "gateway/server.h"
#include "ipc/socket_path.h"
#include "ds4_version.h"

namespace {

const char *kUsage =
    "usage: ds4-gateway [options]\n"
    "\n"
    "Serves ds4d over HTTP: OpenAI chat completions, completions and responses, Anthropic\n"
    "messages (streaming and not), /v1/models, /health, /metrics. Every request except\n"
    "/health needs the bearer key ('Authorization: Bearer KEY' or 'x-api-key: KEY').\n"
    "\n"
    "  --listen ADDR:PORT     address to serve (default 127.0.0.1:8080; [::1]:PORT for IPv6)\n"
    "  --socket PATH          ds4d's socket (default: ds4d's default path)\n"
    "  --state-dir DIR        where the key lives (default $XDG_STATE_HOME/ds4, else\n"
    "                         ~/.local/state/ds4); the key file is DIR/http-key, mode 0600\n"
    "  --key-file PATH        the key file instead of DIR/http-key (created when missing)\n"
    "  --print-key            print the key (creating it when missing) and exit\n"
    "  --no-auth              serve without a key (loopback addresses only)\n"
    "  --model-name NAME      model id to report (default: the daemon's model name)\n"
    "  --workers N            generations in flight at once (default 16)\n"
    "  --queue N              requests waiting beyond those before 429 (default 256)\n"
    "  --max-connections N    open HTTP connections (default 2048)\n"
    "  --timeout S            idle connection timeout in seconds (default 60)\n"
    "  --max-body BYTES       request body limit (default 16777216)\n"
    "  --max-header BYTES     per-connection header memory (default 65536)\n"
    "  --default-max-tokens N when a request gives no limit (default 4096)\n"
    "  --port-file PATH       write the bound port there once listening (for --listen ...:0)\n"
    "  -h, --help             this text\n";

volatile sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

unsigned long parse_num(const char *opt, const char *v, unsigned long lo, unsigned long hi) {
    char *end = nullptr;
    unsigned long n = std::strtoul(v, &end, 10);
    if (!*v || *end || n < lo || n > hi) {
        std::fprintf(stderr, "ds4-gateway: %s: '%s' is not a number in %lu..%lu\n", opt, v, lo, hi);
        std::exit(2);
    }
    return n;
}

}  // namespace

int main(int argc, char **argv) {
    if (ds4_wants_version(argc, argv)) {
        ds4_print_version("ds4-gateway");
        return 0;
    }
    using namespace ds4::gateway;
    Options o;
    std::string state_dir, key_file;
    bool print_key = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto val = [&]() -> const char * {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "ds4-gateway: %s needs a value\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "-h" || a == "--help") {
            std::fputs(kUsage, stdout);
            return 0;
        } else if (a == "--listen") o.listen = val();
        else if (a == "--socket") o.socket_path = val();
        else if (a == "--state-dir") state_dir = val();
        else if (a == "--key-file") key_file = val();
        else if (a == "--print-key") print_key = true;
        else if (a == "--no-auth") o.auth = false;
        else if (a == "--model-name") o.model_name = val();
        else if (a == "--workers") o.workers = unsigned(parse_num("--workers", val(), 1, 1024));
        else if (a == "--queue") o.queue = unsigned(parse_num("--queue", val(), 0, 1 << 20));
        else if (a == "--max-connections") o.max_connections = unsigned(parse_num("--max-connections", val(), 1, 1 << 20));
        else if (a == "--timeout") o.timeout_s = unsigned(parse_num("--timeout", val(), 1, 86400));
        else if (a == "--max-body") o.max_body = parse_num("--max-body", val(), 1024, 1ul << 32);
        else if (a == "--max-header") o.max_header = parse_num("--max-header", val(), 4096, 1ul << 24);
        else if (a == "--default-max-tokens") o.default_max_tokens = uint32_t(parse_num("--default-max-tokens", val(), 1, 1u << 30));
        else if (a == "--port-file") o.port_file = val();
        else {
            std::fprintf(stderr, "ds4-gateway: unknown option %s (see --help)\n", a.c_str());
            return 2;
        }
    }
    if (o.socket_path.empty()) o.socket_path = ds4::ipc::default_socket_path();
    try {
        if (key_file.empty()) {
            const std::string dir = resolve_state_dir(state_dir);
            if (dir.empty() && (o.auth || print_key))
                throw std::runtime_error("no state dir for the key: set --state-dir, --key-file, $XDG_STATE_HOME or $HOME");
            key_file = dir + "/http-key";
        }
        if (print_key) {
            std::printf("%s\n", load_or_create_key(key_file).c_str());
            return 0;
        }
        if (o.auth) o.key = load_or_create_key(key_file);
        Server s(o);
        s.start();
        std::fprintf(stderr, "ds4-gateway: serving http://%s (port %u) for ds4d at %s; %s\n", o.listen.c_str(), s.port(),
                     o.socket_path.c_str(), o.auth ? ("key in " + key_file).c_str() : "no key (--no-auth)");
        struct sigaction sa {};
        sa.sa_handler = on_signal;
        sigaction(SIGINT, &sa, nullptr);
        sigaction(SIGTERM, &sa, nullptr);
        signal(SIGPIPE, SIG_IGN);
        while (!g_stop) pause();
        s.stop();
        return 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "ds4-gateway: error: %s\n", e.what());
        return 1;
    }
}
