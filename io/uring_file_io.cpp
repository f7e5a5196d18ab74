// The default FileIo: io_uring transfers, O_DIRECT-aware, with a pread/pwrite fallback
// when no ring can be created.
#include "io/uring_file_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <vector>

namespace ds4::io {
namespace {

int neg_errno() { return errno ? -errno : -EIO; }

bool is_aligned(const void *p) { return (reinterpret_cast<uintptr_t>(p) & (kIoAlign - 1)) == 0; }

bool fd_is_direct(int fd) {
    const int fl = fcntl(fd, F_GETFL);
    return fl >= 0 && (fl & O_DIRECT);
}

int clear_direct(int fd) {
    const int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_DIRECT) != 0) return neg_errno();
    return 0;
}

class UringFileIo final : public FileIo {
public:
    explicit UringFileIo(const UringOptions &opt)
        : chunk_(std::max(round_up(opt.chunk_bytes ? opt.chunk_bytes : kIoAlign, kIoAlign), kIoAlign)),
          min_read_(round_up(std::max(opt.min_read_chunk, kIoAlign), kIoAlign)),
          depth_(std::clamp(opt.queue_depth, 1u, 64u)) {
        ring_ok_ = io_uring_queue_init(depth_ * 2, &ring_, 0) == 0;
    }
    ~UringFileIo() override {
        if (ring_ok_) io_uring_queue_exit(&ring_);
    }
    bool ring_ok() const { return ring_ok_; }

    int open(const std::string &path, int flags, mode_t mode) override {
        const int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
        return fd >= 0 ? fd : neg_errno();
    }
    int close(int fd) override { return ::close(fd) == 0 ? 0 : neg_errno(); }
    int preallocate(int fd, uint64_t len) override {
        if (len == 0) return 0;
        if (fallocate(fd, 0, 0, off_t(len)) == 0) return 0;
        return errno == EOPNOTSUPP || errno == ENOSYS ? -EOPNOTSUPP : neg_errno();
    }
    int fsync(int fd) override { return ::fsync(fd) == 0 ? 0 : neg_errno(); }
    int file_size(int fd, uint64_t *size) override {
        struct stat st;
        if (fstat(fd, &st) != 0) return neg_errno();
        *size = uint64_t(st.st_size);
        return 0;
    }
    int rename_noreplace(const std::string &from, const std::string &to) override {
        return renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0 ? 0 : neg_errno();
    }
    int unlink(const std::string &path) override { return ::unlink(path.c_str()) == 0 ? 0 : neg_errno(); }
    int mkdir(const std::string &path, mode_t mode) override {
        return ::mkdir(path.c_str(), mode) == 0 ? 0 : neg_errno();
    }
    int fsync_dir(const std::string &path) override {
        const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) return neg_errno();
        const int rc = ::fsync(fd) == 0 ? 0 : neg_errno();
        ::close(fd);
        return rc;
    }
    int list_dir(const std::string &path, std::vector<std::string> *names) override {
        DIR *d = opendir(path.c_str());
        if (!d) return neg_errno();
        names->clear();
        int rc = 0;
        try {
            errno = 0;
            while (struct dirent *e = readdir(d)) {
                if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) names->emplace_back(e->d_name);
                errno = 0;
            }
            if (errno) rc = neg_errno();
        } catch (const std::bad_alloc &) {
            rc = -ENOMEM;
        }
        closedir(d);
        return rc;
    }

    int write_all(int fd, const void *data, size_t len, const ChunkFn &on_chunk) override {
        try {
            size_t hashed = 0;
            int rc = write_pass(fd, static_cast<const uint8_t *>(data), len, on_chunk, &hashed);
            if (rc == -EINVAL && fd_is_direct(fd)) {
                // The file system takes O_DIRECT at open but not these transfers.
                if ((rc = clear_direct(fd)) != 0) return rc;
                rc = write_pass(fd, static_cast<const uint8_t *>(data), len, on_chunk, &hashed);
            }
            return rc;
        } catch (const std::bad_alloc &) {
            return -ENOMEM;
        }
    }

    int64_t read_all(int fd, void *buf, size_t len, const ChunkFn &on_chunk) override {
        try {
            uint8_t *dst = static_cast<uint8_t *>(buf);
            if (fd_is_direct(fd) && !is_aligned(dst)) {
                if (const int rc = clear_direct(fd)) return rc;
            }
            size_t delivered = 0;
            int64_t rc = read_pass(fd, dst, len, on_chunk, &delivered);
            if (rc == -EINVAL && fd_is_direct(fd)) {
                if (const int c = clear_direct(fd)) return c;
                rc = read_pass(fd, dst, len, on_chunk, &delivered);
            }
            return rc;
        } catch (const std::bad_alloc &) {
            return -ENOMEM;
        }
    }

