#include "client/cli_args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "ipc/socket_path.h"

namespace ds4::client {
namespace {

uint64_t parse_u64(const std::string &opt, const char *s, uint64_t max) {
    errno = 0;
    char *end = nullptr;
    if (!*s || *s == '-' || *s == '+') throw UsageError(opt + " needs a non-negative integer, got \"" + s + "\"");
    unsigned long long v = std::strtoull(s, &end, 10);
    if (errno || *end || v > max)
        throw UsageError(opt + " needs an integer in [0, " + std::to_string(max) + "], got \"" + s + "\"");
    return v;
}

float parse_float(const std::string &opt, const char *s, float lo, float hi) {
    errno = 0;
    char *end = nullptr;
    float v = std::strtof(s, &end);
    if (!*s || errno || *end || !std::isfinite(v) || v < lo || v > hi)
        throw UsageError(opt + " needs a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got \"" +
                         s + "\"");
    return v;
}

}  // namespace

std::string usage_text() {
    return "usage: ds4 [--socket PATH] COMMAND [OPTIONS] [ARGS]\n"
           "\n"
           "Talks to a running ds4d over its Unix socket, and only to one run by the same user\n"
           "(checked before anything is sent).\n"
           "\n"
           "Commands:\n"
           "  run [OPTIONS] PROMPT   answer PROMPT, streaming the text to stdout as it is generated\n"
           "                         (PROMPT \"-\" reads it from stdin; several words are joined by spaces)\n"
           "  chat [OPTIONS]         interactive multi-turn chat; Ctrl-C stops the current answer,\n"
           "                         /exit or end of input leaves\n"
           "  stats                  the daemon's statistics\n"
           "  tokenize TEXT          the token ids of TEXT, space-separated\n"
           "  sessions list          stored and live named sessions: name, tokens, bytes on disk,\n"
           "                         last use, pinned, live (held in daemon memory), and why the\n"
           "                         latest save failed when it did; then the names the store's\n"
           "                         budget evicted recently\n"
           "  sessions save NAME     make NAME's current state durable now (it is also saved after\n"
           "                         every turn and when ds4d stops)\n"
           "  sessions delete NAME   forget NAME, in memory and on disk\n"
           "  sessions pin NAME [--unpin]   exempt NAME from the store's eviction (or end that)\n"
           "\n"
           "Options of run and chat:\n"
           "  --session NAME         append to the named session's conversation (created if new) and\n"
           "                         reuse its state; without it, run uses a one-shot session. Named\n"
           "                         sessions persist across ds4d restarts when it has a state dir;\n"
           "                         after each turn ds4 waits until it is stored and warns on stderr\n"
           "                         when saving failed (disk full, I/O error, store budget); run then\n"
           "                         exits with status 5 after printing the answer. It also warns\n"
           "                         when the store's budget evicted NAME earlier (it starts empty)\n"
           "  --max-tokens N         stop after N generated tokens (default 256)\n"
           "  --temperature T        sampling temperature; 0 (default) is greedy\n"
           "  --top-k K, --top-p P, --min-p P   sampling filters (default off)\n"
           "  --seed S               sampling seed (default 0)\n"
           "  --stop STRING          stop when STRING appears in the output (repeatable)\n"
           "  --ids                  (run) print the generated token ids, space-separated, instead of text\n"
           "  --raw                  (run) plain text completion of PROMPT, without the chat template\n"
           "  --think                let the model think before answering (chat template thinking mode)\n"
           "\n"
           "Global options:\n"
           "  --socket PATH          daemon socket (default $XDG_RUNTIME_DIR/ds4.sock, else\n"
           "                         /tmp/ds4-$UID/ds4.sock; here: " +
           ipc::default_socket_path() +
           ")\n"
           "  -h, --help             this help\n"
           "\n"
           "Prefill progress is shown on stderr when stderr is a terminal.\n"
           "Exit status: 0 ok, 2 usage error, 3 cannot connect to ds4d, 4 server error (message on stderr),\n"
           "5 run --session generated the answer but could not store the turn (warning on stderr).\n";
}

CliArgs parse_cli(int argc, const char *const *argv) {
    CliArgs a;
    bool have_command = false;
    bool options_done = false;
    std::vector<std::string> positional;
    auto value = [&](int &i, const std::string &opt) -> const char * {
        if (i + 1 >= argc) throw UsageError(opt + " needs a value");
        return argv[++i];
    };
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        const bool is_opt = !options_done && arg.size() > 1 && arg[0] == '-';
        if (!is_opt) {
            if (!have_command) {
                if (arg == "run") a.command = CliArgs::Command::Run;
                else if (arg == "chat") a.command = CliArgs::Command::Chat;
                else if (arg == "stats") a.command = CliArgs::Command::Stats;
                else if (arg == "tokenize") a.command = CliArgs::Command::Tokenize;
                else if (arg == "sessions") a.command = CliArgs::Command::Sessions;
                else if (arg == "help") a.command = CliArgs::Command::Help;
                else throw UsageError("unknown command \"" + arg + "\"");
                have_command = true;
            } else {
                positional.push_back(arg);
            }
            continue;
        }
        if (arg == "--") {
            options_done = true;
            continue;
        }
        if (arg == "-h" || arg == "--help") {
            a.command = CliArgs::Command::Help;
            return a;
        }
        if (arg == "--socket") {
            a.socket = value(i, arg);
            if (a.socket.empty()) throw UsageError("--socket needs a path");
            continue;
        }
        if (have_command && a.command == CliArgs::Command::Sessions && arg == "--unpin") {
            a.unpin = true;
            continue;
        }
        const bool gen = have_command && (a.command == CliArgs::Command::Run || a.command == CliArgs::Command::Chat);
        if (!gen) throw UsageError("unknown option " + arg + (have_command ? " for this command" : ""));
        if (arg == "--session") {
            a.session = value(i, arg);
            if (a.session.empty()) throw UsageError("--session needs a name");
        } else if (arg == "--max-tokens") {
            a.max_tokens = uint32_t(parse_u64(arg, value(i, arg), 1u << 30));
        } else if (arg == "--temperature") {
            a.temperature = parse_float(arg, value(i, arg), 0.0f, 100.0f);
        } else if (arg == "--top-k") {
            a.top_k = int32_t(parse_u64(arg, value(i, arg), 1u << 30));
        } else if (arg == "--top-p") {
            a.top_p = parse_float(arg, value(i, arg), 0.0f, 1.0f);
        } else if (arg == "--min-p") {
            a.min_p = parse_float(arg, value(i, arg), 0.0f, 1.0f);
        } else if (arg == "--seed") {
            a.seed = parse_u64(arg, value(i, arg), UINT64_MAX);
        } else if (arg == "--stop") {
            a.stops.emplace_back(value(i, arg));
            if (a.stops.back().empty()) throw UsageError("--stop needs a non-empty string");
        } else if (arg == "--ids") {
            a.ids = true;
        } else if (arg == "--raw") {
            a.raw = true;
        } else if (arg == "--think") {
            a.think = true;
        } else {
            throw UsageError("unknown option " + arg);
        }
    }
    if (!have_command) throw UsageError("no command given");
    switch (a.command) {
    case CliArgs::Command::Run:
    case CliArgs::Command::Tokenize:
        if (positional.empty())
            throw UsageError(std::string(a.command == CliArgs::Command::Run ? "run needs a PROMPT" : "tokenize needs TEXT"));
        for (size_t i = 0; i < positional.size(); ++i) a.prompt += (i ? " " : "") + positional[i];
        break;
    case CliArgs::Command::Sessions: {
        const std::string op = positional.empty() ? "list" : positional[0];
        if (op == "list") a.sessions_op = CliArgs::SessionsOp::List;
        else if (op == "save") a.sessions_op = CliArgs::SessionsOp::Save;
        else if (op == "delete") a.sessions_op = CliArgs::SessionsOp::Delete;
        else if (op == "pin") a.sessions_op = CliArgs::SessionsOp::Pin;
        else throw UsageError("sessions needs list, save NAME, delete NAME or pin NAME, got \"" + op + "\"");
        const size_t want = a.sessions_op == CliArgs::SessionsOp::List ? 1 : 2;
        if (positional.size() < want) throw UsageError("sessions " + op + " needs a NAME");
        if (positional.size() > want) throw UsageError("unexpected argument \"" + positional[want] + "\"");
        if (want == 2) a.session_arg = positional[1];
        if (a.unpin && a.sessions_op != CliArgs::SessionsOp::Pin) throw UsageError("--unpin is for sessions pin");
        break;
    }
    case CliArgs::Command::Chat:
        if (a.ids || a.raw) throw UsageError(std::string(a.ids ? "--ids" : "--raw") + " is for run, not chat");
        [[fallthrough]];
    case CliArgs::Command::Stats:
    case CliArgs::Command::Help:
        if (!positional.empty()) throw UsageError("unexpected argument \"" + positional[0] + "\"");
        break;
    }
    return a;
}

}  // namespace ds4::client
