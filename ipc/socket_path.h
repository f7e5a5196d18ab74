// Where ds4d listens unless told otherwise: $DS4_SOCKET, else $XDG_RUNTIME_DIR/ds4.sock, else
// /tmp/ds4-$UID/ds4.sock. The fallback lives in a directory of its own, mode 0700, so
// another local user can neither take the path first nor reach the socket (as ssh-agent
// and tmux do); ds4d creates it, and both sides check it before use.
#pragma once
#include <sys/types.h>

#include <string>

namespace ds4::ipc {

std::string default_socket_path();

// The fallback directory (/tmp/ds4-$UID): the parent of default_socket_path() when
// $XDG_RUNTIME_DIR is not set.
std::string fallback_socket_dir();

// "" when dir is a real directory (not a symlink) owned by `uid` with no group or other
// access; otherwise the problem as a sentence naming the path and its owner. A missing dir
// is reported as missing.
std::string check_private_dir(const std::string &dir, uid_t uid);

// Creates dir with mode 0700 when missing, then check_private_dir(). "" on success.
std::string make_private_dir(const std::string &dir, uid_t uid);

// The directory part of a socket path ("." when it has none).
std::string parent_dir(const std::string &path);

// sun_path holds 107 bytes plus the NUL; longer paths cannot be bound or connected.
inline constexpr size_t kMaxSocketPath = 107;

}  // namespace ds4::ipc
