// A drafter shared read-only across processes (ARCHITECTURE.md §5, "Shared drafter"): a real
// ds4d with the trained drafter exports it; a bridge opener in this process imports it
// (drafter_shared = 1), its pages are the daemon's (the same memfd inode in both smaps,
// shared, no anonymous copy, PSS about half the RSS), and greedy speculative output equals a
// privately loaded drafter's, also after the daemon is killed. Every way the import can go
// wrong falls back (private drafter_path, or no drafter) with the reason, never a crash: no
// daemon, a daemon without a drafter or not sharing it, a drafter of another vocabulary, and a
// lying exporter (size, fingerprint, unsealed file, no descriptor), another user (refused by
// both sides). A client asking in a loop gets a bounded number of descriptors and ds4d's own
// descriptor table does not grow.
#include <gtest/gtest.h>

#ifndef DS4_E2E
#define DS4_E2E 0
#endif

#if !DS4_E2E
TEST(DrafterShareE2E, NeedsBridgeAndDaemon) {
    GTEST_SKIP() << "the shared-drafter end-to-end tests need the bridge library (ds4lib) and ds4d in this build";
}
#else

#include <sys/mman.h>
#include <sys/stat.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <span>

#include "bridge/ds4.hpp"
#include "client/ds4client.hpp"
#include "tests/daemon/e2e_support.h"
#include "tests/daemon/other_user.h"

using namespace e2e;

namespace {

const std::string kModel = std::string(DS4_SOURCE_DIR) + "/models/ds4-pystd-q8_0.gguf";
const std::string kDrafter = std::string(DS4_SOURCE_DIR) + "/models/ds4-pystd-drafter-q8_0.gguf";
constexpr int kCtx = 256;

ds4::bridge::Model open_model(const std::string &import_sock, const std::string &drafter_path) {
    ds4::bridge::ModelOptions mo;
    mo.model_path = kModel;
    mo.n_threads = 1;
    mo.drafter_import = import_sock;
    mo.drafter_path = drafter_path;
    return ds4::bridge::Model(mo);
}

// A greedy turn through spec_trial/commit (as ds4d decodes), n tokens; `after` (if set) is
// called with the count so far after each trial or step.
std::vector<int32_t> spec_turn(ds4::bridge::Model &m, const std::string &text, int n,
                               const std::function<void(size_t)> &after = {}) {
    ds4::bridge::Session s(m, kCtx);
    const std::vector<int32_t> prompt = m.tokenize(text);
    s.sync(prompt);
    std::vector<int32_t> out{s.argmax()};
    while ((int)out.size() < n) {
        const ds4::bridge::SpecTrial t = s.spec_trial(out.back(), 0.f, 0, 1.f, 0.f, nullptr, n - (int)out.size());
        if (t.width == 0) {
            s.eval(out.back());
            out.push_back(s.argmax());
            continue;
        }
        int keep = 0;
        while (keep <= t.accepted && (int)out.size() < n) out.push_back(t.argmax[keep++]);
        s.spec_commit(keep);
        if (after) after(out.size());
    }
    return out;
}

const char *kPrompts[] = {"def parse_config(path):\n    ", "import os\n\nclass Cache:\n    def __init__(self"};

// The fields of the /proc/PID/smaps entries whose name starts with `prefix`, summed (kB),
// plus "inode" of the last one.
std::map<std::string, uint64_t> smaps_of(pid_t pid, const std::string &prefix) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/smaps");
    std::map<std::string, uint64_t> r;
    std::string line;
    bool in = false;
    while (std::getline(f, line)) {
        const size_t colon = line.find(':');
        const bool header = colon == std::string::npos || line.find(' ') < colon;  // "addr-addr perms off dev inode name"
        if (header) {
            std::istringstream ls(line);
            std::string range, perms, off, dev, name;
            uint64_t inode = 0;
            ls >> range >> perms >> off >> dev >> inode;
            std::getline(ls, name);
            name.erase(0, name.find_first_not_of(' '));
            in = name.rfind(prefix, 0) == 0;
            if (in) {
                r["inode"] = inode;
                r["mappings"] += 1;
                if (perms.find('w') != std::string::npos) r["writable"] += 1;
                if (perms.size() > 3 && perms[3] == 's') r["shared_mappings"] += 1;
            }
            continue;
        }
        if (!in) continue;
        std::istringstream ls(line.substr(colon + 1));
        uint64_t kb = 0;
        if (ls >> kb) r[line.substr(0, colon)] += kb;
    }
    return r;
}

size_t count_fds(pid_t pid) {
    size_t n = 0;
    for (auto &e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) (void)e, ++n;
    return n;
}

