// ds4-soak: a bounded soak of ds4d. N clients send random requests (one-shot generations,
// named-session turns, SaveSession, ListSessions, Stats, Tokenize), cancel some, close some
// sockets mid-stream, use more named sessions than --max-sessions, while ds4d is killed with
// SIGKILL every --kill-every seconds and restarted on the same state dir.
//
// Ground truth. Every named turn is greedy with ignore_eos, so its output is a function of
// the session's history; an in-process bridge session per name replays the same evaluation
// (prompt as one chunk, then each generated token singly, as ds4d evaluates it) and predicts
// every token. A turn is acknowledged once a SaveSession reply or a ListSessions listing says
// it is stored. Whenever a named session is opened (after every restart, and before every
// turn) it must hold at least its acknowledged tokens and at most what the tracked
// conversation could have reached; its next turn must equal the prediction from the tracked
// history cut to that length. Exit status 1 on any lost acknowledged turn, wrong token,
// unexplained session length or ds4d death we did not cause.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bridge/ds4.hpp"
#include "client/ds4client.hpp"
#include "ds4_version.h"
#include "ipc/frame.h"

extern "C" char **environ;

namespace {

namespace fs = std::filesystem;
namespace fb = ds4::ipc::fb;
using Clock = std::chrono::steady_clock;
using ds4::client::Client;

struct Options {
    std::string model, ds4d = DS4D_DEFAULT_PATH, make_model = DS4_MAKE_MODEL_PATH, state_dir;
    double seconds = 600;
    int clients = 32;
    int kill_every = 60;
    int names = 40;          // named sessions in play
    int max_sessions = 16;   // ds4d's --max-sessions (below names: LRU release and reload)
    uint32_t ctx = 384;      // context of each named session; a full one is deleted and renamed
    int rss_every_ms = 2000;
    uint64_t seed = 1;
    bool keep = false;
};

// msg empty: --help (stdout, exit 0); else a usage error (stderr, exit 2).
[[noreturn]] void usage(const char *msg) {
    std::fprintf(*msg ? stderr : stdout,
                 "%s%susage: ds4-soak [--model GGUF] [--minutes M | --seconds S] [--clients N] [--kill-every S]\n"
                 "                [--names N] [--max-sessions N] [--ctx N] [--seed N] [--state-dir DIR] [--keep]\n"
                 "                [--ds4d PATH] [--make-model PATH]\n"
                 "Without --model a tiny random model is generated (ds4-make-model --preset tiny).\n"
                 "Exit status 1 on any lost acknowledged turn, wrong continuation or unexplained session state.\n",
                 msg, *msg ? "\n" : "");
    std::exit(*msg ? 2 : 0);
}

Options parse(int argc, char **argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) usage((a + " needs a value").c_str());
            return argv[++i];
        };
        if (a == "--model") o.model = val();
        else if (a == "--ds4d") o.ds4d = val();
        else if (a == "--make-model") o.make_model = val();
        else if (a == "--state-dir") o.state_dir = val();
        else if (a == "--minutes") o.seconds = std::stod(val()) * 60;
        else if (a == "--seconds") o.seconds = std::stod(val());
        else if (a == "--clients") o.clients = std::stoi(val());
        else if (a == "--kill-every") o.kill_every = std::stoi(val());
        else if (a == "--names") o.names = std::stoi(val());
        else if (a == "--max-sessions") o.max_sessions = std::stoi(val());
        else if (a == "--ctx") o.ctx = uint32_t(std::stoul(val()));
        else if (a == "--seed") o.seed = std::stoull(val());
        else if (a == "--keep") o.keep = true;
        else if (a == "-h" || a == "--help") usage("");
        else usage(("unknown option " + a).c_str());
    }
    if (o.seconds <= 0 || o.clients < 1 || o.kill_every < 1 || o.names < 1 || o.ctx < 96)
        usage("--seconds/--clients/--kill-every/--names must be positive, --ctx at least 96");
    return o;
}

std::string now_s(Clock::time_point t0) {
    char b[32];
    std::snprintf(b, sizeof b, "%7.1fs", std::chrono::duration<double>(Clock::now() - t0).count());
    return b;
}

// ---------------------------------------------------------------- the daemon

