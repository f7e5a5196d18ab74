// Hostile and broken GGUF images: each validation rule yields an error that names the
// problem; truncation at every byte and thousands of random mutations never crash.
#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "engine/common/error.h"
#include "engine/gguf/gguf.h"
#include "tests/gguf/test_util.h"

namespace ds4::gguf {
namespace {

using test::Raw;

// Parses from an exact-size heap copy, so any over-read leaves the allocation (ASan).
std::string parse_error(const std::vector<uint8_t> &img) {
    std::unique_ptr<uint8_t[]> buf(new uint8_t[img.size() ? img.size() : 1]);
    if (!img.empty()) std::memcpy(buf.get(), img.data(), img.size());
    try {
        Reader::from_memory(buf.get(), img.size());
    } catch (const Error &e) {
        return e.what();
    }
    return "(no error)";
}

#define EXPECT_ERROR(img, text)                                              \
    do {                                                                     \
        std::string e_ = parse_error(img);                                   \
        EXPECT_NE(e_.find(text), std::string::npos) << "error was: " << e_;  \
    } while (0)

// One tensor "w" (f32, ne) at offset off, data padded to 32.
std::vector<uint8_t> one_tensor(std::vector<int64_t> ne, uint32_t type = 0, uint64_t off = 0, size_t data = 16) {
    Raw r;
    r.header(1, 1).kv_str("general.architecture", "x").tensor("w", ne, type, off).pad(32).zeros(data);
    return r.b;
}

TEST(GgufValidation, BaselineParses) {
    EXPECT_EQ(parse_error(one_tensor({4})), "(no error)");
    Raw v2;
    v2.header(0, 1, 2).kv_u32("a", 1);
    EXPECT_EQ(parse_error(v2.b), "(no error)");   // v2 has the same layout
}

TEST(GgufValidation, HeaderErrors) {
    EXPECT_ERROR(std::vector<uint8_t>{}, "truncated file: reading magic");
    EXPECT_ERROR((Raw().bytes("GGUF", 4).u32(3).u32(0).b), "truncated file: reading tensor count");
    EXPECT_ERROR((Raw().bytes("GGML", 4).u32(3).u64(0).u64(0).b), "bad magic 47 47 4d 4c (not a GGUF file)");
    EXPECT_ERROR((Raw().header(0, 0, 1).b), "unsupported GGUF version 1");
    EXPECT_ERROR((Raw().header(0, 0, 0x03000000).b), "unsupported GGUF version 50331648");
    EXPECT_ERROR((Raw().header(0, 1ull << 60).b), "metadata count 1152921504606846976 is more than the file can hold");
    EXPECT_ERROR((Raw().header(~0ull, 0).zeros(100).b), "tensor count 18446744073709551615 is more than the file can hold");
}

TEST(GgufValidation, MetadataErrors) {
    EXPECT_ERROR((Raw().header(0, 1).u64(1ull << 62).zeros(20).b), "metadata key at offset 24 has length 4611686018427387904, beyond the end of the file");
    EXPECT_ERROR((Raw().header(0, 1).str("k").u32(8).u64(~0ull).b), "string value at offset 37 has length 18446744073709551615, beyond the end");
    EXPECT_ERROR((Raw().header(0, 1).str("").u32(4).u32(1).b), "metadata key 0 at offset 24 is empty");
    EXPECT_ERROR((Raw().header(0, 1).str("k").u32(13).u32(1).b), "metadata key 'k' has unknown value type 13");
    EXPECT_ERROR((Raw().header(0, 2).kv_u32("k", 1).kv_u32("k", 2).b), "duplicate metadata key 'k'");
    EXPECT_ERROR((Raw().header(0, 1).str("k").u32(7).u8(2).b), "metadata key 'k': bool at offset 37 is 2 (must be 0 or 1)");
    EXPECT_ERROR((Raw().header(0, 1).str("k").u32(4).u16(0).b), "truncated file: reading u32 value at offset 37");
    // Array counts are checked against the bytes left before anything is allocated.
    EXPECT_ERROR((Raw().header(0, 1).str("k").u32(9).u32(6).u64(1ull << 61).zeros(64).b),
                 "metadata key 'k': array length 2305843009213693952 at offset 41 is beyond the end of the file");
    EXPECT_ERROR((Raw().header(0, 1).str("k").u32(9).u32(8).u64(2).str("a").zeros(7).b), "truncated file: reading string value");
    EXPECT_ERROR((Raw().header(0, 1).str("k").u32(9).u32(77).u64(0).b), "metadata key 'k': array has unknown element type 77");
    Raw deep;
    deep.header(0, 1).str("deep").u32(9);
    for (int i = 0; i < 20; i++) deep.u32(9).u64(1);
    deep.u32(4).u64(0);
    EXPECT_ERROR(deep.b, "metadata key 'deep': arrays nested deeper than 8 levels");
    // Nesting up to the limit is fine.
    Raw ok;
    ok.header(0, 1).str("ok").u32(9);
    for (int i = 0; i < 7; i++) ok.u32(9).u64(1);
    ok.u32(4).u64(1).u32(5);
    EXPECT_EQ(parse_error(ok.b), "(no error)");
}

TEST(GgufValidation, AlignmentErrors) {
    EXPECT_ERROR((Raw().header(0, 1).kv_u32("general.alignment", 48).b), "general.alignment 48 is not a power of two");
    EXPECT_ERROR((Raw().header(0, 1).kv_u32("general.alignment", 0).b), "general.alignment 0 is not a power of two");
    EXPECT_ERROR((Raw().header(0, 1).kv_str("general.alignment", "32").b), "general.alignment is a string, expected an integer");
    // A tensor offset that is not a multiple of the alignment.
    Raw r;
    r.header(1, 1).kv_u32("general.alignment", 64).tensor("w", {4}, 0, 32).pad(64).zeros(64);
    EXPECT_ERROR(r.b, "tensor 'w': data offset 32 is not a multiple of the alignment 64");
    Raw ok;
    ok.header(1, 1).kv_u32("general.alignment", 64).tensor("w", {4}, 0, 64).pad(64).zeros(128);
    EXPECT_EQ(parse_error(ok.b), "(no error)");
}

TEST(GgufValidation, TensorShapeErrors) {
    EXPECT_ERROR(one_tensor({}), "tensor 'w' has 0 dimensions (must be 1 to 4)");
    EXPECT_ERROR(one_tensor({1, 1, 1, 1, 1}), "tensor 'w' has 5 dimensions (must be 1 to 4)");
    EXPECT_ERROR(one_tensor({4, 0}), "tensor 'w': dimension 1 is 0 (must be positive)");
    EXPECT_ERROR(one_tensor({-4}), "tensor 'w': dimension 0 is -4 (must be positive)");
    EXPECT_ERROR(one_tensor({1ll << 32, 1ll << 32}), "tensor 'w': element count overflows");
    EXPECT_ERROR(one_tensor({1ll << 31, 1ll << 31, 4}), "tensor 'w': element count overflows");
    EXPECT_ERROR(one_tensor({1ll << 31, 1ll << 31}), "tensor 'w': byte size overflows");   // 2^62 f32 = 2^64 B
    EXPECT_ERROR(one_tensor({33}, 8), "tensor 'w': row length 33 is not a multiple of the q8_0 block size 32");
    EXPECT_ERROR(one_tensor({128}, 12), "tensor 'w': row length 128 is not a multiple of the q4_k block size 256");
    EXPECT_ERROR(one_tensor({4}, 4), "unknown tensor type 4 in tensor 'w'");
    EXPECT_ERROR(one_tensor({4}, 99), "unknown tensor type 99 in tensor 'w'");
    EXPECT_ERROR(one_tensor({256}, 13), "unsupported tensor type q5_k in tensor 'w'");
    EXPECT_ERROR(one_tensor({4}, 28), "unsupported tensor type f64 in tensor 'w'");
    Raw empty;
    empty.header(1, 0).str("").u32(1).i64(1).u32(0).u64(0).pad(32).zeros(32);
    EXPECT_ERROR(empty.b, "tensor 0 at offset 24 has an empty name");
}

TEST(GgufValidation, TensorPlacementErrors) {
    EXPECT_ERROR(one_tensor({5}), "tensor 'w': data [0, +20) lies outside the file (data section holds 16 bytes)");
    EXPECT_ERROR(one_tensor({4}, 0, 1ull << 63), "lies outside the file");
    EXPECT_ERROR(one_tensor({4}, 0, ~0ull & ~31ull), "lies outside the file");
    // Header ends right after the tensor infos: no room for the data section.
    Raw nodata;
    nodata.header(1, 0).tensor("w", {4}, 0, 0);
    EXPECT_ERROR(nodata.b, "tensor data section would start at offset 64, beyond the end of the file");
    Raw overlap;
    overlap.header(2, 0).tensor("a", {16}, 0, 32).tensor("b", {16}, 0, 64).pad(32).zeros(160);
    EXPECT_ERROR(overlap.b, "tensor 'b' data at offset 64 overlaps tensor 'a' ending at 96");
    Raw same;
    same.header(2, 0).tensor("a", {4}, 0, 0).tensor("b", {4}, 0, 0).pad(32).zeros(32);
    EXPECT_ERROR(same.b, "overlaps");
    Raw dup;
    dup.header(2, 0).tensor("a", {4}, 0, 0).tensor("a", {4}, 0, 32).pad(32).zeros(64);
    EXPECT_ERROR(dup.b, "duplicate tensor name 'a'");
    Raw adjacent;   // touching is fine
    adjacent.header(2, 0).tensor("a", {8}, 0, 0).tensor("b", {8}, 0, 32).pad(32).zeros(64);
    EXPECT_EQ(parse_error(adjacent.b), "(no error)");
}

TEST(GgufValidation, HostileNamesAreEscapedAndShortened) {
    std::string name(300, 'A');
    name[1] = '\n';
    name[2] = '\0';
    Raw r;
    r.header(1, 0).tensor(name, {4}, 99, 0).pad(32).zeros(16);
    std::string e = parse_error(r.b);
    EXPECT_NE(e.find("unknown tensor type 99 in tensor 'A\\x0a\\x00AAA"), std::string::npos) << e;
    EXPECT_NE(e.find("AAA...'"), std::string::npos) << e;
    EXPECT_LT(e.size(), 200u);
}

TEST(GgufValidation, ErrorsNameTheFile) {
    test::TempDir dir;
    test::write_all(dir.file("bad.gguf"), Raw().bytes("XXXX", 4).u32(3).u64(0).u64(0).b);
    try {
        Reader::open(dir.file("bad.gguf"));
        FAIL();
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find(dir.file("bad.gguf") + ": bad magic"), std::string::npos) << e.what();
    }
    EXPECT_THROW(Reader::open(dir.file("absent.gguf")), Error);
    EXPECT_THROW(Reader::open(dir.path()), Error);   // a directory
    test::write_all(dir.file("empty.gguf"), {});
    EXPECT_THROW(Reader::open(dir.file("empty.gguf")), Error);
}

// A small file that uses every value type, nested arrays and several tensor types.
std::vector<uint8_t> sample_image(const test::TempDir &dir) {
    Writer w(16);
    w.set("general.architecture", Value::str("deepseek4"));
    w.set("a.u8", Value::u8(1));
    w.set("a.i8", Value::i8(-1));
    w.set("a.u16", Value::u16(2));
    w.set("a.i16", Value::i16(-2));
    w.set("a.i32", Value::i32(-3));
    w.set("a.u64", Value::u64(4));
    w.set("a.i64", Value::i64(-4));
    w.set("a.f32", Value::f32(0.5f));
    w.set("a.f64", Value::f64(0.25));
    w.set("a.bool", Value::boolean(true));
    w.set("a.strs", Value::str_array({"x", "yz"}));
    w.set("a.nested", Value::array(ValueType::ARRAY, {Value::i32_array({1, 2}), Value::f32_array({3.f})}));
    std::vector<uint8_t> data(2 * 34, 0x11);
    w.add_tensor("q", Type::Q8_0, {64}, data.data(), data.size());
    w.add_tensor("h", Type::F16, {3, 2}, data.data(), 12);
    w.add_tensor("i", Type::I32, {2}, data.data(), 8);
    w.write(dir.file("s.gguf"));
    return test::read_all(dir.file("s.gguf"));
}

TEST(GgufValidation, TruncatedAtEveryByte) {
    test::TempDir dir;
    std::vector<uint8_t> img = sample_image(dir);
    auto full = Reader::from_memory(img.data(), img.size());
    uint64_t data_end = 0;   // the file may end with padding after the last tensor
    for (const auto &t : full->tensors()) data_end = std::max<uint64_t>(data_end, (t.data - img.data()) + t.nbytes);
    ASSERT_GT(img.size(), 200u);
    for (size_t len = 0; len <= img.size(); len++) {
        std::vector<uint8_t> cut(img.begin(), img.begin() + static_cast<long>(len));
        std::string e = parse_error(cut);
        if (len < data_end) {
            EXPECT_NE(e, "(no error)") << "accepted a file cut at " << len;
        } else {
            EXPECT_EQ(e, "(no error)") << "rejected a file cut at " << len;
        }
    }
    // Through files too (the mmap path), at a stride.
    for (size_t len = 0; len < data_end; len += 7) {
        test::write_all(dir.file("cut.gguf"), std::vector<uint8_t>(img.begin(), img.begin() + static_cast<long>(len)));
        EXPECT_THROW(Reader::open(dir.file("cut.gguf")), Error) << len;
    }
}

TEST(GgufValidation, RandomMutationsNeverCrash) {
    test::TempDir dir;
    const std::vector<uint8_t> img = sample_image(dir);
    std::mt19937_64 rng(20240917);
    const uint64_t interesting[] = {0, 1, 2, 3, 4, 8, 9, 12, 13, 16, 31, 32, 255, 256, 0x7fffffff, 0xffffffff,
                                    1ull << 32, 1ull << 62, 1ull << 63, ~0ull};
    int parsed = 0, rejected = 0;
    for (int iter = 0; iter < 4000; iter++) {
        std::vector<uint8_t> m = img;
        int edits = 1 + static_cast<int>(rng() % 4);
        for (int k = 0; k < edits; k++) {
            size_t at = rng() % m.size();
            switch (rng() % 4) {
            case 0: m[at] = static_cast<uint8_t>(rng()); break;
            case 1: m[at] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
            case 2: {   // an interesting 1/2/4/8-byte little-endian value
                uint64_t v = interesting[rng() % (sizeof interesting / sizeof interesting[0])];
                size_t w = size_t(1) << (rng() % 4);
                for (size_t b = 0; b < w && at + b < m.size(); b++) m[at + b] = static_cast<uint8_t>(v >> (8 * b));
                break;
            }
            case 3: m.resize(at); if (m.empty()) m.push_back('G'); break;
            }
        }
        std::unique_ptr<uint8_t[]> buf(new uint8_t[m.size()]);
        std::memcpy(buf.get(), m.data(), m.size());
        try {
            auto r = Reader::from_memory(buf.get(), m.size());
            parsed++;
            uint64_t sum = 0;
            for (const auto &t : r->tensors()) {
                // Everything handed out lies inside the image.
                ASSERT_GE(t.data, buf.get());
                ASSERT_LE(t.data + t.nbytes, buf.get() + m.size()) << t.name;
                ASSERT_EQ(t.nbytes, row_bytes(t.type, t.ne[0]) * static_cast<uint64_t>(t.rows()));
                for (uint64_t b = 0; b < t.nbytes; b++) sum += t.data[b];
            }
            for (const auto &kv : r->metadata()) sum += kv.first.size();
            (void)sum;
        } catch (const Error &) {
            rejected++;
        } catch (const std::exception &e) {
            FAIL() << "iteration " << iter << ": non-ds4 exception " << e.what();
        }
    }
    // Both outcomes occur, so the mutations really reach the parser's checks.
    EXPECT_GT(parsed, 100);
    EXPECT_GT(rejected, 100);
}

}  // namespace
}  // namespace ds4::gguf
