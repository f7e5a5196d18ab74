// Test-only FileIo: forwards to a real one and fails chosen calls on command.
#pragma once
#include <array>
#include <memory>
#include <mutex>

#include "io/file_io.h"

namespace ds4::kvstore::testing {

using io::ChunkFn;
using io::FileIo;

enum class Op { kOpen, kClose, kPreallocate, kWrite, kRead, kFsync, kFileSize, kRename, kUnlink, kMkdir, kFsyncDir, kListDir, kCount };

class FaultyFileIo final : public FileIo {
public:
    explicit FaultyFileIo(std::shared_ptr<FileIo> real) : real_(std::move(real)) {}

    // The next call of `op` after `skip` successful ones fails with -err. A failing
    // write first writes `after_bytes` bytes for real (a partial file, as with ENOSPC).
    void fail(Op op, int err, int skip = 0, size_t after_bytes = 0);
    void clear();
    int calls(Op op) const;

    int open(const std::string &path, int flags, mode_t mode) override;
    int close(int fd) override;
    int preallocate(int fd, uint64_t len) override;
    int write_all(int fd, const void *data, size_t len, const ChunkFn &on_chunk) override;
    int64_t read_all(int fd, void *buf, size_t len, const ChunkFn &on_chunk) override;
    int fsync(int fd) override;
    int file_size(int fd, uint64_t *size) override;
    int rename_noreplace(const std::string &from, const std::string &to) override;
    int unlink(const std::string &path) override;
    int mkdir(const std::string &path, mode_t mode) override;
    int fsync_dir(const std::string &path) override;
    int list_dir(const std::string &path, std::vector<std::string> *names) override;

private:
    struct Rule {
        bool armed = false;
        int err = 0;
        int skip = 0;
        size_t after_bytes = 0;
    };
    // Counts the call; returns the error to inject (0 = none) and the rule's byte limit.
    int check(Op op, size_t *after_bytes = nullptr);

    std::shared_ptr<FileIo> real_;
    mutable std::mutex mu_;
    std::array<Rule, size_t(Op::kCount)> rules_{};
    std::array<int, size_t(Op::kCount)> calls_{};
};

}  // namespace ds4::kvstore::testing
