// Writer -> Reader round trips: every metadata value type, every tensor type, alignment,
// generated (filled) and sparse tensors, typed getters, header-only opens.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <limits>

#include "engine/common/error.h"
#include "engine/gguf/gguf.h"
#include "tests/gguf/test_util.h"

namespace ds4::gguf {
namespace {

using test::TempDir;

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
    std::vector<uint8_t> v(n);
    uint32_t x = seed * 2654435761u + 1;
    for (auto &c : v) {
        x = x * 1103515245u + 12345u;
        c = static_cast<uint8_t>(x >> 24);
    }
    return v;
}

void expect_same(const Value &a, const Value &b, const std::string &where) {
    ASSERT_EQ(a.type, b.type) << where;
    switch (a.type) {
    case ValueType::U8: case ValueType::U16: case ValueType::U32: case ValueType::U64:
        EXPECT_EQ(a.u, b.u) << where;
        break;
    case ValueType::I8: case ValueType::I16: case ValueType::I32: case ValueType::I64:
        EXPECT_EQ(a.i, b.i) << where;
        break;
    case ValueType::F32:
        EXPECT_EQ(static_cast<float>(a.f), static_cast<float>(b.f)) << where;
        break;
    case ValueType::F64:
        EXPECT_EQ(a.f, b.f) << where;
        break;
    case ValueType::BOOL:
        EXPECT_EQ(a.b, b.b) << where;
        break;
    case ValueType::STRING:
        EXPECT_EQ(a.s, b.s) << where;
        break;
    case ValueType::ARRAY:
        ASSERT_EQ(a.elem_type, b.elem_type) << where;
        ASSERT_EQ(a.arr.size(), b.arr.size()) << where;
        for (size_t i = 0; i < a.arr.size(); i++) expect_same(a.arr[i], b.arr[i], where + "[" + std::to_string(i) + "]");
        break;
    }
}

std::vector<std::pair<std::string, Value>> every_value() {
    std::vector<std::pair<std::string, Value>> kv;
    kv.emplace_back("t.u8", Value::u8(250));
    kv.emplace_back("t.i8", Value::i8(-120));
    kv.emplace_back("t.u16", Value::u16(65000));
    kv.emplace_back("t.i16", Value::i16(-32000));
    kv.emplace_back("t.u32", Value::u32(4000000000u));
    kv.emplace_back("t.i32", Value::i32(-2000000000));
    kv.emplace_back("t.u64", Value::u64(18000000000000000000ull));
    kv.emplace_back("t.i64", Value::i64(-9000000000000000000ll));
    kv.emplace_back("t.f32", Value::f32(-1.5e-7f));
    kv.emplace_back("t.f64", Value::f64(3.141592653589793));
    kv.emplace_back("t.bool_t", Value::boolean(true));
    kv.emplace_back("t.bool_f", Value::boolean(false));
    kv.emplace_back("t.str", Value::str(std::string("h\0llo \xe2\x9c\x93", 10)));
    kv.emplace_back("t.str_empty", Value::str(""));
    kv.emplace_back("t.arr_u32", Value::u32_array({1, 2, 0xffffffffu}));
    kv.emplace_back("t.arr_i32", Value::i32_array({-1, 0, 7}));
    kv.emplace_back("t.arr_f32", Value::f32_array({0.5f, -2.f, 1e30f}));
    kv.emplace_back("t.arr_str", Value::str_array({"a", "", "long string here"}));
    kv.emplace_back("t.arr_empty", Value::array(ValueType::U8, {}));
    kv.emplace_back("t.arr_bool", Value::array(ValueType::BOOL, {Value::boolean(true), Value::boolean(false)}));
    kv.emplace_back("t.arr_u8", Value::array(ValueType::U8, {Value::u8(0), Value::u8(255)}));
    kv.emplace_back("t.arr_i8", Value::array(ValueType::I8, {Value::i8(-128), Value::i8(127)}));
    kv.emplace_back("t.arr_u16", Value::array(ValueType::U16, {Value::u16(1)}));
    kv.emplace_back("t.arr_i16", Value::array(ValueType::I16, {Value::i16(-1)}));
    kv.emplace_back("t.arr_u64", Value::array(ValueType::U64, {Value::u64(~0ull)}));
    kv.emplace_back("t.arr_i64", Value::array(ValueType::I64, {Value::i64(INT64_MIN)}));
    kv.emplace_back("t.arr_f64", Value::array(ValueType::F64, {Value::f64(-0.25)}));
    kv.emplace_back("t.nested",
                    Value::array(ValueType::ARRAY, {Value::u32_array({1, 2}), Value::str_array({"x"}),
                                                    Value::array(ValueType::ARRAY, {Value::f32_array({9.f})}),
                                                    Value::array(ValueType::I64, {})}));
    return kv;
}

TEST(GgufRoundTrip, EveryValueType) {
    TempDir dir;
    Writer w;
    auto kv = every_value();
    for (auto &[k, v] : kv) w.set(k, v);
    w.set("t.u32", Value::u32(4000000000u));   // replacing keeps one entry, in place
    w.write(dir.file("kv.gguf"));

    auto r = Reader::open(dir.file("kv.gguf"));
    EXPECT_EQ(r->version(), 3u);
    EXPECT_EQ(r->alignment(), 32u);
    ASSERT_EQ(r->metadata().size(), kv.size());
    for (size_t i = 0; i < kv.size(); i++) {
        EXPECT_EQ(r->metadata()[i].first, kv[i].first);   // file order is kept
        expect_same(r->metadata()[i].second, kv[i].second, kv[i].first);
        ASSERT_NE(r->find(kv[i].first), nullptr);
    }
    EXPECT_TRUE(r->tensors().empty());
    EXPECT_EQ(r->split_count(), 1);
}

TEST(GgufRoundTrip, TypedGetters) {
    TempDir dir;
    Writer w;
    for (auto &[k, v] : every_value()) w.set(k, v);
    w.write(dir.file("kv.gguf"));
    auto r = Reader::open(dir.file("kv.gguf"));

    EXPECT_EQ(r->get_int("t.u8"), 250);
    EXPECT_EQ(r->get_int("t.i64"), -9000000000000000000ll);
    EXPECT_EQ(r->get_int("t.u32"), 4000000000ll);
    EXPECT_DOUBLE_EQ(r->get_float("t.f64"), 3.141592653589793);
    EXPECT_DOUBLE_EQ(r->get_float("t.i16"), -32000.0);   // integers read as floats
    EXPECT_EQ(r->get_string("t.str"), std::string("h\0llo \xe2\x9c\x93", 10));
    EXPECT_TRUE(r->get_bool("t.bool_t"));
    EXPECT_FALSE(r->get_bool("t.bool_f"));
    EXPECT_EQ(r->get_array("t.arr_str").arr.size(), 3u);
    EXPECT_EQ(r->get_int("absent", 17), 17);
    EXPECT_DOUBLE_EQ(r->get_float("absent", 0.5), 0.5);
    EXPECT_EQ(r->get_string("absent", "dflt"), "dflt");
    EXPECT_FALSE(r->has("absent"));

    auto msg = [&](auto fn) -> std::string {
        try {
            fn();
        } catch (const Error &e) {
            return e.what();
        }
        return "(no error)";
    };
    EXPECT_NE(msg([&] { r->get_int("absent"); }).find("missing metadata key 'absent'"), std::string::npos);
    EXPECT_NE(msg([&] { r->get_int("t.str"); }).find("'t.str' is string, expected an integer"), std::string::npos);
    EXPECT_NE(msg([&] { r->get_int("t.str", 3); }).find("t.str"), std::string::npos);
    EXPECT_NE(msg([&] { r->get_string("t.u8"); }).find("'t.u8' is u8"), std::string::npos);
    EXPECT_NE(msg([&] { r->get_bool("t.u8"); }).find("expected a bool"), std::string::npos);
    EXPECT_NE(msg([&] { r->get_float("t.bool_t"); }).find("expected a number"), std::string::npos);
    EXPECT_NE(msg([&] { r->get_array("t.f32"); }).find("expected an array"), std::string::npos);
    EXPECT_NE(msg([&] { r->get_int("t.u64"); }).find("does not fit in int64"), std::string::npos);
    EXPECT_THROW(r->find("t.bool_t")->as_int(), Error);   // bool is not an integer
}

struct TypeCase {
    Type type;
    std::vector<int64_t> ne;
    uint64_t nbytes;   // from the GGML block layouts, written out by hand
};

TEST(GgufRoundTrip, EverySupportedTensorType) {
    const std::vector<TypeCase> cases = {
        {Type::F32, {3, 5}, 3 * 5 * 4},
        {Type::F16, {7}, 14},
        {Type::BF16, {2, 3, 4}, 2 * 3 * 4 * 2},
        {Type::Q8_0, {64, 3}, 2 * 34 * 3},
        {Type::I32, {11, 1, 2, 3}, 11 * 6 * 4},
        {Type::Q2_K, {512, 2}, 2 * 84 * 2},
        {Type::Q4_K, {256, 3}, 144 * 3},
        {Type::IQ2_XXS, {768}, 3 * 66},
    };
    for (uint32_t align : {1u, 32u, 64u, 4096u}) {
        TempDir dir;
        Writer w(align);
        w.set("general.architecture", Value::str("test"));
        std::vector<std::vector<uint8_t>> data;
        for (size_t i = 0; i < cases.size(); i++) {
            data.push_back(pattern(cases[i].nbytes, static_cast<uint32_t>(i)));
            w.add_tensor("t" + std::to_string(i), cases[i].type, cases[i].ne, data[i].data(), data[i].size());
        }
        EXPECT_EQ(w.tensor_count(), cases.size());
        w.write(dir.file("t.gguf"));

        auto r = Reader::open(dir.file("t.gguf"));
        EXPECT_EQ(r->alignment(), align);
        ASSERT_EQ(r->tensors().size(), cases.size());
        uint64_t total = 0;
        for (size_t i = 0; i < cases.size(); i++) {
            const TensorInfo *t = r->tensor("t" + std::to_string(i));
            ASSERT_NE(t, nullptr);
            EXPECT_EQ(&r->tensors()[i], t);   // add order is kept
            EXPECT_EQ(t->type, cases[i].type);
            EXPECT_EQ(t->ne, cases[i].ne);
            EXPECT_EQ(t->nbytes, cases[i].nbytes) << type_name(cases[i].type);
            EXPECT_EQ(t->offset % align, 0u);
            EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % std::min<uint32_t>(align, 4096), 0u);
            ASSERT_NE(t->data, nullptr);
            EXPECT_EQ(0, std::memcmp(t->data, data[i].data(), data[i].size())) << type_name(cases[i].type);
            EXPECT_EQ(t->split, 0);
            total += cases[i].nbytes;
        }
        EXPECT_EQ(r->total_tensor_bytes(), total);
        EXPECT_EQ(r->tensor("t0")->nelements(), 15);
        EXPECT_EQ(r->tensor("t0")->rows(), 5);
        EXPECT_EQ(r->tensor("t4")->rows(), 6);
        EXPECT_EQ(r->tensor("nope"), nullptr);

        // Header-only open: same infos, no data pointers.
        auto h = Reader::open(dir.file("t.gguf"), false);
        ASSERT_EQ(h->tensors().size(), cases.size());
        for (size_t i = 0; i < cases.size(); i++) {
            EXPECT_EQ(h->tensors()[i].data, nullptr);
            EXPECT_EQ(h->tensors()[i].offset, r->tensors()[i].offset);
        }

        // The same image parsed from memory.
        auto bytes = test::read_all(dir.file("t.gguf"));
        auto m = Reader::from_memory(bytes.data(), bytes.size());
        ASSERT_EQ(m->tensors().size(), cases.size());
        for (size_t i = 0; i < cases.size(); i++) {
            EXPECT_EQ(m->tensors()[i].data, bytes.data() + (r->tensors()[i].data - r->tensors()[0].data) +
                                                (m->tensors()[0].data - bytes.data()));
            EXPECT_EQ(0, std::memcmp(m->tensors()[i].data, data[i].data(), data[i].size()));
        }
    }
}

