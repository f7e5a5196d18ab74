#include "tools/bench_kvstore/raw_disk.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

namespace ds4::bench {
namespace {

constexpr size_t kBlock = size_t(4) << 20;
constexpr size_t kAlign = 4096;

size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

struct Fd {
    int fd;
    ~Fd() {
        if (fd >= 0) close(fd);
    }
};

}  // namespace

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t m = v.size() / 2;
    return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

double raw_read_mibs(const std::string &path, uint8_t *dst, size_t bytes) {
    static uint8_t *scratch = nullptr;  // the dd-like pass's one buffer, kept for the process
    if (!dst && !scratch && !(scratch = static_cast<uint8_t *>(std::aligned_alloc(kAlign, kBlock)))) return -ENOMEM;
    const double t0 = now_s();
    Fd f{open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC)};
    if (f.fd < 0) return -errno;
    for (size_t off = 0; off < bytes;) {
        const size_t n = std::min(kBlock, round_up(bytes - off));
        const ssize_t r = pread(f.fd, dst ? dst + off : scratch, n, off_t(off));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -errno;
        if (r == 0) return -EIO;  // shorter than asked
        off += size_t(r);
    }
    return mibs(bytes, now_s() - t0);
}

double raw_read_queued_mibs(const std::string &path, uint8_t *dst, size_t bytes, unsigned depth) {
    depth = std::max(1u, depth);
    const size_t n_chunks = (round_up(bytes) + kBlock - 1) / kBlock;
    Fd f{-1};
    std::atomic<bool> go{false};
    std::atomic<int> err{0};
    auto reader = [&](size_t first) {
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        for (size_t c = first; c < n_chunks && err.load() == 0; c += depth) {
            const size_t off = c * kBlock, end = std::min(off + kBlock, round_up(bytes));
            for (size_t at = off; at < std::min(end, bytes);) {  // a short read at EOF ends it
                const ssize_t r = pread(f.fd, dst + at, end - at, off_t(at));
                if (r < 0 && errno == EINTR) continue;
                if (r <= 0) {
                    err = r < 0 ? errno : EIO;
                    return;
                }
                at += size_t(r);
            }
        }
    };
    // The readers exist before the clock starts: their creation is not the disk's time.
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < depth && t < n_chunks; ++t) pool.emplace_back(reader, t);
    const double t0 = now_s();
    f.fd = open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (f.fd < 0) err = errno;
    go.store(true, std::memory_order_release);
    if (f.fd >= 0) reader(0);
    for (auto &t : pool) t.join();
    const double t1 = now_s();
    if (err.load() != 0) return -err.load();
    return mibs(bytes, t1 - t0);
}

double raw_write_mibs(const std::string &path, const uint8_t *src, size_t bytes) {
    const double t0 = now_s();
    Fd f{open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600)};
    if (f.fd < 0) return -errno;
    for (size_t off = 0; off < bytes;) {
        const size_t n = std::min(kBlock, round_up(bytes - off));
        const ssize_t w = pwrite(f.fd, src + off, n, off_t(off));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? -errno : -EIO;
        off += size_t(w);
    }
    if (fsync(f.fd) != 0) return -errno;
    return mibs(bytes, now_s() - t0);
}

}  // namespace ds4::bench
