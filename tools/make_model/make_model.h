// ds4-make-model: deterministic random DeepSeek-V4 models written directly as GGUF
// (ModelConfig::to_gguf + the converter's layout table), for the embedded demo model,
// tests and benchmarks. Tensor data is produced row by row at write time, so even the
// real V4-Flash shape (~7 GB per layer at q8_0) never sits in memory.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/gguf/gguf.h"
#include "engine/model/config.h"
#include "tools/convert/layout.h"

namespace ds4::make_model {

// tiny | small | flash-shape. n_layer < 0: the preset's own count. The per-layer arrays
// (compress ratios, SwiGLU clamps) and the hash-layer count follow the preset's pattern
// for the chosen layer count.
ModelConfig preset_config(const std::string &preset, int n_layer = -1);
// Re-derives the per-layer pattern of PRESET for cfg.n_layer layers (after --layers).
void apply_layer_pattern(const std::string &preset, ModelConfig &cfg);
extern const char *const kPresetNames;   // "tiny, small, flash-shape"

struct MakeModelOptions {
    ModelConfig cfg;
    std::string type = "f32";   // --type (matrices)
    std::string expert_type;    // --expert-type
    // Library only (tests): per-role types applied on top of type/expert_type, e.g. every
    // matrix role as q4_k. A type whose block does not divide a tensor's rows still falls
    // back as type_for() says (with a warning).
    std::map<convert::Role, gguf::Type> role_types;
    uint64_t seed = 1;
    bool fast = false;          // hash-synthesised blocks instead of exact Gaussian values
    bool sparse = false;        // matrices left as holes (zeros; no disk)
    bool scripted = false;      // the scripted preset's fixed weights (scripted.h); shape options are ignored
    int threads = 0;            // 0: one per core
    bool progress = true;
    std::string name = "ds4-random";
};

struct MakeModelResult {
    size_t n_tensors = 0;
    uint64_t tensor_bytes = 0;   // logical tensor bytes (holes included)
    uint64_t written_bytes = 0;  // bytes actually generated
    double seconds = 0;
    std::vector<std::string> warnings;
};

MakeModelResult make_model(const MakeModelOptions &opt, const std::string &out_path);

int make_model_main(int argc, char **argv);

}  // namespace ds4::make_model
