// End-to-end hardening of ds4d against misbehaving or hostile local clients: refusals that
// always reach the client, requests classified as the client's fault, handlers that fail
// only their own request, and bounded connections. Real ds4d processes on the tiny model.
#include <gtest/gtest.h>

#ifndef DS4_E2E
#define DS4_E2E 0
#endif

#if !DS4_E2E
TEST(HardeningE2E, NeedsBridgeDaemonAndModelGenerator) {
    GTEST_SKIP() << "hardening end-to-end tests need ds4lib, ds4d and ds4-make-model in this build";
}
#else

#include <sys/resource.h>
#include <sys/stat.h>

#include <memory>

#include "client/ds4client.hpp"
#include "tests/daemon/e2e_support.h"
#include "tests/daemon/other_user.h"

using namespace e2e;
using ds4::client::Client;
using ds4::client::ServerError;

namespace {

bool contains(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

class HardeningE2E : public ::testing::Test {
protected:
    static inline TempDir *dir = nullptr;
    static inline std::string model_path;

    static void SetUpTestSuite() {
        dir = new TempDir;
        model_path = dir->path + "/tiny.gguf";
        CmdResult mk = run_cmd({DS4_MAKE_MODEL_PATH, "--preset", "tiny", "--quiet", model_path}, dir->path);
        ASSERT_EQ(mk.rc, 0) << mk.err;
    }
    static void TearDownTestSuite() {
        delete dir;
        dir = nullptr;
    }
    void SetUp() override {
        if (!std::filesystem::exists(model_path)) GTEST_SKIP() << "suite set-up failed";
    }

    std::string start(Daemon &d, std::vector<std::string> extra = {}) {
        static int n = 0;
        const std::string tag = std::to_string(n++);
        return d.start(DS4D_PATH, model_path, dir->path + "/h" + tag + ".sock", dir->path + "/h" + tag + ".log", extra);
    }
};

// One connection as another user: connect, send Hello and a long request right behind it
// (a client does not wait), then read. "" when every byte was sent and the
// PermissionDenied reply arrived, else what happened instead.
std::string refused_attempt(const std::string &path) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
    if (::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
        const std::string e = std::strerror(errno);
        ::close(fd);
        return "connect: " + e;
    }
    std::vector<uint8_t> bytes = hello_frame(1);
    const std::vector<uint8_t> big = frame([&](auto &fbb) {
        ds4::ipc::finish_frame(fbb, 2, fb::CreateTokenize(fbb, fbb.CreateString(std::string(256 * 1024, 'x'))));
    });
    bytes.insert(bytes.end(), big.begin(), big.end());
    std::string what;
    for (size_t off = 0; off < bytes.size();) {
        ssize_t w = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
        if (w < 0) {
            what = std::string("send: ") + std::strerror(errno);
            break;
        }
        off += size_t(w);
    }
    ds4::ipc::FrameDecoder dec;
    char buf[65536];
    for (;;) {
        auto st = dec.next();
        if (st == ds4::ipc::FrameDecoder::Status::Frame) {
            const fb::Error *e = dec.envelope()->body_as_Error();
            // A failed send counts as lost even though the reply is there: a client gives up
            // on EPIPE (libds4client did) and never reads it.
            if (!(e && e->code() == fb::ErrorCode::PermissionDenied && e->message() &&
                  contains(e->message()->str(), "its own user")))
                what += "; unexpected frame";
            break;
        }
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 5000) != 1) {
            what += "; no reply in 5 s";
            break;
        }
        ssize_t r = ::recv(fd, buf, sizeof buf, 0);
        if (r <= 0) {
            what += r == 0 ? "; EOF before the reply" : std::string("; recv: ") + std::strerror(errno);
            break;
        }
        dec.feed(reinterpret_cast<const uint8_t *>(buf), size_t(r));
    }
    ::close(fd);
    return what;
}