struct Daemon {
    Options opt;
    std::string dir, socket, log;
    std::atomic<pid_t> pid{-1};

    void start() {
        std::vector<std::string> argv = {opt.ds4d,   "--model",        opt.model, "--socket", socket,
                                         "--state-dir", opt.state_dir, "--backend", "cpu",     "--threads",
                                         "1",        "--max-sessions", std::to_string(opt.max_sessions),
                                         "--ctx",    std::to_string(opt.ctx)};
        std::vector<char *> av;
        for (auto &s : argv) av.push_back(s.data());
        av.push_back(nullptr);
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
        pid_t p = -1;
        const int rc = posix_spawn(&p, av[0], &fa, nullptr, av.data(), environ);
        posix_spawn_file_actions_destroy(&fa);
        if (rc != 0) throw std::runtime_error("cannot start " + opt.ds4d);
        const auto deadline = Clock::now() + std::chrono::minutes(5);
        while (Clock::now() < deadline) {
            int st = 0;
            if (waitpid(p, &st, WNOHANG) == p) throw std::runtime_error("ds4d exited during start-up; see " + log);
            try {
                Client probe(socket, "soak-probe");
                pid = p;
                return;
            } catch (const ds4::client::ConnectError &) {
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
            }
        }
        kill(p, SIGKILL);
        waitpid(p, nullptr, 0);
        throw std::runtime_error("ds4d did not listen within 5 minutes; see " + log);
    }
    // True when it was still running (so the kill was ours).
    bool kill9() {
        const pid_t p = pid.exchange(-1);
        if (p <= 0) return false;
        int st = 0;
        const bool alive = waitpid(p, &st, WNOHANG) == 0;
        kill(p, SIGKILL);
        waitpid(p, &st, 0);
        return alive;
    }
    int term() {
        const pid_t p = pid.exchange(-1);
        if (p <= 0) return -1;
        kill(p, SIGTERM);
        int st = 0;
        waitpid(p, &st, 0);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
};

long rss_kb(pid_t p) {
    std::ifstream f("/proc/" + std::to_string(p) + "/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
    return -1;
}

// ---------------------------------------------------------------- tallies

// The request this thread is making, for the error table.
thread_local const char *t_op = "connect";

struct Tally {
    std::mutex mu;
    std::map<std::string, uint64_t> served, errors;
    std::map<std::string, std::string> error_sample;   // the first message of each kind
    std::vector<std::string> failures;   // lost / wrong, with details (first 50 kept)
    std::atomic<uint64_t> lost{0}, wrong{0}, unexplained{0}, rolled_back{0}, verified_turns{0}, reopen_checks{0};
    std::atomic<uint64_t> releases_seen{0}, renamed{0};

    void ok(const char *what) {
        std::lock_guard<std::mutex> lk(mu);
        ++served[what];
    }
    void error(const std::string &code, const std::string &message = {}) {
        std::lock_guard<std::mutex> lk(mu);
        const std::string key = code + " on " + t_op;
        if (!errors[key]++ && !message.empty()) error_sample[key] = message;
    }
    void fail(std::atomic<uint64_t> &counter, std::string msg) {
        ++counter;
        std::lock_guard<std::mutex> lk(mu);
        std::fprintf(stderr, "FAIL: %s\n", msg.c_str());
        if (failures.size() < 50) failures.push_back(std::move(msg));
    }
};

// ---------------------------------------------------------------- reference

// One bridge model; one session per name, evaluated exactly as ds4d evaluated the name's
// history (segments: each prompt as one chunk, each generated token alone).
struct Reference {
    ds4::bridge::Model model;
    std::mutex mu;  // sessions share the model's executor: one at a time
    explicit Reference(const std::string &path)
        : model([&] {
              ds4::bridge::ModelOptions o;
              o.model_path = path;
              o.n_threads = 1;
              return o;
          }()) {}
};

struct Name {
    std::mutex turn_mu;   // held for a whole turn or check
    std::mutex data_mu;   // name + acked (read by the ListSessions path without turn_mu)
    int index = 0;
    int gen = 0;
    std::string name;
    uint32_t acked = 0;
    std::vector<int32_t> timeline;   // the longest history the session can hold
    std::vector<size_t> seg_ends;    // evaluation boundaries in timeline
    bool exact = true;               // the session holds exactly timeline
    std::atomic<bool> opened_since_restart{false};  // set by a restart; the next open may see older state
    std::unique_ptr<ds4::bridge::Session> ref;

    std::string current() {
        std::lock_guard<std::mutex> lk(data_mu);
        return name;
    }
    uint32_t acked_now() {
        std::lock_guard<std::mutex> lk(data_mu);
        return acked;
    }
};

// ---------------------------------------------------------------- a raw connection

// For abrupt disconnects: speaks frames directly so the socket can close mid-stream.
struct Raw {
    int fd = -1;
    ds4::ipc::FrameDecoder dec;
    explicit Raw(const std::string &path) {
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_un a{};
        a.sun_family = AF_UNIX;
        std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
        if (connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
            close(fd);
            fd = -1;
        }
    }
    ~Raw() {
        if (fd >= 0) close(fd);
    }
    template <class F> bool send(F build) {
        flatbuffers::FlatBufferBuilder fbb;
        build(fbb);
        const uint8_t *p = fbb.GetBufferPointer();
        size_t n = fbb.GetSize();
        while (n) {
            ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
            if (w <= 0) return false;
            p += w;
            n -= size_t(w);
        }
        return true;
    }
    const fb::Envelope *next(int timeout_ms = 20000) {
        const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
        for (;;) {
            auto st = dec.next();
            if (st == ds4::ipc::FrameDecoder::Status::Frame) return dec.envelope();
            if (st == ds4::ipc::FrameDecoder::Status::Error) return nullptr;
            const int left = int(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
            if (left <= 0) return nullptr;
            pollfd p{fd, POLLIN, 0};
            if (poll(&p, 1, left) <= 0) continue;
            uint8_t buf[65536];
            ssize_t r = recv(fd, buf, sizeof buf, 0);
            if (r <= 0) return nullptr;
            dec.feed(buf, size_t(r));
        }
    }
    bool hello() {
        if (fd < 0 || !send([](auto &fbb) {
                ds4::ipc::finish_frame(fbb, 1, fb::CreateHelloDirect(fbb, ds4::ipc::kProtocolVersion, "soak-raw"));
            }))
            return false;
        const fb::Envelope *e = next();
        return e && e->body_type() == fb::Message::HelloOk;
    }
};

// ---------------------------------------------------------------- the run

struct Soak {
    Options opt;
    Daemon daemon;
    Tally tally;
    std::unique_ptr<Reference> reference;
    std::vector<std::unique_ptr<Name>> names;
    int vocab = 0;
    std::atomic<bool> stop{false};
    std::atomic<int> restarts{0};
    std::atomic<int> unexpected_deaths{0};
    Clock::time_point t0;
    std::mutex rss_mu;
    std::vector<std::pair<double, long>> rss;   // (seconds since start, kB)

    // ---- reference

    void ref_rebuild(Name &n) {
        n.ref = std::make_unique<ds4::bridge::Session>(reference->model, int(opt.ctx));
        size_t at = 0;
        for (size_t end : n.seg_ends) {
            if (end - at == 1) n.ref->eval(n.timeline[at]);
            else n.ref->sync(std::span<const int32_t>(n.timeline.data(), end));
            at = end;
        }
    }

    // Evaluates prompt on the name's reference (at timeline) and predicts `count` greedy
    // tokens, evaluating each (as ds4d does). The reference ends at timeline+prompt+count.
    std::vector<int32_t> ref_turn(Name &n, const std::vector<int32_t> &prompt, uint32_t count) {
        std::lock_guard<std::mutex> lk(reference->mu);
        if (!n.ref || size_t(n.ref->pos()) != n.timeline.size()) ref_rebuild(n);
        std::vector<int32_t> all = n.timeline;
        all.insert(all.end(), prompt.begin(), prompt.end());
        n.ref->sync(all);
        std::vector<int32_t> out;
        for (uint32_t i = 0; i < count; ++i) {
            out.push_back(n.ref->argmax());
            n.ref->eval(out.back());
        }
        return out;
    }

    void extend(Name &n, const std::vector<int32_t> &prompt, const std::vector<int32_t> &gen) {
        n.timeline.insert(n.timeline.end(), prompt.begin(), prompt.end());
        n.seg_ends.push_back(n.timeline.size());
        for (int32_t t : gen) {
            n.timeline.push_back(t);
            n.seg_ends.push_back(n.timeline.size());
        }
    }

    // ---- the check at every open

    // Reconciles the tracked conversation with a session that holds n_tokens. Returns false
    // when the name cannot be continued (it is then renamed).
    bool reconcile(Name &n, uint32_t n_tokens, const char *when) {
        ++tally.reopen_checks;
        const uint32_t acked = n.acked_now();
        if (n_tokens < acked) {
            tally.fail(tally.lost, n.name + " " + when + ": holds " + std::to_string(n_tokens) + " tokens, " +
                                       std::to_string(acked) + " were acknowledged as stored");
            return false;
        }
        if (n_tokens > n.timeline.size()) {
            tally.fail(tally.unexplained, n.name + " " + when + ": holds " + std::to_string(n_tokens) +
                                              " tokens, the conversation reached at most " +
                                              std::to_string(n.timeline.size()));
            return false;
        }
        if (n_tokens < n.timeline.size()) {
            if (n.exact && !n.opened_since_restart) {
                // Shrinking without a restart in between: the live session lost turns.
                tally.fail(tally.unexplained, n.name + " " + when + ": holds " + std::to_string(n_tokens) +
                                                  " tokens without a restart, expected " +
                                                  std::to_string(n.timeline.size()));
                return false;
            }
            if (n.exact) ++tally.rolled_back;   // unacknowledged turns lost with a kill: allowed
            n.timeline.resize(n_tokens);
            while (!n.seg_ends.empty() && n.seg_ends.back() > n_tokens) n.seg_ends.pop_back();
            if (n.seg_ends.empty() ? n_tokens > 0 : n.seg_ends.back() != n_tokens) n.seg_ends.push_back(n_tokens);
        }
        n.exact = true;
        n.opened_since_restart = false;
        return true;
    }

    void rename(Client *c, Name &n) {
        if (c) {
            try {
                t_op = "DeleteSession";
                c->delete_session(n.name);
                tally.ok("DeleteSession");
            } catch (const ds4::client::ServerError &e) {
                tally.error(e.code_name, e.server_message);
            } catch (const std::exception &) {
                tally.error("connection");
            }
        }
        {
            std::lock_guard<std::mutex> rl(reference->mu);   // the model's executor is shared
            n.ref.reset();
        }
        std::lock_guard<std::mutex> lk(n.data_mu);
        ++n.gen;
        n.name = "soak-" + std::to_string(n.index) + "-g" + std::to_string(n.gen);
        n.acked = 0;
        n.timeline.clear();
        n.seg_ends.clear();
        n.exact = true;
        ++tally.renamed;
    }

    // ---- one named turn (turn_mu held by the caller)

    void named_turn(std::unique_ptr<Client> &c, Name &n, std::mt19937_64 &rng, bool allow_chaos) {
        std::uniform_int_distribution<int> tok(0, vocab - 1);
        std::vector<int32_t> prompt(size_t(1 + rng() % 8));
        for (auto &t : prompt) t = tok(rng);
        const uint32_t max_tokens = uint32_t(4 + rng() % 13);
        if (n.timeline.size() + prompt.size() + max_tokens + 4 > opt.ctx) {
            rename(c.get(), n);
            return;
        }
        t_op = "OpenSession";
        const ds4::client::SessionInfo info = c->open_session(n.name, opt.ctx);
        tally.ok("OpenSession");
        if (!info.evicted.empty()) tally.error("evicted-notice");
        if (!reconcile(n, info.n_tokens, "at open")) {
            rename(c.get(), n);
            return;
        }
        const int mode = allow_chaos ? int(rng() % 100) : 99;
        std::vector<int32_t> got;
        bool certain = false;
        uint32_t generated = 0;
        if (mode < 6) {
            // Abrupt disconnect: a second connection runs the turn and closes mid-stream.
            tally.ok("AbruptDisconnect");
            Raw r(daemon.socket);
            if (r.hello() && r.send([&](auto &fbb) {
                    ds4::ipc::finish_frame(fbb, 2, fb::CreateOpenSessionDirect(fbb, n.name.c_str(), opt.ctx));
                })) {
                const fb::Envelope *e = r.next();
                if (e && e->body_type() == fb::Message::SessionOpened) {
                    const uint64_t sid = e->body_as_SessionOpened()->session();
                    r.send([&](auto &fbb) {
                        ds4::ipc::finish_frame(fbb, 3,
                                               fb::CreateGenerateDirect(fbb, sid, nullptr, &prompt, nullptr, true, false, 0,
                                                                        max_tokens, nullptr, nullptr, true, false));
                    });
                    if (const fb::Envelope *ch = r.next(); ch && ch->body_type() == fb::Message::TokenChunk)
                        if (auto *v = ch->body_as_TokenChunk()->tokens()) got.assign(v->begin(), v->end());
                }
            }
            close(r.fd);
            r.fd = -1;
            // Let ds4d see the close before this name is opened again (the turn stops then).
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        } else {
            ds4::client::GenerateRequest req;
            req.session = info.id;
            req.kind = ds4::client::GenerateRequest::Prompt::Tokens;
            req.tokens = prompt;
            req.max_tokens = max_tokens;
            req.ignore_eos = true;
            const size_t cancel_after = mode < 16 ? size_t(1 + rng() % 4) : SIZE_MAX;
            ds4::client::GenerateCallbacks cb;
            cb.on_chunk = [&](const ds4::client::Chunk &ch) {
                got.insert(got.end(), ch.tokens.begin(), ch.tokens.end());
                return got.size() < cancel_after;
            };
            t_op = "Generate(named)";
            try {
                const ds4::client::DoneInfo d = c->generate(req, cb);
                tally.ok(cancel_after != SIZE_MAX && d.reason == ds4::client::FinishReason::Cancelled ? "Generate(cancelled)"
                                                                                                   : "Generate(named)");
                generated = d.generated_tokens;
                certain = true;
                if (generated != got.size()) {
                    tally.fail(tally.wrong, n.name + ": Done says " + std::to_string(generated) + " tokens, " +
                                                std::to_string(got.size()) + " streamed");
                    certain = false;
                }
            } catch (const ds4::client::ServerError &e) {
                tally.error(e.code_name, e.server_message);
                if (got.empty()) return;   // refused before it ran: the session is unchanged
                c.reset();
            } catch (const std::exception &) {
                tally.error("connection");
                c.reset();
            }
        }
        // The prediction: all of it when the outcome is uncertain (the session may hold any
        // prefix of it), the generated count when Done said.
        const std::vector<int32_t> expect = ref_turn(n, prompt, certain ? generated : max_tokens);
        for (size_t i = 0; i < got.size(); ++i)
            if (i >= expect.size() || got[i] != expect[i]) {
                tally.fail(tally.wrong, n.name + ": token " + std::to_string(i) + " of a turn at " +
                                            std::to_string(n.timeline.size()) + " is " + std::to_string(got[i]) +
                                            ", the reference says " +
                                            (i < expect.size() ? std::to_string(expect[i]) : std::string("nothing")));
                break;
            }
        ++tally.verified_turns;
        extend(n, prompt, expect);
        n.exact = certain;
        if (!certain || !c) return;
        if (rng() % 100 < 35) {
            t_op = "SaveSession";
            const ds4::client::SavedSession s = c->save_session(n.name);
            tally.ok("SaveSession");
            if (s.n_tokens != n.timeline.size()) {
                tally.fail(tally.unexplained, n.name + ": SaveSession stored " + std::to_string(s.n_tokens) +
                                                  " tokens, the conversation holds " + std::to_string(n.timeline.size()));
                return;
            }
            std::lock_guard<std::mutex> lk(n.data_mu);
            n.acked = std::max(n.acked, s.n_tokens);
        }
    }

    void note_listing(const std::vector<ds4::client::StoredSession> &list) {
        for (const auto &s : list) {
            if (s.stored_tokens == 0 || s.name.rfind("soak-", 0) != 0) continue;
            const int idx = std::atoi(s.name.c_str() + 5);
            if (idx < 0 || idx >= int(names.size())) continue;
            Name &n = *names[size_t(idx)];
            std::lock_guard<std::mutex> lk(n.data_mu);
            if (n.name == s.name) n.acked = std::max(n.acked, s.stored_tokens);
        }
    }

    // ---- a client

    void client_loop(int id) {
        std::mt19937_64 rng(opt.seed * 1000003 + uint64_t(id));
        std::unique_ptr<Client> c;
        std::uniform_int_distribution<int> tok(0, vocab - 1);
        while (!stop) {
            try {
                t_op = "connect";
                if (!c) c = std::make_unique<Client>(daemon.socket, "soak-" + std::to_string(id));
                const int r = int(rng() % 100);
                if (r < 50) {
                    Name &n = *names[rng() % names.size()];
                    std::unique_lock<std::mutex> lk(n.turn_mu, std::try_to_lock);
                    if (!lk.owns_lock()) continue;
                    named_turn(c, n, rng, true);
                } else if (r < 70) {
                    ds4::client::GenerateRequest req;
                    if (rng() % 2) {
                        req.kind = ds4::client::GenerateRequest::Prompt::Text;
                        req.text = "def f" + std::to_string(rng() % 1000) + "(x):\n    return";
                    } else {
                        req.kind = ds4::client::GenerateRequest::Prompt::Tokens;
                        req.tokens.resize(1 + rng() % 24);
                        for (auto &t : req.tokens) t = tok(rng);
                    }
                    req.max_tokens = uint32_t(1 + rng() % 24);
                    req.temperature = rng() % 2 ? 0.0f : 0.8f;
                    req.seed = rng();
                    const bool do_cancel = rng() % 5 == 0;
                    ds4::client::GenerateCallbacks cb;
                    cb.on_chunk = [&](const ds4::client::Chunk &) { return !do_cancel; };
                    if (rng() % 8 == 0) {
                        // Abrupt disconnect of a one-shot generation.
                        Raw raw(daemon.socket);
                        if (raw.hello()) {
                            raw.send([&](auto &fbb) {
                                ds4::ipc::finish_frame(fbb, 2,
                                                       fb::CreateGenerateDirect(fbb, 0, nullptr, &req.tokens, nullptr, true,
                                                                                false, 0, 64, nullptr, nullptr, true, false));
                            });
                            raw.next();
                        }
                        tally.ok("AbruptDisconnect");
                        continue;
                    }
                    t_op = "Generate(one-shot)";
                    c->generate(req, cb);
                    tally.ok(do_cancel ? "Generate(cancelled)" : "Generate(one-shot)");
                } else if (r < 78) {
                    t_op = "ListSessions";
                    note_listing(c->list_sessions());
                    tally.ok("ListSessions");
                } else if (r < 86) {
                    t_op = "Stats";
                    c->stats();
                    tally.ok("Stats");
                } else {
                    std::string text;
                    const size_t len = rng() % 64;
                    for (size_t i = 0; i < len; ++i) text.push_back(char(rng() % 4 ? 'a' + rng() % 26 : " \n\t.,(){}"[rng() % 9]));
                    t_op = "Tokenize";
                    c->tokenize(text, rng() % 2);
                    tally.ok("Tokenize");
                }
            } catch (const ds4::client::ServerError &e) {
                tally.error(e.code_name, e.server_message);
            } catch (const ds4::bridge::BridgeError &e) {
                tally.fail(tally.unexplained, std::string("reference: ") + e.what());
            } catch (const std::exception &) {
                // The daemon was killed (or refused the connection): wait and reconnect.
                tally.error("connection");
                c.reset();
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
            }
        }
    }

    // ---- after a restart: every name holds at least its acknowledged history

    void check_all(const char *when, bool with_turn) {
        std::unique_ptr<Client> c;
        std::mt19937_64 rng(opt.seed ^ 0x5eed);
        for (auto &np : names) {
            Name &n = *np;
            std::lock_guard<std::mutex> lk(n.turn_mu);
            for (int attempt = 0; attempt < 50; ++attempt) {
                try {
                    t_op = "connect";
                    if (!c) c = std::make_unique<Client>(daemon.socket, "soak-check");
                    if (with_turn) {
                        named_turn(c, n, rng, false);
                    } else {
                        t_op = "OpenSession(check)";
                        const auto info = c->open_session(n.name, opt.ctx);
                        if (!reconcile(n, info.n_tokens, when)) rename(c.get(), n);
                    }
                    break;
                } catch (const ds4::client::ServerError &e) {
                    tally.error(e.code_name, e.server_message);
                    std::this_thread::sleep_for(std::chrono::milliseconds(100));
                } catch (const std::exception &) {
                    tally.error("connection");
                    c.reset();
                    std::this_thread::sleep_for(std::chrono::milliseconds(100));
                }
            }
        }
    }

    void restart(const char *why) {
        if (!daemon.kill9()) {
            ++unexpected_deaths;
            tally.fail(tally.unexplained, "ds4d died without our kill; see " + daemon.log);
        }
        // Nothing is open on the new daemon: the next open of each name may see older state.
        for (auto &np : names) np->opened_since_restart = true;
        daemon.start();
        ++restarts;
        std::fprintf(stderr, "%s kill -9 and restart #%d (%s)\n", now_s(t0).c_str(), restarts.load(), why);
    }

    int run() {
        fs::path tmp = fs::temp_directory_path() / ("ds4-soak-" + std::to_string(getpid()));
        fs::create_directories(tmp);
        daemon.opt = opt;
        daemon.dir = tmp.string();
        daemon.socket = (tmp / "ds4.sock").string();
        daemon.log = (tmp / "ds4d.log").string();
        if (opt.state_dir.empty()) opt.state_dir = (tmp / "state").string();
        daemon.opt.state_dir = opt.state_dir;
        if (opt.model.empty()) {
            opt.model = (tmp / "tiny.gguf").string();
            const std::string cmd = "'" + opt.make_model + "' --preset tiny --quiet '" + opt.model + "'";
            if (std::system(cmd.c_str()) != 0) throw std::runtime_error("ds4-make-model failed: " + cmd);
        }
        daemon.opt.model = opt.model;
        reference = std::make_unique<Reference>(opt.model);
        vocab = reference->model.vocab_size();
        for (int i = 0; i < opt.names; ++i) {
            auto n = std::make_unique<Name>();
            n->index = i;
            n->name = "soak-" + std::to_string(i) + "-g0";
            names.push_back(std::move(n));
        }
        std::fprintf(stderr,
                     "ds4-soak: %.0f s, %d clients, %d named sessions over --max-sessions %d, kill -9 every %d s; "
                     "ds4d log %s\n",
                     opt.seconds, opt.clients, opt.names, opt.max_sessions, opt.kill_every, daemon.log.c_str());
        t0 = Clock::now();
        daemon.start();

        std::thread sampler([&] {
            while (!stop) {
                const pid_t p = daemon.pid.load();
                if (p > 0) {
                    const long kb = rss_kb(p);
                    if (kb > 0) {
                        std::lock_guard<std::mutex> lk(rss_mu);
                        rss.emplace_back(std::chrono::duration<double>(Clock::now() - t0).count(), kb);
                    }
                }
                std::this_thread::sleep_for(std::chrono::milliseconds(opt.rss_every_ms));
            }
        });
        std::vector<std::thread> clients;
        for (int i = 0; i < opt.clients; ++i) clients.emplace_back([this, i] { client_loop(i); });

        const auto end = t0 + std::chrono::milliseconds(int64_t(opt.seconds * 1000));
        auto next_kill = t0 + std::chrono::seconds(opt.kill_every);
        while (Clock::now() < end) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            const pid_t p = daemon.pid.load();
            if (p > 0 && waitpid(p, nullptr, WNOHANG) == p) {
                daemon.pid = -1;
                ++unexpected_deaths;
                tally.fail(tally.unexplained, "ds4d died without our kill; see " + daemon.log);
                daemon.start();
            }
            if (Clock::now() >= next_kill && Clock::now() + std::chrono::seconds(5) < end) {
                restart("scheduled");
                check_all("after restart", false);
                next_kill += std::chrono::seconds(opt.kill_every);   // a fixed rate, whatever the check took
            }
        }
        stop = true;
        for (auto &t : clients) t.join();
        sampler.join();
        // Final: one more kill, then a verified turn on every name.
        restart("final");
        const uint64_t before_final = tally.verified_turns.load();
        check_all("after final restart", true);
        const uint64_t final_verified = tally.verified_turns.load() - before_final;
        const int term_rc = daemon.term();
        const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
        report(secs, term_rc, final_verified);
        const bool bad = tally.lost || tally.wrong || tally.unexplained || unexpected_deaths || term_rc != 0 ||
                         tally.verified_turns == 0;
        if (opt.keep || bad) std::printf("kept %s (ds4d.log, state/)\n", tmp.c_str());
        else fs::remove_all(tmp);
        return bad ? 1 : 0;
    }

    static std::pair<long, long> median_max(std::vector<long> v) {
        if (v.empty()) return {0, 0};
        std::sort(v.begin(), v.end());
        return {v[v.size() / 2], v.back()};
    }

    void report(double secs, int term_rc, uint64_t final_verified) {
        std::lock_guard<std::mutex> lk(tally.mu);
        std::printf("ds4-soak report: %.0f s, %d clients, %d names, --max-sessions %d, %d kill -9 + restarts\n", secs,
                    opt.clients, opt.names, opt.max_sessions, restarts.load());
        uint64_t total = 0;
        for (auto &[k, v] : tally.served) total += v;
        std::printf("requests served: %llu\n", (unsigned long long)total);
        for (auto &[k, v] : tally.served) std::printf("  %-36s %llu\n", k.c_str(), (unsigned long long)v);
        std::printf("errors by code:\n");
        for (auto &[k, v] : tally.errors) {
            auto it = tally.error_sample.find(k);
            std::printf("  %-36s %llu%s%s\n", k.c_str(), (unsigned long long)v, it == tally.error_sample.end() ? "" : "  e.g. ",
                        it == tally.error_sample.end() ? "" : it->second.c_str());
        }
        std::printf("named turns verified against the reference: %llu; session opens checked: %llu\n",
                    (unsigned long long)tally.verified_turns.load(), (unsigned long long)tally.reopen_checks.load());
        std::printf("names continued exactly after the final kill -9: %llu of %zu\n", (unsigned long long)final_verified,
                    names.size());
        std::printf("unacknowledged turns rolled back by kills (allowed): %llu; names renamed (full/failed): %llu\n",
                    (unsigned long long)tally.rolled_back.load(), (unsigned long long)tally.renamed.load());
        std::printf("LOST acknowledged turns: %llu\nWRONG continuations: %llu\nunexplained states: %llu\n"
                    "unexpected ds4d deaths: %d\nclean shutdown exit status: %d\n",
                    (unsigned long long)tally.lost.load(), (unsigned long long)tally.wrong.load(),
                    (unsigned long long)tally.unexplained.load(), unexpected_deaths.load(), term_rc);
        std::lock_guard<std::mutex> lr(rss_mu);
        if (!rss.empty()) {
            const double last = rss.back().first;
            std::vector<long> first_min, last_min, all;
            std::map<int, std::vector<long>> per_min;
            for (auto &[t, kb] : rss) {
                all.push_back(kb);
                if (t < 60) first_min.push_back(kb);
                if (t > last - 60) last_min.push_back(kb);
                per_min[int(t / 60)].push_back(kb);
            }
            auto [m1, x1] = median_max(first_min);
            auto [m2, x2] = median_max(last_min);
            std::printf("ds4d RSS (%zu samples every %d ms): first minute median %.1f MB max %.1f MB; last minute median "
                        "%.1f MB max %.1f MB; overall max %.1f MB\n",
                        rss.size(), opt.rss_every_ms, m1 / 1024.0, x1 / 1024.0, m2 / 1024.0, x2 / 1024.0,
                        median_max(all).second / 1024.0);
            std::printf("  per minute (median/max MB):");
            for (auto &[m, v] : per_min) {
                auto [md, mx] = median_max(v);
                std::printf(" [%d] %.1f/%.1f", m, md / 1024.0, mx / 1024.0);
            }
            std::printf("\n");
        }
        for (auto &f : tally.failures) std::printf("failure: %s\n", f.c_str());
    }
};

}  // namespace

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    if (ds4_wants_version(argc, argv)) {
        ds4_print_version("ds4-soak");
        return 0;
    }
    Soak s;
    s.opt = parse(argc, argv);
    try {
        return s.run();
    } catch (const std::exception &e) {
        std::fprintf(stderr, "ds4-soak: %s\n", e.what());
        s.daemon.kill9();
        return 1;
    }
}
