// Converts every committed HF fixture and checks the GGUF against the safetensors source:
// every tensor present under its ARCHITECTURE.md section-2 name (mapping written out here
// independently of the converter's table), GGML dims reversed, experts stacked, values
// bit-exact for f32 and within format tolerance for f16/bf16/q8_0, and the metadata equal
// to what config.json says.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <set>

#include "engine/common/error.h"
#include "engine/gguf/gguf.h"
#include "engine/model/config.h"
#include "engine/quant/quants.h"
#include "tests/convert/convert_test_util.h"
#include "tools/convert/convert.h"

namespace ds4::convert::test {
namespace {

using gguf::Type;

struct Expect {
    std::string gguf;
    int expert = -1;   // >= 0: slice of a stacked tensor
};

// ARCHITECTURE.md §2, transcribed.
Expect gguf_name_of(const std::string &hf) {
    static const std::map<std::string, std::string> global = {
        {"model.embed_tokens.weight", "token_embd"}, {"head.weight", "output"},
        {"model.norm.weight", "output_norm"},         {"model.hc_head.hc_fn", "output_hc_fn"},
        {"model.hc_head.hc_base", "output_hc_base"}, {"model.hc_head.hc_scale", "output_hc_scale"},
    };
    static const std::map<std::string, std::string> layer = {
        {"attn_norm.weight", "attn_norm"},
        {"ffn_norm.weight", "ffn_norm"},
        {"hc_attn_fn", "hc_attn_fn"},
        {"hc_attn_base", "hc_attn_base"},
        {"hc_attn_scale", "hc_attn_scale"},
        {"hc_ffn_fn", "hc_ffn_fn"},
        {"hc_ffn_base", "hc_ffn_base"},
        {"hc_ffn_scale", "hc_ffn_scale"},
        {"attn.wq_a.weight", "attn_q_a"},
        {"attn.q_norm.weight", "attn_q_a_norm"},
        {"attn.wq_b.weight", "attn_q_b"},
        {"attn.wkv.weight", "attn_kv"},
        {"attn.norm.weight", "attn_kv_a_norm"},
        {"attn.attn_sink", "attn_sinks"},
        {"attn.wo_a.weight", "attn_output_a"},
        {"attn.wo_b.weight", "attn_output_b"},
        {"attn.compressor.wkv.weight", "attn_compressor_kv"},
        {"attn.compressor.wgate.weight", "attn_compressor_gate"},
        {"attn.compressor.ape", "attn_compressor_ape"},
        {"attn.compressor.norm.weight", "attn_compressor_norm"},
        {"attn.indexer.compressor.wkv.weight", "indexer_compressor_kv"},
        {"attn.indexer.compressor.wgate.weight", "indexer_compressor_gate"},
        {"attn.indexer.compressor.ape", "indexer_compressor_ape"},
        {"attn.indexer.compressor.norm.weight", "indexer_compressor_norm"},
        {"attn.indexer.wq_b.weight", "indexer.attn_q_b"},
        {"attn.indexer.weights_proj.weight", "indexer.proj"},
        {"ffn.gate.weight", "ffn_gate_inp"},
        {"ffn.gate.bias", "ffn_exp_probs_b"},
        {"ffn.gate.tid2eid", "ffn_gate_tid2eid"},
        {"ffn.shared_experts.w1.weight", "ffn_gate_shexp"},
        {"ffn.shared_experts.w3.weight", "ffn_up_shexp"},
        {"ffn.shared_experts.w2.weight", "ffn_down_shexp"},
    };
    if (auto it = global.find(hf); it != global.end()) return {it->second + ".weight"};
    static const std::regex lay(R"(model\.layers\.(\d+)\.(.+))");
    static const std::regex exp(R"(ffn\.experts\.(\d+)\.w([123])\.weight)");
    std::smatch m;
    if (!std::regex_match(hf, m, lay)) return {""};
    const std::string blk = "blk." + m[1].str() + ".";
    const std::string rest = m[2].str();
    std::smatch e;
    if (std::regex_match(rest, e, exp)) {
        const char *which = e[2] == "1" ? "gate" : e[2] == "3" ? "up" : "down";
        return {blk + "ffn_" + which + "_exps.weight", std::stoi(e[1].str())};
    }
    if (auto it = layer.find(rest); it != layer.end()) return {blk + it->second + ".weight"};
    return {""};
}

bool stays_f32(const std::string &g) {
    for (const char *s : {"_norm.weight", "hc_", "attn_sinks", "_ape.weight", "exp_probs_b"})
        if (g.find(s) != std::string::npos) return true;
    return false;
}

Type expected_type(const std::string &g, int64_t ne0, Type requested) {
    if (g.find("tid2eid") != std::string::npos) return Type::I32;
    if (stays_f32(g)) return Type::F32;
    if (requested == Type::Q8_0 && ne0 % 32 != 0) return Type::F16;
    return requested;
}

std::vector<float> to_f32(const RawTensor &t) {
    const size_t n = t.dtype == "F32" ? t.bytes.size() / 4 : t.bytes.size() / 2;
    std::vector<float> v(n);
    if (t.dtype == "F32") std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
    else quant::dequantize_row(t.dtype == "F16" ? Type::F16 : Type::BF16, t.bytes.data(), v.data(), static_cast<int64_t>(n));
    return v;
}

// Element-wise bound on |stored - source| for the row format.
void expect_close(const std::string &what, Type t, const float *src, const uint8_t *stored, int64_t n) {
    std::vector<float> got(static_cast<size_t>(n));
    quant::dequantize_row(t, stored, got.data(), n);
    const int64_t blk = t == Type::Q8_0 ? 32 : 1;
    for (int64_t b0 = 0; b0 < n; b0 += blk) {
        float amax = 0;
        for (int64_t i = b0; i < b0 + blk; i++) amax = std::max(amax, std::fabs(src[i]));
        for (int64_t i = b0; i < b0 + blk; i++) {
            double tol;
            switch (t) {
            case Type::F16: tol = std::fabs(src[i]) * 0x1p-11 + 0x1p-25; break;
            case Type::BF16: tol = std::fabs(src[i]) * 0x1p-8 + 1e-38; break;
            case Type::Q8_0: tol = amax / 127.0 * 0.5 * 1.002 + amax * 0x1p-11; break;
            default: tol = 0;
            }
            ASSERT_LE(std::fabs(got[static_cast<size_t>(i)] - src[i]), tol)
                << what << " element " << i << ": " << src[i] << " stored as " << got[static_cast<size_t>(i)];
        }
    }
}

void check_fixture(const std::string &fixture, Type type) {
    SCOPED_TRACE(fixture + " " + gguf::type_name(type));
    TempDir tmp;
    ConvertOptions o;
    o.in_dir = fixture_dir(fixture);
    o.out_path = tmp.file("out.gguf");
    o.type = gguf::type_name(type);
    o.progress = false;
    ConvertResult res = convert_hf(o);
    auto r = gguf::Reader::open(o.out_path);

    const RawFile src = read_safetensors(fixture_dir(fixture) + "/model.safetensors");
    const nlohmann::json cfg = read_json(fixture_dir(fixture) + "/config.json");
    const int n_expert = cfg["n_routed_experts"];
    std::set<std::string> expected_names;
    for (const auto &[name, t] : src) {
        SCOPED_TRACE(name);
        Expect e = gguf_name_of(name);
        ASSERT_FALSE(e.gguf.empty()) << "test mapping does not know " << name;
        expected_names.insert(e.gguf);
        const gguf::TensorInfo *g = r->tensor(e.gguf);
        ASSERT_NE(g, nullptr) << e.gguf << " missing";
        std::vector<int64_t> ne(t.shape.rbegin(), t.shape.rend());
        if (e.expert >= 0) ne.push_back(n_expert);
        ASSERT_EQ(g->ne, ne);
        const Type want = expected_type(e.gguf, ne[0], type);
        ASSERT_EQ(g->type, want) << gguf::type_name(g->type);
        const int64_t per = static_cast<int64_t>(t.bytes.size()) / (t.dtype == "I64" ? 8 : 4);
        const int64_t rows = per / ne[0];
        const uint64_t rb = gguf::row_bytes(want, ne[0]);
        const uint8_t *base = g->data + (e.expert >= 0 ? static_cast<uint64_t>(e.expert) * rb * rows : 0);
        if (want == Type::I32) {
            ASSERT_EQ(t.dtype, "I64");
            for (int64_t i = 0; i < per; i++) {
                int64_t a;
                int32_t b;
                std::memcpy(&a, t.bytes.data() + i * 8, 8);
                std::memcpy(&b, base + i * 4, 4);
                ASSERT_EQ(a, b) << "index " << i;
            }
            continue;
        }
        if (want == Type::F32) {
            ASSERT_EQ(std::memcmp(base, t.bytes.data(), t.bytes.size()), 0) << "f32 bytes differ";
            continue;
        }
        const std::vector<float> f = to_f32(t);
        for (int64_t row = 0; row < rows; row++)
            expect_close(e.gguf + " row " + std::to_string(row), want, f.data() + row * ne[0], base + row * rb, ne[0]);
    }
    std::set<std::string> got_names;
    for (const auto &t : r->tensors()) got_names.insert(t.name);
    EXPECT_EQ(got_names, expected_names);
    EXPECT_EQ(res.n_tensors, expected_names.size());
}

class Roundtrip : public ::testing::TestWithParam<std::string> {};

TEST_P(Roundtrip, F32BitExact) { check_fixture(GetParam(), Type::F32); }
TEST_P(Roundtrip, F16WithinRounding) { check_fixture(GetParam(), Type::F16); }
TEST_P(Roundtrip, BF16WithinRounding) { check_fixture(GetParam(), Type::BF16); }
TEST_P(Roundtrip, Q8_0WithinBlockStep) { check_fixture(GetParam(), Type::Q8_0); }

// Metadata read back through ModelConfig::from_gguf equals config.json, read here directly.
TEST_P(Roundtrip, MetadataMatchesConfigJson) {
    const std::string fixture = GetParam();
    TempDir tmp;
    ConvertOptions o;
    o.in_dir = fixture_dir(fixture);
    o.out_path = tmp.file("out.gguf");
    o.progress = false;
    convert_hf(o);
    auto r = gguf::Reader::open(o.out_path);
    const ModelConfig c = ModelConfig::from_gguf(*r);
    const nlohmann::json j = read_json(fixture_dir(fixture) + "/config.json");

    EXPECT_EQ(r->get_string("general.architecture"), "deepseek4");
    EXPECT_EQ(c.n_layer, j["num_hidden_layers"].get<int>());
    EXPECT_EQ(c.n_embd, j["hidden_size"].get<int>());
    EXPECT_EQ(c.n_vocab, j["vocab_size"].get<int>());
    EXPECT_EQ(c.n_ctx_train, j["max_position_embeddings"].get<int>());
    EXPECT_EQ(c.n_head, j["num_attention_heads"].get<int>());
    EXPECT_EQ(c.head_dim, j["head_dim"].get<int>());
    EXPECT_EQ(c.n_rot, static_cast<int>(std::lround(j["head_dim"].get<double>() * j["partial_rotary_factor"].get<double>())));
    EXPECT_EQ(c.n_rot, j["qk_rope_head_dim"].get<int>());
    EXPECT_EQ(c.q_lora, j["q_lora_rank"].get<int>());
    EXPECT_EQ(c.o_lora, j["o_lora_rank"].get<int>());
    EXPECT_EQ(c.o_groups, j["o_groups"].get<int>());
    EXPECT_EQ(c.sliding_window, j["sliding_window"].get<int>());
    std::vector<int> ratios;
    for (const auto &t : j["layer_types"]) {
        const std::string s = t;
        ratios.push_back(s == "sliding_attention" ? 0 : j["compress_rates"][s].get<int>());
    }
    EXPECT_EQ(c.compress_ratio, ratios);
    for (int l = 0; l < c.n_layer; l++) {
        EXPECT_EQ(c.is_csa(l), j["layer_types"][l] == "compressed_sparse_attention") << "layer " << l;
        EXPECT_EQ(c.is_hca(l), j["layer_types"][l] == "heavily_compressed_attention") << "layer " << l;
    }
    EXPECT_EQ(c.indexer_heads, j["index_n_heads"].get<int>());
    EXPECT_EQ(c.indexer_dim, j["index_head_dim"].get<int>());
    EXPECT_EQ(c.indexer_topk, j["index_topk"].get<int>());
    EXPECT_FLOAT_EQ(c.rms_eps, j["rms_norm_eps"].get<float>());
    EXPECT_EQ(c.n_expert, j["n_routed_experts"].get<int>());
    EXPECT_EQ(c.n_expert_used, j["num_experts_per_tok"].get<int>());
    EXPECT_EQ(c.n_expert_shared, j["n_shared_experts"].get<int>());
    EXPECT_EQ(c.n_ff_exp, j["moe_intermediate_size"].get<int>());
    EXPECT_FLOAT_EQ(c.expert_scale, j["routed_scaling_factor"].get<float>());
    int hash = 0;
    while (hash < c.n_layer && j["mlp_layer_types"][hash] == "hash_moe") hash++;
    EXPECT_EQ(c.n_hash_layer, hash);
    ASSERT_EQ(static_cast<int>(c.swiglu_limit.size()), c.n_layer);
    for (float s : c.swiglu_limit) EXPECT_FLOAT_EQ(s, j["swiglu_limit"].get<float>());
    EXPECT_EQ(c.hc_mult, j["hc_mult"].get<int>());
    EXPECT_EQ(c.hc_iters, j["hc_sinkhorn_iters"].get<int>());
    EXPECT_FLOAT_EQ(c.hc_eps, j["hc_eps"].get<float>());
    const auto &rp = j["rope_parameters"];
    EXPECT_FLOAT_EQ(c.rope_base, rp["main"]["rope_theta"].get<float>());
    EXPECT_FLOAT_EQ(c.compress_rope_base, rp["compress"]["rope_theta"].get<float>());
    const bool yarn = rp["compress"]["rope_type"] == "yarn";
    EXPECT_EQ(c.yarn, yarn);
    if (yarn) {
        EXPECT_FLOAT_EQ(c.yarn_factor, rp["compress"]["factor"].get<float>());
        EXPECT_EQ(c.yarn_orig_ctx, rp["compress"]["original_max_position_embeddings"].get<int>());
        EXPECT_FLOAT_EQ(c.yarn_beta_fast, rp["compress"]["beta_fast"].get<float>());
        EXPECT_FLOAT_EQ(c.yarn_beta_slow, rp["compress"]["beta_slow"].get<float>());
    }
    EXPECT_EQ(r->get_int("tokenizer.ggml.bos_token_id"), j["bos_token_id"].get<int>());
    EXPECT_EQ(r->get_int("tokenizer.ggml.eos_token_id"), j["eos_token_id"].get<int>());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Roundtrip, ::testing::Values("mix", "flashlike", "wide"));

}  // namespace
}  // namespace ds4::convert::test

