#include "daemon/drafter_export.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "ipc/frame.h"

namespace ds4::daemon {

namespace {

[[noreturn]] void fail(const std::string &what) { throw std::runtime_error(what + ": " + std::strerror(errno)); }

}  // namespace

std::unique_ptr<DrafterExport> DrafterExport::create(const std::string &path) {
    std::unique_ptr<DrafterExport> e(new DrafterExport());
    const int src = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (src < 0) fail("drafter " + path + ": cannot open");
    struct stat st {};
    if (fstat(src, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(src);
        errno = errno ? errno : EINVAL;
        fail("drafter " + path + ": not a regular file");
    }
    e->fd_ = memfd_create("ds4-drafter", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (e->fd_ < 0) {
        ::close(src);
        fail("drafter " + path + ": memfd_create");
    }
    e->bytes_ = uint64_t(st.st_size);
    if (ftruncate(e->fd_, off_t(e->bytes_)) != 0) {
        ::close(src);
        fail("drafter " + path + ": cannot size the shared copy to " + std::to_string(e->bytes_) + " bytes");
    }
    off_t off = 0;
    while (uint64_t(off) < e->bytes_) {
        const ssize_t n = sendfile(e->fd_, src, &off, size_t(std::min<uint64_t>(e->bytes_ - uint64_t(off), 1u << 30)));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            if (n == 0) errno = EIO;  // the file shrank while being copied
            ::close(src);
            fail("drafter " + path + ": cannot copy it into the shared memfd");
        }
    }
    // The file's own page cache is not needed any more: the memfd holds the one copy.
    posix_fadvise(src, 0, 0, POSIX_FADV_DONTNEED);
    ::close(src);
    if (fcntl(e->fd_, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
        fail("drafter " + path + ": cannot seal the shared memfd");
    return e;
}

DrafterExport::~DrafterExport() {
    if (fd_ >= 0) ::close(fd_);
}

std::string DrafterExport::open_path() const { return "/proc/self/fd/" + std::to_string(fd_); }

void DrafterExport::set_identity(uint64_t fingerprint, uint32_t n_vocab) {
    fingerprint_ = fingerprint;
    n_vocab_ = n_vocab;
    ready_ = true;
}

std::vector<uint8_t> DrafterExport::share_frame(uint64_t rid) const {
    flatbuffers::FlatBufferBuilder fbb(128);
    ipc::finish_frame(fbb, rid, ipc::fb::CreateDrafterShare(fbb, 1, fingerprint_, n_vocab_, bytes_));
    return ipc::frame_bytes(fbb);
}

long DrafterExport::send_share(int sock, const std::vector<uint8_t> &frame) const {
    struct iovec iov {const_cast<uint8_t *>(frame.data()), frame.size()};
    alignas(struct cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
    struct msghdr msg {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl;
    msg.msg_controllen = sizeof ctl;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cm), &fd_, sizeof(int));
    ssize_t n;
    do n = sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    return long(n);
}

}  // namespace ds4::daemon
