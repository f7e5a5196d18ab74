#include "client/cli_args.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
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

std::string number(float v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", double(v));
    return buf;
}

float parse_float(const std::string &opt, const char *s, float lo, float hi) {
    errno = 0;
    char *end = nullptr;
    float v = std::strtof(s, &end);
    if (!*s || errno || *end || !std::isfinite(v) || v < lo || v > hi)
        throw UsageError(opt + " needs a number in [" + number(lo) + ", " + number(hi) + "], got \"" + s + "\"");
    return v;
}

int32_t parse_i32(const std::string &opt, const char *s, int32_t lo, int32_t hi) {
    errno = 0;
    char *end = nullptr;
    const long long v = std::strtoll(s, &end, 10);
    if (!*s || errno || *end || v < lo || v > hi)
        throw UsageError(opt + " needs an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got \"" +
                         s + "\"");
    return int32_t(v);
}

// ID=BIAS: a token id and a bias in [-100, 100].
std::pair<int32_t, float> parse_bias(const std::string &opt, const char *s) {
    const char *eq = std::strchr(s, '=');
    if (!eq) throw UsageError(opt + " needs TOKEN_ID=BIAS, got \"" + std::string(s) + "\"");
    const std::string id(s, eq);
    return {parse_i32(opt + " token id", id.c_str(), 0, INT32_MAX), parse_float(opt + " bias", eq + 1, -100.0f, 100.0f)};
}

}  // namespace

bool is_sampling_option(const std::string &opt) {
    for (const char *o : {"--max-tokens", "--temperature", "--top-k", "--top-p", "--min-p", "--seed", "--repeat-penalty",
                          "--repeat-last-n", "--frequency-penalty", "--presence-penalty", "--logit-bias"})
        if (opt == o) return true;
    return false;
}

void set_sampling_option(CliArgs &a, std::string key, const char *v) {
    for (char &c : key)
        if (c == '_') c = '-';
    const std::string opt = "--" + key;
    if (key == "max-tokens") {
        a.max_tokens = uint32_t(parse_u64(opt, v, 1u << 30));
    } else if (key == "temperature") {
        a.temperature = parse_float(opt, v, 0.0f, 100.0f);
    } else if (key == "top-k") {
        a.top_k = int32_t(parse_u64(opt, v, 1u << 30));
    } else if (key == "top-p") {
        a.top_p = parse_float(opt, v, 0.0f, 1.0f);
    } else if (key == "min-p") {
        a.min_p = parse_float(opt, v, 0.0f, 1.0f);
    } else if (key == "seed") {
        a.seed = parse_u64(opt, v, UINT64_MAX);
        a.seed_set = true;
    } else if (key == "repeat-penalty") {
        a.repeat_penalty = parse_float(opt, v, 0.0f, 10.0f);
        if (a.repeat_penalty <= 0.0f) throw UsageError(opt + " must be above 0 (1 is off), got \"" + std::string(v) + "\"");
    } else if (key == "repeat-last-n") {
        a.repeat_last_n = parse_i32(opt, v, -1, INT32_MAX);
    } else if (key == "frequency-penalty") {
        a.frequency_penalty = parse_float(opt, v, -2.0f, 2.0f);
    } else if (key == "presence-penalty") {
        a.presence_penalty = parse_float(opt, v, -2.0f, 2.0f);
    } else if (key == "logit-bias") {
        const auto b = parse_bias(opt, v);
        for (const auto &x : a.logit_bias)
            if (x.first == b.first) throw UsageError(opt + " names token " + std::to_string(b.first) + " twice");
        if (a.logit_bias.size() >= 300) throw UsageError(opt + ": at most 300 entries");
        a.logit_bias.push_back(b);
    } else {
        throw UsageError("unknown setting \"" + key +
                         "\" (max_tokens, temperature, top_k, top_p, min_p, seed, repeat_penalty, repeat_last_n, "
                         "frequency_penalty, presence_penalty, logit_bias)");
    }
}

