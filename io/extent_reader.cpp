#include "io/extent_reader.h"

#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <new>
#include <vector>

namespace ds4::io {

struct ExtentReader::Impl {
    unsigned depth;
    size_t chunk;
    struct io_uring ring {};
    bool ring_ok = false;

    struct Req {
        size_t extent = 0;
        uint64_t off = 0;  // file offset of the request
        size_t want = 0;
        size_t done = 0;
        uint8_t *buf = nullptr;
    };
    std::vector<Req> reqs;
    std::vector<unsigned> free_slots;

    int read_sync(std::span<ReadExtent> ex) {
        int first = 0;
        for (ReadExtent &e : ex) {
            size_t got = 0;
            e.got = 0;
            while (got < e.len) {
                const ssize_t r = ::pread(e.fd, e.buf + got, e.len - got, off_t(e.offset + got));
                if (r < 0 && errno == EINTR) continue;
                if (r < 0) {
                    e.got = -errno;
                    if (!first) first = -errno;
                    break;
                }
                if (r == 0) break;
                got += size_t(r);
            }
            if (e.got == 0) e.got = int64_t(got);
        }
        return first;
    }

    int read(std::span<ReadExtent> ex) {
        if (!ring_ok) return read_sync(ex);
        // Pieces still to submit: (extent, offset within it), walked in order.
        size_t next_ext = 0, next_off = 0;
        std::vector<size_t> done(ex.size(), 0);
        std::vector<char> eof(ex.size(), 0);
        for (ReadExtent &e : ex) e.got = 0;
        unsigned inflight = 0;
        int err = 0;
        auto prep = [&](unsigned slot) {
            Req &r = reqs[slot];
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            if (!sqe) return false;
            io_uring_prep_read(sqe, ex[r.extent].fd, r.buf + r.done, unsigned(r.want - r.done), r.off + r.done);
            io_uring_sqe_set_data64(sqe, slot);
            ++inflight;
            return true;
        };
        while (true) {
            bool queued = false;
            while (err == 0 && !free_slots.empty() && next_ext < ex.size()) {
                ReadExtent &e = ex[next_ext];
                if (next_off >= e.len) {
                    ++next_ext, next_off = 0;
                    continue;
                }
                const unsigned slot = free_slots.back();
                const size_t n = std::min(chunk, e.len - next_off);
                reqs[slot] = Req{next_ext, e.offset + next_off, n, 0, e.buf + next_off};
                if (!prep(slot)) break;
                free_slots.pop_back();
                queued = true;
                next_off += n;
            }
            if (queued) {
                const int rc = io_uring_submit(&ring);
                if (rc < 0 && err == 0) err = rc;
            }
            if (inflight == 0) break;
            struct io_uring_cqe *cqe;
            if (const int w = io_uring_wait_cqe(&ring, &cqe); w != 0) {
                if (w == -EINTR) continue;
                return w;  // the ring is unusable; requests may still be in flight
            }
            bool resubmit = false;
            do {
                const unsigned slot = unsigned(io_uring_cqe_get_data64(cqe));
                const int res = cqe->res;
                io_uring_cqe_seen(&ring, cqe);
                --inflight;
                Req &r = reqs[slot];
                ReadExtent &e = ex[r.extent];
                if (res < 0) {
                    if (e.got >= 0) e.got = res;
                    if (err == 0) err = res;
                    free_slots.push_back(slot);
                } else {
                    r.done += size_t(res);
                    if (res > 0 && r.done < r.want && err == 0) {
                        resubmit = prep(slot) || (err = -EBUSY, free_slots.push_back(slot), false);
                    } else {
                        done[r.extent] += r.done;
                        if (r.done < r.want) eof[r.extent] = 1;
                        free_slots.push_back(slot);
                    }
                }
            } while (io_uring_peek_cqe(&ring, &cqe) == 0);
            if (resubmit) {
                const int rc = io_uring_submit(&ring);
                if (rc < 0 && err == 0) err = rc;
            }
        }
        for (size_t i = 0; i < ex.size(); ++i)
            if (ex[i].got >= 0) ex[i].got = int64_t(std::min(done[i], ex[i].len));
        (void)eof;
        return err;
    }
};

ExtentReader::ExtentReader(const ExtentReaderOptions &opt) : impl_(new Impl) {
    impl_->depth = std::clamp(opt.queue_depth, 1u, 256u);
    impl_->chunk = std::max(round_up(opt.chunk_bytes ? opt.chunk_bytes : kIoAlign, kIoAlign), kIoAlign);
    impl_->ring_ok = io_uring_queue_init(impl_->depth, &impl_->ring, 0) == 0;
    impl_->reqs.resize(impl_->depth);
    for (unsigned i = 0; i < impl_->depth; ++i) impl_->free_slots.push_back(impl_->depth - 1 - i);
}

ExtentReader::~ExtentReader() {
    if (impl_->ring_ok) io_uring_queue_exit(&impl_->ring);
}

int ExtentReader::read(std::span<ReadExtent> extents) {
    try {
        return impl_->read(extents);
    } catch (const std::bad_alloc &) {
        return -ENOMEM;
    }
}

bool ExtentReader::uses_uring() const { return impl_->ring_ok; }

int open_for_direct_read(const std::string &path, bool *direct) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd >= 0) {
        *direct = true;
        return fd;
    }
    if (errno != EINVAL) return -errno;
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    *direct = false;
    return fd >= 0 ? fd : -errno;
}

}  // namespace ds4::io