TEST(GgufRoundTrip, TypeTraits) {
    struct {
        Type t;
        const char *name;
        int64_t elems, bytes;
        bool supported;
    } want[] = {
        {Type::F32, "f32", 1, 4, true},      {Type::F16, "f16", 1, 2, true},
        {Type::BF16, "bf16", 1, 2, true},    {Type::Q8_0, "q8_0", 32, 34, true},
        {Type::I32, "i32", 1, 4, true},      {Type::Q2_K, "q2_k", 256, 84, true},
        {Type::Q4_K, "q4_k", 256, 144, true}, {Type::IQ2_XXS, "iq2_xxs", 256, 66, true},
        {Type::Q4_0, "q4_0", 32, 18, false}, {Type::Q5_K, "q5_k", 256, 176, false},
        {Type::Q6_K, "q6_k", 256, 210, false}, {Type::IQ4_XS, "iq4_xs", 256, 136, false},
        {Type::Q8_K, "q8_k", 256, 292, false}, {Type::F64, "f64", 1, 8, false},
    };
    for (const auto &c : want) {
        EXPECT_STREQ(type_name(c.t), c.name);
        EXPECT_EQ(type_block_elems(c.t), c.elems) << c.name;
        EXPECT_EQ(type_block_bytes(c.t), c.bytes) << c.name;
        EXPECT_EQ(type_supported(c.t), c.supported) << c.name;
        Type back;
        ASSERT_TRUE(type_from_name(c.name, &back));
        EXPECT_EQ(back, c.t);
    }
    EXPECT_FALSE(type_from_name("q9_9", nullptr));
    EXPECT_STREQ(type_name(static_cast<Type>(4)), "?");
    EXPECT_STREQ(type_name(static_cast<Type>(999)), "?");
    EXPECT_FALSE(type_supported(static_cast<Type>(999)));
    EXPECT_THROW(type_block_bytes(static_cast<Type>(999)), Error);
    EXPECT_EQ(row_bytes(Type::Q8_0, 64), 68u);
    EXPECT_EQ(row_bytes(Type::IQ2_XXS, 512), 132u);
    EXPECT_THROW(row_bytes(Type::Q8_0, 33), Error);
    EXPECT_THROW(row_bytes(Type::Q4_K, 128), Error);
    EXPECT_THROW(row_bytes(Type::F32, -1), Error);
}

