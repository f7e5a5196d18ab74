#include "daemon/drafter_export.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
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
    struct stat ms {};
    if (fstat(e->fd_, &ms) != 0) fail("drafter " + path + ": cannot stat the shared memfd");
    e->dev_ = uint64_t(ms.st_dev);
    e->ino_ = uint64_t(ms.st_ino);
    return e;
}

DrafterExport::~DrafterExport() {
    if (fd_ >= 0) ::close(fd_);
    if (device_fd_ >= 0) ::close(device_fd_);
}

void DrafterExport::set_device(int fd, const Device &d) {
    const int own = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (own < 0) fail("drafter: cannot duplicate the device weights' handle");
    if (device_fd_ >= 0) ::close(device_fd_);
    device_fd_ = own;
    device_ = d;
}

std::string DrafterExport::open_path() const { return "/proc/self/fd/" + std::to_string(fd_); }

void DrafterExport::set_identity(uint64_t fingerprint, uint32_t n_vocab) {
    fingerprint_ = fingerprint;
    n_vocab_ = n_vocab;
    ready_ = true;
}

std::vector<uint8_t> DrafterExport::share_frame(uint64_t rid, bool device) const {
    flatbuffers::FlatBufferBuilder fbb(192);
    flatbuffers::Offset<ipc::fb::DrafterDevice> dev;
    if (device && has_device())
        dev = ipc::fb::CreateDrafterDevice(fbb, device_.bytes, device_.granularity,
                                           fbb.CreateVector(device_.uuid, sizeof device_.uuid), device_.layout_hash);
    ipc::finish_frame(fbb, rid, ipc::fb::CreateDrafterShare(fbb, 1, fingerprint_, n_vocab_, bytes_, dev));
    return ipc::frame_bytes(fbb);
}

long DrafterExport::send_share(int sock, const std::vector<uint8_t> &frame, bool device) const {
    const int fds[2] = {fd_, device_fd_};
    const size_t nfd = device && has_device() ? 2 : 1;
    struct iovec iov {const_cast<uint8_t *>(frame.data()), frame.size()};
    alignas(struct cmsghdr) char ctl[CMSG_SPACE(2 * sizeof(int))] = {};
    struct msghdr msg {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl;
    msg.msg_controllen = CMSG_SPACE(nfd * sizeof(int));
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(nfd * sizeof(int));
    std::memcpy(CMSG_DATA(cm), fds, nfd * sizeof(int));
    ssize_t n;
    do n = sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    return long(n);
}

void DrafterExport::record_share(int32_t pid, uint32_t uid) {
    ++shares_;
    const uint64_t now = uint64_t(std::time(nullptr));
    auto it = std::find_if(importers_.begin(), importers_.end(),
                           [&](const DrafterImporter &i) { return i.pid == pid && i.uid == uid; });
    DrafterImporter rec;
    if (it != importers_.end()) {
        rec = *it;
        importers_.erase(it);
    } else {
        rec.pid = pid;
        rec.uid = uid;
        rec.first_unix = now;
        if (importers_.size() >= kImportersKept) importers_.erase(importers_.begin());
    }
    rec.last_unix = now;
    rec.shares += 1;
    rec.bytes = bytes_;
    importers_.push_back(rec);
}

namespace {

// Whether /proc/PID/maps has a mapping of the file (dev, ino). Lines read
// "start-end perms offset major:minor inode [path]", the device in hex.
bool maps_file(int32_t pid, uint64_t dev, uint64_t ino) {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/maps", int(pid));
    FILE *f = std::fopen(path, "re");
    if (!f) return false;
    char line[4096];
    bool found = false;
    while (!found && std::fgets(line, sizeof line, f)) {
        unsigned maj = 0, min = 0;
        unsigned long long inode = 0;
        if (std::sscanf(line, "%*s %*s %*s %x:%x %llu", &maj, &min, &inode) == 3)
            found = inode == ino && makedev(maj, min) == dev;
        // A line longer than the buffer continues in the next fgets: skip its rest.
        while (!std::strchr(line, '\n') && std::fgets(line, sizeof line, f)) {
        }
    }
    std::fclose(f);
    return found;
}

}  // namespace

DrafterSharing DrafterExport::sharing() const {
    DrafterSharing s;
    s.offered = ready_;
    s.bytes = bytes_;
    s.shares = shares_;
    s.importers.assign(importers_.rbegin(), importers_.rend());
    for (DrafterImporter &i : s.importers) i.mapped = maps_file(i.pid, dev_, ino_);
    return s;
}

}  // namespace ds4::daemon
