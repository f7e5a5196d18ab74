#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "io/aligned_buffer.h"
#include "io/uring_file_io.h"
#include "tests/kvstore/test_util.h"

// ds4_io's FileIo, exercised on real files (here beside the store's tests, which share
// its scratch helpers).
namespace ds4::io {
namespace {

using kvstore::testing::TempDir;

std::vector<uint8_t> pattern(size_t n, uint64_t seed) {
    std::vector<uint8_t> v(n);
    uint64_t s = seed;
    for (size_t i = 0; i < n; i += 8) {
        const uint64_t x = kvstore::testing::splitmix64(s);
        memcpy(v.data() + i, &x, std::min<size_t>(8, n - i));
    }
    return v;
}

class UringFileIoTest : public ::testing::TestWithParam<bool> {};

// Small chunks and depth so a few-MB file exercises many requests in flight.
UringOptions small_chunks() { return UringOptions{64 * 1024, 4}; }

TEST_P(UringFileIoTest, WriteThenReadBackAnySize) {
    const bool direct = GetParam();
    TempDir dir;
    auto io = make_uring_file_io(small_chunks());
    EXPECT_TRUE(uses_uring(*io));
    for (size_t n : {size_t(0), size_t(1), size_t(4095), size_t(4096), size_t(4097), size_t(65536 * 3 + 5),
                     size_t(1 << 20) + 12345}) {
        const auto data = pattern(n + 1, n);
        // Unaligned source on purpose (data + 1) so O_DIRECT writes go through bounce buffers.
        const uint8_t *src = data.data() + 1;
        std::string fname = "f";
        fname += std::to_string(n);
        const std::string path = dir.sub(fname);
        int fd = io->open(path, O_WRONLY | O_CREAT | O_EXCL | (direct ? O_DIRECT : 0), 0600);
        ASSERT_GE(fd, 0) << strerror(-fd);
        std::vector<uint8_t> seen;
        ASSERT_EQ(io->write_all(fd, src, n, [&](const uint8_t *p, size_t k) { seen.insert(seen.end(), p, p + k); }), 0);
        ASSERT_EQ(io->fsync(fd), 0);
        ASSERT_EQ(io->close(fd), 0);
        EXPECT_TRUE(std::equal(seen.begin(), seen.end(), src) && seen.size() == n) << "write chunks for " << n;

        const auto onfile = kvstore::testing::read_file(path);
        ASSERT_EQ(onfile.size(), n);
        EXPECT_TRUE(std::equal(onfile.begin(), onfile.end(), src)) << n;

        fd = io->open(path, O_RDONLY | (direct ? O_DIRECT : 0), 0);
        ASSERT_GE(fd, 0);
        AlignedBuffer buf(n);
        seen.clear();
        const int64_t got = io->read_all(fd, buf.data(), n, [&](const uint8_t *p, size_t k) {
            EXPECT_EQ(p, buf.data() + seen.size());
            seen.insert(seen.end(), p, p + k);
        });
        io->close(fd);
        ASSERT_EQ(got, int64_t(n));
        EXPECT_EQ(seen.size(), n);
        EXPECT_EQ(memcmp(buf.data(), src, n), 0) << n;
    }
}

TEST_P(UringFileIoTest, ReadOfAShorterFileReportsTheShortCount) {
    TempDir dir;
    auto io = make_uring_file_io(small_chunks());
    const auto data = pattern(200000, 7);
    const std::string path = dir.sub("short");
    kvstore::testing::write_file(path, data.data(), data.size());
    const int fd = io->open(path, O_RDONLY | (GetParam() ? O_DIRECT : 0), 0);
    ASSERT_GE(fd, 0);
    AlignedBuffer buf(300000);
    size_t seen = 0;
    const int64_t got = io->read_all(fd, buf.data(), 300000, [&](const uint8_t *, size_t k) { seen += k; });
    io->close(fd);
    EXPECT_EQ(got, 200000);
    EXPECT_EQ(seen, 200000u);
    EXPECT_EQ(memcmp(buf.data(), data.data(), data.size()), 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, UringFileIoTest, ::testing::Values(false, true),
                         [](const auto &i) { return i.param ? "Direct" : "Buffered"; });

TEST(UringFileIo, DirectoryOperations) {
    TempDir dir;
    auto io = make_uring_file_io();
    ASSERT_EQ(io->mkdir(dir.sub("d"), 0700), 0);
    EXPECT_EQ(io->mkdir(dir.sub("d"), 0700), -EEXIST);
    kvstore::testing::write_file(dir.sub("d/a"), "x", 1);
    kvstore::testing::write_file(dir.sub("d/b"), "y", 1);
    EXPECT_EQ(io->rename_noreplace(dir.sub("d/a"), dir.sub("d/b")), -EEXIST);
    EXPECT_EQ(io->rename_noreplace(dir.sub("d/a"), dir.sub("d/c")), 0);
    EXPECT_EQ(io->fsync_dir(dir.sub("d")), 0);
    std::vector<std::string> names;
    ASSERT_EQ(io->list_dir(dir.sub("d"), &names), 0);
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"b", "c"}));
    EXPECT_EQ(io->unlink(dir.sub("d/b")), 0);
    EXPECT_EQ(io->unlink(dir.sub("d/b")), -ENOENT);
    EXPECT_EQ(io->list_dir(dir.sub("nope"), &names), -ENOENT);
}

}  // namespace
}  // namespace ds4::io