TEST(GgufRoundTrip, FilledAndSparseTensors) {
    TempDir dir;
    Writer w(64);
    // 9 MiB, more than one fill chunk, with a length that is not a multiple of it.
    const int64_t n = (9 << 20) / 4 + 3;
    std::vector<uint64_t> calls;
    w.add_tensor_fill("gen", Type::F32, {n}, [&](uint64_t off, uint8_t *dst, size_t len) {
        calls.push_back(off);
        for (size_t i = 0; i < len; i++) dst[i] = static_cast<uint8_t>((off + i) * 7 + 1);
    });
    w.add_tensor_fill("hole", Type::Q8_0, {1 << 20, 4}, nullptr);   // 4.25 MiB of zeros
    std::vector<uint8_t> small = pattern(34, 5);
    w.add_tensor("after", Type::Q8_0, {32}, small.data(), small.size());
    w.write(dir.file("f.gguf"));
    EXPECT_GE(calls.size(), 3u);   // produced in pieces

    auto r = Reader::open(dir.file("f.gguf"));
    const TensorInfo *g = r->tensor("gen"), *h = r->tensor("hole"), *a = r->tensor("after");
    ASSERT_TRUE(g && h && a);
    ASSERT_EQ(g->nbytes, static_cast<uint64_t>(n) * 4);
    for (uint64_t i = 0; i < g->nbytes; i += 4099) ASSERT_EQ(g->data[i], static_cast<uint8_t>(i * 7 + 1)) << i;
    EXPECT_EQ(g->data[g->nbytes - 1], static_cast<uint8_t>((g->nbytes - 1) * 7 + 1));
    ASSERT_EQ(h->nbytes, (1u << 20) / 32 * 34 * 4);
    for (uint64_t i = 0; i < h->nbytes; i += 4093) ASSERT_EQ(h->data[i], 0) << i;
    EXPECT_EQ(0, std::memcmp(a->data, small.data(), small.size()));

    // The hole is not allocated on disk (sparse), so the file uses less than its size.
    struct stat st;
    ASSERT_EQ(stat(dir.file("f.gguf").c_str(), &st), 0);
    EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, static_cast<uint64_t>(st.st_size) - (3u << 20));
}

