// ds4_bridge_session_save_payload replaces the file crash-safely: a fresh unique temporary
// in the same directory, fsync, rename, directory fsync. A failed save leaves the old file
// exactly as it was and no temporary behind.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "tests/bridge/bridge_test_util.h"
#include "tests/common/scratch.h"

namespace bridge_test {
namespace {

namespace fs = std::filesystem;
using ds4::bridge::Session;

std::set<std::string> names_in(const std::string &dir) {
    std::set<std::string> out;
    for (const auto &e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
    return out;
}

class PayloadFile : public BridgeTest {
protected:
    ds4test::TempDir dir;

    // A session at n tokens, saved to path through the C ABI; "" on success, else the error.
    std::string save(Session &s, const std::string &path) {
        Err e;
        return ds4_bridge_session_save_payload(s.handle(), path.c_str(), e.buf, sizeof e.buf) == 0 ? "" : e.str();
    }
    int loaded_pos(const std::string &path) {
        Session s(*model, 64);
        s.load_payload(path);
        return s.pos();
    }
};

TEST_F(PayloadFile, SaveOverAnExistingPayloadWhileAStaleTmpExists) {
    const std::string path = dir.file("s.payload");
    Session a(*model, 64), b(*model, 64);
    a.sync(tokens(5));
    b.sync(tokens(9));
    ASSERT_EQ(save(a, path), "");
    ASSERT_EQ(loaded_pos(path), 5);
    // What a crashed earlier writer (or another one, right now) left behind: it is not ours
    // to truncate or rename away.
    ds4test::write_file_bytes(path + ".tmp", {'s', 't', 'a', 'l', 'e'});
    EXPECT_EQ(save(b, path), "");
    EXPECT_EQ(loaded_pos(path), 9);
    EXPECT_EQ(ds4test::read_file_bytes(path + ".tmp"), (std::vector<uint8_t>{'s', 't', 'a', 'l', 'e'}));
    // Even one that cannot be opened for writing.
    fs::remove(path + ".tmp");
    fs::create_directory(path + ".tmp");
    EXPECT_EQ(save(a, path), "");
    EXPECT_EQ(loaded_pos(path), 5);
    EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"s.payload", "s.payload.tmp"})) << "a temporary was left behind";
    // A relative path in the working directory works too (its directory is ".").
    const fs::path cwd = fs::current_path();
    fs::current_path(dir.path());
    const std::string err = save(b, "rel.payload");
    fs::current_path(cwd);
    EXPECT_EQ(err, "");
    EXPECT_EQ(loaded_pos(dir.file("rel.payload")), 9);
}

TEST_F(PayloadFile, FailedSaveLeavesTheOldFileIntact) {
    const std::string path = dir.file("s.payload");
    Session a(*model, 64), b(*model, 600);
    a.sync(tokens(5));
    b.sync(tokens(300));   // a payload much larger than a's
    ASSERT_EQ(save(a, path), "");
    const std::vector<uint8_t> old = ds4test::read_file_bytes(path);
    ASSERT_FALSE(old.empty());
    uint64_t b_size = 0;
    Err e;
    ASSERT_EQ(ds4_bridge_session_payload_size(b.handle(), &b_size, e.buf, sizeof e.buf), 0) << e.str();
    ASSERT_GT(b_size, old.size() + 8192) << "the size-limit case needs a larger second payload";

    // The directory does not exist.
    const std::string missing = dir.file("no/such/dir/x.payload");
    std::string err = save(b, missing);
    EXPECT_TRUE(has(err, missing));
    EXPECT_TRUE(has(err, "No such file or directory"));

    // The write runs out of room half way (EFBIG from the file size limit: a real failed
    // write, even as root).
    {
        struct rlimit saved;
        ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
        sighandler_t prev = signal(SIGXFSZ, SIG_IGN);
        struct rlimit lim = saved;
        lim.rlim_cur = old.size() + 4096;
        ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
        err = save(b, path);
        setrlimit(RLIMIT_FSIZE, &saved);
        signal(SIGXFSZ, prev);
        EXPECT_TRUE(has(err, "File too large"));
        EXPECT_TRUE(has(err, "s.payload"));
    }
    EXPECT_EQ(ds4test::read_file_bytes(path), old);
    EXPECT_EQ(names_in(dir.path()), std::set<std::string>{"s.payload"}) << "the failed temporary was left behind";

    // The directory is not writable (root may write anyway: then there is nothing to check).
    ASSERT_EQ(chmod(dir.path().c_str(), 0500), 0);
    if (access(dir.path().c_str(), W_OK) != 0) {
        err = save(b, path);
        EXPECT_TRUE(has(err, "Permission denied"));
        EXPECT_TRUE(has(err, path));
    }
    chmod(dir.path().c_str(), 0700);
    EXPECT_EQ(ds4test::read_file_bytes(path), old);

    // The rename fails: the target is a directory that is not empty.
    const std::string blocked = dir.file("blocked");
    fs::create_directories(blocked + "/inside");
    err = save(b, blocked);
    EXPECT_TRUE(has(err, "rename"));
    EXPECT_TRUE(fs::is_directory(blocked + "/inside"));
    EXPECT_EQ(names_in(dir.path()), (std::set<std::string>{"s.payload", "blocked"}));
    EXPECT_EQ(ds4test::read_file_bytes(path), old);
    EXPECT_EQ(loaded_pos(path), 5);
}

}  // namespace
}  // namespace bridge_test
