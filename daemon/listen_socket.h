// The daemon's socket file: an advisory lock beside it (PATH.lock) so two daemons never
// race for one path, a live socket is never stolen, a stale one is replaced, and the new
// socket is created with mode 0600. Files another user planted at these paths (a lock, a
// symlink, a listening socket) are refused with their owner named, never followed.
#pragma once
#include <sys/types.h>

#include <stdexcept>
#include <string>

namespace ds4::daemon {

struct StartupError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// For a socket in the fallback directory (/tmp/ds4-$UID): creates that directory with mode
// 0700 and checks it is ours and private. Other paths are the caller's choice: untouched.
void prepare_socket_dir(const std::string &socket_path);

// Holds an exclusive flock on PATH.lock for its lifetime. The lock file is opened without
// following symlinks and must be a regular file owned by this uid.
class SocketLock {
public:
    explicit SocketLock(const std::string &socket_path);  // throws StartupError when held elsewhere
    ~SocketLock();
    SocketLock(const SocketLock &) = delete;
    SocketLock &operator=(const SocketLock &) = delete;

private:
    int fd_ = -1;
};

// Throws StartupError when a daemon answers on path, or path is something other than a
// socket, or belongs to another user; removes a socket file nobody listens on.
void clear_stale_socket(const std::string &path);

class ListenSocket {
public:
    // Binds and listens on path (which must not exist), mode 0600. Non-blocking, close-on-exec.
    ListenSocket(const std::string &path, int backlog);
    // Takes over a socket that is already bound and listening (socket activation): the
    // file belongs to whoever bound it (systemd), so it is never removed here.
    struct Adopt {};
    ListenSocket(Adopt, int fd, const std::string &path);
    ~ListenSocket();  // closes the fd if still owned and removes the file if it is still ours
    ListenSocket(const ListenSocket &) = delete;
    ListenSocket &operator=(const ListenSocket &) = delete;

    int fd() const { return fd_; }
    // Hands the fd to another owner (libuv), which closes it.
    int release_fd();
    // Removes the socket file if it is still the one this object created.
    void remove_file();
    const std::string &path() const { return path_; }

private:
    std::string path_;
    int fd_ = -1;
    dev_t dev_ = 0;
    ino_t ino_ = 0;
    bool file_owned_ = false;
};

}  // namespace ds4::daemon