namespace ds4::convert::test {
namespace {

// --expert-type on fixtures whose rows are too short for 256-blocks: the K/IQ types fall
// back per tensor (to q8_0 when rows are a multiple of 32, else f16) and the ds4 layouts
// set the other roles as documented.
TEST(ExpertType, FallbacksAndDs4Layout) {
    TempDir tmp;
    ConvertOptions o;
    o.in_dir = fixture_dir("wide");
    o.out_path = tmp.file("w.gguf");
    o.type = "f32";
    o.expert_type = "ds4-q2";
    o.progress = false;
    ConvertResult res = convert_hf(o);
    EXPECT_FALSE(res.warnings.empty());
    auto r = gguf::Reader::open(o.out_path);
    // wide: 96 wide (a multiple of 32, not of 256), expert width 24.
    EXPECT_EQ(r->tensor("blk.1.ffn_gate_exps.weight")->type, Type::Q8_0);
    EXPECT_EQ(r->tensor("blk.1.ffn_down_exps.weight")->type, Type::F16);
    EXPECT_EQ(r->tensor("blk.1.ffn_gate_inp.weight")->type, Type::F16);
    EXPECT_EQ(r->tensor("blk.1.hc_attn_fn.weight")->type, Type::F16);
    EXPECT_EQ(r->tensor("blk.1.indexer.proj.weight")->type, Type::F16);
    EXPECT_EQ(r->tensor("blk.1.attn_kv.weight")->type, Type::Q8_0);
    EXPECT_EQ(r->tensor("output.weight")->type, Type::Q8_0);
    EXPECT_EQ(r->tensor("blk.1.attn_sinks.weight")->type, Type::F32);

    o.expert_type = "q9_9";
    EXPECT_THROW(convert_hf(o), Error);
    o.expert_type = "";
    o.type = "q4_k";   // 2/4-bit types are for experts only
    EXPECT_THROW(convert_hf(o), Error);
}

}  // namespace
}  // namespace ds4::convert::test
