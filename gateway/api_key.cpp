#include "gateway/api_key.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace ds4::gateway {

std::string resolve_state_dir(const std::string &given) {
    if (!given.empty()) return given;
    const char *x = std::getenv("XDG_STATE_HOME");
    if (x && *x == '/') return std::string(x) + "/ds4";
    const char *h = std::getenv("HOME");
    if (h && *h == '/') return std::string(h) + "/.local/state/ds4";
    return {};
}

namespace {

[[noreturn]] void fail_errno(const std::string &what, const std::string &path) {
    throw std::runtime_error(what + " " + path + ": " + std::strerror(errno));
}

void make_dirs(const std::string &dir) {
    if (dir.empty()) return;
    struct stat st;
    if (::stat(dir.c_str(), &st) == 0) return;
    const size_t slash = dir.find_last_of('/');
    if (slash != std::string::npos && slash > 0) make_dirs(dir.substr(0, slash));
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) fail_errno("cannot create", dir);
}

std::string read_key(int fd, const std::string &path) {
    struct stat st;
    if (::fstat(fd, &st) != 0) fail_errno("cannot stat", path);
    if (st.st_uid != ::getuid())
        throw std::runtime_error("key file " + path + " belongs to another user (uid " + std::to_string(st.st_uid) + ")");
    if (st.st_mode & 077)
        throw std::runtime_error("key file " + path + " is readable by other users (mode " +
                                 std::to_string(st.st_mode & 0777) + " octal " + [&] {
                                     char b[8];
                                     std::snprintf(b, sizeof b, "%03o", unsigned(st.st_mode & 0777));
                                     return std::string(b);
                                 }() + "); chmod 600 it or delete it to have a new one made");
    char buf[256];
    ssize_t n = ::read(fd, buf, sizeof buf - 1);
    if (n < 0) fail_errno("cannot read", path);
    std::string k(buf, size_t(n));
    while (!k.empty() && (k.back() == '\n' || k.back() == '\r' || k.back() == ' ')) k.pop_back();
    if (k.size() < 16) throw std::runtime_error("key file " + path + " holds no key of at least 16 characters");
    return k;
}

}  // namespace

std::string load_or_create_key(const std::string &path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0) {
        std::string k;
        try {
            k = read_key(fd, path);
        } catch (...) {
            ::close(fd);
            throw;
        }
        ::close(fd);
        return k;
    }
    if (errno != ENOENT) fail_errno("cannot open", path);
    const size_t slash = path.find_last_of('/');
    if (slash != std::string::npos && slash > 0) make_dirs(path.substr(0, slash));
    unsigned char raw[24];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t n = ::getrandom(raw + got, sizeof raw - got, 0);
        if (n < 0 && errno != EINTR) fail_errno("getrandom for", path);
        if (n > 0) got += size_t(n);
    }
    std::string key = "ds4-";
    for (unsigned char c : raw) {
        char h[3];
        std::snprintf(h, sizeof h, "%02x", c);
        key += h;
    }
    // Written whole to a temporary, then linked into place: a concurrent start either
    // sees no key or the complete one, and the first writer's key wins.
    const std::string tmp = path + ".tmp" + std::to_string(::getpid());
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) fail_errno("cannot create", tmp);
    const std::string line = key + "\n";
    const bool ok = ::write(fd, line.data(), line.size()) == ssize_t(line.size()) && ::fsync(fd) == 0;
    ::close(fd);
    if (!ok) {
        ::unlink(tmp.c_str());
        fail_errno("cannot write", tmp);
    }
    const int linked = ::link(tmp.c_str(), path.c_str());
    const int link_errno = errno;
    ::unlink(tmp.c_str());
    if (linked != 0) {
        if (link_errno == EEXIST) return load_or_create_key(path);
        errno = link_errno;
        fail_errno("cannot create", path);
    }
    return key;
}

bool same_secret(const std::string &a, const std::string &b) {
    unsigned char d = a.size() == b.size() ? 0 : 1;
    for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
    return d == 0;
}

}  // namespace ds4::gateway
