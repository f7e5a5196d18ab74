// Helpers for the ds4d end-to-end tests: a temporary directory, a real ds4d child process,
// a raw socket connection that speaks frames directly, and the in-process reference
// generator that calls the bridge the way the daemon schedules it.
#pragma once
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ipc/frame.h"

namespace e2e {

namespace fb = ds4::ipc::fb;
using Clock = std::chrono::steady_clock;

inline std::string read_file(const std::string &p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

struct TempDir {
    std::string path;
    TempDir() {
        char tmpl[] = "/tmp/ds4d-e2e-XXXXXX";
        path = mkdtemp(tmpl);
    }
    ~TempDir() { std::filesystem::remove_all(path); }
};

extern "C" char **environ;

// Runs argv with stdout/stderr redirected to files; returns the pid.
inline pid_t spawn(const std::vector<std::string> &argv, const std::string &out_path, const std::string &err_path,
                   const std::string &in_path = "") {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, in_path.empty() ? "/dev/null" : in_path.c_str(), O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<char *> av;
    for (const auto &a : argv) av.push_back(const_cast<char *>(a.c_str()));
    av.push_back(nullptr);
    pid_t pid = -1;
    int rc = posix_spawn(&pid, av[0], &fa, nullptr, av.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    return rc == 0 ? pid : -1;
}

// Waits for pid up to timeout; returns the exit status, or -1000 - signal, or -1 on timeout.
inline int wait_exit(pid_t pid, int timeout_ms) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
        int st = 0;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1000 - WTERMSIG(st);
        if (Clock::now() > deadline) return -1;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
}

struct CmdResult {
    int rc = -1;
    std::string out, err;
};

inline CmdResult run_cmd(const std::vector<std::string> &argv, const std::string &dir, const std::string &stdin_text = "",
                         int timeout_ms = 60000) {
    static int n = 0;
    const std::string base = dir + "/cmd" + std::to_string(n++);
    std::string in;
    if (!stdin_text.empty()) {
        in = base + ".in";
        std::ofstream(in) << stdin_text;
    }
    CmdResult r;
    pid_t pid = spawn(argv, base + ".out", base + ".err", in);
    if (pid < 0) return r;
    r.rc = wait_exit(pid, timeout_ms);
    if (r.rc == -1) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
    }
    r.out = read_file(base + ".out");
    r.err = read_file(base + ".err");
    return r;
}

inline bool can_connect(const std::string &path) {
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
    bool ok = connect(s, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0;
    close(s);
    return ok;
}

// A ds4d child process.
struct Daemon {
    pid_t pid = -1;
    std::string socket, log;

    // Starts ds4d and waits until its socket accepts connections. Empty string on success,
    // else what went wrong (with the daemon's log).
    std::string start(const std::string &exe, const std::string &model, const std::string &sock,
                      const std::string &log_path, std::vector<std::string> extra = {}) {
        socket = sock;
        log = log_path;
        std::vector<std::string> argv = {exe, "--model", model, "--socket", sock, "--backend", "cpu", "--threads", "1"};
        // Tests that do not name a state dir run without a store (the default one is shared).
        if (std::find(extra.begin(), extra.end(), "--state-dir") == extra.end()) extra.push_back("--no-store");
        argv.insert(argv.end(), extra.begin(), extra.end());
        pid = spawn(argv, log_path + ".out", log_path);
        if (pid < 0) return "cannot spawn " + exe;
        const auto deadline = Clock::now() + std::chrono::seconds(60);
        while (Clock::now() < deadline) {
            int st = 0;
            if (waitpid(pid, &st, WNOHANG) == pid) {
                pid = -1;
                return "ds4d exited during start-up:\n" + read_file(log_path);
            }
            if (can_connect(sock)) return "";
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        return "ds4d did not listen within 60 s:\n" + read_file(log_path);
    }

    // Sends sig and returns the exit status (see wait_exit).
    int stop(int sig = SIGTERM, int timeout_ms = 20000) {
        if (pid < 0) return -2;
        kill(pid, sig);
        int rc = wait_exit(pid, timeout_ms);
        if (rc == -1) {
            kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
        }
        pid = -1;
        return rc;
    }

    ~Daemon() {
        if (pid > 0) stop(SIGKILL, 5000);
    }
};

// ------------------------------------------------------------------ frames

template <class F> std::vector<uint8_t> frame(F build) {
    flatbuffers::FlatBufferBuilder fbb;
    build(fbb);
    return ds4::ipc::frame_bytes(fbb);
}

inline std::vector<uint8_t> hello_frame(uint64_t rid = 1, uint32_t version = ds4::ipc::kProtocolVersion) {
    return frame([&](auto &fbb) { ds4::ipc::finish_frame(fbb, rid, fb::CreateHelloDirect(fbb, version, "e2e-raw")); });
}

inline std::vector<uint8_t> generate_tokens_frame(uint64_t rid, const std::vector<int32_t> &toks, uint32_t max_tokens,
                                                  bool ignore_eos, uint64_t session = 0, bool progress = false) {
    return frame([&](auto &fbb) {
        ds4::ipc::finish_frame(fbb, rid,
                               fb::CreateGenerateDirect(fbb, session, nullptr, &toks, nullptr, true, false, 0, max_tokens,
                                                        nullptr, nullptr, ignore_eos, progress));
    });
}

inline std::vector<uint8_t> stats_frame(uint64_t rid) {
    return frame([&](auto &fbb) { ds4::ipc::finish_frame(fbb, rid, fb::CreateStats(fbb)); });
}

// A connection that speaks raw frames, for error paths and slow readers.
struct RawConn {
    int fd = -1;
    ds4::ipc::FrameDecoder dec;
    bool eof = false;

    explicit RawConn(const std::string &path) {
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_un a{};
        a.sun_family = AF_UNIX;
        std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
        if (connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
            close(fd);
            fd = -1;
        }
    }
    ~RawConn() {
        if (fd >= 0) close(fd);
    }

    bool ok() const { return fd >= 0; }

    bool send(const std::vector<uint8_t> &b) { return send(b.data(), b.size()); }
    bool send(const void *p, size_t n) {
        const char *c = static_cast<const char *>(p);
        while (n) {
            ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
            if (w <= 0) return false;
            c += w;
            n -= size_t(w);
        }
        return true;
    }

    // Next frame, or nullptr at EOF / timeout (then eof tells which).
    const fb::Envelope *next(int timeout_ms = 15000) {
        const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
        for (;;) {
            auto st = dec.next();
            if (st == ds4::ipc::FrameDecoder::Status::Frame) return dec.envelope();
            if (st == ds4::ipc::FrameDecoder::Status::Error) return nullptr;
            const int left = int(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
            if (left <= 0) return nullptr;
            pollfd p{fd, POLLIN, 0};
            if (poll(&p, 1, left) <= 0) continue;
            char buf[65536];
            ssize_t r = recv(fd, buf, sizeof buf, 0);
            if (r <= 0) {
                eof = true;
                return nullptr;
            }
            dec.feed(reinterpret_cast<const uint8_t *>(buf), size_t(r));
        }
    }

    // True when the peer closes the connection within timeout (frames before it are skipped).
    bool closed_by_peer(int timeout_ms = 15000) {
        while (next(timeout_ms) != nullptr) {
        }
        return eof;
    }

    bool hello() {
        if (!send(hello_frame())) return false;
        const fb::Envelope *e = next();
        return e && e->body_type() == fb::Message::HelloOk;
    }
};

}  // namespace e2e