// ds4d refuses other users; the refusal must arrive every time, even when the client is
// still writing (it used to be lost to "Broken pipe" now and then).
TEST_F(HardeningE2E, RefusalOfAnotherUserAlwaysArrives) {
    if (!othuser::can_switch_user()) GTEST_SKIP() << "needs root to connect as another uid (65534)";
    ASSERT_EQ(::chmod(dir->path.c_str(), 0711), 0);  // uid 65534 may reach the socket inside
    Daemon d;
    ASSERT_EQ(start(d), "");
    ASSERT_EQ(::chmod(d.socket.c_str(), 0666), 0);   // and may connect to it: ds4d must refuse
    const std::string path = d.socket;
    othuser::Child child([&](int, int report) {
        int ok = 0;
        std::string failures;
        for (int i = 0; i < 40; ++i) {
            const std::string w = refused_attempt(path);
            if (w.empty()) ++ok;
            else failures += "attempt " + std::to_string(i) + ": " + w + "\n";
        }
        const std::string out = std::to_string(ok) + "\n" + failures;
        [[maybe_unused]] ssize_t n = ::write(report, out.data(), out.size());
        return 0;
    });
    const std::string report = child.read_report(120000);
    EXPECT_EQ(child.wait(), 0);
    EXPECT_EQ(report.substr(0, report.find('\n')), "40") << report;
    EXPECT_TRUE(contains(read_file(d.log), "refused a client with uid 65534"));
    EXPECT_TRUE(RawConn(d.socket).hello()) << "ds4d stopped serving its own user";
    EXPECT_EQ(d.stop(SIGTERM), 0);
}

// A chat role the template does not know and a session name the store would refuse are the
// client's mistakes: BadRequest at once (they used to come back as Engine and Store), and
// the reply carries no invalid UTF-8 from the request.
TEST_F(HardeningE2E, BadRoleAndBadSessionNameAreBadRequests) {
    Daemon d;
    ASSERT_EQ(start(d, {"--state-dir", dir->path + "/names-state"}), "");
    Client c(d.socket);
    for (const std::string role : {"tool", "\xff\xfeX\x01"}) {
        ds4::client::GenerateRequest req;
        req.kind = ds4::client::GenerateRequest::Prompt::Chat;
        req.messages.push_back({role, "hello"});
        req.max_tokens = 2;
        try {
            c.generate(req);
            ADD_FAILURE() << "role accepted";
        } catch (const ServerError &e) {
            EXPECT_EQ(e.code_name, "BadRequest") << e.what();
            EXPECT_TRUE(contains(e.server_message, "not system, user or assistant")) << e.what();
            for (unsigned char ch : e.server_message) EXPECT_TRUE(ch >= 0x20 && ch < 0x7F) << "byte " << int(ch);
        }
    }
    for (const char *name : {"a..b", "x/y", " pad"}) {
        try {
            c.open_session(name);
            ADD_FAILURE() << "session name " << name << " accepted";
        } catch (const ServerError &e) {
            EXPECT_EQ(e.code_name, "BadRequest") << name << ": " << e.what();
        }
        try {
            c.load_session(name);
            ADD_FAILURE() << "session name " << name << " accepted";
        } catch (const ServerError &e) {
            EXPECT_EQ(e.code_name, "BadRequest") << name << ": " << e.what();
        }
    }
    // What the store allows, the daemon allows.
    EXPECT_TRUE(c.open_session("notes v2").created);
    EXPECT_EQ(d.stop(SIGTERM), 0);
}

// VmData of pid in bytes (0 when unknown): what RLIMIT_DATA limits.
uint64_t vm_data(pid_t pid) {
    std::istringstream in(read_file("/proc/" + std::to_string(pid) + "/status"));
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("VmData:", 0) == 0) return std::stoull(line.substr(7)) * 1024;
    return 0;
}

