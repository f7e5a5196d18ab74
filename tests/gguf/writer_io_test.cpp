// Writer failure paths: I/O errors (a file size limit stands in for a full disk) and
// failing fill callbacks throw, remove the temp file and leave an existing PATH intact.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>

#include "engine/common/error.h"
#include "engine/gguf/gguf.h"
#include "tests/gguf/test_util.h"

namespace ds4::gguf {
namespace {

using test::TempDir;

bool exists(const std::string &p) { return access(p.c_str(), F_OK) == 0; }

void write_old(const std::string &path) {
    Writer w;
    w.set("old", Value::u32(1));
    w.write(path);
}

// Lowers RLIMIT_FSIZE for the scope: writes past it fail with EFBIG instead of SIGXFSZ.
struct FileSizeLimit {
    rlimit saved{};
    void (*saved_handler)(int);
    explicit FileSizeLimit(rlim_t bytes) {
        getrlimit(RLIMIT_FSIZE, &saved);
        saved_handler = std::signal(SIGXFSZ, SIG_IGN);
        rlimit l = saved;
        l.rlim_cur = bytes;
        setrlimit(RLIMIT_FSIZE, &l);
    }
    ~FileSizeLimit() {
        setrlimit(RLIMIT_FSIZE, &saved);
        std::signal(SIGXFSZ, saved_handler);
    }
};

TEST(GgufWriterIo, WriteErrorThrowsAndCleansUp) {
    TempDir dir;
    const std::string path = dir.file("m.gguf");
    write_old(path);
    Writer w;
    std::vector<uint8_t> data(1 << 20, 0x5a);
    w.add_tensor("big", Type::F32, {1 << 18}, data.data(), data.size());
    {
        FileSizeLimit limit(64 << 10);
        try {
            w.write(path);
            FAIL() << "write past the file size limit succeeded";
        } catch (const Error &e) {
            EXPECT_NE(std::string(e.what()).find("m.gguf.tmp"), std::string::npos) << e.what();
        }
    }
    EXPECT_FALSE(exists(path + ".tmp"));
    auto r = Reader::open(path);   // the old file is untouched
    EXPECT_EQ(r->get_int("old"), 1);
    EXPECT_TRUE(r->tensors().empty());
}

TEST(GgufWriterIo, SparseSizeBeyondTheLimitFails) {
    TempDir dir;
    Writer w;
    w.add_tensor_fill("hole", Type::F32, {1 << 20}, nullptr);   // 4 MiB, never written
    FileSizeLimit limit(1 << 20);
    EXPECT_THROW(w.write(dir.file("h.gguf")), Error);   // ftruncate is checked too
    EXPECT_FALSE(exists(dir.file("h.gguf.tmp")));
    EXPECT_FALSE(exists(dir.file("h.gguf")));
}

TEST(GgufWriterIo, FailingFillThrowsAndCleansUp) {
    TempDir dir;
    const std::string path = dir.file("m.gguf");
    write_old(path);
    Writer w;
    w.add_tensor_fill("gen", Type::F32, {1 << 22}, [](uint64_t off, uint8_t *dst, size_t n) {
        if (off > 0) throw Error("generator failed");
        std::memset(dst, 1, n);
    });
    try {
        w.write(path);
        FAIL();
    } catch (const Error &e) {
        EXPECT_STREQ(e.what(), "generator failed");
    }
    EXPECT_FALSE(exists(path + ".tmp"));
    EXPECT_EQ(Reader::open(path)->get_int("old"), 1);
}

TEST(GgufWriterIo, MissingDirectoryIsAnError) {
    TempDir dir;
    Writer w;
    try {
        w.write(dir.file("no/such/dir/m.gguf"));
        FAIL();
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("cannot create"), std::string::npos) << e.what();
    }
}

TEST(GgufWriterIo, RewriteReplacesTheFile) {
    TempDir dir;
    const std::string path = dir.file("m.gguf");
    write_old(path);
    Writer w;
    w.set("new", Value::u32(2));
    w.write(path);
    auto r = Reader::open(path);
    EXPECT_FALSE(r->has("old"));
    EXPECT_EQ(r->get_int("new"), 2);
    EXPECT_FALSE(exists(path + ".tmp"));
}

}  // namespace
}  // namespace ds4::gguf
