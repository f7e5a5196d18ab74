// The GPU half of the shared drafter (ARCHITECTURE.md §5, "Shared drafter"): ds4d with its
// drafter on the CUDA backend places the drafter's device weights in one CUDA VMM allocation
// and passes its POSIX handle with the memfd; a second process on the bridge
// (ds4-drafter-importer, drafter_import, backend cuda) maps that device memory instead of
// uploading. Checked: ds4_bridge_drafter_shared = 1 and the device weights imported; greedy
// speculative output token-identical to a private drafter on the GPU, also after ds4d is
// killed (the allocation lives while the importer maps it); the GPU's used memory
// (cudaMemGetInfo) grows by the drafter's device bytes once across the two processes, not
// twice; and an exporter whose device descriptor does not fit (another GPU's UUID) makes the
// importer upload privately, with the reason, and decode the same tokens. Skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <string>
#include <vector>

#include "tests/daemon/e2e_support.h"

using namespace e2e;

namespace {

// The build's paths, or the environment's (scripts/gpu-drafter-share-check.sh runs this binary
// on a machine where the tree and the build sit elsewhere).
std::string path_of(const char *env, const char *built) {
    const char *e = std::getenv(env);
    return e && *e ? e : built;
}
const std::string kSource = path_of("DS4_SOURCE_DIR", DS4_SOURCE_DIR);
const std::string kDs4d = path_of("DS4D_PATH", DS4D_PATH);
const std::string kImporter = path_of("DS4_IMPORTER_PATH", DS4_IMPORTER_PATH);
const std::string kMakeModel = path_of("DS4_MAKE_MODEL_BIN", DS4_MAKE_MODEL_BIN);
const std::string kModel = kSource + "/models/ds4-pystd-q8_0.gguf";
const std::string kDrafter = kSource + "/models/ds4-pystd-drafter-q8_0.gguf";
const char *kText = "def parse_config(path):\n    ";

bool have_gpu(std::string *why) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        *why = e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device";
        return false;
    }
    return true;
}

// The GPU's free bytes as this process's context sees them (the whole device's).
uint64_t gpu_free() {
    size_t f = 0, t = 0;
    return cudaMemGetInfo(&f, &t) == cudaSuccess ? f : 0;
}

// "device ON_DEVICE IMPORTED READ_ONLY BYTES" of ds4-drafter-importer.
struct DeviceLine {
    int on_device = -1, imported = -1, read_only = -1;
    unsigned long long bytes = 0;
};
DeviceLine device_line(const std::string &s) {
    DeviceLine d;
    std::sscanf(s.c_str(), "%d %d %d %llu", &d.on_device, &d.imported, &d.read_only, &d.bytes);
    return d;
}

std::vector<std::string> gpu_daemon_args(const std::string &drafter) {
    return {"--backend", "cuda", "--drafter", drafter, "--ctx", "256"};
}

class DrafterShareGpu : public ::testing::Test {
protected:
    void SetUp() override {
        std::string why;
        if (!have_gpu(&why)) GTEST_SKIP() << "no usable GPU: " << why;
    }
};

// The trained pair: imported on the device, token-identical to a private drafter on the GPU.
TEST_F(DrafterShareGpu, ImportedDeviceWeightsDecodeLikeAPrivateDrafter) {
    TempDir d;
    Daemon dd;
    ASSERT_EQ(dd.start(kDs4d, kModel, d.path + "/g.sock", d.path + "/g.log", gpu_daemon_args(kDrafter)), "");
    const std::string log = read_file(dd.log);
    ASSERT_NE(log.find("bytes of GPU memory"), std::string::npos) << "ds4d did not export the device weights:\n" << log;

    ImporterProcess imp({kImporter, kModel, "--import", dd.socket, "40", kText, "cuda"});
    ASSERT_TRUE(imp.wait_ready());
    EXPECT_EQ(imp.lines["shared"], "1");
    const DeviceLine di = device_line(imp.lines["device"]);
    EXPECT_EQ(di.on_device, 1);
    EXPECT_EQ(di.imported, 1) << "the importer uploaded the drafter itself (its stderr says why)";
    EXPECT_GT(di.bytes, 0u);
    std::printf("imported %llu device bytes, mapped %s\n", di.bytes, di.read_only ? "read-only" : "read-write");
    const std::string shared_tokens = imp.lines["tokens"];
    // The imported device memory outlives the exporter: kill -9 ds4d, decode again.
    EXPECT_EQ(dd.stop(SIGKILL), -1000 - SIGKILL);
    ASSERT_TRUE(imp.again());
    EXPECT_EQ(imp.lines["tokens"], shared_tokens) << "after ds4d was killed";
    EXPECT_EQ(imp.finish(), 0);

    ImporterProcess priv({kImporter, kModel, "--private", kDrafter, "40", kText, "cuda"});
    ASSERT_TRUE(priv.wait_ready());
    EXPECT_EQ(priv.lines["shared"], "0");
    const DeviceLine dp = device_line(priv.lines["device"]);
    EXPECT_EQ(dp.on_device, 1);
    EXPECT_EQ(dp.imported, 0);
    EXPECT_FALSE(shared_tokens.empty());
    EXPECT_EQ(priv.lines["tokens"], shared_tokens);
    EXPECT_EQ(priv.finish(), 0);
}

