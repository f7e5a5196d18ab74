#include "daemon/fd_limit.h"

#include <dirent.h>
#include <sys/resource.h>

namespace ds4::daemon {
namespace {

constexpr uint64_t kSpareFds = 32;  // store files, log, libuv's own, a save in flight

uint64_t open_fds() {
    uint64_t n = 0;
    if (DIR *d = ::opendir("/proc/self/fd")) {
        while (const dirent *e = ::readdir(d))
            if (e->d_name[0] != '.') ++n;
        ::closedir(d);
    }
    return n;
}

}  // namespace

uint32_t connections_within_fd_limit(uint32_t wanted, std::string *note) {
    rlimit rl{};
    if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return wanted;
    if (rl.rlim_cur < rl.rlim_max) {
        rlimit up = rl;
        up.rlim_cur = rl.rlim_max;
        if (::setrlimit(RLIMIT_NOFILE, &up) == 0) rl = up;
    }
    if (rl.rlim_cur == RLIM_INFINITY) return wanted;
    // Served connections plus as many being refused (ds4d drains a refusal before closing).
    const uint64_t base = open_fds() + kSpareFds;
    const uint64_t room = rl.rlim_cur > base ? (rl.rlim_cur - base) / 2 : 0;
    if (room >= wanted) return wanted;
    const uint32_t fit = uint32_t(room > 0 ? room : 1);
    if (note)
        *note = "--max-connections " + std::to_string(wanted) + " does not fit the open-file limit of " +
                std::to_string(rl.rlim_cur) + " (" + std::to_string(base - kSpareFds) +
                " files already open): serving at most " + std::to_string(fit) + " connections";
    return fit;
}

}  // namespace ds4::daemon
