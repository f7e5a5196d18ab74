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
#include <map>
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

// Reads one frame from a raw connection, keeping descriptors passed with it.
struct FdConn : RawConn {
    std::vector<int> fds;
    using RawConn::RawConn;
    ~FdConn() {
        for (int f : fds) close(f);
    }
    const fb::Envelope *next_with_fds() {
        for (;;) {
            auto st = dec.next();
            if (st == ds4::ipc::FrameDecoder::Status::Frame) return dec.envelope();
            if (st == ds4::ipc::FrameDecoder::Status::Error) return nullptr;
            uint8_t buf[4096];
            alignas(cmsghdr) char ctl[CMSG_SPACE(8 * sizeof(int))];
            iovec iov{buf, sizeof buf};
            msghdr msg{};
            msg.msg_iov = &iov;
            msg.msg_iovlen = 1;
            msg.msg_control = ctl;
            msg.msg_controllen = sizeof ctl;
            pollfd p{fd, POLLIN, 0};
            if (poll(&p, 1, 15000) <= 0) return nullptr;
            const ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
            if (n <= 0) return nullptr;
            for (cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
                for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++i) {
                    int f;
                    std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
                    fds.push_back(f);
                }
            dec.feed(buf, size_t(n));
        }
    }
};

// ------------------------------------------------------------------ the C importer

// The C importer (drafter_importer.c) as a child: its output up to "ready", then it waits
// for finish().
struct ImporterProcess {
    pid_t pid = -1;
    int in = -1, out = -1;
    std::map<std::string, std::string> lines;  // first word -> rest
    explicit ImporterProcess(const std::vector<std::string> &args) {
        int pin[2], pout[2];
        if (pipe2(pin, O_CLOEXEC) != 0 || pipe2(pout, O_CLOEXEC) != 0) return;
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, pin[0], 0);
        posix_spawn_file_actions_adddup2(&fa, pout[1], 1);
        std::vector<char *> argv;
        for (const auto &a : args) argv.push_back(const_cast<char *>(a.c_str()));
        argv.push_back(nullptr);
        if (posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid = -1;
        posix_spawn_file_actions_destroy(&fa);
        close(pin[0]);
        close(pout[1]);
        in = pin[1];
        out = pout[0];
    }
    bool wait_ready() {
        std::string buf;
        char b[4096];
        for (;;) {
            pollfd p{out, POLLIN, 0};
            if (poll(&p, 1, 60000) <= 0) return false;
            const ssize_t n = read(out, b, sizeof b);
            if (n <= 0) return false;
            buf.append(b, size_t(n));
            size_t nl;
            while ((nl = buf.find('\n')) != std::string::npos) {
                const std::string line = buf.substr(0, nl);
                buf.erase(0, nl + 1);
                if (line == "ready") return true;
                const size_t sp = line.find(' ');
                lines[line.substr(0, sp)] = sp == std::string::npos ? "" : line.substr(sp + 1);
            }
        }
    }
    // Decodes once more (drafter_importer.c's "again"); lines["tokens"] is the new output.
    bool again() {
        if (in < 0 || write(in, "again\n", 6) != 6) return false;
        return wait_ready();
    }
    int finish() {
        if (in >= 0) (void)!write(in, "\n", 1), close(in), in = -1;
        if (out >= 0) close(out), out = -1;
        int st = 0;
        if (pid > 0 && waitpid(pid, &st, 0) != pid) return -1;
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    ~ImporterProcess() {
        if (pid > 0) kill(pid, SIGKILL);
        finish();
    }
};

}  // namespace e2e