std::string usage_text() {
    return "usage: ds4 [--socket PATH] COMMAND [OPTIONS] [ARGS]\n"
           "\n"
           "Talks to a running ds4d over its Unix socket, and only to one run by the same user\n"
           "(checked before anything is sent).\n"
           "\n"
           "Commands:\n"
           "  run [OPTIONS] PROMPT   answer PROMPT, streaming the text to stdout as it is generated\n"
           "                         (PROMPT \"-\" reads it from stdin; several words are joined by spaces)\n"
           "  chat [OPTIONS]         interactive multi-turn chat with line editing and history; Ctrl-C\n"
           "                         stops the current answer; a line ending in \\ continues on the\n"
           "                         next; /help lists /reset, /save NAME, /load NAME, /set KEY VALUE;\n"
           "                         /exit or end of input leaves\n"
           "  stats                  the daemon's statistics\n"
           "  tokenize TEXT          the token ids of TEXT, space-separated (TEXT \"-\" reads stdin)\n"
           "  sessions [list]        stored and live named sessions: name, tokens, bytes on disk,\n"
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
           "  --seed S               sampling seed, for repeatable sampling (default: a random seed)\n"
           "  --repeat-penalty P     divide (multiply, when negative) the logit of every token among the\n"
           "                         last --repeat-last-n of the context by P, in (0, 10] (default 1: off)\n"
           "  --repeat-last-n N      the window of --repeat-penalty (default 64; 0 off, -1 the whole context)\n"
           "  --frequency-penalty F  subtract F x (times a token was generated) from its logit, in [-2, 2]\n"
           "  --presence-penalty F   subtract F from the logit of every token generated so far, in [-2, 2]\n"
           "  --logit-bias ID=BIAS   add BIAS in [-100, 100] to token ID's logit (repeatable)\n"
           "  --stop STRING          stop when STRING appears in the output (repeatable)\n"
           "  --ignore-eos           keep generating past end-of-sequence tokens (until --max-tokens\n"
           "                         or the context is full)\n"
           "  --no-speculate         decode without ds4d's drafter (--drafter): plain one-token steps\n"
           "  --ids                  (run) print the generated token ids, space-separated, instead of text\n"
           "  --logprobs N           (run) instead of text, one JSON line per generated token: its id, text,\n"
           "                         log-probability and the N (0..20) most likely tokens with theirs\n"
           "                         (after --logit-bias and the penalties, over the temperature; not\n"
           "                         truncated by top-k/top-p/min-p)\n"
           "  --json                 (run) the answer is one JSON object: ds4d masks every token that would\n"
           "                         break its syntax and ends the answer when the object closes (closing\n"
           "                         it early rather than running past --max-tokens, at least 2)\n"
           "  --raw                  (run) plain text completion: PROMPT is sent as it is. The default for\n"
           "                         a model whose GGUF has no chat template (tokenizer.chat_template),\n"
           "                         such as the raw Python model models/ds4-pystd-q8_0.gguf\n"
           "  --chat                 (run) wrap PROMPT in the chat template as a user turn. The default\n"
           "                         for a model whose GGUF has a chat template\n"
           "  --think                let the model think before answering (chat template thinking mode;\n"
           "                         not with --raw, nor on a model without a chat template unless --chat)\n"
           "\n"
           "Global options:\n"
           "  --socket PATH          daemon socket (default $XDG_RUNTIME_DIR/ds4.sock, else\n"
           "                         /tmp/ds4-$UID/ds4.sock; here: " +
           ipc::default_socket_path() +
           ")\n"
           "                         $DS4_SOCKET overrides the default\n"
           "  -h, --help             this help\n"
           "  --version              version and git revision\n"
           "\n"
           "Prefill progress is shown on stderr when stderr is a terminal.\n"
           "Exit status: 0 ok, 2 usage error, 3 cannot connect to ds4d, 4 server error (message on stderr),\n"
           "5 run --session generated the answer but could not store the turn (warning on stderr),\n"
           "6 run's answer was cut short: the context is full or ds4d cancelled it (shutting down),\n"
           "130 interrupted by Ctrl-C.\n";
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
        if (arg == "--version") {
            a.command = CliArgs::Command::Version;
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
        } else if (arg == "--stop") {
            a.stops.emplace_back(value(i, arg));
            if (a.stops.back().empty()) throw UsageError("--stop needs a non-empty string");
        } else if (arg == "--ids") {
            a.ids = true;
        } else if (arg == "--json") {
            a.json = true;
        } else if (arg == "--logprobs") {
            a.logprobs = int32_t(parse_u64(arg, value(i, arg), 20));
        } else if (arg == "--ignore-eos") {
            a.ignore_eos = true;
        } else if (arg == "--no-speculate") {
            a.no_speculate = true;
        } else if (arg == "--raw") {
            a.raw = true;
        } else if (arg == "--chat") {
            a.chat_template = true;
        } else if (arg == "--think") {
            a.think = true;
        } else if (is_sampling_option(arg)) {
            set_sampling_option(a, arg.substr(2), value(i, arg));
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
        if (a.raw && a.think) throw UsageError("--think needs the chat template; it cannot be combined with --raw");
        if (a.raw && a.chat_template) throw UsageError("--raw and --chat exclude each other");
        if (a.ids && a.logprobs >= 0) throw UsageError("--ids and --logprobs exclude each other (--logprobs prints the ids too)");
        if (a.json && a.think) throw UsageError("--json and --think exclude each other (the reasoning is free text)");
        if (a.json && a.max_tokens < 2) throw UsageError("--json needs --max-tokens of at least 2");
        break;
    case CliArgs::Command::Sessions: {
        const std::string op = positional.empty() ? "list" : positional[0];
        if (op == "list") a.sessions_op = CliArgs::SessionsOp::List;
        else if (op == "save") a.sessions_op = CliArgs::SessionsOp::Save;
        else if (op == "delete") a.sessions_op = CliArgs::SessionsOp::Delete;
        else if (op == "pin") a.sessions_op = CliArgs::SessionsOp::Pin;
        else throw UsageError("sessions needs list, save NAME, delete NAME or pin NAME, got \"" + op + "\"");
        const size_t want = a.sessions_op == CliArgs::SessionsOp::List ? 1 : 2;
        // Plain `ds4 sessions` lists them (positional is empty then).
        if (!positional.empty() && positional.size() < want) throw UsageError("sessions " + op + " needs a NAME");
        if (positional.size() > want) throw UsageError("unexpected argument \"" + positional[want] + "\"");
        if (want == 2) a.session_arg = positional[1];
        if (a.unpin && a.sessions_op != CliArgs::SessionsOp::Pin) throw UsageError("--unpin is for sessions pin");
        break;
    }
    case CliArgs::Command::Chat:
        if (a.ids || a.raw || a.chat_template || a.logprobs >= 0 || a.json)
            throw UsageError(std::string(a.ids ? "--ids" : a.raw ? "--raw" : a.chat_template ? "--chat"
                                         : a.json ? "--json" : "--logprobs") + " is for run, not chat");
        [[fallthrough]];
    case CliArgs::Command::Stats:
    case CliArgs::Command::Help:
    case CliArgs::Command::Version:
        if (!positional.empty()) throw UsageError("unexpected argument \"" + positional[0] + "\"");
        break;
    }
    return a;
}

}  // namespace ds4::client