// The figure on the GPU, with a drafter large enough (~430 MB of q8_0 experts) to
// stand out of the contexts' own memory: the importer's use of the GPU is the private
// loader's less the drafter's device bytes, and ds4d holds them once.
TEST_F(DrafterShareGpu, DeviceMemoryHoldsTheDrafterOnce) {
    TempDir d;
    const std::string target = d.path + "/target.gguf", drafter = d.path + "/drafter.gguf";
    ASSERT_EQ(run_cmd({kMakeModel, "--preset", "tiny", "--quiet", target}, d.path).rc, 0);
    const CmdResult mk = run_cmd({kMakeModel, "--preset", "tiny", "--embd", "256", "--experts", "128",
                                  "--expert-ff", "1024", "--expert-type", "q8_0", "--fast", "--seed", "7", "--quiet",
                                  drafter},
                                 d.path);
    ASSERT_EQ(mk.rc, 0) << mk.err;

    const uint64_t f0 = gpu_free();
    Daemon dd;
    ASSERT_EQ(dd.start(kDs4d, target, d.path + "/m.sock", d.path + "/m.log", gpu_daemon_args(drafter)), "");
    ASSERT_NE(read_file(dd.log).find("bytes of GPU memory"), std::string::npos) << read_file(dd.log);
    const uint64_t f1 = gpu_free();

    ImporterProcess imp({kImporter, target, "--import", dd.socket, "32", "abc", "cuda"});
    ASSERT_TRUE(imp.wait_ready());
    const uint64_t f2 = gpu_free();
    const DeviceLine di = device_line(imp.lines["device"]);
    ASSERT_EQ(di.imported, 1);
    const std::string shared_tokens = imp.lines["tokens"];
    EXPECT_EQ(imp.finish(), 0);

    // The importer's context is gone once the driver has taken its memory back.
    for (int i = 0; i < 50 && gpu_free() + (64ull << 20) < f1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const uint64_t f1b = gpu_free();
    ImporterProcess priv({kImporter, target, "--private", drafter, "32", "abc", "cuda"});
    ASSERT_TRUE(priv.wait_ready());
    const uint64_t f3 = gpu_free();
    EXPECT_EQ(priv.lines["tokens"], shared_tokens);
    EXPECT_EQ(priv.finish(), 0);

    const double mib = 1048576.0, drafter_b = double(di.bytes);
    const double daemon_use = double(f0) - double(f1), import_use = double(f1) - double(f2),
                 private_use = double(f1b) - double(f3);
    std::printf("drafter device bytes %.1f MiB; GPU used by ds4d %.1f MiB, by the importer %.1f MiB, by a private "
                "loader %.1f MiB (difference %.1f MiB)\n",
                drafter_b / mib, daemon_use / mib, import_use / mib, private_use / mib, (private_use - import_use) / mib);
    EXPECT_GE(daemon_use, drafter_b) << "ds4d holds the drafter's device weights";
    EXPECT_GE(private_use - import_use, 0.9 * drafter_b) << "the importer did not save the drafter's device bytes";
    EXPECT_LE(private_use - import_use, 1.1 * drafter_b + 64 * mib);
}

// An exporter whose device descriptor names another GPU: the importer keeps the shared file
// (shared = 1), uploads the device weights privately, says why, and decodes the same tokens.
TEST_F(DrafterShareGpu, ForeignDeviceDescriptorFallsBackToAnUpload) {
    TempDir d;
    Daemon dd;
    ASSERT_EQ(dd.start(kDs4d, kModel, d.path + "/g.sock", d.path + "/g.log", gpu_daemon_args(kDrafter)), "");
    const std::string sock = dd.socket;

    // A relay between the importer and ds4d that rewrites the UUID in DrafterShare.device
    // and passes both descriptors on.
    const std::string relay_path = d.path + "/relay.sock";
    const int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, relay_path.c_str(), sizeof a.sun_path - 1);
    ASSERT_EQ(bind(lfd, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
    ASSERT_EQ(listen(lfd, 1), 0);
    std::thread relay([&] {
        const int c = accept(lfd, nullptr, nullptr);
        if (c < 0) return;
        FdConn up(sock);
        ds4::ipc::FrameDecoder dec;
        auto from_client = [&]() -> const fb::Envelope * {
            for (;;) {
                if (dec.next() == ds4::ipc::FrameDecoder::Status::Frame) return dec.envelope();
                uint8_t b[4096];
                const ssize_t n = recv(c, b, sizeof b, 0);
                if (n <= 0) return nullptr;
                dec.feed(b, size_t(n));
            }
        };
        // Hello: forwarded, answered as ds4d answers.
        if (!from_client()) return (void)close(c);
        up.send(frame([&](auto &fbb) {
            ds4::ipc::finish_frame(fbb, 1, fb::CreateHelloDirect(fbb, ds4::ipc::kProtocolVersion, "relay"));
        }));
        const auto ok = frame([&](auto &fbb) {
            ds4::ipc::finish_frame(fbb, 1, fb::CreateHelloOkDirect(fbb, ds4::ipc::kProtocolVersion, "relay"));
        });
        (void)::send(c, ok.data(), ok.size(), MSG_NOSIGNAL);
        up.next_with_fds();
        // GetDrafter with device: forwarded; the reply's UUID rewritten.
        const fb::Envelope *g = from_client();
        if (!g) return (void)close(c);
        const uint64_t rid = g->request_id();
        up.send(frame([&](auto &fbb) { ds4::ipc::finish_frame(fbb, 7, fb::CreateGetDrafter(fbb, true)); }));
        const fb::Envelope *e = up.next_with_fds();
        const auto *s = e ? e->body_as_DrafterShare() : nullptr;
        if (!s || !s->device() || up.fds.size() != 2) return (void)close(c);
        std::vector<uint8_t> uuid(16, 0xab);
        const auto share = frame([&](auto &fbb) {
            auto dev = fb::CreateDrafterDevice(fbb, s->device()->bytes(), s->device()->granularity(),
                                               fbb.CreateVector(uuid), s->device()->layout_hash());
            ds4::ipc::finish_frame(fbb, rid, fb::CreateDrafterShare(fbb, s->layout(), s->fingerprint(), s->n_vocab(),
                                                                    s->bytes(), dev));
        });
        iovec iov{const_cast<uint8_t *>(share.data()), share.size()};
        alignas(cmsghdr) char ctl[CMSG_SPACE(2 * sizeof(int))] = {};
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = ctl;
        msg.msg_controllen = sizeof ctl;
        cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(2 * sizeof(int));
        const int fds[2] = {up.fds[0], up.fds[1]};
        std::memcpy(CMSG_DATA(cm), fds, sizeof fds);
        (void)sendmsg(c, &msg, MSG_NOSIGNAL);
        char b[64];
        while (recv(c, b, sizeof b, 0) > 0) {
        }
        close(c);
    });

    ImporterProcess imp({kImporter, kModel, "--import", relay_path, "40", kText, "cuda"});
    const bool ready = imp.wait_ready();
    const std::string tokens = imp.lines["tokens"];
    const DeviceLine di = device_line(imp.lines["device"]);
    const std::string shared = imp.lines["shared"];
    const int rc = imp.finish();
    shutdown(lfd, SHUT_RDWR);   // an importer that never connected must not leave accept() waiting
    relay.join();
    close(lfd);
    ASSERT_TRUE(ready);
    EXPECT_EQ(rc, 0);
    EXPECT_EQ(shared, "1") << "the file half is still shared";
    EXPECT_EQ(di.on_device, 1);
    EXPECT_EQ(di.imported, 0) << "a device descriptor of another GPU was used";

    ImporterProcess priv({kImporter, kModel, "--private", kDrafter, "40", kText, "cuda"});
    ASSERT_TRUE(priv.wait_ready());
    EXPECT_EQ(priv.lines["tokens"], tokens);
    EXPECT_EQ(priv.finish(), 0);
}

}  // namespace
