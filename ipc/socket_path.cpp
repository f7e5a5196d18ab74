#include "ipc/socket_path.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ds4::ipc {

std::string fallback_socket_dir() { return "/tmp/ds4-" + std::to_string(::geteuid()); }

std::string default_socket_path() {
    const char *env = std::getenv("DS4_SOCKET");
    if (env && *env) return env;
    const char *xdg = std::getenv("XDG_RUNTIME_DIR");
    if (xdg && *xdg) return std::string(xdg) + "/ds4.sock";
    return fallback_socket_dir() + "/ds4.sock";
}

std::string parent_dir(const std::string &path) {
    const size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    if (slash == 0) return "/";
    return path.substr(0, slash);
}

std::string check_private_dir(const std::string &dir, uid_t uid) {
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0) {
        const int e = errno;
        return "cannot use socket directory " + dir + ": " + std::strerror(e);
    }
    if (S_ISLNK(st.st_mode))
        return "socket directory " + dir + " is a symbolic link; refusing to follow it (remove it if it is not yours)";
    if (!S_ISDIR(st.st_mode)) return "socket directory " + dir + " exists and is not a directory";
    if (st.st_uid != uid)
        return "socket directory " + dir + " belongs to uid " + std::to_string(st.st_uid) + ", not to uid " +
               std::to_string(uid) + "; another user may have created it to intercept ds4 (remove it, or set " +
               "$XDG_RUNTIME_DIR or --socket)";
    if (st.st_mode & 077) {
        char mode[8];
        std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
        return "socket directory " + dir + " has mode " + mode +
               "; it must not be accessible to group or others (chmod 700 " + dir + ")";
    }
    return {};
}

std::string make_private_dir(const std::string &dir, uid_t uid) {
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
        const int e = errno;
        return "cannot create socket directory " + dir + ": " + std::strerror(e);
    }
    return check_private_dir(dir, uid);
}

}  // namespace ds4::ipc
