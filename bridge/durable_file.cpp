#include "bridge/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "engine/common/error.h"

namespace ds4::bridge_io {
namespace {

[[noreturn]] void fail_errno(const std::string &what, int e) { throw ds4::Error(what + ": " + std::strerror(e)); }

std::string dir_of(const std::string &path) {
    const size_t slash = path.rfind('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : path.substr(0, slash);
}

// Removes the temporary unless it was renamed into place.
struct TempFile {
    std::string name;
    int fd = -1;
    bool keep = false;
    ~TempFile() {
        if (fd >= 0) ::close(fd);
        if (!keep && !name.empty()) ::unlink(name.c_str());
    }
};

void write_all(int fd, std::span<const uint8_t> bytes, const std::string &name) {
    size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) fail_errno("writing " + name + " failed", errno);
        if (w == 0) fail_errno("writing " + name + " failed", EIO);
        done += size_t(w);
    }
}

}  // namespace

void write_file_durable(const std::string &path, std::span<const uint8_t> bytes) {
    TempFile tmp;
    // mkostemp picks a name nobody else holds, so a stale or concurrent "<path>.tmp" is
    // never truncated or renamed away from under its owner.
    std::vector<char> tmpl(path.begin(), path.end());
    for (char c : std::string(".tmp-XXXXXX")) tmpl.push_back(c);
    tmpl.push_back('\0');
    tmp.fd = ::mkostemp(tmpl.data(), O_CLOEXEC);
    if (tmp.fd < 0) fail_errno("cannot create a temporary file next to " + path, errno);
    tmp.name = tmpl.data();
    write_all(tmp.fd, bytes, tmp.name);
    if (::fsync(tmp.fd) != 0) fail_errno("fsync of " + tmp.name + " failed", errno);
    const int fd = tmp.fd;
    tmp.fd = -1;
    if (::close(fd) != 0) fail_errno("closing " + tmp.name + " failed", errno);
    if (::rename(tmp.name.c_str(), path.c_str()) != 0) fail_errno("rename of " + tmp.name + " to " + path + " failed", errno);
    tmp.keep = true;
    // The rename is durable only once the directory entry is.
    const std::string dir = dir_of(path);
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) fail_errno(path + " was replaced, but opening its directory " + dir + " to fsync it failed", errno);
    const int rc = ::fsync(dfd), e = errno;
    ::close(dfd);
    if (rc != 0) fail_errno(path + " was replaced, but fsync of its directory " + dir + " failed", e);
}

}  // namespace ds4::bridge_io