// A request whose handler cannot get its memory (a real std::bad_alloc) fails alone with an
// error reply; the daemon keeps serving. It used to end the worker, and with it the daemon.
// ds4d's data segment is capped (RLIMIT_DATA, which also covers malloc arenas growing into
// their reserved space) just above what it uses once a first tokenize of the same size has
// run on this connection, so the loop already holds its read buffer: the loop's copy of
// the text fits, the handler's token buffer (4 bytes per text byte) does not.
TEST_F(HardeningE2E, AReplyLargerThanTheFrameLimitIsAnErrorNotADroppedConnection) {
    Daemon d;
    ASSERT_EQ(start(d, {"--max-frame", "1048576", "--input-budget", "4194304"}), "");
    // The daemon's limit is also the clients' own: a client that kept the default would
    // accept the big reply, one that did not would drop the connection.
    Client c(d.socket);
    std::string text(900u << 10, 'x');
    for (size_t i = 0; i < text.size(); ++i) text[i] = char('a' + (i * 7919) % 26);   // no long merges
    try {
        const size_t n = c.tokenize(text).size();
        ADD_FAILURE() << "a " << n << "-token reply came back above the 1 MiB frame limit";
    } catch (const ServerError &e) {
        EXPECT_EQ(e.code_name, "BadRequest") << e.what();
        EXPECT_TRUE(contains(e.server_message, "frame limit")) << e.what();
    }
    EXPECT_GT(c.tokenize("still here").size(), 0u);   // the connection survived
    EXPECT_TRUE(contains(read_file(d.log), "exceeds the frame limit")) << read_file(d.log);
    EXPECT_EQ(d.stop(SIGTERM), 0);
}

TEST_F(HardeningE2E, AFailedAllocationFailsOnlyItsOwnRequest) {
    Daemon d;
    // Every block of 64 KiB or more is its own mapping, returned when freed: what the
    // first request used is not lying around for the second to reuse.
    ::setenv("MALLOC_MMAP_THRESHOLD_", "65536", 1);
    const std::string started = start(d);
    ::unsetenv("MALLOC_MMAP_THRESHOLD_");
    ASSERT_EQ(started, "");
    Client c(d.socket);
    const std::string text(3u << 20, 'x');  // its 3 Mi tokens still fit a reply frame
    ASSERT_GT(c.tokenize(text).size(), 0u);
    const uint64_t used = vm_data(d.pid);
    ASSERT_GT(used, 0u);
    const uint64_t cap = used + text.size() * 5 / 2;  // room for the loop's copy, not for 4x
    const rlimit lim{cap, cap};
    ASSERT_EQ(::prlimit(d.pid, RLIMIT_DATA, &lim, nullptr), 0) << std::strerror(errno);
    try {
        c.tokenize(text);
        ADD_FAILURE() << "the allocation did not fail; the test's memory cap is too loose";
    } catch (const ServerError &e) {
        EXPECT_EQ(e.code_name, "Internal") << e.what();
        EXPECT_TRUE(contains(e.server_message, "out of memory")) << e.what();
    } catch (const std::exception &e) {
        FAIL() << e.what() << "; ds4d's log:\n" << read_file(d.log);
    }
    EXPECT_EQ(c.tokenize("still here").size(), c.tokenize("still here").size());
    EXPECT_EQ(c.stats().connections, 1u);
    Client other(d.socket);
    EXPECT_GT(other.tokenize("a new client").size(), 0u);
    EXPECT_TRUE(contains(read_file(d.log), "failed: out of memory")) << read_file(d.log);
    EXPECT_EQ(d.stop(SIGTERM), 0);
}

