// The real FileIo: moves file contents with io_uring in large aligned requests with
// several in flight, using O_DIRECT when the descriptor was opened with it and falling
// back to buffered I/O when the file system refuses it (EINVAL). If no ring can be set
// up (e.g. io_uring disabled by the kernel) it transfers with pread/pwrite instead. Not
// thread-safe: one owner at a time.
#pragma once
#include <cstddef>
#include <memory>

#include "io/aligned_buffer.h"
#include "io/file_io.h"

namespace ds4::io {

struct UringOptions {
    size_t chunk_bytes = size_t(2) << 20;  // per request; a multiple of kIoAlign
    unsigned queue_depth = 8;              // requests in flight
    // Reads split a file into about 4 bunches of queue_depth requests, so the caller's
    // per-chunk work (e.g. a checksum) on one bunch overlaps the next one's transfer, but
    // no request is smaller than this (the per-request cost shows below it). Capped by
    // chunk_bytes.
    size_t min_read_chunk = size_t(256) << 10;
};

std::unique_ptr<FileIo> make_uring_file_io(const UringOptions &opt = {});

// True when `io` is this implementation and its ring is active.
bool uses_uring(const FileIo &io);

}  // namespace ds4::io
