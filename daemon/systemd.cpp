#include "daemon/systemd.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "daemon/listen_socket.h"

namespace ds4::daemon {
namespace {

constexpr int kListenFdsStart = 3;  // SD_LISTEN_FDS_START

bool parse_long(const char *s, long *out) {
    if (!s || !*s) return false;
    errno = 0;
    char *end = nullptr;
    const long v = std::strtol(s, &end, 10);
    if (errno || *end) return false;
    *out = v;
    return true;
}

}  // namespace

int systemd_listen_fd() {
    const char *pid_s = std::getenv("LISTEN_PID");
    const char *fds_s = std::getenv("LISTEN_FDS");
    long pid = 0, n = 0;
    if (!parse_long(pid_s, &pid) || pid != long(::getpid())) return -1;  // meant for another process
    ::unsetenv("LISTEN_PID");
    ::unsetenv("LISTEN_FDS");
    ::unsetenv("LISTEN_FDNAMES");
    if (!parse_long(fds_s, &n) || n <= 0) return -1;
    if (n != 1)
        throw StartupError("systemd passed " + std::to_string(n) +
                           " sockets (LISTEN_FDS); ds4d listens on exactly one: give ds4d.socket one ListenStream=");
    const int fd = kListenFdsStart;
    if (::fcntl(fd, F_SETFD, FD_CLOEXEC) != 0)
        throw StartupError("socket activation: fd 3 is not open: " + std::string(std::strerror(errno)));
    int type = 0, listening = 0;
    socklen_t len = sizeof type;
    sockaddr_storage ss{};
    socklen_t alen = sizeof ss;
    if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM ||
        ::getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &alen) != 0 || ss.ss_family != AF_UNIX)
        throw StartupError("socket activation: fd 3 is not a Unix stream socket (use ListenStream=/path in the .socket unit)");
    len = sizeof listening;
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening)
        throw StartupError("socket activation: fd 3 is not listening (Accept=no is required)");
    return fd;
}

bool systemd_notify(const std::string &state) {
    const char *path = std::getenv("NOTIFY_SOCKET");
    if (!path || !*path) return false;
    const size_t n = std::strlen(path);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (n >= sizeof addr.sun_path || (path[0] != '/' && path[0] != '@')) return false;
    std::memcpy(addr.sun_path, path, n);
    if (path[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
    const socklen_t alen = socklen_t(offsetof(sockaddr_un, sun_path) + n + (path[0] == '@' ? 0 : 1));
    const int s = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) return false;
    const ssize_t w = ::sendto(s, state.data(), state.size(), MSG_NOSIGNAL, reinterpret_cast<sockaddr *>(&addr), alen);
    ::close(s);
    return w == ssize_t(state.size());
}

std::string bound_socket_path(int fd) {
    sockaddr_un a{};
    socklen_t len = sizeof a;
    if (::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) != 0 || a.sun_family != AF_UNIX) return {};
    const size_t n = len > offsetof(sockaddr_un, sun_path) ? len - offsetof(sockaddr_un, sun_path) : 0;
    if (n == 0 || a.sun_path[0] == '\0') return {};
    return std::string(a.sun_path, strnlen(a.sun_path, n));
}

}  // namespace ds4::daemon