TEST(GgufRoundTrip, UnsupportedTypesAreWrittenButRejectedOnRead) {
    TempDir dir;
    Writer w;
    std::vector<uint8_t> q5(176 * 2);
    w.add_tensor("blk.0.ffn_down_exps.weight", Type::Q5_K, {512}, q5.data(), q5.size());
    w.write(dir.file("q5.gguf"));
    try {
        Reader::open(dir.file("q5.gguf"));
        FAIL() << "q5_k was accepted";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("unsupported tensor type q5_k in tensor 'blk.0.ffn_down_exps.weight'"),
                  std::string::npos)
            << e.what();
    }
}

TEST(GgufRoundTrip, WriterRejectsBadInput) {
    Writer w;
    float f[4] = {};
    EXPECT_THROW(w.add_tensor("a", Type::F32, {4}, f, 12), Error);          // wrong byte count
    EXPECT_THROW(w.add_tensor("a", Type::F32, {0}, f, 0), Error);           // empty dim
    EXPECT_THROW(w.add_tensor("a", Type::F32, {1, 1, 1, 1, 1}, f, 4), Error);
    EXPECT_THROW(w.add_tensor("a", Type::F32, {}, f, 4), Error);
    EXPECT_THROW(w.add_tensor("", Type::F32, {1}, f, 4), Error);
    EXPECT_THROW(w.add_tensor("a", Type::Q8_0, {16}, f, 16), Error);        // not a whole block
    EXPECT_THROW(w.add_tensor("a", static_cast<Type>(4), {1}, f, 4), Error);
    EXPECT_THROW(w.add_tensor_fill("a", Type::F32, {INT64_MAX, 2}, nullptr), Error);
    EXPECT_THROW(w.set("k", Value::array(ValueType::U32, {Value::i32(1)})), Error);   // mixed array
    Value big = Value::u32(1);
    big.type = ValueType::U8;
    big.u = 300;
    EXPECT_THROW(w.set("k", big), Error);
    EXPECT_THROW(w.set("general.alignment", Value::u32(3)), Error);
    EXPECT_THROW(w.set("", Value::u32(3)), Error);
    EXPECT_THROW(Writer(48), Error);
    EXPECT_EQ(w.tensor_count(), 0u);

    TempDir dir;
    w.add_tensor("dup", Type::F32, {1}, f, 4);
    w.add_tensor("dup", Type::F32, {1}, f, 4);
    EXPECT_THROW(w.write(dir.file("d.gguf")), Error);
}

}  // namespace
}  // namespace ds4::gguf