// --max-connections: one more client is refused with a message saying why (through the
// library and the ds4 command), ds4d logs it, and a freed slot serves again.
TEST_F(HardeningE2E, ConnectionCapRefusesWithAMessageAndALogLine) {
    Daemon d;
    ASSERT_EQ(start(d, {"--max-connections", "2"}), "");
    auto a = std::make_unique<Client>(d.socket);
    Client b(d.socket);
    try {
        Client c(d.socket);
        ADD_FAILURE() << "a third connection was served";
    } catch (const ServerError &e) {
        EXPECT_EQ(e.code_name, "Busy") << e.what();
        EXPECT_TRUE(contains(e.server_message, "at most 2 connections") && contains(e.server_message, "--max-connections"))
            << e.what();
    }
    CmdResult cli = run_cmd({DS4_CLI_PATH, "--socket", d.socket, "stats"}, dir->path);
    EXPECT_EQ(cli.rc, 4) << cli.err;
    EXPECT_TRUE(contains(cli.err, "--max-connections")) << cli.err;
    EXPECT_TRUE(contains(read_file(d.log), "refused connection")) << read_file(d.log);
    EXPECT_TRUE(contains(read_file(d.log), "(--max-connections 2)"));
    a.reset();
    bool served = false;
    for (int i = 0; i < 200 && !served; ++i) {  // the daemon sees the close asynchronously
        try {
            Client c(d.socket);
            served = c.stats().connections >= 1;
        } catch (const ServerError &) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
    }
    EXPECT_TRUE(served) << "a freed slot was not reused";
    EXPECT_EQ(b.stats().sessions, 0u);
    EXPECT_EQ(d.stop(SIGTERM), 0);
}

// --client-timeout: half a frame, or no Hello, is dropped after the timeout with an error
// frame and a log line; a client that is idle between complete frames is not.
TEST_F(HardeningE2E, HalfAFrameIsDroppedAfterTheClientTimeout) {
    Daemon d;
    ASSERT_EQ(start(d, {"--client-timeout", "1"}), "");
    RawConn idle(d.socket), half(d.socket), mute(d.socket);
    ASSERT_TRUE(idle.hello());
    ASSERT_TRUE(half.hello());
    const std::vector<uint8_t> st = stats_frame(2);
    ASSERT_TRUE(half.send(st.data(), st.size() / 2));
    const auto t0 = Clock::now();
    const fb::Envelope *e = half.next(5000);
    ASSERT_NE(e, nullptr) << "no error frame before the close";
    ASSERT_EQ(e->body_type(), fb::Message::Error);
    EXPECT_EQ(e->body_as_Error()->code(), fb::ErrorCode::BadFrame);
    EXPECT_TRUE(contains(e->body_as_Error()->message()->str(), "--client-timeout"));
    EXPECT_TRUE(half.closed_by_peer(5000));
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    EXPECT_GE(waited, 0.7);
    EXPECT_LE(waited, 4.0);
    const fb::Envelope *m = mute.next(5000);
    ASSERT_NE(m, nullptr) << "a connection without Hello was not dropped";
    EXPECT_EQ(m->body_as_Error()->code(), fb::ErrorCode::Protocol);
    EXPECT_TRUE(mute.closed_by_peer(5000));
    // Idle for longer than the timeout between frames: still served.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    ASSERT_TRUE(idle.send(stats_frame(3)));
    const fb::Envelope *r = idle.next(5000);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->body_type(), fb::Message::StatsResult);
    const std::string log = read_file(d.log);
    EXPECT_TRUE(contains(log, "did not finish a frame") && contains(log, "--client-timeout")) << log;
    EXPECT_TRUE(contains(log, "did not send Hello")) << log;
    EXPECT_EQ(d.stop(SIGTERM), 0);
}

