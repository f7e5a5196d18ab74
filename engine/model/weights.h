// Binds the GGUF tensors of a DeepSeek-V4 model to per-layer views, checking every
// shape against the config. Large matrices stay in the mmap'd file (any supported
// format); small vectors (norms, biases, sinks, position biases) are dequantised to
// owned f32 copies once.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/gguf/gguf.h"
#include "engine/kernels/matmul.h"
#include "engine/model/config.h"

namespace ds4 {

struct CompressorWeights {
    WeightView kv, gate;            // ne = [n_embd, width]; width = 2*dim (CSA) or dim (HCA)
    std::vector<float> ape;         // [ratio][width]
    std::vector<float> norm;        // [dim]
    int dim = 0, width = 0;
};

struct LayerWeights {
    std::vector<float> attn_norm, ffn_norm;
    WeightView hc_attn_fn, hc_ffn_fn;                     // ne = [hc*n_embd, (2+hc)*hc]
    std::vector<float> hc_attn_base, hc_attn_scale, hc_ffn_base, hc_ffn_scale;
    WeightView q_a, q_b, kv, o_a, o_b;
    std::vector<float> q_a_norm, kv_norm, sinks;
    CompressorWeights comp;        // CSA and HCA layers
    CompressorWeights icomp;       // CSA: the indexer's own compressor
    WeightView i_q_b, i_proj;      // CSA: indexer queries and head weights
    WeightView gate_inp;           // router, ne = [n_embd, n_expert]
    std::vector<float> probs_b;    // router correction bias (non-hash layers)
    const int32_t *tid2eid = nullptr;   // hash layers: [n_vocab][n_expert_used]
    ExpertsView gate_exps, up_exps, down_exps;
    WeightView gate_sh, up_sh, down_sh;
};

using TensorPlan = std::unordered_map<std::string, size_t>;

struct ModelWeights {
    WeightView token_embd;         // ne = [n_embd, n_vocab]
    WeightView output;             // ne = [n_embd, n_vocab]
    std::vector<float> output_norm;
    WeightView output_hc_fn;       // ne = [hc*n_embd, hc]
    std::vector<float> output_hc_base, output_hc_scale;
    std::vector<LayerWeights> layers;
    uint64_t mapped_bytes = 0;     // bytes of tensors referenced in place
    uint64_t owned_bytes = 0;      // bytes of the f32 copies

    // plan: the host's name -> index into r.tensors() (the bridge's bind plan); every name the
    // binder asks for must be in it, and the tensor at its index is bound under that name
    // (shapes still checked). Without a plan names are looked up in the reader.
    static ModelWeights bind(const gguf::Reader &r, const ModelConfig &c, const TensorPlan *plan = nullptr);
    // The names bind() asks for, in order, found by a dry run that checks shapes but reads
    // no tensor data (r may be opened without mapping). With a plan, also checks the plan.
    static std::vector<std::string> required_names(const gguf::Reader &r, const ModelConfig &c,
                                                   const TensorPlan *plan = nullptr);
};

}  // namespace ds4
