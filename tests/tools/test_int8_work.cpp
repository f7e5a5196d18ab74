// ds4-bench's count of a prefilled token's Q8_0 multiply-adds, rule by rule.
#include <gtest/gtest.h>

#include "tools/bench/int8_work.h"

namespace {

using ds4::gguf::TensorInfo;
using ds4::gguf::Type;

TensorInfo t(const char *name, std::vector<int64_t> ne, Type type = Type::Q8_0) {
    TensorInfo i;
    i.name = name;
    i.ne = std::move(ne);
    i.type = type;
    return i;
}

TEST(BenchInt8Work, CountsEachLayerProductOnceAndRoutedExpertsPerUse) {
    ds4::ModelConfig c;
    c.n_expert = 8;
    c.n_expert_used = 2;
    c.n_hash_layer = 1;   // layer 0 routes by table
    const std::vector<TensorInfo> ts = {
        t("token_embd.weight", {64, 100}),                  // a lookup
        t("output.weight", {64, 100}),                      // the last token only
        t("blk.0.attn_q_a.weight", {64, 32}),               // 2048
        t("blk.0.attn_norm.weight", {64}, Type::F32),       // no product
        t("blk.0.hc_attn_fn.weight", {64, 24}, Type::F32),  // not Q8_0
        t("blk.0.ffn_gate_inp.weight", {64, 8}),            // hash layer: no router product
        t("blk.1.ffn_gate_inp.weight", {64, 8}),            // 512
        t("blk.1.ffn_up_exps.weight", {64, 32, 8}),         // 2 uses of 64 x 32: 4096
        t("blk.1.ffn_down_exps.weight", {32, 64, 8}, Type::Q4_K),
        t("blk.12.attn_kv.weight", {64, 16}),               // 1024
    };
    EXPECT_DOUBLE_EQ(ds4::bench::q8_0_macs_per_token(ts, c), 2048.0 + 512 + 4096 + 1024);
}

TEST(BenchInt8Work, NoQ8_0WeightsCountNothing) {
    ds4::ModelConfig c;
    c.n_expert_used = 6;
    EXPECT_EQ(ds4::bench::q8_0_macs_per_token({t("blk.0.attn_q_a.weight", {64, 32}, Type::F16)}, c), 0.0);
}

}  // namespace