// --input-budget: unfinished frames across connections are bounded; the connection that
// goes over is refused with a message, the others carry on.
TEST_F(HardeningE2E, UnfinishedFramesShareOneBudget) {
    Daemon d;
    ASSERT_EQ(start(d, {"--max-frame", "1048576", "--input-budget", "1048576"}), "");
    // A big request with a small reply (the reply must fit --max-frame too): 225 Ki token ids
    // of single bytes detokenize to 225 KiB of text.
    const std::vector<int32_t> ids(225 * 1024, int32_t('x'));
    const std::vector<uint8_t> big = frame([&](auto &fbb) {
        ds4::ipc::finish_frame(fbb, 2, fb::CreateDetokenize(fbb, fbb.CreateVector(ids)));
    });
    const size_t part = 700 * 1024;
    RawConn a(d.socket), b(d.socket);
    ASSERT_TRUE(a.hello());
    ASSERT_TRUE(b.hello());
    ASSERT_TRUE(a.send(big.data(), part));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a's bytes are held first
    ASSERT_TRUE(b.send(big.data(), part));
    const fb::Envelope *e = b.next(5000);
    ASSERT_NE(e, nullptr);
    ASSERT_EQ(e->body_type(), fb::Message::Error);
    EXPECT_EQ(e->body_as_Error()->code(), fb::ErrorCode::Busy);
    EXPECT_TRUE(contains(e->body_as_Error()->message()->str(), "--input-budget"));
    EXPECT_TRUE(b.closed_by_peer(5000));
    ASSERT_TRUE(a.send(big.data() + part, big.size() - part));
    const fb::Envelope *r = a.next(15000);
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->body_type(), fb::Message::DetokenizeResult);
    EXPECT_TRUE(contains(read_file(d.log), "(--input-budget 1048576)")) << read_file(d.log);
    EXPECT_EQ(run_cmd({DS4D_PATH, "--model", model_path, "--max-frame", "2097152", "--input-budget", "1048576"},
                      dir->path)
                  .rc,
              2);
    EXPECT_EQ(d.stop(SIGTERM), 0);
}

// At the open-file limit libuv resets new clients itself and ds4d never hears of them: ds4d
// fits --max-connections under the limit (and says so), so every client beyond it is
// refused with a message instead of reset.
TEST_F(HardeningE2E, ConnectionsBeyondTheFileLimitAreRefusedNotReset) {
    // ds4d under an open-file limit of 80 (soft and hard), set by a shell that execs it.
    const std::string wrapper = dir->path + "/ds4d-nofile80.sh";
    std::ofstream(wrapper) << "#!/bin/sh\nulimit -n 80 || exit 97\nexec " << DS4D_PATH << " \"$@\"\n";
    ASSERT_EQ(::chmod(wrapper.c_str(), 0755), 0);
    Daemon d;
    static int n = 0;
    const std::string tag = "fd" + std::to_string(n++);
    ASSERT_EQ(d.start(wrapper, model_path, dir->path + "/" + tag + ".sock", dir->path + "/" + tag + ".log"), "");
    std::vector<std::unique_ptr<Client>> held;
    int refused = 0;
    std::string other;
    for (int i = 0; i < 100; ++i) {
        try {
            held.push_back(std::make_unique<Client>(d.socket));
        } catch (const ServerError &e) {
            if (e.code_name == "Busy" && contains(e.server_message, "--max-connections")) ++refused;
            else other += std::string(e.what()) + "\n";
        } catch (const std::exception &e) {
            other += std::string(e.what()) + "\n";
        }
    }
    // A refusal drains its connection before closing it, so when this loop outruns the
    // daemon's closes, more refusals are in flight than fds are set aside for them: those
    // connections are then closed at once, by design, and the log must say so. What must
    // never happen is a silent reset.
    const std::string log = read_file(d.log);
    if (!other.empty()) {
        EXPECT_TRUE(contains(log, "closing new connections at once"))
            << "clients were reset and the log does not say why (" << held.size() << " served, " << refused
            << " refused):\n" << other << log;
    }
    EXPECT_GT(held.size(), 0u);
    EXPECT_GT(refused, 0);
    EXPECT_TRUE(contains(log, "does not fit the open-file limit of 80")) << log;
    for (auto &c : held) EXPECT_EQ(c->stats().sessions, 0u);
    held.clear();
    EXPECT_EQ(d.stop(SIGTERM), 0);
}

}  // namespace

#endif
