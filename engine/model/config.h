// DeepSeek-V4 hyper-parameters, read from / written to GGUF metadata (deepseek4.*).
// Shapes always come from here, never from constants, so the real V4-Flash shape and
// tiny test shapes go through the same code.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/gguf/gguf.h"

namespace ds4 {

// Metadata keys, as the existing ds4 GGUF files spell them.
namespace key {
inline constexpr const char *kArch = "general.architecture";     // "deepseek4"
inline constexpr const char *kName = "general.name";
inline constexpr const char *kBlockCount = "deepseek4.block_count";
inline constexpr const char *kContextLength = "deepseek4.context_length";
inline constexpr const char *kEmbedding = "deepseek4.embedding_length";
inline constexpr const char *kVocab = "deepseek4.vocab_size";
inline constexpr const char *kHeads = "deepseek4.attention.head_count";
inline constexpr const char *kHeadsKV = "deepseek4.attention.head_count_kv";
inline constexpr const char *kKeyLength = "deepseek4.attention.key_length";
inline constexpr const char *kValueLength = "deepseek4.attention.value_length";
inline constexpr const char *kRopeDims = "deepseek4.rope.dimension_count";
inline constexpr const char *kQLora = "deepseek4.attention.q_lora_rank";
inline constexpr const char *kOLora = "deepseek4.attention.output_lora_rank";
inline constexpr const char *kOGroups = "deepseek4.attention.output_group_count";
inline constexpr const char *kSlidingWindow = "deepseek4.attention.sliding_window";
inline constexpr const char *kCompressRatios = "deepseek4.attention.compress_ratios";  // u32 per layer
inline constexpr const char *kIndexerHeads = "deepseek4.attention.indexer.head_count";
inline constexpr const char *kIndexerDim = "deepseek4.attention.indexer.key_length";
inline constexpr const char *kIndexerTopK = "deepseek4.attention.indexer.top_k";
inline constexpr const char *kRmsEps = "deepseek4.attention.layer_norm_rms_epsilon";
inline constexpr const char *kExperts = "deepseek4.expert_count";
inline constexpr const char *kExpertsUsed = "deepseek4.expert_used_count";
inline constexpr const char *kExpertsShared = "deepseek4.expert_shared_count";
inline constexpr const char *kExpertFF = "deepseek4.expert_feed_forward_length";
inline constexpr const char *kExpertScale = "deepseek4.expert_weights_scale";
inline constexpr const char *kExpertNorm = "deepseek4.expert_weights_norm";
inline constexpr const char *kExpertGating = "deepseek4.expert_gating_func";  // "sqrtsoftplus"
inline constexpr const char *kHashLayers = "deepseek4.hash_layer_count";
inline constexpr const char *kSwigluClamp = "deepseek4.swiglu_clamp_exp";     // f32 or f32[layers]
inline constexpr const char *kHcCount = "deepseek4.hyper_connection.count";
inline constexpr const char *kHcIters = "deepseek4.hyper_connection.sinkhorn_iterations";
inline constexpr const char *kHcEps = "deepseek4.hyper_connection.epsilon";
inline constexpr const char *kRopeBase = "deepseek4.rope.freq_base";
inline constexpr const char *kCompressRopeBase = "deepseek4.attention.compress_rope_freq_base";
inline constexpr const char *kRopeScalingType = "deepseek4.rope.scaling.type";   // "yarn" | "none"
inline constexpr const char *kRopeScalingFactor = "deepseek4.rope.scaling.factor";
inline constexpr const char *kRopeOrigCtx = "deepseek4.rope.scaling.original_context_length";
inline constexpr const char *kYarnBetaFast = "deepseek4.rope.scaling.yarn_beta_fast";
inline constexpr const char *kYarnBetaSlow = "deepseek4.rope.scaling.yarn_beta_slow";
}  // namespace key

struct ModelConfig {
    int n_layer = 0;
    int n_embd = 0;
    int n_vocab = 0;
    int n_ctx_train = 0;          // max_position_embeddings
    int n_head = 0;
    int head_dim = 0;             // K = V width of the single shared head
    int n_rot = 0;                // trailing rope channels of each head
    int q_lora = 0;
    int o_lora = 0;               // per-group output rank
    int o_groups = 0;
    int sliding_window = 0;
    std::vector<int> compress_ratio;   // per layer: 0 (sliding only), CSA ratio (4), HCA ratio (128)
    int csa_ratio = 4;            // the ratio that means "CSA with indexer" (smallest non-zero)
    int indexer_heads = 0;
    int indexer_dim = 0;
    int indexer_topk = 0;
    float rms_eps = 1e-6f;
    int n_expert = 0;
    int n_expert_used = 0;
    int n_expert_shared = 1;
    int n_ff_exp = 0;             // routed and shared expert width
    float expert_scale = 1.5f;    // routed_scaling_factor
    int n_hash_layer = 0;         // first layers route by tid2eid
    std::vector<float> swiglu_limit;   // per layer
    int hc_mult = 4;
    int hc_iters = 20;
    float hc_eps = 1e-6f;
    float rope_base = 10000.f;           // sliding-only layers
    float compress_rope_base = 160000.f; // compressed layers
    bool yarn = false;                   // YaRN on compressed layers (no magnitude scaling)
    float yarn_factor = 1.f;
    int yarn_orig_ctx = 0;
    float yarn_beta_fast = 32.f;
    float yarn_beta_slow = 1.f;

    bool is_csa(int layer) const { return compress_ratio[layer] != 0 && compress_ratio[layer] == csa_ratio; }
    bool is_hca(int layer) const { return compress_ratio[layer] != 0 && compress_ratio[layer] != csa_ratio; }
    bool is_hash(int layer) const { return layer < n_hash_layer; }

    // Reads and validates (positive sizes, divisibility, array lengths); throws ds4::Error
    // naming the offending key.
    static ModelConfig from_gguf(const gguf::Reader &r);
    // Writes every key above (plus general.architecture).
    void to_gguf(gguf::Writer &w) const;
    void validate() const;
    std::string summary() const;   // one line: layers, widths, heads, experts, vocab
};

// Tensor names (GGUF side). blk(l, "attn_q_a") -> "blk.<l>.attn_q_a.weight".
std::string blk_tensor(int layer, const char *suffix);
std::string global_tensor(const char *name);   // "token_embd" -> "token_embd.weight"

}  // namespace ds4