private:
    struct Req {
        uint64_t off = 0;      // file offset of the request
        size_t want = 0;       // bytes the request transfers
        size_t done = 0;       // bytes transferred so far (short transfers are resubmitted)
        uint8_t *buf = nullptr;
        size_t chunk = 0;      // chunk index (reads)
        bool busy = false;
    };

    // Drains every in-flight request, ignoring their results (after an error).
    void drain(std::vector<Req> &reqs, unsigned &inflight) {
        while (inflight > 0) {
            struct io_uring_cqe *cqe;
            if (io_uring_wait_cqe(&ring_, &cqe) != 0) break;
            reqs[io_uring_cqe_get_data64(cqe)].busy = false;
            io_uring_cqe_seen(&ring_, cqe);
            --inflight;
        }
    }

    int submit(Req &r, size_t slot, bool write, int fd) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&ring_);
        if (!sqe) return -EBUSY;
        if (write)
            io_uring_prep_write(sqe, fd, r.buf + r.done, unsigned(r.want - r.done), r.off + r.done);
        else
            io_uring_prep_read(sqe, fd, r.buf + r.done, unsigned(r.want - r.done), r.off + r.done);
        io_uring_sqe_set_data64(sqe, slot);
        const int rc = io_uring_submit(&ring_);
        return rc < 0 ? rc : 0;
    }

    // One attempt at writing the whole file. `hashed` tracks how far on_chunk has been
    // called so a buffered retry after EINVAL does not report bytes twice.
    int write_pass(int fd, const uint8_t *src, size_t len, const ChunkFn &on_chunk, size_t *hashed) {
        const bool direct = fd_is_direct(fd);
        const size_t total = direct ? round_up(len, kIoAlign) : len;
        auto report = [&](size_t off, size_t n) {
            if (off + n > *hashed && on_chunk) {
                const size_t from = std::max(off, *hashed);
                on_chunk(src + from, off + n - from);
            }
            *hashed = std::max(*hashed, off + n);
        };
        if (!ring_ok_) return write_sync(fd, src, len, total, direct, report);

        if (direct && bounce_.size() < depth_) bounce_.resize(depth_);
        std::vector<Req> reqs(depth_);
        unsigned inflight = 0;
        size_t next = 0;
        int err = 0;
        while ((next < total && err == 0) || inflight > 0) {
            while (err == 0 && next < total && inflight < depth_) {
                size_t slot = 0;
                while (reqs[slot].busy) ++slot;
                Req &r = reqs[slot];
                const size_t n = std::min(chunk_, total - next);
                const size_t real = std::min(n, len - next);
                r = Req{next, n, 0, nullptr, 0, true};
                if (direct && (!is_aligned(src + next) || real < n)) {
                    AlignedBuffer &b = bounce_[slot];
                    b.resize(chunk_);
                    memcpy(b.data(), src + next, real);
                    memset(b.data() + real, 0, n - real);
                    r.buf = b.data();
                } else {
                    r.buf = const_cast<uint8_t *>(src + next);
                }
                if ((err = submit(r, slot, true, fd)) != 0) {
                    r.busy = false;
                    break;
                }
                ++inflight;
                report(next, real);
                next += n;
            }
            if (inflight == 0) break;
            struct io_uring_cqe *cqe;
            if (const int w = io_uring_wait_cqe(&ring_, &cqe); w != 0) {
                err = w;
                break;
            }
            const size_t slot = io_uring_cqe_get_data64(cqe);
            const int res = cqe->res;
            io_uring_cqe_seen(&ring_, cqe);
            --inflight;
            Req &r = reqs[slot];
            if (res < 0) {
                if (err == 0) err = res;
                r.busy = false;
            } else if (res == 0) {
                if (err == 0) err = -EIO;
                r.busy = false;
            } else {
                r.done += size_t(res);
                if (r.done < r.want && err == 0) {
                    if ((err = submit(r, slot, true, fd)) == 0) ++inflight; else r.busy = false;
                } else {
                    r.busy = false;
                }
            }
        }
        if (err != 0) {
            drain(reqs, inflight);
            return err;
        }
        if (total != len && ftruncate(fd, off_t(len)) != 0) return neg_errno();
        return 0;
    }

    template <class Report>
    int write_sync(int fd, const uint8_t *src, size_t len, size_t total, bool direct, Report &report) {
        if (direct && bounce_.empty()) bounce_.resize(1);
        for (size_t off = 0; off < total;) {
            const size_t n = std::min(chunk_, total - off);
            const size_t real = std::min(n, len - off);
            const uint8_t *p = src + off;
            if (direct && (!is_aligned(p) || real < n)) {
                bounce_[0].resize(chunk_);
                memcpy(bounce_[0].data(), p, real);
                memset(bounce_[0].data() + real, 0, n - real);
                p = bounce_[0].data();
            }
            report(off, real);
            for (size_t done = 0; done < n;) {
                const ssize_t w = ::pwrite(fd, p + done, n - done, off_t(off + done));
                if (w < 0 && errno == EINTR) continue;
                if (w < 0) return neg_errno();
                if (w == 0) return -EIO;
                done += size_t(w);
            }
            off += n;
        }
        if (total != len && ftruncate(fd, off_t(len)) != 0) return neg_errno();
        return 0;
    }

    // The request size for reading `total` bytes: small enough that the file arrives in
    // about four bunches of depth_ requests (so checksumming one bunch overlaps the next),
    // but not below min_read_ (the per-request cost shows there) nor above chunk_.
    size_t read_chunk(size_t total) const {
        const size_t want = round_up(total / (size_t(depth_) * 4) + 1, kIoAlign);
        return std::min(chunk_, std::max(want, min_read_));
    }

    // One attempt at reading the file. on_chunk is called for the contiguous completed
    // prefix as it grows; `delivered` tracks how far so a retry does not repeat bytes.
    int64_t read_pass(int fd, uint8_t *dst, size_t len, const ChunkFn &on_chunk, size_t *delivered) {
        const bool direct = fd_is_direct(fd);
        const size_t total = direct ? round_up(len, kIoAlign) : len;
        const size_t chunk = read_chunk(total);
        const size_t n_chunks = (total + chunk - 1) / chunk;
        std::vector<size_t> got(n_chunks, 0);
        std::vector<char> complete(n_chunks, 0);
        size_t frontier = 0;  // first chunk not yet reported
        size_t end = len;     // shrinks when EOF is met early
        auto advance = [&] {
            while (frontier < n_chunks && complete[frontier]) {
                const size_t off = frontier * chunk;
                const size_t stop = std::min(off + got[frontier], end);
                if (stop > *delivered && on_chunk) on_chunk(dst + *delivered, stop - *delivered);
                *delivered = std::max(*delivered, stop);
                ++frontier;
            }
        };
        if (!ring_ok_) {
            for (size_t c = 0; c < n_chunks; ++c) {
                const size_t off = c * chunk;
                const size_t n = std::min(chunk, total - off);
                while (got[c] < n) {
                    const ssize_t r = ::pread(fd, dst + off + got[c], n - got[c], off_t(off + got[c]));
                    if (r < 0 && errno == EINTR) continue;
                    if (r < 0) return neg_errno();
                    if (r == 0) break;
                    got[c] += size_t(r);
                }
                complete[c] = 1;
                if (got[c] < n) end = std::min(end, off + got[c]);
                advance();
                if (got[c] < n) break;
            }
            return int64_t(std::min(*delivered, len));
        }

        std::vector<Req> reqs(depth_);
        unsigned inflight = 0;
        size_t next = 0;
        int err = 0;
        // A completion: resubmits the rest of a short read, or marks the chunk complete.
        auto reap = [&](struct io_uring_cqe *cqe) {
            const size_t slot = io_uring_cqe_get_data64(cqe);
            const int res = cqe->res;
            io_uring_cqe_seen(&ring_, cqe);
            --inflight;
            Req &r = reqs[slot];
            if (res < 0) {
                if (err == 0) err = res;
                r.busy = false;
                return;
            }
            r.done += size_t(res);
            // Reading past the expected end is only the O_DIRECT rounding: done.
            if (res > 0 && r.done < r.want && r.off + r.done < len && err == 0) {
                if ((err = submit(r, slot, false, fd)) == 0) ++inflight; else r.busy = false;
                return;
            }
            r.busy = false;
            got[r.chunk] = r.done;
            complete[r.chunk] = 1;
            if (r.done < r.want) end = std::min(end, size_t(r.off + r.done));  // EOF
        };
        // Requests tend to complete in bunches (a device serving them in parallel). So every
        // completion that is ready is reaped and the queue refilled before the caller's
        // on_chunk work (the checksum) runs on the finished data: that work then overlaps
        // the next bunch's transfer instead of delaying its submission.
        while ((next < n_chunks && err == 0) || inflight > 0) {
            while (err == 0 && next < n_chunks && inflight < depth_ && next * chunk < end) {
                size_t slot = 0;
                while (reqs[slot].busy) ++slot;
                Req &r = reqs[slot];
                const size_t off = next * chunk;
                r = Req{off, std::min(chunk, total - off), 0, dst + off, next, true};
                if ((err = submit(r, slot, false, fd)) != 0) {
                    r.busy = false;
                    break;
                }
                ++inflight;
                ++next;
            }
            if (err == 0) advance();
            if (inflight == 0) break;
            struct io_uring_cqe *cqe;
            if (const int w = io_uring_wait_cqe(&ring_, &cqe); w != 0) {
                err = w;
                break;
            }
            reap(cqe);
            while (io_uring_peek_cqe(&ring_, &cqe) == 0) reap(cqe);
        }
        if (err != 0) {
            drain(reqs, inflight);
            return err;
        }
        // Chunks never submitted because EOF came first count as empty.
        for (size_t c = frontier; c < n_chunks; ++c) complete[c] = 1;
        advance();
        return int64_t(std::min(*delivered, len));
    }

    const size_t chunk_;
    const size_t min_read_;
    const unsigned depth_;
    struct io_uring ring_ {};
    bool ring_ok_ = false;
    std::vector<AlignedBuffer> bounce_;
};

}  // namespace

std::unique_ptr<FileIo> make_uring_file_io(const UringOptions &opt) {
    return std::make_unique<UringFileIo>(opt);
}

bool uses_uring(const FileIo &io) {
    const auto *u = dynamic_cast<const UringFileIo *>(&io);
    return u && u->ring_ok();
}

}  // namespace ds4::io
