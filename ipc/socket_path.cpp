#include "ipc/socket_path.h"

#include <unistd.h>

#include <cstdlib>

namespace ds4::ipc {

std::string default_socket_path() {
    const char *xdg = std::getenv("XDG_RUNTIME_DIR");
    if (xdg && *xdg) return std::string(xdg) + "/ds4.sock";
    return "/tmp/ds4-" + std::to_string(getuid()) + ".sock";
}

}  // namespace ds4::ipc
