// Reads many (file, offset, length) extents at once with io_uring: every extent is split
// into requests of at most chunk_bytes, up to queue_depth are kept in flight, and each
// refill of the queue is one submission. Meant for scattered reads such as a layer's
// routed experts, where a single queue of one request at a time would leave an SSD idle.
//
// With O_DIRECT descriptors the caller keeps the rules: buffers, offsets and lengths
// aligned to kIoAlign (io/aligned_buffer.h). A read past the end of file is short, not an
// error. Not thread-safe: one owner at a time (each thread that reads keeps its own).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "io/aligned_buffer.h"

namespace ds4::io {

struct ReadExtent {
    int fd = -1;
    uint64_t offset = 0;
    size_t len = 0;
    uint8_t *buf = nullptr;
    int64_t got = 0;  // out: bytes read (< len only at end of file), or -errno
};

struct ExtentReaderOptions {
    unsigned queue_depth = 64;             // requests in flight
    size_t chunk_bytes = size_t(1) << 20;  // the largest request; a multiple of kIoAlign
};

class ExtentReader {
public:
    explicit ExtentReader(const ExtentReaderOptions &opt = {});
    ~ExtentReader();
    ExtentReader(const ExtentReader &) = delete;
    ExtentReader &operator=(const ExtentReader &) = delete;

    // Reads every extent; returns 0 when all were read (each `got` says how much) or the
    // first -errno (the other extents' `got` still say what happened to them). Never throws.
    int read(std::span<ReadExtent> extents);
    // False when no ring could be set up: reads then go through pread, one at a time.
    bool uses_uring() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// Opens `path` read-only with O_DIRECT, or without it where the file system refuses it
// (tmpfs); *direct says which. Returns the descriptor or -errno.
int open_for_direct_read(const std::string &path, bool *direct);

}  // namespace ds4::io
