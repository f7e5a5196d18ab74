// config.json of a transformers DeepseekV4ForCausalLM directory -> ModelConfig.
// Understands the transformers >= 5.17 spellings (layer_types, compress_rates,
// mlp_layer_types, nested rope_parameters) and the older DeepSeek ones (compress_ratios,
// num_hash_layers, compress_rate_csa/hca, rope_scaling). Anything the engine does not
// implement (another scoring function, YaRN magnitude scaling, several KV heads, ...) is an
// error naming the key, never a silent approximation.
#pragma once
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "engine/model/config.h"

namespace ds4::convert {

struct HfConfig {
    ModelConfig cfg;
    int bos_token_id = -1;   // -1: not given
    int eos_token_id = -1;
    bool tie_word_embeddings = false;
};

HfConfig parse_hf_config(const nlohmann::json &j);
HfConfig read_hf_config(const std::string &config_json_path);

}  // namespace ds4::convert
