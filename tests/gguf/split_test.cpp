// Split sets (NAME-0000K-of-0000N.gguf) as llama.cpp's gguf-split writes them: opened from
// any split, tensors merged, metadata from the first, inconsistent sets rejected.
#include <gtest/gtest.h>

#include "engine/common/error.h"
#include "engine/gguf/gguf.h"
#include "tests/gguf/test_util.h"

namespace ds4::gguf {
namespace {

using test::TempDir;

struct SplitSpec {
    std::vector<std::vector<std::string>> tensors;   // per split
    int count_override = -1;                         // split.count written into split 1 (0-based index 1)
    int no_override = -1;                            // split.no written into split index 1
    int tensors_count_override = -1;
    bool omit_count_in_last = false;
};

float value_of(const std::string &name, int i) { return static_cast<float>(name.size() * 100 + i); }

std::string write_set(const TempDir &dir, const SplitSpec &spec) {
    const int n = static_cast<int>(spec.tensors.size());
    int total = 0;
    for (const auto &t : spec.tensors) total += static_cast<int>(t.size());
    for (int s = 0; s < n; s++) {
        Writer w;
        if (s == 0) {
            w.set("general.architecture", Value::str("deepseek4"));
            w.set("only.first", Value::u32(7));
        } else {
            w.set("only.later", Value::u32(8));
        }
        w.set("split.no", Value::u16(static_cast<uint16_t>(s == 1 && spec.no_override >= 0 ? spec.no_override : s)));
        if (!(spec.omit_count_in_last && s == n - 1))
            w.set("split.count", Value::u16(static_cast<uint16_t>(s == 1 && spec.count_override >= 0 ? spec.count_override : n)));
        w.set("split.tensors.count", Value::i32(spec.tensors_count_override >= 0 ? spec.tensors_count_override : total));
        for (const auto &name : spec.tensors[s]) {
            float v[3] = {value_of(name, 0), value_of(name, 1), value_of(name, 2)};
            w.add_tensor(name, Type::F32, {3}, v, sizeof v);
        }
        w.write(split_path(dir.file("model"), s + 1, n));
    }
    return split_path(dir.file("model"), 1, n);
}

std::string open_error(const std::string &path) {
    try {
        Reader::open(path);
    } catch (const Error &e) {
        return e.what();
    }
    return "(no error)";
}

TEST(GgufSplit, PathHelpers) {
    EXPECT_EQ(split_path("/a/m", 2, 3), "/a/m-00002-of-00003.gguf");
    std::string prefix;
    int k = 0, n = 0;
    ASSERT_TRUE(parse_split_path("/a/m-00002-of-00003.gguf", &prefix, &k, &n));
    EXPECT_EQ(prefix, "/a/m");
    EXPECT_EQ(k, 2);
    EXPECT_EQ(n, 3);
    EXPECT_FALSE(parse_split_path("/a/m.gguf", nullptr, nullptr, nullptr));
    EXPECT_FALSE(parse_split_path("/a/m-00004-of-00003.gguf", nullptr, nullptr, nullptr));
    EXPECT_FALSE(parse_split_path("/a/m-00000-of-00003.gguf", nullptr, nullptr, nullptr));
    EXPECT_FALSE(parse_split_path("/a/m-0001-of-00003.gguf", nullptr, nullptr, nullptr));
    EXPECT_FALSE(parse_split_path("/a/m-00001-of-00003.bin", nullptr, nullptr, nullptr));
}

TEST(GgufSplit, OpensFromAnySplit) {
    TempDir dir;
    SplitSpec spec;
    spec.tensors = {{"a", "bb"}, {"ccc"}, {"dddd", "eeeee", "ffffff"}};
    write_set(dir, spec);
    for (int k = 1; k <= 3; k++) {
        for (bool map : {true, false}) {
            auto r = Reader::open(split_path(dir.file("model"), k, 3), map);
            EXPECT_EQ(r->split_count(), 3);
            ASSERT_EQ(r->tensors().size(), 6u);
            EXPECT_EQ(r->get_int("only.first"), 7);   // metadata comes from the first split
            EXPECT_FALSE(r->has("only.later"));
            EXPECT_EQ(r->get_string("general.architecture"), "deepseek4");
            EXPECT_EQ(r->total_tensor_bytes(), 6u * 12);
            const char *names[] = {"a", "bb", "ccc", "dddd", "eeeee", "ffffff"};
            const int splits[] = {0, 0, 1, 2, 2, 2};
            for (int i = 0; i < 6; i++) {
                const TensorInfo *t = r->tensor(names[i]);
                ASSERT_NE(t, nullptr) << names[i];
                EXPECT_EQ(t, &r->tensors()[i]);
                EXPECT_EQ(t->split, splits[i]) << names[i];
                if (map) {
                    ASSERT_NE(t->data, nullptr);
                    float v[3];
                    std::memcpy(v, t->data, sizeof v);
                    EXPECT_EQ(v[0], value_of(names[i], 0));
                    EXPECT_EQ(v[2], value_of(names[i], 2));
                } else {
                    EXPECT_EQ(t->data, nullptr);
                }
            }
        }
    }
}

TEST(GgufSplit, SingleSplitSetIsAPlainFile) {
    TempDir dir;
    SplitSpec spec;
    spec.tensors = {{"a"}};
    auto r = Reader::open(write_set(dir, spec));
    EXPECT_EQ(r->split_count(), 1);
    EXPECT_EQ(r->tensors().size(), 1u);
}

TEST(GgufSplit, MissingSplitIsNamed) {
    TempDir dir;
    SplitSpec spec;
    spec.tensors = {{"a"}, {"b"}, {"c"}};
    std::string first = write_set(dir, spec);
    std::remove(split_path(dir.file("model"), 2, 3).c_str());
    std::string e = open_error(first);
    EXPECT_NE(e.find("model-00002-of-00003.gguf: cannot open"), std::string::npos) << e;
}

TEST(GgufSplit, InconsistentSetsAreRejected) {
    {
        TempDir dir;
        SplitSpec spec;
        spec.tensors = {{"a"}, {"b"}, {"c"}};
        spec.count_override = 4;
        std::string e = open_error(write_set(dir, spec));
        EXPECT_NE(e.find("00002-of-00003.gguf: split.count is 4 but the file name says 3"), std::string::npos) << e;
    }
    {
        TempDir dir;
        SplitSpec spec;
        spec.tensors = {{"a"}, {"b"}, {"c"}};
        spec.no_override = 2;
        std::string e = open_error(write_set(dir, spec));
        EXPECT_NE(e.find("split.no is 2 but the file name says split 1"), std::string::npos) << e;
    }
    {
        TempDir dir;
        SplitSpec spec;
        spec.tensors = {{"a"}, {"b"}, {"c"}};
        spec.omit_count_in_last = true;
        std::string e = open_error(write_set(dir, spec));
        EXPECT_NE(e.find("00003-of-00003.gguf: split file has no split.count"), std::string::npos) << e;
    }
    {
        TempDir dir;
        SplitSpec spec;
        spec.tensors = {{"a"}, {"b"}, {"c"}};
        spec.tensors_count_override = 5;
        std::string e = open_error(write_set(dir, spec));
        EXPECT_NE(e.find("split.tensors.count is 5 but the splits hold 3 tensors"), std::string::npos) << e;
    }
    {
        TempDir dir;
        SplitSpec spec;
        spec.tensors = {{"a", "x"}, {"b"}, {"x"}};
        std::string e = open_error(write_set(dir, spec));
        EXPECT_NE(e.find("00003-of-00003.gguf: duplicate tensor name 'x' (also in"), std::string::npos) << e;
        EXPECT_NE(e.find("00001-of-00003.gguf"), std::string::npos) << e;
    }
}

TEST(GgufSplit, SplitKeysInAnUnsplitNameAreRejected) {
    TempDir dir;
    Writer w;
    w.set("split.no", Value::u16(0));
    w.set("split.count", Value::u16(2));
    w.write(dir.file("plain.gguf"));
    std::string e = open_error(dir.file("plain.gguf"));
    EXPECT_NE(e.find("split.count is 2 but the file name is not"), std::string::npos) << e;
}

}  // namespace
}  // namespace ds4::gguf