std::vector<uint8_t> get_drafter_frame(uint64_t rid) {
    return frame([&](auto &fbb) { ds4::ipc::finish_frame(fbb, rid, fb::CreateGetDrafter(fbb)); });
}

class DrafterShareE2E : public ::testing::Test {
protected:
    static inline TempDir *dir = nullptr;
    static inline Daemon *daemon = nullptr;
    static inline std::vector<int32_t> *private_out = nullptr;

    static void SetUpTestSuite() {
        dir = new TempDir;
        daemon = new Daemon;
        const std::string err = daemon->start(DS4D_PATH, kModel, dir->path + "/ds4.sock", dir->path + "/ds4d.log",
                                              {"--drafter", kDrafter, "--ctx", std::to_string(kCtx)});
        ASSERT_EQ(err, "");
        ds4::bridge::Model priv = open_model("", kDrafter);
        private_out = new std::vector<int32_t>;
        for (const char *p : kPrompts) {
            const auto t = spec_turn(priv, p, 40);
            private_out->insert(private_out->end(), t.begin(), t.end());
        }
    }
    static void TearDownTestSuite() {
        if (daemon && daemon->pid > 0) {
            EXPECT_EQ(daemon->stop(SIGTERM), 0) << read_file(daemon->log);
        }
        delete daemon;
        delete dir;
        delete private_out;
        daemon = nullptr;
        dir = nullptr;
        private_out = nullptr;
    }
    void SetUp() override {
        if (!daemon || daemon->pid < 0) GTEST_SKIP() << "suite set-up failed";
    }
    static std::vector<int32_t> turns(ds4::bridge::Model &m, const std::function<void(size_t)> &after = {}) {
        std::vector<int32_t> out;
        for (const char *p : kPrompts) {
            const auto t = spec_turn(m, p, 40, after);
            out.insert(out.end(), t.begin(), t.end());
        }
        return out;
    }
};

TEST_F(DrafterShareE2E, ImportedDrafterIsTheDaemonsPagesAndDecodesLikeAPrivateOne) {
    ds4::bridge::Model m = open_model(daemon->socket, "");
    ASSERT_TRUE(m.drafter_shared()) << m.drafter_import_note();
    EXPECT_EQ(m.drafter_import_note(), "");
    EXPECT_EQ(m.spec_counters().draft_max, 4);
    ds4::bridge::Model priv = open_model("", kDrafter);
    EXPECT_FALSE(priv.drafter_shared());
    EXPECT_EQ(m.drafter_info().fingerprint, priv.drafter_info().fingerprint);

    EXPECT_EQ(turns(m), *private_out);
    EXPECT_GT(m.spec_counters().drafted, 0u);
    EXPECT_GT(m.spec_counters().accepted, 0u);

    // The importer maps the daemon's memfd (same inode), shared and read-only, with no
    // anonymous (private copy) pages; both processes have the pages resident, so each is
    // charged about half of them (PSS).
    const auto mine = smaps_of(getpid(), "/memfd:ds4-drafter");
    const auto theirs = smaps_of(daemon->pid, "/memfd:ds4-drafter");
    ASSERT_GT(mine.count("inode"), 0u) << "no memfd mapping in this process";
    ASSERT_GT(theirs.count("inode"), 0u) << "no memfd mapping in ds4d";
    EXPECT_EQ(mine.at("inode"), theirs.at("inode"));
    const uint64_t file_kb = std::filesystem::file_size(kDrafter) / 1024;
    EXPECT_GE(mine.at("Size"), file_kb);
    EXPECT_EQ(mine.count("writable"), 0u);
    EXPECT_EQ(mine.at("shared_mappings"), mine.at("mappings"));
    EXPECT_EQ(mine.at("Anonymous"), 0u);
    EXPECT_GE(mine.at("Rss"), file_kb * 9 / 10) << "prewarm touched the drafter";
    EXPECT_GE(mine.at("Shared_Clean") + mine.at("Shared_Dirty"), mine.at("Rss") * 9 / 10);
    EXPECT_LE(mine.at("Pss"), mine.at("Rss") * 6 / 10);
    EXPECT_LE(theirs.at("Pss"), theirs.at("Rss") * 6 / 10);
    std::printf("drafter %llu kB: importer Rss %llu kB Pss %llu kB, ds4d Rss %llu kB Pss %llu kB\n",
                (unsigned long long)file_kb, (unsigned long long)mine.at("Rss"), (unsigned long long)mine.at("Pss"),
                (unsigned long long)theirs.at("Rss"), (unsigned long long)theirs.at("Pss"));
}

