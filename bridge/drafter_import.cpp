#include "bridge/drafter_import.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "engine/common/error.h"
#include "ipc/frame.h"

namespace ds4::bridge_impl {

namespace {

namespace fb = ipc::fb;

constexpr int kTimeoutS = 10;           // a daemon that does not answer within this is skipped
constexpr uint32_t kLayoutGgufFile = 1;  // DrafterShare.layout: the GGUF's bytes from offset 0

struct Fd {
    int fd = -1;
    Fd() = default;
    explicit Fd(int f) : fd(f) {}
    Fd(Fd &&o) noexcept : fd(o.fd) { o.fd = -1; }
    Fd &operator=(Fd &&o) noexcept {
        reset();
        fd = o.fd;
        o.fd = -1;
        return *this;
    }
    ~Fd() { reset(); }
    void reset() {
        if (fd >= 0) ::close(fd);
        fd = -1;
    }
};

[[noreturn]] void sys_fail(const std::string &what) { throw ds4::Error(what + ": " + std::strerror(errno)); }

struct Share {
    Fd fd;
    uint32_t layout = 0, n_vocab = 0;
    uint64_t fingerprint = 0, bytes = 0;
    Fd device_fd;                      // the device weights' handle, when asked for and sent
    ds4::DeviceWeightsLayout device;
};

class Conn {
public:
    explicit Conn(const std::string &path) {
        sockaddr_un addr{};
        if (path.size() >= sizeof addr.sun_path) throw ds4::Error("socket path is too long");
        sock_ = Fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
        if (sock_.fd < 0) sys_fail("socket");
        timeval tv{kTimeoutS, 0};
        setsockopt(sock_.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(sock_.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        addr.sun_family = AF_UNIX;
        std::memcpy(addr.sun_path, path.data(), path.size());
        if (::connect(sock_.fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0) sys_fail("cannot connect");
        // Weights are only taken from a server of our own user.
        ucred cred{};
        socklen_t len = sizeof cred;
        if (getsockopt(sock_.fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) sys_fail("SO_PEERCRED");
        if (cred.uid != ::geteuid())
            throw ds4::Error("the server runs as uid " + std::to_string(cred.uid) + ", not ours (" +
                             std::to_string(::geteuid()) + ")");
    }

    template <class T> void send(uint64_t rid, flatbuffers::Offset<T> body, flatbuffers::FlatBufferBuilder &fbb) {
        ipc::finish_frame(fbb, rid, body);
        const uint8_t *p = fbb.GetBufferPointer();
        size_t left = fbb.GetSize();
        while (left) {
            const ssize_t n = ::send(sock_.fd, p, left, MSG_NOSIGNAL);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) sys_fail("send");
            p += n;
            left -= size_t(n);
        }
    }

    // The next frame's envelope; descriptors that arrive meanwhile are kept in fds().
    const fb::Envelope *next() {
        for (;;) {
            const auto st = dec_.next();
            if (st == ipc::FrameDecoder::Status::Frame) return dec_.envelope();
            if (st == ipc::FrameDecoder::Status::Error) throw ds4::Error("bad reply: " + dec_.error_message());
            uint8_t buf[4096];
            alignas(cmsghdr) char ctl[CMSG_SPACE(4 * sizeof(int))];
            iovec iov{buf, sizeof buf};
            msghdr msg{};
            msg.msg_iov = &iov;
            msg.msg_iovlen = 1;
            msg.msg_control = ctl;
            msg.msg_controllen = sizeof ctl;
            const ssize_t n = ::recvmsg(sock_.fd, &msg, MSG_CMSG_CLOEXEC);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) sys_fail(errno == EAGAIN || errno == EWOULDBLOCK ? "no answer within " + std::to_string(kTimeoutS) + " s"
                                                                        : std::string("recvmsg"));
            for (cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
                if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
                const size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t i = 0; i < k; ++i) {
                    int fd;
                    std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                    fds_.emplace_back(fd);
                }
            }
            if (msg.msg_flags & MSG_CTRUNC) throw ds4::Error("the server sent more descriptors than expected");
            if (n == 0) throw ds4::Error("the server closed the connection");
            dec_.feed(buf, size_t(n));
        }
    }

    std::vector<Fd> &fds() { return fds_; }

private:
    Fd sock_;
    ipc::FrameDecoder dec_;
    std::vector<Fd> fds_;
};

std::string refusal(const fb::Envelope *env, const char *expected) {
    if (const auto *e = env->body_as_Error())
        return std::string("ds4d refused (") + ipc::error_code_name(e->code()) + "): " + (e->message() ? e->message()->str() : "");
    return std::string("expected ") + expected + ", got message type " + std::to_string(int(env->body_type()));
}

Share fetch_share(const std::string &socket_path, bool want_device) {
    Conn c(socket_path);
    {
        flatbuffers::FlatBufferBuilder fbb;
        c.send(1, fb::CreateHello(fbb, ipc::kProtocolVersion, fbb.CreateString("libds4 drafter import")), fbb);
    }
    const fb::Envelope *env = c.next();
    if (env->body_type() != fb::Message::HelloOk) throw ds4::Error(refusal(env, "HelloOk"));
    {
        flatbuffers::FlatBufferBuilder fbb;
        c.send(2, fb::CreateGetDrafter(fbb, want_device), fbb);
    }
    env = c.next();
    const auto *d = env->body_as_DrafterShare();
    if (!d || env->request_id() != 2) throw ds4::Error(refusal(env, "DrafterShare"));
    const fb::DrafterDevice *dev = want_device ? d->device() : nullptr;
    const size_t expect = dev ? 2 : 1;
    if (c.fds().size() != expect)
        throw ds4::Error("the reply carried " + std::to_string(c.fds().size()) + " descriptors, not " +
                         (expect == 2 ? "two" : "one"));
    Share s;
    s.fd = std::move(c.fds()[0]);
    s.layout = d->layout();
    s.fingerprint = d->fingerprint();
    s.n_vocab = d->n_vocab();
    s.bytes = d->bytes();
    if (dev) {
        // A malformed device descriptor only costs the device half: the file is still shared.
        if (dev->uuid() && dev->uuid()->size() == sizeof s.device.uuid) {
            s.device_fd = std::move(c.fds()[1]);
            s.device.bytes = dev->bytes();
            s.device.granularity = dev->granularity();
            s.device.layout_hash = dev->layout_hash();
            std::memcpy(s.device.uuid, dev->uuid()->data(), sizeof s.device.uuid);
        } else {
            std::fprintf(stderr, "ds4: drafter_import: the device descriptor has no 16-byte GPU UUID; "
                                 "uploading the drafter's weights privately\n");
        }
    }
    return s;
}

// The descriptor and the file must agree, and the file must be frozen: a writable or
// shrinkable mapping could change or fault (SIGBUS) under the engine.
void check_share(const Share &s) {
    if (s.layout != kLayoutGgufFile)
        throw ds4::Error("unknown layout " + std::to_string(s.layout) + " (this library reads layout 1)");
    struct stat st {};
    if (fstat(s.fd.fd, &st) != 0) sys_fail("fstat of the shared file");
    if (!S_ISREG(st.st_mode)) throw ds4::Error("the shared descriptor is not a regular file");
    if (uint64_t(st.st_size) != s.bytes)
        throw ds4::Error("the descriptor says " + std::to_string(s.bytes) + " bytes, the shared file has " +
                         std::to_string(st.st_size));
    const int seals = fcntl(s.fd.fd, F_GET_SEALS);
    const int need = F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW;
    if (seals < 0 || (seals & need) != need)
        throw ds4::Error("the shared file is not sealed against writing and resizing");
}

}  // namespace

std::unique_ptr<ds4::Model> import_drafter(const std::string &socket_path, const ds4::ModelOptions &opt,
                                           std::string *why,
                                           const std::function<void(const ds4::Model &)> &check) {
    std::string link;  // the engine's messages name the file by this path
    try {
        // The device weights are asked for only by a drafter that will run on a GPU.
        Share s = fetch_share(socket_path, opt.backend == ds4::BackendKind::Cuda);
        check_share(s);
        // The memfd opens as a file through its /proc link: the reader maps it read-only and
        // shared, as it maps any GGUF. The target's host tables and expert streaming are not
        // the drafter's.
        ds4::ModelOptions mo = opt;
        mo.directory = nullptr;
        mo.plan = nullptr;
        mo.streaming = {};
        // On the GPU: the exporter's device allocation instead of an upload, when it fits
        // (else the backend uploads privately and says why; Backend::device_share()).
        mo.device_share = {};
        if (s.device_fd.fd >= 0) {
            mo.device_share.import_fd = s.device_fd.fd;
            mo.device_share.import_layout = s.device;
        }
        link = "/proc/self/fd/" + std::to_string(s.fd.fd);
        std::unique_ptr<ds4::Model> d = ds4::Model::open(link, mo);
        if (d->fingerprint() != s.fingerprint)
            throw ds4::Error("the shared file's fingerprint " + std::to_string(d->fingerprint()) +
                             " differs from the descriptor's " + std::to_string(s.fingerprint));
        if (uint32_t(d->config().n_vocab) != s.n_vocab)
            throw ds4::Error("the shared file's vocabulary has " + std::to_string(d->config().n_vocab) +
                             " tokens, the descriptor says " + std::to_string(s.n_vocab));
        check(*d);
        return d;
    } catch (const std::exception &e) {
        *why = e.what();
        for (size_t at; !link.empty() && (at = why->find(link)) != std::string::npos;)
            why->replace(at, link.size(), "(shared by ds4d)");
        return nullptr;
    }
}

}  // namespace ds4::bridge_impl
