// `ds4`: the command-line client of ds4d (run, chat, stats, tokenize, sessions). See usage_text().
#include <editline/readline.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <iostream>
#include <memory>
#include <string>
#include <unordered_map>

#include "client/cli_args.h"
#include "client/ds4client.hpp"
#include "ds4_version.h"

using namespace ds4::client;

namespace {

constexpr int kExitOk = 0;
constexpr int kExitUsage = 2;
constexpr int kExitConnect = 3;
constexpr int kExitServer = 4;
constexpr int kExitNotStored = 5;  // run --session: the answer was printed, its turn not stored
constexpr int kExitCut = 6;        // run: the answer was cut short (context full, cancelled by ds4d)
constexpr int kExitInterrupted = 130;

int g_sigpipe[2] = {-1, -1};
// Set by the handler: the client library drains the pipe itself when it cancels a request,
// so the pipe alone cannot tell afterwards whether Ctrl-C was pressed.
volatile sig_atomic_t g_sigint_seen = 0;

void on_sigint(int) {
    g_sigint_seen = 1;
    const int saved = errno;
    const char b = 1;
    [[maybe_unused]] ssize_t w = ::write(g_sigpipe[1], &b, 1);
    errno = saved;
}

// SIGINT becomes a byte on a self-pipe: the client cancels the running request when it
// sees it, and the chat prompt just starts a new line. No SA_RESTART, so a blocking read
// of the prompt returns EINTR.
void install_sigint() {
    if (::pipe2(g_sigpipe, O_CLOEXEC | O_NONBLOCK) != 0) return;
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    sigaction(SIGINT, &sa, nullptr);
}

// Whether Ctrl-C was pressed since the last call; drains the self-pipe.
bool drain_sigpipe() {
    bool any = g_sigint_seen;
    g_sigint_seen = 0;
    char buf[64];
    while (g_sigpipe[0] >= 0 && ::read(g_sigpipe[0], buf, sizeof buf) > 0) any = true;
    return any;
}

struct Progress {
    bool tty = ::isatty(2);
    bool shown = false;
    void update(uint32_t cur, uint32_t total) {
        if (!tty) return;
        std::fprintf(stderr, "\r\033[Kprefill %u/%u", cur, total);
        shown = true;
    }
    void clear() {
        if (shown) std::fprintf(stderr, "\r\033[K");
        shown = false;
    }
};

// A JSON string of token bytes: valid UTF-8 is kept, control characters are escaped, and a
// byte outside valid UTF-8 (a token may hold part of a character) becomes U+FFFD, *lossy set.
std::string json_string(std::string_view s, bool *lossy) {
    std::string o = "\"";
    *lossy = false;
    const auto *p = reinterpret_cast<const unsigned char *>(s.data());
    for (size_t i = 0; i < s.size();) {
        const unsigned char c = p[i];
        size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = n > 0 && i + n <= s.size();
        for (size_t k = 1; ok && k < n; ++k) ok = (p[i + k] & 0xC0) == 0x80;
        if (ok && n == 2) ok = c >= 0xC2;                                      // overlong
        if (ok && n == 3) ok = !(c == 0xE0 && p[i + 1] < 0xA0) && !(c == 0xED && p[i + 1] >= 0xA0);
        if (ok && n == 4) ok = c <= 0xF4 && !(c == 0xF0 && p[i + 1] < 0x90) && !(c == 0xF4 && p[i + 1] >= 0x90);
        if (!ok) {
            o += "\xEF\xBF\xBD";
            *lossy = true;
            ++i;
            continue;
        }
        if (n == 1) {
            if (c == '"' || c == '\\') {
                o += '\\';
                o += char(c);
            } else if (c == '\n' || c == '\t' || c == '\r') {
                o += '\\';
                o += c == '\n' ? 'n' : c == '\t' ? 't' : 'r';
            } else if (c < 0x20 || c == 0x7F) {
                char esc[8];
                std::snprintf(esc, sizeof esc, "\\u%04x", c);
                o += esc;
            } else {
                o += char(c);
            }
        } else {
            o.append(s.substr(i, n));
        }
        i += n;
    }
    return o + "\"";
}

// The bytes of single tokens, for --logprobs, looked up on a second connection (the first one
// is streaming the answer) and cached.
class TokenTexts {
public:
    explicit TokenTexts(std::string socket) : socket_(std::move(socket)) {}
    const std::string &get(int32_t t) {
        auto it = cache_.find(t);
        if (it != cache_.end()) return it->second;
        if (!client_) client_ = std::make_unique<Client>(socket_, "ds4-logprobs");
        return cache_.emplace(t, client_->detokenize(std::span<const int32_t>(&t, 1))).first->second;
    }
    // {"token":ID,"text":"...","logprob":X} plus "bytes":[...] when the text is not valid UTF-8.
    std::string entry(int32_t t, float logprob) {
        const std::string &b = get(t);
        bool lossy = false;
        std::string o = "{\"token\":";
        o += std::to_string(t);
        o += ",\"text\":";
        o += json_string(b, &lossy);
        char num[48];
        std::snprintf(num, sizeof num, ",\"logprob\":%.9g", double(logprob));
        o += num;
        if (lossy) {
            o += ",\"bytes\":[";
            for (size_t i = 0; i < b.size(); ++i) {
                if (i) o += ',';
                o += std::to_string(unsigned(static_cast<unsigned char>(b[i])));
            }
            o += "]";
        }
        return o;
    }

private:
    std::string socket_;
    std::unique_ptr<Client> client_;
    std::unordered_map<int32_t, std::string> cache_;
};

enum class Output { Text, Ids, Logprobs };

// Streams one answer to stdout. Returns the Done info. texts: for Output::Logprobs.
DoneInfo stream_answer(Client &client, const GenerateRequest &req, Output out, bool *last_newline,
                       TokenTexts *texts = nullptr) {
    Progress progress;
    bool first_id = true;
    const bool ids = out == Output::Ids;
    GenerateCallbacks cb;
    cb.on_progress = [&](uint32_t cur, uint32_t total) { progress.update(cur, total); };
    cb.on_chunk = [&](const Chunk &c) {
        progress.clear();
        if (out == Output::Logprobs) {
            // One JSON line per token: the token, then its most likely alternatives.
            for (size_t i = 0; i < c.tokens.size() && i < c.logprobs.size(); ++i) {
                std::string line = texts->entry(c.tokens[i], c.logprobs[i].logprob) + ",\"top\":[";
                for (size_t k = 0; k < c.logprobs[i].top.size(); ++k) {
                    if (k) line += ',';
                    line += texts->entry(c.logprobs[i].top[k].first, c.logprobs[i].top[k].second);
                    line += '}';
                }
                line += "]}\n";
                std::fwrite(line.data(), 1, line.size(), stdout);
            }
            *last_newline = true;
        } else if (ids) {
            for (int32_t t : c.tokens) {
                std::fprintf(stdout, first_id ? "%d" : " %d", t);
                first_id = false;
            }
        } else if (!c.text.empty()) {
            std::fwrite(c.text.data(), 1, c.text.size(), stdout);
            *last_newline = c.text.back() == '\n';
        }
        std::fflush(stdout);
        return true;
    };
    DoneInfo d = client.generate(req, cb);
    progress.clear();
    return d;
}

// Without --seed every run samples differently, as users of other local runners expect.
uint64_t random_seed() {
    uint64_t v = 0;
    if (::getrandom(&v, sizeof v, 0) != ssize_t(sizeof v)) v = uint64_t(::time(nullptr)) ^ (uint64_t(::getpid()) << 32);
    return v;
}

GenerateRequest base_request(const CliArgs &a) {
    GenerateRequest req;
    req.max_tokens = a.max_tokens;
    req.temperature = a.temperature;
    req.top_k = a.top_k;
    req.top_p = a.top_p;
    req.min_p = a.min_p;
    req.seed = a.seed_set ? a.seed : random_seed();
    req.repeat_penalty = a.repeat_penalty;
    req.repeat_last_n = a.repeat_last_n;
    req.frequency_penalty = a.frequency_penalty;
    req.presence_penalty = a.presence_penalty;
    req.logit_bias = a.logit_bias;
    req.stop_strings = a.stops;
    req.thinking = a.think;
    req.ignore_eos = a.ignore_eos;
    req.speculate = !a.no_speculate;
    req.progress = ::isatty(2);
    return req;
}

void print_summary(const DoneInfo &d) {
    if (!::isatty(2)) return;
    const double tok_s = d.decode_us ? d.generated_tokens * 1e6 / double(d.decode_us) : 0.0;
    std::fprintf(stderr, "[%s: %u prompt tokens (%u cached), %u generated, %.1f tok/s]\n",
                 finish_reason_name(d.reason), d.prompt_tokens, d.cached_tokens, d.generated_tokens, tok_s);
}

std::string read_all_stdin() {
    std::string s;
    char buf[65536];
    for (;;) {
        ssize_t r = ::read(0, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        s.append(buf, size_t(r));
    }
    return s;
}

// A failed save leaves the stored version of a session behind its live state: say so, since
// a daemon restart would lose the newer turns.
void warn_save_error(const std::string &name, const std::string &err) {
    std::fprintf(stderr,
                 "ds4: warning: saving session %s failed, so its stored version is behind the live one "
                 "(a ds4d restart would lose the newer turns): %s\n",
                 name.c_str(), err.c_str());
}

// The answer was cut short by ds4d (not by Ctrl-C here): it is said on stderr, and run exits
// with kExitCut, so a script does not take a truncated answer for a whole one.
void note_cancelled_by_daemon(const DoneInfo &d) {
    if (d.reason != FinishReason::Cancelled) return;
    std::fprintf(stderr, "ds4: the answer was cancelled by ds4d before it finished (is it shutting down?)\n");
}

// Generation stopped at the context limit: the answer is cut short and must not pass
// unnoticed (a session in that state takes no further turn).
void note_context_full(const DoneInfo &d, const std::string &session) {
    if (d.reason != FinishReason::Context) return;
    if (session.empty()) std::fprintf(stderr, "ds4: the answer stopped because the context is full\n");
    else
        std::fprintf(stderr,
                     "ds4: the answer stopped because session %s filled its context; it takes no further turn "
                     "in this context (delete it to start afresh)\n",
                     session.c_str());
}

// The name's stored session was evicted to keep the store's budget: this one starts empty.
void warn_evicted(const SessionInfo &si) {
    if (si.evicted.empty()) return;
    std::fprintf(stderr, "ds4: warning: %s; session %s starts again, empty\n", si.evicted.c_str(), si.name.c_str());
}

// Waits until the session's latest turn is stored (ListSessions answers after queued saves)
// and returns why saving it failed, or "".
std::string latest_save_error(Client &client, const std::string &name) {
    for (const StoredSession &s : client.list_sessions())
        if (s.name == name) return s.save_error;
    return {};
}

int cmd_run(Client &client, const CliArgs &a) {
    GenerateRequest req = base_request(a);
    // Neither --raw nor --chat: the model says. A model without a chat template (a raw
    // completion model, e.g. the default Python one) would only continue the template's markup.
    const ModelInfo &model = client.server_info().model;
    const bool raw = a.raw || (!a.chat_template && !model.chat_template);
    if (raw && a.think)
        throw UsageError(a.raw ? "--think needs the chat template; it cannot be combined with --raw"
                               : "--think needs the chat template, and " + model.name +
                                     " has none (a plain completion model); add --chat to use the template anyway");
    req.json_object = a.json;
    if (a.logprobs >= 0) {
        req.logprobs = true;
        req.top_logprobs = uint32_t(a.logprobs);
    }
    const std::string prompt = a.prompt == "-" ? read_all_stdin() : a.prompt;
    if (!a.session.empty()) {
        SessionInfo si = client.open_session(a.session);
        warn_evicted(si);
        if (!si.save_error.empty()) warn_save_error(si.name, si.save_error);
        req.session = si.id;
    }
    if (raw) {
        req.kind = GenerateRequest::Prompt::Text;
        req.text = prompt;
    } else {
        req.kind = GenerateRequest::Prompt::Chat;
        req.messages.push_back({"user", prompt});
    }
    client.set_interrupt_fd(g_sigpipe[0]);
    bool last_newline = false;
    TokenTexts texts(a.socket);
    const Output out = a.logprobs >= 0 ? Output::Logprobs : a.ids ? Output::Ids : Output::Text;
    DoneInfo d = stream_answer(client, req, out, &last_newline, &texts);
    if (out == Output::Ids) std::fputc('\n', stdout);
    else if (::isatty(1) && !last_newline) std::fputc('\n', stdout);
    std::fflush(stdout);
    print_summary(d);
    note_context_full(d, a.session);
    bool stored = true;
    if (!a.session.empty()) {
        const std::string err = latest_save_error(client, a.session);
        if (!err.empty()) warn_save_error(a.session, err);
        stored = err.empty();
    }
    if (d.reason == FinishReason::Cancelled && drain_sigpipe()) return kExitInterrupted;
    note_cancelled_by_daemon(d);
    if (d.reason == FinishReason::Context || d.reason == FinishReason::Cancelled) return kExitCut;
    // Scripts must not take a turn a restart would lose for a stored one.
    return stored ? kExitOk : kExitNotStored;
}

// One line from stdin; false at end of input. An interrupt at the prompt yields an empty line.
bool read_line(std::string &line, bool *interrupted) {
    static std::string pending;
    *interrupted = false;
    for (;;) {
        size_t nl = pending.find('\n');
        if (nl != std::string::npos) {
            line = pending.substr(0, nl);
            pending.erase(0, nl + 1);
            return true;
        }
        char buf[4096];
        ssize_t r = ::read(0, buf, sizeof buf);
        if (r < 0 && errno == EINTR) {
            if (drain_sigpipe()) {
                pending.clear();
                *interrupted = true;
                line.clear();
                return true;
            }
            continue;
        }
        if (r <= 0) {
            if (pending.empty()) return false;
            line.swap(pending);
            pending.clear();
            return true;
        }
        pending.append(buf, size_t(r));
    }
}

// Line editing on a terminal (libedit). Its own signal handling is off: SIGINT stays ours,
// and a Ctrl-C at the prompt ends the read with the line discarded (as in a shell).
bool g_line_interrupted = false;

int editline_getc(FILE *) {
    for (;;) {
        unsigned char c;
        const ssize_t r = ::read(0, &c, 1);
        if (r == 1) return c;
        if (r < 0 && errno == EINTR) {
            if (drain_sigpipe()) {
                g_line_interrupted = true;
                return '\n';
            }
            continue;
        }
        return EOF;
    }
}

std::string history_path() {
    const char *x = std::getenv("XDG_STATE_HOME");
    const char *h = std::getenv("HOME");
    std::string dir = x && *x == '/' ? std::string(x) + "/ds4" : h && *h == '/' ? std::string(h) + "/.local/state/ds4" : "";
    struct stat st {};
    if (dir.empty() || ::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return {};
    return dir + "/chat_history";
}

class LineReader {
public:
    explicit LineReader(bool tty) : tty_(tty) {
        if (!tty_) return;
        rl_catch_signals = 0;
        rl_getc_function = editline_getc;
        using_history();
        history_ = history_path();
        if (!history_.empty()) read_history(history_.c_str());
    }
    ~LineReader() {
        if (tty_ && !history_.empty()) write_history(history_.c_str());
    }
    // One logical line (a trailing backslash joins the next). false at end of input.
    bool read(std::string &out, bool *interrupted) {
        out.clear();
        *interrupted = false;
        for (bool first = true;; first = false) {
            std::string part;
            if (tty_) {
                g_line_interrupted = false;
                char *l = readline(first ? "> " : ". ");
                if (!l) return !first;
                part = l;
                std::free(l);
                if (g_line_interrupted) {
                    *interrupted = true;
                    out.clear();
                    return true;
                }
            } else {
                if (!read_line(part, interrupted)) return !first;
                if (*interrupted) return true;
            }
            if (!part.empty() && part.back() == '\\') {
                part.pop_back();
                out += part + "\n";
                continue;
            }
            out += part;
            if (tty_ && !out.empty()) add_history(out.c_str());
            return true;
        }
    }

private:
    bool tty_;
    std::string history_;
};

const char *kChatHelp =
    "/help              this list\n"
    "/reset             start a new, empty conversation (a named session stays stored)\n"
    "/save NAME         store the conversation as the named session NAME\n"
    "/load NAME         continue the stored session NAME\n"
    "/set KEY VALUE     change a setting: temperature, top_k, top_p, min_p, seed, max_tokens,\n"
    "                   repeat_penalty, repeat_last_n, frequency_penalty, presence_penalty, logit_bias ID=BIAS\n"
    "/set               show the settings\n"
    "/exit, /quit       leave (so does end of input, Ctrl-D)\n"
    "A line ending in \\ continues on the next. Ctrl-C stops the answer being generated.\n";

// Runs one slash command. false: leave the chat.
bool chat_command(Client &client, CliArgs &a, SessionInfo &s, const std::string &line) {
    std::vector<std::string> w;
    for (size_t i = 0; i < line.size();) {
        while (i < line.size() && line[i] == ' ') ++i;
        size_t j = line.find(' ', i);
        if (j == std::string::npos) j = line.size();
        if (j > i) w.push_back(line.substr(i, j - i));
        i = j;
    }
    const std::string cmd = w.empty() ? "" : w[0];
    try {
        if (cmd == "/exit" || cmd == "/quit") return false;
        if (cmd == "/help") {
            std::fputs(kChatHelp, stdout);
        } else if (cmd == "/reset") {
            if (s.name.empty()) client.close_session(s.id);
            s = client.open_session();
            a.session.clear();
            std::printf("[new conversation]\n");
        } else if (cmd == "/save" && w.size() == 2) {
            SavedSession v = client.save_session(w[1], s.id);
            std::printf("[saved %s: %u tokens]\n", v.name.c_str(), v.n_tokens);
        } else if (cmd == "/load" && w.size() == 2) {
            SessionInfo n = client.load_session(w[1]);
            if (s.name.empty() && n.id != s.id) client.close_session(s.id);
            s = n;
            a.session = n.name;
            std::printf("[loaded %s: %u tokens]\n", n.name.c_str(), n.n_tokens);
        } else if (cmd == "/set" && w.size() == 3) {
            set_sampling_option(a, w[1], w[2].c_str());
            std::printf("[%s = %s]\n", w[1].c_str(), w[2].c_str());
        } else if (cmd == "/set" && w.size() == 1) {
            std::printf("temperature %g, top_k %d, top_p %g, min_p %g, max_tokens %u, seed %s, repeat_penalty %g, "
                        "repeat_last_n %d, frequency_penalty %g, presence_penalty %g, logit_bias %zu entries\n",
                        double(a.temperature), a.top_k, double(a.top_p), double(a.min_p), a.max_tokens,
                        a.seed_set ? std::to_string(a.seed).c_str() : "random", double(a.repeat_penalty),
                        a.repeat_last_n, double(a.frequency_penalty), double(a.presence_penalty), a.logit_bias.size());
        } else {
            std::printf("[unknown or incomplete command %s; /help lists them]\n", line.c_str());
        }
    } catch (const UsageError &e) {
        std::printf("[%s]\n", e.what());
    } catch (const ServerError &e) {
        std::printf("[%s]\n", e.what());
    }
    std::fflush(stdout);
    return true;
}

int cmd_chat(Client &client, CliArgs a) {
    const bool tty_in = ::isatty(0);
    SessionInfo s = client.open_session(a.session);
    warn_evicted(s);
    std::string save_error = s.save_error;
    if (!save_error.empty()) warn_save_error(s.name, save_error);
    if (tty_in) {
        const ServerInfo &info = client.server_info();
        std::fprintf(stderr, "ds4 chat with %s (%s)%s. Ctrl-C stops an answer, /help lists commands, /exit leaves.\n",
                     info.model.name.c_str(), info.model.family.c_str(),
                     s.n_tokens ? (", continuing session " + s.name).c_str() : "");
    }
    if (!client.server_info().model.chat_template)
        std::fprintf(stderr,
                     "ds4: warning: %s has no chat template (a plain completion model): it was not trained on "
                     "conversations, so its answers may make little sense; `ds4 run PROMPT` continues text\n",
                     client.server_info().model.name.c_str());
    client.set_interrupt_fd(g_sigpipe[0]);
    LineReader reader(tty_in);
    std::string line;
    for (;;) {
        bool interrupted = false;
        if (!reader.read(line, &interrupted)) break;
        if (interrupted) {
            if (!tty_in) std::fputc('\n', stdout);
            continue;
        }
        if (line.empty()) continue;
        if (line[0] == '/') {
            if (!chat_command(client, a, s, line)) break;
            continue;
        }
        drain_sigpipe();
        GenerateRequest req = base_request(a);
        req.session = s.id;
        req.kind = GenerateRequest::Prompt::Chat;
        req.messages.push_back({"user", line});
        bool last_newline = false;
        DoneInfo d = stream_answer(client, req, Output::Text, &last_newline);
        if (!last_newline) std::fputc('\n', stdout);
        std::fflush(stdout);
        note_context_full(d, a.session);
        if (d.reason == FinishReason::Cancelled) {
            if (drain_sigpipe()) {
                if (tty_in) std::fprintf(stderr, "[stopped]\n");
            } else {
                note_cancelled_by_daemon(d);
            }
        }
        if (!a.session.empty()) {
            const std::string err = latest_save_error(client, a.session);
            if (!err.empty() && err != save_error) warn_save_error(a.session, err);
            save_error = err;
        }
    }
    if (tty_in) std::fputc('\n', stdout);
    return kExitOk;
}

std::string bytes(uint64_t b) {
    char buf[64];
    if (b >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(1ull << 30));
    else if (b >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", double(b) / double(1ull << 20));
    else if (b >= (1ull << 10)) std::snprintf(buf, sizeof buf, "%.2f KiB", double(b) / double(1ull << 10));
    else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
    return buf;
}

int cmd_stats(Client &client) {
    Stats s = client.stats();
    const ModelInfo &m = s.model;
    std::printf("uptime       %.1f s\n", s.uptime_s);
    std::printf("model        %s (%s, %s): %u layers, %u wide, %u heads, %u experts, vocab %u, context max %u\n",
                m.name.c_str(), m.family.c_str(), m.backend.c_str(), m.n_layer, m.n_embd, m.n_head, m.n_expert,
                m.n_vocab, m.n_ctx_max);
    std::printf("connections  %u\n", s.connections);
    std::printf("sessions     %u\n", s.sessions);
    uint32_t prefilling = 0;
    for (const Stats::Stream &x : s.streams) prefilling += x.prefilling ? 1 : 0;
    const uint32_t running = s.active_requests - std::min(s.active_requests, s.queued_requests);
    std::printf("requests     %llu total; now %u running (%u in prefill), %u waiting to start\n",
                static_cast<unsigned long long>(s.requests_total), running, prefilling, s.queued_requests);
    std::printf("tokens       %llu in (%llu cached), %llu out\n", static_cast<unsigned long long>(s.tokens_in),
                static_cast<unsigned long long>(s.tokens_cached), static_cast<unsigned long long>(s.tokens_out));
    std::printf("throughput   prefill %.1f tok/s, decode %.1f tok/s\n", s.prefill_tok_s, s.decode_tok_s);
    std::printf("memory       weights %s, caches %s, scratch %s", bytes(s.memory.weights_bytes).c_str(),
                bytes(s.memory.cache_bytes).c_str(), bytes(s.memory.scratch_bytes).c_str());
    if (s.memory.device_total)
        std::printf(", device %s: weights %s, %s free of %s", s.memory.device.c_str(),
                    bytes(s.memory.device_weights_bytes).c_str(), bytes(s.memory.device_free).c_str(),
                    bytes(s.memory.device_total).c_str());
    std::printf("\n");
    if (s.memory.drafter_bytes || s.memory.shared_bytes)
        std::printf("             drafter %s; shared with other processes %s, ds4d's alone %s\n",
                    bytes(s.memory.drafter_bytes).c_str(), bytes(s.memory.shared_bytes).c_str(),
                    bytes(s.memory.private_bytes).c_str());
    std::printf("kv budget    %s of %s in use, %u requests waiting for memory, %u for a session slot, %llu refused\n",
                bytes(s.kv_in_use).c_str(), bytes(s.kv_budget).c_str(), s.kv_waiting, s.slot_waiting,
                static_cast<unsigned long long>(s.kv_refused));
    std::printf("store        %llu failed session saves\n", static_cast<unsigned long long>(s.saves_failed));
    if (s.steps) {
        const double rows = double(s.step_rows) / double(s.steps), reqs = double(s.step_requests) / double(s.steps);
        std::printf("batching     %llu steps, %.2f requests and %.1f tokens per step (occupancy %.0f%% of "
                    "--max-batch %u, --step-tokens %u), %.1f steps/s while busy\n",
                    static_cast<unsigned long long>(s.steps), reqs, rows, s.max_batch ? 100.0 * reqs / s.max_batch : 0.0,
                    s.max_batch, s.step_tokens, s.step_seconds > 0 ? double(s.steps) / s.step_seconds : 0.0);
    }
    if (s.draft_max) {
        std::printf("speculation  --draft-max %u: %llu trials, %llu drafted, %llu accepted (%.1f%%), mean k %.2f, "
                    "%.2f tokens per trial, %llu declined\n",
                    s.draft_max, static_cast<unsigned long long>(s.spec_trials),
                    static_cast<unsigned long long>(s.spec_drafted), static_cast<unsigned long long>(s.spec_accepted),
                    s.spec_drafted ? 100.0 * double(s.spec_accepted) / double(s.spec_drafted) : 0.0,
                    s.spec_trials ? double(s.spec_drafted) / double(s.spec_trials) : 0.0,
                    s.spec_trials ? double(s.spec_tokens) / double(s.spec_trials) : 0.0,
                    static_cast<unsigned long long>(s.spec_fallbacks));
        const double spec_rate = s.spec_solo_seconds > 0 ? double(s.spec_solo_tokens) / s.spec_solo_seconds : 0.0;
        const double solo_rate = s.solo_seconds > 0 ? double(s.solo_steps) / s.solo_seconds : 0.0;
        std::printf("             alone in a step: %.1f tok/s in trials vs %.1f tok/s in plain one-row steps", spec_rate,
                    solo_rate);
        if (spec_rate > 0 && solo_rate > 0) std::printf(": measured speedup %.2fx", spec_rate / solo_rate);
        std::printf("\n");
    }
    if (s.drafter_offered) {
        size_t mapped = 0;
        for (const DrafterImporter &i : s.drafter_importers) mapped += i.mapped ? 1 : 0;
        std::printf("drafter      shared read-only (%s sealed memfd): %llu descriptors to %zu processes, %zu mapping it now\n",
                    bytes(s.drafter_share_bytes).c_str(), static_cast<unsigned long long>(s.drafter_shares),
                    s.drafter_importers.size(), mapped);
        const auto now = static_cast<uint64_t>(std::time(nullptr));
        for (const DrafterImporter &i : s.drafter_importers) {
            char when[32] = "?";
            const std::time_t t = static_cast<std::time_t>(i.last_unix);
            std::tm tm{};
            if (localtime_r(&t, &tm)) std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
            std::printf("  importer pid %-7d uid %-6u %s (%llu s ago), %s, %u %s, %s\n", i.pid, i.uid, when,
                        static_cast<unsigned long long>(now > i.last_unix ? now - i.last_unix : 0),
                        bytes(i.bytes).c_str(), i.shares, i.shares == 1 ? "share" : "shares",
                        i.mapped ? "mapping it" : "gone (not mapping it)");
        }
    }
    if (s.streaming) {
        const ExpertStats &e = s.experts;
        const uint64_t evaluated = s.tokens_in - std::min(s.tokens_in, s.tokens_cached) + s.tokens_out;
        std::printf("experts      %.1f%% hits (%llu of %llu used, %llu read on demand, %llu waited on their prefetch); "
                    "cache %llu of %llu experts (%s)\n",
                    100.0 * e.hit_rate(), static_cast<unsigned long long>(e.acquired - std::min(e.acquired, e.misses)),
                    static_cast<unsigned long long>(e.acquired), static_cast<unsigned long long>(e.misses),
                    static_cast<unsigned long long>(e.late), static_cast<unsigned long long>(e.resident),
                    static_cast<unsigned long long>(e.capacity), bytes(e.capacity_bytes).c_str());
        std::printf("             read %s (%s per token), %.2f GB/s while reading; prefetch %llu read, %llu used, "
                    "%.0f%% of read time hidden; store %llu records read, %llu failed their checksum\n",
                    bytes(e.bytes_read).c_str(), bytes(evaluated ? e.bytes_read / evaluated : 0).c_str(), e.read_gb_s(),
                    static_cast<unsigned long long>(e.prefetched), static_cast<unsigned long long>(e.prefetch_used),
                    100.0 * e.hidden(), static_cast<unsigned long long>(e.store_reads),
                    static_cast<unsigned long long>(e.store_corrupt));
    }
    for (const Stats::Stream &x : s.streams) {
        if (x.prefilling)
            std::printf("  request %-6llu %-16s prefill %u/%u tokens\n", static_cast<unsigned long long>(x.request_id),
                        x.session.empty() ? "(one-shot)" : x.session.c_str(), x.prefilled, x.prompt_tokens);
        else
        {
            std::printf("  request %-6llu %-16s %u tokens, %.1f tok/s", static_cast<unsigned long long>(x.request_id),
                        x.session.empty() ? "(one-shot)" : x.session.c_str(), x.generated, x.tok_s);
            if (x.drafted)
                std::printf(", %llu/%llu drafts accepted (%.0f%%)", static_cast<unsigned long long>(x.accepted),
                            static_cast<unsigned long long>(x.drafted), 100.0 * double(x.accepted) / double(x.drafted));
            std::printf("\n");
        }
    }
    return kExitOk;
}

int cmd_tokenize(Client &client, const CliArgs &a) {
    std::vector<int32_t> toks = client.tokenize(a.prompt == "-" ? read_all_stdin() : a.prompt);
    for (size_t i = 0; i < toks.size(); ++i) std::printf(i ? " %d" : "%d", toks[i]);
    std::printf("\n");
    return kExitOk;
}

std::string when(uint64_t unix_s) {
    if (!unix_s) return "-";
    const time_t t = time_t(unix_s);
    tm lt;
    localtime_r(&t, &lt);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &lt);
    return buf;
}

int cmd_sessions(Client &client, const CliArgs &a) {
    switch (a.sessions_op) {
    case CliArgs::SessionsOp::List: {
        std::vector<EvictedSession> evicted;
        std::vector<StoredSession> v = client.list_sessions(&evicted);
        std::printf("%-24s %8s %12s  %-19s  %-6s %s\n", "NAME", "TOKENS", "BYTES", "LAST USED", "PINNED", "LIVE");
        for (const StoredSession &s : v) {
            std::printf("%-24s %8u %12llu  %-19s  %-6s %s\n", s.name.c_str(), s.n_tokens,
                        static_cast<unsigned long long>(s.bytes), when(s.last_used_unix).c_str(),
                        s.pinned ? "yes" : "no", s.live ? "yes" : "no");
            if (!s.save_error.empty())
                std::printf("  ! latest save failed; stored version has %u tokens: %s\n", s.stored_tokens,
                            s.save_error.c_str());
        }
        if (!evicted.empty()) std::printf("\nrecently evicted (their conversations are gone):\n");
        for (const EvictedSession &e : evicted)
            std::printf("%-24s evicted %s %s\n", e.name.c_str(), when(e.evicted_unix).c_str(), e.reason.c_str());
        return kExitOk;
    }
    case CliArgs::SessionsOp::Save: {
        SavedSession s = client.save_session(a.session_arg);
        std::printf("saved %s: %u tokens, %s\n", s.name.c_str(), s.n_tokens, bytes(s.bytes).c_str());
        return kExitOk;
    }
    case CliArgs::SessionsOp::Delete:
        client.delete_session(a.session_arg);
        std::printf("deleted %s\n", a.session_arg.c_str());
        return kExitOk;
    case CliArgs::SessionsOp::Pin:
        client.pin_session(a.session_arg, !a.unpin);
        std::printf("%s %s\n", a.unpin ? "unpinned" : "pinned", a.session_arg.c_str());
        return kExitOk;
    }
    return kExitOk;
}

}  // namespace

int main(int argc, char **argv) {
    CliArgs a;
    try {
        a = parse_cli(argc, argv);
    } catch (const UsageError &e) {
        std::fprintf(stderr, "ds4: %s\nRun 'ds4 --help' for usage.\n", e.what());
        return kExitUsage;
    }
    if (a.command == CliArgs::Command::Help) {
        std::fputs(usage_text().c_str(), stdout);
        return kExitOk;
    }
    if (a.command == CliArgs::Command::Version) {
        ds4_print_version("ds4");
        return kExitOk;
    }
    install_sigint();
    try {
        Client client(a.socket, "ds4");
        switch (a.command) {
        case CliArgs::Command::Run: return cmd_run(client, a);
        case CliArgs::Command::Chat: return cmd_chat(client, a);
        case CliArgs::Command::Stats: return cmd_stats(client);
        case CliArgs::Command::Tokenize: return cmd_tokenize(client, a);
        case CliArgs::Command::Sessions: return cmd_sessions(client, a);
        case CliArgs::Command::Help:
        case CliArgs::Command::Version: break;
        }
        return kExitOk;
    } catch (const ConnectError &e) {
        std::fprintf(stderr, "ds4: %s\n", e.what());
        // Nobody listens there (as opposed to a refused peer): say how to get a daemon.
        if (std::strstr(e.what(), "No such file") || std::strstr(e.what(), "Connection refused"))
            std::fprintf(stderr,
                         "ds4: is ds4d running? Start it with: ds4d --model MODEL.gguf%s\n"
                         "     (or, installed with systemd units: systemctl --user start ds4d.socket)\n",
                         a.socket.empty() ? "" : (" --socket " + a.socket).c_str());
        return kExitConnect;
    } catch (const UsageError &e) {
        std::fprintf(stderr, "ds4: %s\n", e.what());
        return kExitUsage;
    } catch (const ServerError &e) {
        std::fprintf(stderr, "ds4: %s\n", e.what());
        return kExitServer;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "ds4: %s\n", e.what());
        return kExitServer;
    }
}
