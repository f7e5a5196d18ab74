// The tensor set of a DeepSeek-V4 model as a function of its ModelConfig: GGUF name,
// checkpoint (transformers save_pretrained) name, GGML shape and role of every tensor.
// The converter checks a checkpoint against it; the model generator fills it with random
// data. One table, so both always produce the same layout (ARCHITECTURE.md §2).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/config.h"

namespace ds4::convert {

// What a tensor is for; the type policy and the random generator key off this.
enum class Role {
    Embedding,       // token_embd
    Output,          // output (LM head)
    AttnProj,        // attn_q_a, attn_q_b, attn_kv, attn_output_a/b
    CompressorProj,  // attn_compressor_{kv,gate}, indexer_compressor_{kv,gate}
    IndexerProj,     // indexer.attn_q_b, indexer.proj
    Router,          // ffn_gate_inp
    ExpertGate,      // ffn_gate_exps (stacked w1)
    ExpertUp,        // ffn_up_exps (stacked w3)
    ExpertDown,      // ffn_down_exps (stacked w2)
    SharedExpert,    // ffn_{gate,up,down}_shexp
    HcFn,            // hyper-connection projections (hc_*_fn, output_hc_fn)
    HcBase,
    HcScale,
    Norm,            // RMSNorm weights
    RouterBias,      // ffn_exp_probs_b
    Sink,            // attn_sinks
    Ape,             // compressor position biases
    HashTable,       // ffn_gate_tid2eid (I32)
};
const char *role_name(Role r);
// The large 2-D (3-D for experts) weight matrices whose type --type / --expert-type choose.
bool role_is_matrix(Role r);

struct TensorSpec {
    std::string gguf;            // "blk.3.attn_q_a.weight"
    std::string hf;              // "model.layers.3.attn.wq_a.weight"; stacked: "...experts.{E}.w1.weight"
    Role role;
    int layer = -1;              // -1: not in a layer
    std::vector<int64_t> ne;     // GGML order (ne[0] contiguous); stacked experts: [in, out, n_expert]
    int64_t n_stack = 0;         // > 0: one checkpoint tensor per expert, stacked along ne[2]

    // Checkpoint name of expert e of a stacked tensor (the name itself otherwise).
    std::string hf_name(int64_t e) const;
    // The checkpoint tensor's torch shape (per expert for stacked ones).
    std::vector<int64_t> hf_shape() const;
    int64_t nelements() const;
    int64_t rows() const { return nelements() / ne[0]; }
};

std::vector<TensorSpec> model_layout(const ModelConfig &c);

// Checkpoint names are accepted in the transformers spelling and in the original DeepSeek
// one ("layers.N.", "embed.weight", "norm.weight", "hc_head_fn", "attn.kv_norm"); this maps
// the latter onto the former.
std::string canonical_hf_name(const std::string &name);

}  // namespace ds4::convert
