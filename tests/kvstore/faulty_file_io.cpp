#include "tests/kvstore/faulty_file_io.h"

namespace ds4::kvstore::testing {

void FaultyFileIo::fail(Op op, int err, int skip, size_t after_bytes) {
    std::lock_guard lk(mu_);
    rules_[size_t(op)] = Rule{true, err, skip, after_bytes};
}

void FaultyFileIo::clear() {
    std::lock_guard lk(mu_);
    rules_.fill(Rule{});
}

int FaultyFileIo::calls(Op op) const {
    std::lock_guard lk(mu_);
    return calls_[size_t(op)];
}

int FaultyFileIo::check(Op op, size_t *after_bytes) {
    std::lock_guard lk(mu_);
    ++calls_[size_t(op)];
    Rule &r = rules_[size_t(op)];
    if (!r.armed) return 0;
    if (r.skip > 0) {
        --r.skip;
        return 0;
    }
    r.armed = false;
    if (after_bytes) *after_bytes = r.after_bytes;
    return r.err;
}

int FaultyFileIo::open(const std::string &path, int flags, mode_t mode) {
    if (int e = check(Op::kOpen)) return -e;
    return real_->open(path, flags, mode);
}
int FaultyFileIo::close(int fd) {
    if (int e = check(Op::kClose)) {
        real_->close(fd);  // the descriptor is gone either way, as with close(2)
        return -e;
    }
    return real_->close(fd);
}
int FaultyFileIo::preallocate(int fd, uint64_t len) {
    if (int e = check(Op::kPreallocate)) return -e;
    return real_->preallocate(fd, len);
}
int FaultyFileIo::write_all(int fd, const void *data, size_t len, const ChunkFn &on_chunk) {
    size_t after = 0;
    if (int e = check(Op::kWrite, &after)) {
        if (after > 0) real_->write_all(fd, data, after < len ? after : len, on_chunk);
        return -e;
    }
    return real_->write_all(fd, data, len, on_chunk);
}
int64_t FaultyFileIo::read_all(int fd, void *buf, size_t len, const ChunkFn &on_chunk) {
    if (int e = check(Op::kRead)) return -e;
    return real_->read_all(fd, buf, len, on_chunk);
}
int FaultyFileIo::fsync(int fd) {
    if (int e = check(Op::kFsync)) return -e;
    return real_->fsync(fd);
}
int FaultyFileIo::file_size(int fd, uint64_t *size) {
    if (int e = check(Op::kFileSize)) return -e;
    return real_->file_size(fd, size);
}
int FaultyFileIo::rename_noreplace(const std::string &from, const std::string &to) {
    if (int e = check(Op::kRename)) return -e;
    return real_->rename_noreplace(from, to);
}
int FaultyFileIo::unlink(const std::string &path) {
    if (int e = check(Op::kUnlink)) return -e;
    return real_->unlink(path);
}
int FaultyFileIo::mkdir(const std::string &path, mode_t mode) {
    if (int e = check(Op::kMkdir)) return -e;
    return real_->mkdir(path, mode);
}
int FaultyFileIo::fsync_dir(const std::string &path) {
    if (int e = check(Op::kFsyncDir)) return -e;
    return real_->fsync_dir(path);
}
int FaultyFileIo::list_dir(const std::string &path, std::vector<std::string> *names) {
    if (int e = check(Op::kListDir)) return -e;
    return real_->list_dir(path, names);
}

}  // namespace ds4::kvstore::testing
