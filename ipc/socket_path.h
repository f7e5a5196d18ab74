// Where ds4d listens unless told otherwise: $XDG_RUNTIME_DIR/ds4.sock, else /tmp/ds4-$UID.sock.
#pragma once
#include <string>

namespace ds4::ipc {

std::string default_socket_path();

// sun_path holds 107 bytes plus the NUL; longer paths cannot be bound or connected.
inline constexpr size_t kMaxSocketPath = 107;

}  // namespace ds4::ipc