TEST_F(DrafterShareE2E, WithoutADaemonTheOpenFallsBack) {
    const std::string nowhere = dir->path + "/nobody.sock";
    ds4::bridge::Model withp = open_model(nowhere, kDrafter);
    EXPECT_FALSE(withp.drafter_shared());
    EXPECT_EQ(withp.spec_counters().draft_max, 4) << "the private drafter is loaded";
    EXPECT_NE(withp.drafter_import_note().find("cannot connect"), std::string::npos) << withp.drafter_import_note();
    EXPECT_NE(withp.drafter_import_note().find("loading the drafter privately"), std::string::npos);
    EXPECT_EQ(turns(withp), *private_out);

    ds4::bridge::Model none = open_model(nowhere, "");
    EXPECT_FALSE(none.drafter_shared());
    EXPECT_EQ(none.spec_counters().draft_max, 0);
    EXPECT_NE(none.drafter_import_note().find("no drafter"), std::string::npos) << none.drafter_import_note();
}

TEST_F(DrafterShareE2E, DaemonsWithoutASharedDrafterRefuse) {
    TempDir d;
    const std::string tiny = d.path + "/tiny.gguf";
    ASSERT_EQ(run_cmd({DS4_MAKE_MODEL_PATH, "--preset", "tiny", tiny}, d.path).rc, 0);
    Daemon plain;
    ASSERT_EQ(plain.start(DS4D_PATH, tiny, d.path + "/plain.sock", d.path + "/plain.log"), "");
    ds4::bridge::Model a = open_model(plain.socket, kDrafter);
    EXPECT_FALSE(a.drafter_shared());
    EXPECT_EQ(a.spec_counters().draft_max, 4);
    EXPECT_NE(a.drafter_import_note().find("without a drafter"), std::string::npos) << a.drafter_import_note();

    Daemon priv;
    ASSERT_EQ(priv.start(DS4D_PATH, kModel, d.path + "/priv.sock", d.path + "/priv.log",
                         {"--drafter", kDrafter, "--no-share-drafter"}),
              "");
    ds4::bridge::Model b = open_model(priv.socket, "");
    EXPECT_FALSE(b.drafter_shared());
    EXPECT_EQ(b.spec_counters().draft_max, 0);
    EXPECT_NE(b.drafter_import_note().find("--no-share-drafter"), std::string::npos) << b.drafter_import_note();
    EXPECT_EQ(smaps_of(priv.pid, "/memfd:ds4-drafter").count("inode"), 0u) << "--no-share-drafter makes no memfd";
}

TEST_F(DrafterShareE2E, ADrafterOfAnotherVocabularyIsRefused) {
    TempDir d;
    const std::string tiny = d.path + "/tiny.gguf";
    ASSERT_EQ(run_cmd({DS4_MAKE_MODEL_PATH, "--preset", "tiny", tiny}, d.path).rc, 0);
    Daemon other;
    ASSERT_EQ(other.start(DS4D_PATH, tiny, d.path + "/o.sock", d.path + "/o.log", {"--drafter", tiny}), "");
    ds4::bridge::Model m = open_model(other.socket, kDrafter);
    EXPECT_FALSE(m.drafter_shared());
    EXPECT_NE(m.drafter_import_note().find("does not fit the model"), std::string::npos) << m.drafter_import_note();
    EXPECT_EQ(turns(m), *private_out) << "the private drafter is used";
}

// GetDrafter asking for the device weights (an importer on a GPU) from a ds4d whose drafter
// runs on the CPU: the file alone, one descriptor, no device descriptor (the GPU half is
// tests/cuda/drafter_share_gpu_test.cpp).
TEST_F(DrafterShareE2E, DeviceRequestOfACpuDaemonGetsTheFileOnly) {
    FdConn c(daemon->socket);
    ASSERT_TRUE(c.send(hello_frame()) && c.next_with_fds());
    ASSERT_TRUE(c.send(frame([](auto &fbb) { ds4::ipc::finish_frame(fbb, 2, fb::CreateGetDrafter(fbb, true)); })));
    const fb::Envelope *e = c.next_with_fds();
    ASSERT_NE(e, nullptr);
    const auto *s = e->body_as_DrafterShare();
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->device(), nullptr);
    EXPECT_EQ(c.fds.size(), 1u);
}

