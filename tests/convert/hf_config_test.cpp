// config.json -> ModelConfig: the older DeepSeek spellings give the same config as the
// transformers ones, and everything the engine does not implement is refused by name.
#include <gtest/gtest.h>

#include "engine/common/error.h"
#include "tests/convert/convert_test_util.h"
#include "tools/convert/hf_config.h"

namespace ds4::convert::test {
namespace {

nlohmann::json mix() { return read_json(fixture_dir("mix") + "/config.json"); }

std::string error_of(const nlohmann::json &j) {
    try {
        parse_hf_config(j);
    } catch (const Error &e) {
        return e.what();
    }
    return "";
}

void expect_same(const ModelConfig &a, const ModelConfig &b) {
    EXPECT_EQ(a.n_layer, b.n_layer);
    EXPECT_EQ(a.n_rot, b.n_rot);
    EXPECT_EQ(a.compress_ratio, b.compress_ratio);
    EXPECT_EQ(a.csa_ratio, b.csa_ratio);
    EXPECT_EQ(a.n_hash_layer, b.n_hash_layer);
    EXPECT_EQ(a.yarn, b.yarn);
    EXPECT_EQ(a.yarn_factor, b.yarn_factor);
    EXPECT_EQ(a.yarn_orig_ctx, b.yarn_orig_ctx);
    EXPECT_EQ(a.yarn_beta_fast, b.yarn_beta_fast);
    EXPECT_EQ(a.yarn_beta_slow, b.yarn_beta_slow);
    EXPECT_EQ(a.rope_base, b.rope_base);
    EXPECT_EQ(a.compress_rope_base, b.compress_rope_base);
    EXPECT_EQ(a.swiglu_limit, b.swiglu_limit);
}

TEST(HfConfig, LegacySpellingsGiveTheSameConfig) {
    const nlohmann::json j = mix();
    const ModelConfig want = parse_hf_config(j).cfg;
    nlohmann::json l = j;
    for (const char *k : {"layer_types", "compress_rates", "mlp_layer_types", "rope_parameters", "partial_rotary_factor"})
        l.erase(k);
    l["compress_ratios"] = {0, 4, 16, 4, 0};   // plus one MTP layer's entry
    l["compress_rate_csa"] = 4;
    l["num_hash_layers"] = 2;
    l["compress_rope_theta"] = 160000.0;
    l["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64},
                         {"beta_fast", 32}, {"beta_slow", 1}};
    expect_same(parse_hf_config(l).cfg, want);
}

TEST(HfConfig, SwigluPerLayerList) {
    nlohmann::json j = mix();
    j["swiglu_limit"] = {1.0, 2.0, 3.0, 4.0};
    EXPECT_EQ(parse_hf_config(j).cfg.swiglu_limit, (std::vector<float>{1, 2, 3, 4}));
    j["swiglu_limit"] = {1.0, 2.0};
    EXPECT_NE(error_of(j).find("swiglu_limit"), std::string::npos);
}

TEST(HfConfig, RefusesWhatTheEngineDoesNotImplement) {
    struct Case {
        const char *key;
        std::function<void(nlohmann::json &)> edit;
    };
    const Case cases[] = {
        {"scoring_func", [](nlohmann::json &j) { j["scoring_func"] = "softmax"; }},
        {"attention_factor", [](nlohmann::json &j) { j["rope_parameters"]["compress"]["attention_factor"] = 1.2; }},
        {"rope_parameters.main.rope_type", [](nlohmann::json &j) { j["rope_parameters"]["main"]["rope_type"] = "yarn"; }},
        {"rope_type", [](nlohmann::json &j) { j["rope_parameters"]["compress"]["rope_type"] = "dynamic"; }},
        {"num_key_value_heads", [](nlohmann::json &j) { j["num_key_value_heads"] = 4; }},
        {"norm_topk_prob", [](nlohmann::json &j) { j["norm_topk_prob"] = false; }},
        {"hidden_act", [](nlohmann::json &j) { j["hidden_act"] = "gelu"; }},
        {"model_type", [](nlohmann::json &j) { j["model_type"] = "deepseek_v3"; }},
        {"mlp_layer_types[2]", [](nlohmann::json &j) { j["mlp_layer_types"] = {"hash_moe", "moe", "hash_moe", "moe"}; }},
        {"mlp_layer_types[0]", [](nlohmann::json &j) { j["mlp_layer_types"][0] = "dense"; }},
        {"layer_types[1]", [](nlohmann::json &j) { j["layer_types"][1] = "full_attention"; }},
        {"layer_types", [](nlohmann::json &j) { j["layer_types"].erase(0); }},
        {"partial_rotary_factor", [](nlohmann::json &j) { j["partial_rotary_factor"] = 0.3; j.erase("qk_rope_head_dim"); }},
        {"qk_rope_head_dim", [](nlohmann::json &j) { j["qk_rope_head_dim"] = 16; }},
        {"compress_rates", [](nlohmann::json &j) { j["compress_rates"]["heavily_compressed_attention"] = 4; }},
        {"hc_mult", [](nlohmann::json &j) { j.erase("hc_mult"); }},
        {"rope_theta", [](nlohmann::json &j) { j["rope_parameters"]["main"].erase("rope_theta"); j.erase("rope_theta"); }},
        {"factor", [](nlohmann::json &j) { j["rope_parameters"]["compress"].erase("factor"); }},
        {"vocab_size", [](nlohmann::json &j) { j["vocab_size"] = "many"; }},
    };
    for (const Case &c : cases) {
        nlohmann::json j = mix();
        c.edit(j);
        std::string e = error_of(j);
        EXPECT_NE(e.find(c.key), std::string::npos) << c.key << ": got '" << e << "'";
    }
}

TEST(HfConfig, AttentionFactorOneAndPlainRopeAreAccepted) {
    nlohmann::json j = mix();
    j["rope_parameters"]["compress"]["attention_factor"] = 1.0;
    EXPECT_TRUE(parse_hf_config(j).cfg.yarn);
    j["rope_parameters"]["compress"] = {{"rope_type", "default"}, {"rope_theta", 40000.0}};
    ModelConfig c = parse_hf_config(j).cfg;
    EXPECT_FALSE(c.yarn);
    EXPECT_EQ(c.compress_rope_base, 40000.f);
}

}  // namespace
}  // namespace ds4::convert::test
