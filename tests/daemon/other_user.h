// A second local user for the socket-security tests: a forked child that drops to
// nobody (uid/gid 65534) and runs a function there. Needs root; callers skip otherwise.
#pragma once
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>

namespace othuser {

inline constexpr uid_t kNobody = 65534;

inline bool can_switch_user() { return ::geteuid() == 0; }

// Child process running fn as nobody; fn's return value is the exit status. The child
// reports on `report` (a pipe's write end) what the parent wants to know.
struct Child {
    pid_t pid = -1;
    int ready = -1;   // read end: one byte when the child is set up
    int report = -1;  // read end: what the child wrote before exiting

    // fn gets the write ends (ready, report).
    explicit Child(const std::function<int(int ready_fd, int report_fd)> &fn) {
        int r[2], p[2];
        if (::pipe(r) != 0 || ::pipe(p) != 0) return;
        pid = ::fork();
        if (pid == 0) {
            ::close(r[0]);
            ::close(p[0]);
            if (::setgroups(0, nullptr) != 0 || ::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) ::_exit(90);
            ::_exit(fn(r[1], p[1]));
        }
        ::close(r[1]);
        ::close(p[1]);
        ready = r[0];
        report = p[0];
    }
    // True once the child signalled readiness (within timeout_ms).
    bool wait_ready(int timeout_ms = 10000) {
        pollfd pf{ready, POLLIN, 0};
        char c;
        return ::poll(&pf, 1, timeout_ms) == 1 && ::read(ready, &c, 1) == 1;
    }
    // Everything the child reported, once it exits (or timeout_ms passes).
    std::string read_report(int timeout_ms = 20000) {
        std::string out;
        char buf[4096];
        for (;;) {
            pollfd pf{report, POLLIN, 0};
            if (::poll(&pf, 1, timeout_ms) != 1) break;
            ssize_t n = ::read(report, buf, sizeof buf);
            if (n <= 0) break;
            out.append(buf, size_t(n));
        }
        return out;
    }
    // Exit status, or -1 when it had to be killed.
    int wait(int timeout_ms = 20000) {
        if (pid <= 0) return -1;
        for (int waited = 0;; waited += 10) {
            int st = 0;
            if (::waitpid(pid, &st, WNOHANG) == pid) {
                pid = -1;
                return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
            }
            if (waited >= timeout_ms) break;
            ::usleep(10000);
        }
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        pid = -1;
        return -1;
    }
    ~Child() {
        if (pid > 0) wait(0);
        if (ready >= 0) ::close(ready);
        if (report >= 0) ::close(report);
    }
};

inline void signal_ready(int fd) {
    const char c = 1;
    [[maybe_unused]] ssize_t w = ::write(fd, &c, 1);
}

// A listening socket at path, or -1.
inline int listen_at(const std::string &path) {
    int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
    if (::bind(s, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 || ::listen(s, 8) != 0) {
        ::close(s);
        return -1;
    }
    return s;
}

}  // namespace othuser