// An exporter that lies: answers Hello, then GetDrafter with the given descriptor and fd.
struct FakeExporter {
    std::string path;
    int lfd = -1;
    std::thread th;
    FakeExporter(const std::string &p, uint64_t fingerprint, uint32_t n_vocab, uint64_t bytes, int pass_fd) : path(p) {
        lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_un a{};
        a.sun_family = AF_UNIX;
        std::strncpy(a.sun_path, p.c_str(), sizeof a.sun_path - 1);
        EXPECT_EQ(bind(lfd, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
        EXPECT_EQ(listen(lfd, 4), 0);
        th = std::thread([=, this] {
            const int c = accept(lfd, nullptr, nullptr);
            if (c < 0) return;
            ds4::ipc::FrameDecoder dec;
            auto next = [&]() -> const fb::Envelope * {
                for (;;) {
                    if (dec.next() == ds4::ipc::FrameDecoder::Status::Frame) return dec.envelope();
                    uint8_t b[4096];
                    const ssize_t n = recv(c, b, sizeof b, 0);
                    if (n <= 0) return nullptr;
                    dec.feed(b, size_t(n));
                }
            };
            if (next()) {
                const auto ok = frame([&](auto &fbb) {
                    ds4::ipc::finish_frame(fbb, 1, fb::CreateHelloOkDirect(fbb, ds4::ipc::kProtocolVersion, "fake"));
                });
                (void)::send(c, ok.data(), ok.size(), MSG_NOSIGNAL);
            }
            if (const fb::Envelope *e = next()) {
                const auto share = frame([&](auto &fbb) {
                    ds4::ipc::finish_frame(fbb, e->request_id(), fb::CreateDrafterShare(fbb, 1, fingerprint, n_vocab, bytes));
                });
                iovec iov{const_cast<uint8_t *>(share.data()), share.size()};
                alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
                msghdr msg{};
                msg.msg_iov = &iov;
                msg.msg_iovlen = 1;
                if (pass_fd >= 0) {
                    msg.msg_control = ctl;
                    msg.msg_controllen = sizeof ctl;
                    cmsghdr *cm = CMSG_FIRSTHDR(&msg);
                    cm->cmsg_level = SOL_SOCKET;
                    cm->cmsg_type = SCM_RIGHTS;
                    cm->cmsg_len = CMSG_LEN(sizeof(int));
                    std::memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
                }
                (void)sendmsg(c, &msg, MSG_NOSIGNAL);
                char b[64];
                while (recv(c, b, sizeof b, 0) > 0) {
                }
            }
            close(c);
        });
    }
    ~FakeExporter() {
        th.join();
        close(lfd);
        unlink(path.c_str());
    }
};

// A memfd holding the drafter's bytes; sealed or not.
int drafter_memfd(bool seal) {
    const int fd = memfd_create("fake-drafter", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    std::ifstream in(kDrafter, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(write(fd, bytes.data(), bytes.size()), ssize_t(bytes.size()));
    if (seal) {
        EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
    }
    return fd;
}

TEST_F(DrafterShareE2E, LyingDescriptorsAreRefused) {
    ds4::bridge::Model priv = open_model("", kDrafter);
    const ds4_bridge_model_info_t info = priv.drafter_info();
    const uint64_t size = std::filesystem::file_size(kDrafter);
    const int sealed = drafter_memfd(true), unsealed = drafter_memfd(false);
    const int plain_file = open(kDrafter.c_str(), O_RDONLY | O_CLOEXEC);
    struct Case {
        const char *what;
        uint64_t fingerprint;
        uint32_t n_vocab;
        uint64_t bytes;
        int fd;
        const char *expect;
    } cases[] = {
        {"size", info.fingerprint, uint32_t(info.n_vocab), size + 4096, sealed, "the descriptor says"},
        {"short size", info.fingerprint, uint32_t(info.n_vocab), size / 2, sealed, "the descriptor says"},
        {"fingerprint", info.fingerprint ^ 1, uint32_t(info.n_vocab), size, sealed, "fingerprint"},
        {"vocabulary", info.fingerprint, uint32_t(info.n_vocab) + 1, size, sealed, "vocabulary"},
        {"unsealed", info.fingerprint, uint32_t(info.n_vocab), size, unsealed, "not sealed"},
        {"plain file", info.fingerprint, uint32_t(info.n_vocab), size, plain_file, "not sealed"},
        {"no descriptor", info.fingerprint, uint32_t(info.n_vocab), size, -1, "descriptors, not one"},
    };
    int n = 0;
    for (const Case &c : cases) {
        SCOPED_TRACE(c.what);
        const std::string sock = dir->path + "/fake" + std::to_string(n++) + ".sock";
        FakeExporter fake(sock, c.fingerprint, c.n_vocab, c.bytes, c.fd);
        ds4::bridge::Model m = open_model(sock, "");
        EXPECT_FALSE(m.drafter_shared());
        EXPECT_EQ(m.spec_counters().draft_max, 0);
        EXPECT_NE(m.drafter_import_note().find(c.expect), std::string::npos) << m.drafter_import_note();
    }
    // The honest version of the same exporter is accepted (the checks above are what failed).
    {
        FakeExporter fake(dir->path + "/honest.sock", info.fingerprint, uint32_t(info.n_vocab), size, sealed);
        ds4::bridge::Model m = open_model(dir->path + "/honest.sock", "");
        EXPECT_TRUE(m.drafter_shared()) << m.drafter_import_note();
    }
    close(sealed);
    close(unsealed);
    close(plain_file);
}

TEST_F(DrafterShareE2E, AClientAskingInALoopGetsBoundedDescriptors) {
    const size_t before = count_fds(daemon->pid);
    {
        FdConn c(daemon->socket);
        ASSERT_TRUE(c.ok());
        ASSERT_TRUE(c.send(hello_frame()));
        const fb::Envelope *e = c.next_with_fds();
        ASSERT_TRUE(e && e->body_type() == fb::Message::HelloOk);
        int shared = 0, busy = 0;
        for (uint64_t rid = 2; rid < 22; ++rid) {
            ASSERT_TRUE(c.send(get_drafter_frame(rid)));
            e = c.next_with_fds();
            ASSERT_NE(e, nullptr);
            EXPECT_EQ(e->request_id(), rid);
            if (e->body_type() == fb::Message::DrafterShare) ++shared;
            else if (e->body_as_Error() && e->body_as_Error()->code() == fb::ErrorCode::Busy) ++busy;
        }
        EXPECT_EQ(shared, 4);
        EXPECT_EQ(busy, 16);
        EXPECT_EQ(c.fds.size(), 4u) << "one descriptor per DrafterShare, none with a refusal";
        // Before Hello, GetDrafter is refused and passes nothing.
        FdConn early(daemon->socket);
        ASSERT_TRUE(early.send(get_drafter_frame(7)));
        e = early.next_with_fds();
        ASSERT_TRUE(e && e->body_as_Error());
        EXPECT_EQ(e->body_as_Error()->code(), fb::ErrorCode::Protocol);
        EXPECT_TRUE(early.fds.empty());
    }
    for (int i = 0; i < 30; ++i) {
        FdConn c(daemon->socket);
        ASSERT_TRUE(c.send(hello_frame()) && c.next_with_fds());
        ASSERT_TRUE(c.send(get_drafter_frame(2)));
        const fb::Envelope *e = c.next_with_fds();
        ASSERT_TRUE(e && e->body_type() == fb::Message::DrafterShare);
        EXPECT_EQ(c.fds.size(), 1u);
    }
    // ds4d closes the connections as it sees them go; its table returns to where it was.
    size_t after = 0;
    for (int i = 0; i < 200 && (after = count_fds(daemon->pid)) != before; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(after, before);
}

// Another user is refused by ds4d itself (SO_PEERCRED), even where the file modes would let
// it reach the socket; it falls back like any refused import.
TEST_F(DrafterShareE2E, AnotherUserIsRefused) {
    if (!othuser::can_switch_user()) GTEST_SKIP() << "needs root to run a second user";
    TempDir d;
    Daemon dd;
    ASSERT_EQ(dd.start(DS4D_PATH, kModel, d.path + "/u.sock", d.path + "/u.log", {"--drafter", kDrafter}), "");
    ASSERT_EQ(chmod(d.path.c_str(), 0755), 0);
    ASSERT_EQ(chmod(dd.socket.c_str(), 0666), 0);
    const std::string sock = dd.socket;
    othuser::Child child([&](int ready, int report) {
        (void)!write(ready, "r", 1);
        std::string note;
        try {
            ds4::bridge::Model m = open_model(sock, "");
            note = std::string(m.drafter_shared() ? "SHARED " : "private ") + m.drafter_import_note();
        } catch (const std::exception &e) {
            note = std::string("open failed: ") + e.what();
        }
        // The daemon's side, asked directly: refused at the connection, no descriptor.
        FdConn c(sock);
        if (c.ok() && c.send(hello_frame()) && c.send(get_drafter_frame(2))) {
            const fb::Envelope *e = c.next_with_fds();
            note += "\n";
            note += e && e->body_as_Error() && e->body_as_Error()->message() ? e->body_as_Error()->message()->str()
                                                                             : "no error frame";
            note += " fds=" + std::to_string(c.fds.size());
        }
        (void)!write(report, note.data(), note.size());
        return 0;
    });
    ASSERT_TRUE(child.wait_ready());
    const std::string note = child.read_report();
    EXPECT_EQ(child.wait(), 0);
    // The importer refuses a server of another user before asking; ds4d refuses the peer.
    EXPECT_EQ(note.rfind("private ", 0), 0u) << note;
    EXPECT_NE(note.find("not ours"), std::string::npos) << note;
    EXPECT_NE(note.find("serves only its own user"), std::string::npos) << note;
    EXPECT_NE(note.find("fds=0"), std::string::npos) << note;
}

TEST_F(DrafterShareE2E, TheImporterOutlivesTheDaemon) {
    TempDir d;
    Daemon victim;
    ASSERT_EQ(victim.start(DS4D_PATH, kModel, d.path + "/v.sock", d.path + "/v.log", {"--drafter", kDrafter}), "");
    ds4::bridge::Model m = open_model(victim.socket, "");
    ASSERT_TRUE(m.drafter_shared()) << m.drafter_import_note();
    victim.stop(SIGKILL);
    EXPECT_EQ(turns(m), *private_out);
    EXPECT_GT(m.spec_counters().accepted, 0u);
}

// The daemon is killed with SIGKILL while the importer is in the middle of a generation and
// restarted on the same socket before it goes on: the importer finishes exactly as a private
// drafter decodes (the memfd lives while mapped), the restarted daemon exports again, and
// ds4 stats lists the importers (pid, uid, when, bytes) and whether each maps the drafter
// now -- by the memfd's inode, so this process mapping the first daemon's memfd does not
// count for the second's.
TEST_F(DrafterShareE2E, KilledAndRestartedMidDecodeTheImporterGoesOnAndANewOneImports) {
    TempDir d;
    const std::string sock = d.path + "/r.sock";
    const uint64_t file_bytes = std::filesystem::file_size(kDrafter);
    Daemon first;
    ASSERT_EQ(first.start(DS4D_PATH, kModel, sock, d.path + "/r1.log", {"--drafter", kDrafter}), "");
    ds4::bridge::Model m = open_model(sock, "");
    ASSERT_TRUE(m.drafter_shared()) << m.drafter_import_note();

    // The importer's memory: the drafter's in-place tensors are shared, the rest private.
    const ds4_bridge_memory_ex_t mx = m.memory_ex();
    EXPECT_GT(mx.drafter_mapped_bytes, file_bytes / 2);
    EXPECT_GE(mx.drafter_weights_bytes, mx.drafter_mapped_bytes);
    EXPECT_EQ(mx.shared_bytes, mx.drafter_mapped_bytes);
    EXPECT_EQ(mx.private_bytes + mx.shared_bytes, mx.base.weights_bytes + mx.base.cache_bytes + mx.base.scratch_bytes);
    {
        ds4::bridge::Model priv = open_model("", kDrafter);
        const ds4_bridge_memory_ex_t px = priv.memory_ex();
        EXPECT_EQ(px.shared_bytes, 0u);
        EXPECT_EQ(px.drafter_mapped_bytes, mx.drafter_mapped_bytes);
        // An older caller's shorter struct: only the part it knows is written.
        struct {
            ds4_bridge_memory_t base;
            uint64_t drafter_weights_bytes;
            uint64_t guard;
        } shorter;
        shorter.guard = 0x5a5a5a5a5a5a5a5aull;
        char err[256];
        ASSERT_EQ(ds4_bridge_memory_stats_ex(priv.handle(), reinterpret_cast<ds4_bridge_memory_ex_t *>(&shorter),
                                             sizeof shorter - sizeof shorter.guard, err, sizeof err),
                  0)
            << err;
        EXPECT_EQ(shorter.drafter_weights_bytes, px.drafter_weights_bytes);
        EXPECT_EQ(shorter.guard, 0x5a5a5a5a5a5a5a5aull);
        EXPECT_NE(ds4_bridge_memory_stats_ex(priv.handle(), reinterpret_cast<ds4_bridge_memory_ex_t *>(&shorter),
                                             sizeof(ds4_bridge_memory_t) - 1, err, sizeof err),
                  0);
        EXPECT_NE(std::string(err).find("out_size"), std::string::npos) << err;
    }

    const auto t0 = uint64_t(std::time(nullptr));
    {
        ds4::client::Client c(sock, "stats");
        const ds4::client::Stats st = c.stats();
        ASSERT_TRUE(st.drafter_offered);
        EXPECT_EQ(st.drafter_share_bytes, file_bytes);
        EXPECT_EQ(st.drafter_shares, 1u);
        ASSERT_EQ(st.drafter_importers.size(), 1u);
        const auto &i = st.drafter_importers[0];
        EXPECT_EQ(i.pid, int32_t(getpid()));
        EXPECT_EQ(i.uid, uint32_t(geteuid()));
        EXPECT_EQ(i.bytes, file_bytes);
        EXPECT_EQ(i.shares, 1u);
        EXPECT_TRUE(i.mapped);
        EXPECT_LE(i.first_unix, t0);
        EXPECT_GE(i.first_unix + 120, t0);
        EXPECT_EQ(st.memory.shared_bytes, mx.drafter_mapped_bytes) << "ds4d's drafter pages are mapped here too";
        EXPECT_GT(st.memory.private_bytes, 0u);
        EXPECT_EQ(st.memory.drafter_bytes, mx.drafter_weights_bytes);
    }

    // Decode in a thread that stops halfway through its first prompt until the daemon has
    // been killed and restarted.
    std::mutex mu;
    std::condition_variable cv;
    int phase = 0;  // 1: the importer is mid-generation; 2: the daemon was restarted
    std::vector<int32_t> out;
    std::thread importer([&] {
        out = turns(m, [&](size_t produced) {
            std::unique_lock<std::mutex> lk(mu);
            if (phase != 0 || produced < 16) return;
            phase = 1;
            cv.notify_all();
            cv.wait(lk, [&] { return phase == 2; });
        });
    });
    Daemon second;
    {
        std::unique_lock<std::mutex> lk(mu);
        ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(60), [&] { return phase == 1; }));
    }
    EXPECT_EQ(first.stop(SIGKILL), -1000 - SIGKILL);
    const std::string started = second.start(DS4D_PATH, kModel, sock, d.path + "/r2.log", {"--drafter", kDrafter});
    {
        std::lock_guard<std::mutex> lk(mu);
        phase = 2;
    }
    cv.notify_all();
    importer.join();
    ASSERT_EQ(started, "");
    EXPECT_EQ(out, *private_out) << "the importer decoded on after its exporter was killed";

    ds4::client::Client c(sock, "stats");
    EXPECT_EQ(c.stats().drafter_shares, 0u);
    EXPECT_TRUE(c.stats().drafter_importers.empty());
    EXPECT_EQ(c.stats().memory.shared_bytes, 0u) << "nobody maps the new daemon's drafter yet";
    {
        ds4::bridge::Model m2 = open_model(sock, "");
        ASSERT_TRUE(m2.drafter_shared()) << m2.drafter_import_note();
        EXPECT_EQ(turns(m2), *private_out);
        const ds4::client::Stats st = c.stats();
        ASSERT_EQ(st.drafter_importers.size(), 1u);
        EXPECT_EQ(st.drafter_importers[0].pid, int32_t(getpid()));
        EXPECT_TRUE(st.drafter_importers[0].mapped);
        EXPECT_GT(st.memory.shared_bytes, 0u);
    }
    // m2 is gone; m still maps the first daemon's memfd, which is not the second's.
    const ds4::client::Stats st = c.stats();
    ASSERT_EQ(st.drafter_importers.size(), 1u);
    EXPECT_FALSE(st.drafter_importers[0].mapped);
    EXPECT_EQ(st.memory.shared_bytes, 0u);
    const CmdResult cli = run_cmd({DS4_CLI_PATH, "--socket", sock, "stats"}, d.path);
    EXPECT_EQ(cli.rc, 0) << cli.err;
    EXPECT_NE(cli.out.find("1 descriptors to 1 processes, 0 mapping it now"), std::string::npos) << cli.out;
    EXPECT_NE(cli.out.find("importer pid " + std::to_string(getpid())), std::string::npos) << cli.out;
    EXPECT_NE(cli.out.find("gone (not mapping it)"), std::string::npos) << cli.out;
}

// PSS (kB) of the mappings of pid whose path counts(path) keeps (/proc/PID/smaps).
template <class Keep>
uint64_t pss_kb_where(pid_t pid, Keep counts) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/smaps");
    std::string line;
    uint64_t kb = 0;
    bool take = false;
    while (std::getline(f, line)) {
        const size_t dash = line.find('-');
        if (dash != std::string::npos && dash > 0 && line.find_first_not_of("0123456789abcdef") == dash) {
            std::istringstream h(line);   // a mapping's header: range perms offset dev inode [path]
            std::string range, perms, offset, dev, inode, path;
            h >> range >> perms >> offset >> dev >> inode;
            std::getline(h >> std::ws, path);
            take = counts(path);
        } else if (take && line.rfind("Pss:", 0) == 0) {
            kb += std::stoull(line.substr(4));
        }
    }
    return kb;
}

// A process's PSS less its mappings of the file `except`: both processes map the model, and
// how much of it is resident when each figure is taken moves with the memory pressure of
// tests running beside this one (by more than the drafter's size), which has nothing to do
// with what is compared here.
uint64_t pss_kb(pid_t pid, const std::string &except) {
    return pss_kb_where(pid, [&](const std::string &path) { return path != except; });
}
// Only the mappings whose path starts with prefix.
uint64_t pss_kb_of(pid_t pid, const std::string &prefix) {
    return pss_kb_where(pid, [&](const std::string &path) { return path.rfind(prefix, 0) == 0; });
}

// The figure: ds4d and a C program on the bridge. Importing, the drafter's pages are
// counted once across the two processes (the sum of their PSS grows by about nothing for the
// drafter); a private load adds the whole file again. Token-identical output either way.
TEST_F(DrafterShareE2E, TwoProcessesCountTheDrafterOnce) {
    TempDir d;
    // Private copies of the files: PSS divides a file's pages among every process that maps
    // them, and other tests running beside this one map the committed model pair.
    const std::string model = d.path + "/model.gguf", drafter = d.path + "/drafter.gguf";
    std::filesystem::copy_file(kModel, model);
    std::filesystem::copy_file(kDrafter, drafter);
    Daemon dd;
    ASSERT_EQ(dd.start(DS4D_PATH, model, d.path + "/p.sock", d.path + "/p.log", {"--drafter", drafter}), "");
    const uint64_t drafter_kb = std::filesystem::file_size(drafter) / 1024;
    const std::string text = kPrompts[0];
    const uint64_t ds4d_before = pss_kb(dd.pid, model);
    // ds4d's drafter is a memfd (drafter_export.cpp); its own PSS is free of the heap's noise,
    // which moved the whole process's figure by a few hundred kB between two readings.
    const std::string kDrafterMap = "/memfd:ds4-drafter";
    const uint64_t drafter_before = pss_kb_of(dd.pid, kDrafterMap);

    ImporterProcess imp({DS4_IMPORTER_PATH, model, "--import", dd.socket, "40", text});
    ASSERT_TRUE(imp.wait_ready());
    const uint64_t ds4d_with_importer = pss_kb(dd.pid, model), importer = pss_kb(imp.pid, model);
    const uint64_t drafter_with_importer = pss_kb_of(dd.pid, kDrafterMap);
    EXPECT_EQ(imp.lines["shared"], "1");
    const std::string imported_tokens = imp.lines["tokens"];
    std::istringstream mem(imp.lines["memory"]);
    uint64_t shared_b = 0, private_b = 0, mapped_b = 0;
    mem >> shared_b >> private_b >> mapped_b;
    EXPECT_EQ(shared_b, mapped_b);
    EXPECT_GT(shared_b, 0u);
    EXPECT_EQ(imp.finish(), 0);

    ImporterProcess priv({DS4_IMPORTER_PATH, model, "--private", drafter, "40", text});
    ASSERT_TRUE(priv.wait_ready());
    const uint64_t ds4d_with_private = pss_kb(dd.pid, model), private_loader = pss_kb(priv.pid, model);
    EXPECT_EQ(priv.lines["shared"], "0");
    EXPECT_EQ(priv.lines["memory"].rfind("0 ", 0), 0u) << priv.lines["memory"];
    EXPECT_EQ(priv.lines["tokens"], imported_tokens);
    EXPECT_FALSE(imported_tokens.empty());
    EXPECT_EQ(priv.finish(), 0);

    const uint64_t with_import = ds4d_with_importer + importer, with_private = ds4d_with_private + private_loader;
    std::printf("drafter %llu kB; PSS kB (the model's mappings left out): ds4d alone %llu; ds4d %llu + importer %llu = %llu; ds4d %llu + private "
                "loader %llu = %llu; difference %lld kB\n",
                (unsigned long long)drafter_kb, (unsigned long long)ds4d_before, (unsigned long long)ds4d_with_importer,
                (unsigned long long)importer, (unsigned long long)with_import, (unsigned long long)ds4d_with_private,
                (unsigned long long)private_loader, (unsigned long long)with_private,
                (long long)with_private - (long long)with_import);
    std::printf("ds4d's drafter mapping: PSS %llu kB alone, %llu kB with the importer\n",
                (unsigned long long)drafter_before, (unsigned long long)drafter_with_importer);
    // ds4d maps the drafter's pages; the importer takes half of them off its PSS; a private
    // loader adds a whole drafter to the two processes' sum.
    EXPECT_GE(drafter_before, drafter_kb / 2);
    EXPECT_LE(drafter_with_importer * 10, drafter_before * 6);
    EXPECT_GE(with_private, with_import + drafter_kb * 3 / 4);
}

}  // namespace

#endif
