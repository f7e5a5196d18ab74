// The default socket location and its private fallback directory: created 0700, and refused
// when it is a symlink, open to others, or owned by another user.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "ipc/socket_path.h"

namespace {

using ds4::ipc::check_private_dir;
using ds4::ipc::make_private_dir;

struct Scratch {
    std::string path;
    Scratch() {
        char t[] = "/tmp/ds4-sockpath-XXXXXX";
        path = mkdtemp(t);
    }
    ~Scratch() { std::filesystem::remove_all(path); }
};

bool contains(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

TEST(SocketPath, FallbackIsAFileInAPerUserDirectory) {
    const char *saved = std::getenv("XDG_RUNTIME_DIR");
    const std::string keep = saved ? saved : "";
    ::unsetenv("XDG_RUNTIME_DIR");
    const std::string dir = "/tmp/ds4-" + std::to_string(::geteuid());
    EXPECT_EQ(ds4::ipc::default_socket_path(), dir + "/ds4.sock");
    EXPECT_EQ(ds4::ipc::fallback_socket_dir(), dir);
    EXPECT_EQ(ds4::ipc::parent_dir(ds4::ipc::default_socket_path()), dir);
    ::setenv("XDG_RUNTIME_DIR", "/run/user/1234", 1);
    EXPECT_EQ(ds4::ipc::default_socket_path(), "/run/user/1234/ds4.sock");
    if (saved) ::setenv("XDG_RUNTIME_DIR", keep.c_str(), 1);
    else ::unsetenv("XDG_RUNTIME_DIR");
}

TEST(SocketPath, PrivateDirIsCreatedWithMode0700) {
    Scratch s;
    const std::string dir = s.path + "/ds4-x";
    ::umask(0);  // the mode must not depend on the caller's umask
    EXPECT_EQ(make_private_dir(dir, ::geteuid()), "");
    ::umask(022);
    struct stat st {};
    ASSERT_EQ(::lstat(dir.c_str(), &st), 0);
    EXPECT_TRUE(S_ISDIR(st.st_mode));
    EXPECT_EQ(st.st_mode & 07777, 0700u);
    EXPECT_EQ(make_private_dir(dir, ::geteuid()), "") << "an existing private dir is fine";
}

TEST(SocketPath, DirOpenToOthersIsRefused) {
    Scratch s;
    const std::string dir = s.path + "/open";
    ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
    ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
    const std::string err = make_private_dir(dir, ::geteuid());
    EXPECT_TRUE(contains(err, dir) && contains(err, "0755") && contains(err, "group or others")) << err;
}

TEST(SocketPath, SymlinkDirIsRefused) {
    Scratch s;
    const std::string target = s.path + "/real", link = s.path + "/link";
    ASSERT_EQ(::mkdir(target.c_str(), 0700), 0);
    ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
    const std::string err = make_private_dir(link, ::geteuid());
    EXPECT_TRUE(contains(err, link) && contains(err, "symbolic link")) << err;
}

TEST(SocketPath, DirOwnedByAnotherUserIsRefused) {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to create a directory owned by another uid (65534)";
    Scratch s;
    const std::string dir = s.path + "/foreign";
    ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
    ASSERT_EQ(::chown(dir.c_str(), 65534, 65534), 0);
    const std::string err = make_private_dir(dir, ::geteuid());
    EXPECT_TRUE(contains(err, dir) && contains(err, "uid 65534")) << err;
    EXPECT_EQ(check_private_dir(dir, 65534), "");
}

TEST(SocketPath, AFileIsNotADirectory) {
    Scratch s;
    const std::string f = s.path + "/file";
    FILE *fp = std::fopen(f.c_str(), "w");
    ASSERT_NE(fp, nullptr);
    std::fclose(fp);
    EXPECT_TRUE(contains(make_private_dir(f, ::geteuid()), "not a directory"));
}

}  // namespace
