#include "daemon/listen_socket.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "ipc/socket_path.h"

namespace ds4::daemon {
namespace {

sockaddr_un make_addr(const std::string &path) {
    if (path.empty() || path.size() > ipc::kMaxSocketPath)
        throw StartupError("socket path must be 1.." + std::to_string(ipc::kMaxSocketPath) + " bytes: \"" + path + "\"");
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.data(), path.size());
    return a;
}

std::string errno_text(int e) { return std::strerror(e); }

std::string owner_note(const std::string &path) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return {};
    return " (it belongs to uid " + std::to_string(st.st_uid) + "; ds4d runs as uid " + std::to_string(::geteuid()) + ")";
}

}  // namespace

void prepare_socket_dir(const std::string &socket_path) {
    const std::string dir = ipc::parent_dir(socket_path);
    if (dir != ipc::fallback_socket_dir()) return;
    const std::string err = ipc::make_private_dir(dir, ::geteuid());
    if (!err.empty()) throw StartupError(err);
}

SocketLock::SocketLock(const std::string &socket_path) {
    const std::string lock_path = socket_path + ".lock";
    // O_NOFOLLOW: a symlink planted here would otherwise make us create or lock its target;
    // O_NONBLOCK: a FIFO planted here would block the open (it is refused below).
    fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
    if (fd_ < 0) {
        const int e = errno;
        if (e == ELOOP)
            throw StartupError("lock file " + lock_path + " is a symbolic link" + owner_note(lock_path) +
                               "; refusing to follow it. Remove it, or use another --socket");
        throw StartupError("cannot open lock file " + lock_path + ": " + errno_text(e) + owner_note(lock_path));
    }
    struct stat st {};
    std::string bad;
    if (::fstat(fd_, &st) != 0) bad = "cannot stat lock file " + lock_path + ": " + errno_text(errno);
    else if (!S_ISREG(st.st_mode)) bad = "lock file " + lock_path + " is not a regular file; refusing to use it";
    else if (st.st_uid != ::geteuid())
        bad = "lock file " + lock_path + " belongs to uid " + std::to_string(st.st_uid) + ", not to uid " +
              std::to_string(::geteuid()) + " (ds4d); another user may be squatting the socket path. Remove it, " +
              "or use another --socket";
    if (!bad.empty()) {
        ::close(fd_);
        fd_ = -1;
        throw StartupError(bad);
    }
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
        const int e = errno;
        ::close(fd_);
        fd_ = -1;
        if (e == EWOULDBLOCK)
            throw StartupError("another ds4d is running on " + socket_path + " (it holds " + lock_path + ")");
        throw StartupError("cannot lock " + lock_path + ": " + errno_text(e));
    }
}

SocketLock::~SocketLock() {
    if (fd_ >= 0) ::close(fd_);
}

void clear_stale_socket(const std::string &path) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
        if (errno == ENOENT) return;
        throw StartupError("cannot stat " + path + ": " + errno_text(errno));
    }
    if (!S_ISSOCK(st.st_mode)) throw StartupError(path + " exists and is not a socket; refusing to replace it");
    if (st.st_uid != ::geteuid())
        throw StartupError("socket " + path + " belongs to uid " + std::to_string(st.st_uid) + ", not to uid " +
                           std::to_string(::geteuid()) + " (ds4d); another user may be squatting it. Not using it");
    sockaddr_un addr = make_addr(path);
    int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) throw StartupError("socket(): " + errno_text(errno));
    int rc = ::connect(s, reinterpret_cast<sockaddr *>(&addr), sizeof addr);
    const int e = errno;
    ::close(s);
    if (rc == 0) throw StartupError("a ds4d is already listening on " + path + "; not taking it over");
    if (e != ECONNREFUSED) throw StartupError("cannot probe existing socket " + path + ": " + errno_text(e));
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
        throw StartupError("cannot remove stale socket " + path + ": " + errno_text(errno));
}

ListenSocket::ListenSocket(const std::string &path, int backlog) : path_(path) {
    sockaddr_un addr = make_addr(path);
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd_ < 0) throw StartupError("socket(): " + errno_text(errno));
    // The umask makes bind create the file 0600 from the start (no window with wider access).
    const mode_t old = ::umask(0177);
    int rc = ::bind(fd_, reinterpret_cast<sockaddr *>(&addr), sizeof addr);
    const int e = errno;
    ::umask(old);
    if (rc != 0) {
        ::close(fd_);
        fd_ = -1;
        throw StartupError("cannot bind " + path + ": " + errno_text(e));
    }
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
        dev_ = st.st_dev;
        ino_ = st.st_ino;
        file_owned_ = true;
    }
    if (::listen(fd_, backlog) != 0) {
        const int le = errno;
        remove_file();
        ::close(fd_);
        fd_ = -1;
        throw StartupError("cannot listen on " + path + ": " + errno_text(le));
    }
}

ListenSocket::ListenSocket(Adopt, int fd, const std::string &path) : path_(path), fd_(fd) {
    const int fl = ::fcntl(fd_, F_GETFL);
    if (fl < 0 || ::fcntl(fd_, F_SETFL, fl | O_NONBLOCK) != 0)
        throw StartupError("cannot make the passed socket non-blocking: " + errno_text(errno));
}

ListenSocket::~ListenSocket() {
    remove_file();
    if (fd_ >= 0) ::close(fd_);
}

int ListenSocket::release_fd() {
    int fd = fd_;
    fd_ = -1;
    return fd;
}

void ListenSocket::remove_file() {
    if (!file_owned_) return;
    file_owned_ = false;
    struct stat st {};
    if (::stat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) ::unlink(path_.c_str());
}

}  // namespace ds4::daemon
