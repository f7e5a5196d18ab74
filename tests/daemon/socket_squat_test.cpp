// Socket squatting by another local user (uid 65534 in a forked child): the client refuses
// a server that is not its own user before sending anything, and ds4d refuses a socket, a
// lock file or a lock symlink that someone else planted, naming the path and the owner.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "client/ds4client.hpp"
#include "daemon/listen_socket.h"
#include "ipc/frame.h"
#include "tests/daemon/other_user.h"

namespace {

namespace fb = ds4::ipc::fb;
using ds4::daemon::StartupError;

struct SharedDir {
    std::string path;
    SharedDir() {
        char t[] = "/tmp/ds4-squat-XXXXXX";
        path = mkdtemp(t);
        ::chmod(path.c_str(), 01777);  // like /tmp: everybody may create files here
    }
    ~SharedDir() { std::filesystem::remove_all(path); }
};

bool contains(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

// The squatter: answers Hello like ds4d would and reports how many bytes it received.
int squatter(const std::string &path, int ready, int report) {
    int ls = othuser::listen_at(path);
    if (ls < 0) return 91;
    ::chmod(path.c_str(), 0666);
    othuser::signal_ready(ready);
    pollfd pf{ls, POLLIN, 0};
    if (::poll(&pf, 1, 10000) != 1) return 92;
    int c = ::accept(ls, nullptr, nullptr);
    if (c < 0) return 93;
    ds4::ipc::FrameDecoder dec;
    size_t got = 0;
    char buf[4096];
    for (;;) {
        pollfd cp{c, POLLIN, 0};
        if (::poll(&cp, 1, 5000) != 1) break;
        ssize_t n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0) break;
        got += size_t(n);
        dec.feed(reinterpret_cast<const uint8_t *>(buf), size_t(n));
        if (dec.next() == ds4::ipc::FrameDecoder::Status::Frame && dec.envelope()->body_type() == fb::Message::Hello) {
            flatbuffers::FlatBufferBuilder fbb;
            ds4::ipc::finish_frame(fbb, dec.envelope()->request_id(),
                                   fb::CreateHelloOkDirect(fbb, ds4::ipc::kProtocolVersion, "not-ds4d", 0, 4096, 1u << 20));
            [[maybe_unused]] ssize_t w = ::send(c, fbb.GetBufferPointer(), fbb.GetSize(), MSG_NOSIGNAL);
        }
    }
    const std::string n = std::to_string(got);
    [[maybe_unused]] ssize_t w = ::write(report, n.data(), n.size());
    return 0;
}

TEST(SocketSquat, ClientRefusesAServerRunAsAnotherUserAndSendsNothing) {
    if (!othuser::can_switch_user()) GTEST_SKIP() << "needs root to run the squatter as another uid (65534)";
    SharedDir dir;
    const std::string path = dir.path + "/ds4.sock";
    othuser::Child child([&](int ready, int report) { return squatter(path, ready, report); });
    ASSERT_TRUE(child.wait_ready()) << "the squatter did not start";
    try {
        ds4::client::Client c(path);
        ADD_FAILURE() << "the client talked to a server run by uid 65534";
    } catch (const ds4::client::ConnectError &e) {
        const std::string m = e.what();
        EXPECT_TRUE(contains(m, "uid 65534")) << m;
        EXPECT_TRUE(contains(m, path)) << m;
        EXPECT_TRUE(contains(m, "uid " + std::to_string(::geteuid()))) << m;
    }
    EXPECT_EQ(child.read_report(), "0") << "bytes reached the squatter";
    EXPECT_EQ(child.wait(), 0);
}

TEST(SocketSquat, DaemonDoesNotUseASocketAnotherUserListensOn) {
    if (!othuser::can_switch_user()) GTEST_SKIP() << "needs root to run the squatter as another uid (65534)";
    SharedDir dir;
    const std::string path = dir.path + "/ds4.sock";
    othuser::Child child([&](int ready, int report) { return squatter(path, ready, report); });
    ASSERT_TRUE(child.wait_ready());
    try {
        ds4::daemon::clear_stale_socket(path);
        ADD_FAILURE() << "a socket of uid 65534 was accepted";
    } catch (const StartupError &e) {
        EXPECT_TRUE(contains(e.what(), "uid 65534") && contains(e.what(), path)) << e.what();
    }
    child.wait(0);  // the squatter waits for a connection that ds4d no longer makes
}

TEST(SocketSquat, LockFileOfAnotherUserIsRefusedNamingItsOwner) {
    if (!othuser::can_switch_user()) GTEST_SKIP() << "needs root to create a lock file owned by uid 65534";
    SharedDir dir;
    const std::string path = dir.path + "/ds4.sock", lock = path + ".lock";
    {
        othuser::Child child([&](int, int) {
            FILE *f = std::fopen(lock.c_str(), "w");
            return f && std::fclose(f) == 0 ? 0 : 1;
        });
        ASSERT_EQ(child.wait(), 0);
    }
    try {
        ds4::daemon::SocketLock l(path);
        ADD_FAILURE() << "a lock file owned by uid 65534 was used";
    } catch (const StartupError &e) {
        EXPECT_TRUE(contains(e.what(), lock) && contains(e.what(), "uid 65534")) << e.what();
    }
}

TEST(SocketSquat, SymlinkedLockIsRefusedAndItsTargetNotCreated) {
    SharedDir dir;
    const std::string path = dir.path + "/ds4.sock", lock = path + ".lock", target = dir.path + "/victim";
    ASSERT_EQ(::symlink(target.c_str(), lock.c_str()), 0);
    try {
        ds4::daemon::SocketLock l(path);
        ADD_FAILURE() << "the lock symlink was followed";
    } catch (const StartupError &e) {
        EXPECT_TRUE(contains(e.what(), lock) && contains(e.what(), "symbolic link")) << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(target)) << "ds4d created the symlink's target";
}

TEST(SocketSquat, OwnLockAndStaleSocketStillWork) {
    SharedDir dir;
    const std::string path = dir.path + "/ds4.sock";
    ds4::daemon::SocketLock l(path);
    ds4::daemon::clear_stale_socket(path);  // nothing there
    ds4::daemon::ListenSocket s(path, 4);
    EXPECT_TRUE(std::filesystem::exists(path));
}

}  // namespace
