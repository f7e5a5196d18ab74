// A small file-system interface for bulk file transfers. Callers do every file-system
// call through a FileIo, so tests can wrap the real implementation and fail chosen calls
// (ENOSPC mid-write, EIO on fsync, ...). Calls return 0 (or a descriptor >= 0) on
// success and -errno on failure; they never throw.
//
// The real implementation is in io/uring_file_io.h.
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ds4::io {

// Called with consecutive pieces of the file contents, in file order, while the transfer
// is still running (so a checksum overlaps the I/O).
using ChunkFn = std::function<void(const uint8_t *data, size_t len)>;

class FileIo {
public:
    virtual ~FileIo() = default;

    virtual int open(const std::string &path, int flags, mode_t mode) = 0;
    virtual int close(int fd) = 0;
    // Reserves len bytes; -EOPNOTSUPP when the file system cannot (the caller goes on).
    virtual int preallocate(int fd, uint64_t len) = 0;
    // Writes data[0, len) as the whole content of the file from offset 0 (the file ends
    // at len afterwards). on_chunk sees every byte once, in order.
    virtual int write_all(int fd, const void *data, size_t len, const ChunkFn &on_chunk) = 0;
    // Reads up to len bytes from offset 0 into buf. With O_DIRECT, buf must be aligned to
    // kIoAlign and hold round_up(len, kIoAlign) bytes (io/aligned_buffer.h; otherwise it
    // falls back to buffered reads). Returns the byte count read (< len when the file is shorter) or -errno.
    virtual int64_t read_all(int fd, void *buf, size_t len, const ChunkFn &on_chunk) = 0;
    virtual int fsync(int fd) = 0;
    virtual int file_size(int fd, uint64_t *size) = 0;
    // rename(2) that fails with -EEXIST instead of replacing `to`.
    virtual int rename_noreplace(const std::string &from, const std::string &to) = 0;
    virtual int unlink(const std::string &path) = 0;
    virtual int mkdir(const std::string &path, mode_t mode) = 0;
    // Opens the directory and fsyncs it, making renames/creations in it durable.
    virtual int fsync_dir(const std::string &path) = 0;
    // Entry names other than "." and "..".
    virtual int list_dir(const std::string &path, std::vector<std::string> *names) = 0;
};

}  // namespace ds4::io
