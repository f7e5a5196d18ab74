// A small tmpfs mounted for the length of a test: a real file system that really fills up
// (ENOSPC from the kernel, not an injected error). Needs root and mount permission; tests
// skip when mounting is refused.
#pragma once
#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace ds4test {

class TmpfsMount {
public:
    // opts as for mount -o, e.g. "size=6m,mode=0700".
    TmpfsMount(const std::string &where, const char *opts) : where_(where) {
        ok_ = mount("ds4-test", where.c_str(), "tmpfs", 0, opts) == 0;
        if (!ok_) errno_ = errno;
    }
    ~TmpfsMount() {
        if (ok_) umount2(where_.c_str(), MNT_DETACH);
    }
    TmpfsMount(const TmpfsMount &) = delete;
    TmpfsMount &operator=(const TmpfsMount &) = delete;
    bool ok() const { return ok_; }
    int error() const { return errno_; }  // why mounting failed

private:
    std::string where_;
    bool ok_ = false;
    int errno_ = 0;
};

// Writes `path` until the file system has no space left (the last write fails with
// ENOSPC). Returns the bytes written, or -errno for any other failure.
inline long long fill_file_system(const std::string &path) {
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -errno;
    static char block[65536];
    long long total = 0;
    for (size_t n = sizeof block; n >= 512;) {
        const ssize_t w = write(fd, block, n);
        if (w > 0) {
            total += w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno != ENOSPC) {
            const int e = errno;
            close(fd);
            return -e;
        }
        n /= 2;  // full at this size: top up the last partial blocks with smaller writes
    }
    fsync(fd);
    close(fd);
    return total;
}

}  // namespace ds4test
