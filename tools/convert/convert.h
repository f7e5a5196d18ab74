// ds4-convert: a transformers DeepseekV4ForCausalLM directory (config.json + safetensors,
// optional tokenizer.json) -> one GGUF in the ds4 layout. Everything is checked (config,
// every tensor's presence, dtype and shape, no leftovers) before the output is written;
// tensor data is then streamed from the mmap'd safetensors straight into the file.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/config.h"

namespace ds4::convert {

struct ConvertOptions {
    std::string in_dir;
    std::string out_path;
    std::string type = "f32";       // --type
    std::string expert_type;        // --expert-type ("" = same as type)
    int threads = 0;                // 0: one per core
    bool progress = true;           // progress + warnings on stderr
};

struct ConvertResult {
    ModelConfig cfg;
    size_t n_tensors = 0;
    uint64_t source_bytes = 0;      // safetensors tensor bytes read
    uint64_t tensor_bytes = 0;      // GGUF tensor bytes written
    double seconds = 0;
    std::vector<std::string> warnings;
};

ConvertResult convert_hf(const ConvertOptions &opt);

// The command line: parses argv, runs, prints errors; returns the exit status.
int convert_main(int argc, char **argv);

}  // namespace ds4::convert
