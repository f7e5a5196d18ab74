// The gateway's bearer key: a random secret kept in the state directory (mode 0600, the
// directory 0700), created on first use. TCP on loopback is open to every local user,
// unlike ds4d's 0600 socket, so the HTTP front asks for this key by default.
#pragma once
#include <string>

namespace ds4::gateway {

// --state-dir, else $XDG_STATE_HOME/ds4, else $HOME/.local/state/ds4 (ds4d's rule).
// Empty when none resolves.
std::string resolve_state_dir(const std::string &given);

// Reads the key at path, creating it (and its directory) when missing. Throws
// std::runtime_error naming the path when the file is unreadable, empty, or readable by
// other users.
std::string load_or_create_key(const std::string &path);

// Constant-time comparison (the key must not leak through timing).
bool same_secret(const std::string &a, const std::string &b);

}  // namespace ds4::gateway
