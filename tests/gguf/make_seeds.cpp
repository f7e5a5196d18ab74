// Writes the fuzzer's seed corpus (tests/gguf/corpus/): a few tiny, valid GGUF files that
// between them use every value type, nested arrays, each supported tensor type and
// non-default alignments. Run: gguf_make_seeds DIR
#include <cstdio>
#include <string>
#include <vector>

#include "engine/common/error.h"
#include "engine/gguf/gguf.h"

using namespace ds4::gguf;

static std::vector<uint8_t> bytes(size_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; i++) v[i] = static_cast<uint8_t>(seed + i * 37);
    return v;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    try {
        {   // metadata only: every scalar type, strings, nested arrays
            Writer w;
            w.set("general.architecture", Value::str("deepseek4"));
            w.set("a.u8", Value::u8(200));
            w.set("a.i8", Value::i8(-5));
            w.set("a.u16", Value::u16(60000));
            w.set("a.i16", Value::i16(-300));
            w.set("a.u32", Value::u32(70000));
            w.set("a.i32", Value::i32(-70000));
            w.set("a.u64", Value::u64(1ull << 40));
            w.set("a.i64", Value::i64(-(1ll << 40)));
            w.set("a.f32", Value::f32(1.25f));
            w.set("a.f64", Value::f64(-2.5));
            w.set("a.bool", Value::boolean(true));
            w.set("a.toks", Value::str_array({"<s>", "</s>", "a", "b c"}));
            w.set("a.nested", Value::array(ValueType::ARRAY, {Value::u32_array({1, 2, 3}), Value::array(ValueType::ARRAY, {Value::f32_array({0.5f})})}));
            w.write(dir + "/metadata.gguf");
        }
        {   // the plain and Q8_0 types
            Writer w;
            w.set("general.architecture", Value::str("deepseek4"));
            auto f32 = bytes(4 * 8, 1), f16 = bytes(2 * 8, 2), bf16 = bytes(2 * 4, 3), q8 = bytes(34 * 2, 4), i32 = bytes(4 * 3, 5);
            w.add_tensor("token_embd.weight", Type::F32, {4, 2}, f32.data(), f32.size());
            w.add_tensor("blk.0.attn_q_a.weight", Type::F16, {8}, f16.data(), f16.size());
            w.add_tensor("blk.0.attn_norm.weight", Type::BF16, {2, 1, 2}, bf16.data(), bf16.size());
            w.add_tensor("blk.0.ffn_gate_shexp.weight", Type::Q8_0, {32, 2}, q8.data(), q8.size());
            w.add_tensor("blk.0.ffn_gate_tid2eid.weight", Type::I32, {3}, i32.data(), i32.size());
            w.write(dir + "/plain_types.gguf");
        }
        {   // the expert block formats, alignment 64
            Writer w(64);
            auto q2 = bytes(84, 6), q4 = bytes(144, 7), iq2 = bytes(66 * 2, 8);
            w.add_tensor("blk.1.ffn_down_exps.weight", Type::Q2_K, {256}, q2.data(), q2.size());
            w.add_tensor("blk.1.ffn_up_exps.weight", Type::Q4_K, {256, 1, 1, 1}, q4.data(), q4.size());
            w.add_tensor("blk.1.ffn_gate_exps.weight", Type::IQ2_XXS, {256, 2}, iq2.data(), iq2.size());
            w.write(dir + "/expert_types.gguf");
        }
        {   // one split of a set, alignment 8
            Writer w(8);
            w.set("split.no", Value::u16(0));
            w.set("split.count", Value::u16(1));
            w.set("split.tensors.count", Value::i32(1));
            auto f = bytes(12, 9);
            w.add_tensor("output_norm.weight", Type::F32, {3}, f.data(), f.size());
            w.write(dir + "/split.gguf");
        }
    } catch (const ds4::Error &e) {
        std::fprintf(stderr, "gguf_make_seeds: %s\n", e.what());
        return 1;
    }
    return 0;
}
