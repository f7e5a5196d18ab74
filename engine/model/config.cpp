#include "engine/model/config.h"

#include <algorithm>
#include <sstream>

#include "engine/common/error.h"

namespace ds4 {

namespace {

int get_pos(const gguf::Reader &r, const char *k) {
    int64_t v = r.get_int(k);
    if (v <= 0 || v > (int64_t{1} << 31) - 1) failf("GGUF metadata %s = %lld: must be a positive 32-bit value", k, (long long)v);
    return (int)v;
}

int get_nonneg(const gguf::Reader &r, const char *k, int64_t dflt) {
    int64_t v = r.get_int(k, dflt);
    if (v < 0 || v > (int64_t{1} << 31) - 1) failf("GGUF metadata %s = %lld: out of range", k, (long long)v);
    return (int)v;
}

}  // namespace

ModelConfig ModelConfig::from_gguf(const gguf::Reader &r) {
    std::string arch = r.get_string(key::kArch);
    if (arch != "deepseek4") failf("GGUF architecture is '%s', expected 'deepseek4'", arch.c_str());
    ModelConfig c;
    c.n_layer = get_pos(r, key::kBlockCount);
    c.n_embd = get_pos(r, key::kEmbedding);
    c.n_head = get_pos(r, key::kHeads);
    c.head_dim = get_pos(r, key::kKeyLength);
    if (r.has(key::kValueLength) && r.get_int(key::kValueLength) != c.head_dim)
        fail("GGUF metadata: value_length must equal key_length (V4 shares one K=V head)");
    if (r.has(key::kHeadsKV) && r.get_int(key::kHeadsKV) != 1)
        fail("GGUF metadata: head_count_kv must be 1 (V4 shares one K=V head)");
    c.n_rot = get_pos(r, key::kRopeDims);
    c.q_lora = get_pos(r, key::kQLora);
    c.o_lora = get_pos(r, key::kOLora);
    c.o_groups = get_pos(r, key::kOGroups);
    c.sliding_window = get_pos(r, key::kSlidingWindow);
    c.indexer_heads = get_nonneg(r, key::kIndexerHeads, 0);
    c.indexer_dim = get_nonneg(r, key::kIndexerDim, 0);
    c.indexer_topk = get_nonneg(r, key::kIndexerTopK, 0);
    c.rms_eps = (float)r.get_float(key::kRmsEps, 1e-6);
    c.n_expert = get_pos(r, key::kExperts);
    c.n_expert_used = get_pos(r, key::kExpertsUsed);
    c.n_expert_shared = get_nonneg(r, key::kExpertsShared, 1);
    c.n_ff_exp = get_pos(r, key::kExpertFF);
    c.expert_scale = (float)r.get_float(key::kExpertScale, 1.5);
    c.n_hash_layer = get_nonneg(r, key::kHashLayers, 0);
    c.hc_mult = get_pos(r, key::kHcCount);
    c.hc_iters = get_pos(r, key::kHcIters);
    c.hc_eps = (float)r.get_float(key::kHcEps, 1e-6);
    c.rope_base = (float)r.get_float(key::kRopeBase, 10000.0);
    c.compress_rope_base = (float)r.get_float(key::kCompressRopeBase, 160000.0);
    std::string scaling = r.get_string(key::kRopeScalingType, r.has(key::kRopeScalingFactor) ? "yarn" : "none");
    if (scaling == "yarn") {
        c.yarn = true;
        c.yarn_factor = (float)r.get_float(key::kRopeScalingFactor);
        c.yarn_orig_ctx = (int)r.get_int(key::kRopeOrigCtx);
        c.yarn_beta_fast = (float)r.get_float(key::kYarnBetaFast, 32.0);
        c.yarn_beta_slow = (float)r.get_float(key::kYarnBetaSlow, 1.0);
    } else if (scaling != "none") {
        failf("GGUF metadata %s = '%s': only 'yarn' and 'none' are supported", key::kRopeScalingType, scaling.c_str());
    }
    c.n_vocab = r.has(key::kVocab) ? get_pos(r, key::kVocab) : 0;
    if (c.n_vocab == 0) {
        const gguf::TensorInfo *t = r.tensor("token_embd.weight");
        if (!t || t->ne.size() != 2) fail("GGUF: no deepseek4.vocab_size and no 2-D token_embd.weight");
        c.n_vocab = (int)t->ne[1];
    }
    c.n_ctx_train = get_nonneg(r, key::kContextLength, 0);

    const gguf::Value &ratios = r.get_array(key::kCompressRatios);
    if ((int)ratios.arr.size() != c.n_layer)
        failf("GGUF metadata %s has %zu entries, expected %d (one per layer)", key::kCompressRatios, ratios.arr.size(), c.n_layer);
    for (const gguf::Value &v : ratios.arr) {
        int64_t x = v.as_int();
        if (x < 0 || x > 65536) failf("GGUF metadata %s: ratio %lld out of range", key::kCompressRatios, (long long)x);
        c.compress_ratio.push_back((int)x);
    }
    c.csa_ratio = get_nonneg(r, "deepseek4.attention.csa_compress_ratio", 4);

    const gguf::Value *clamp = r.find(key::kSwigluClamp);
    if (!clamp) {
        c.swiglu_limit.assign(c.n_layer, 10.f);
    } else if (clamp->type == gguf::ValueType::ARRAY) {
        if ((int)clamp->arr.size() != c.n_layer) failf("GGUF metadata %s: %zu entries, expected %d", key::kSwigluClamp, clamp->arr.size(), c.n_layer);
        for (const gguf::Value &v : clamp->arr) c.swiglu_limit.push_back((float)v.as_float());
    } else {
        c.swiglu_limit.assign(c.n_layer, (float)clamp->as_float());
    }
    c.validate();
    return c;
}

void ModelConfig::validate() const {
    auto need = [](bool ok, const char *what) {
        if (!ok) failf("invalid DeepSeek-V4 shape: %s", what);
    };
    need(n_layer > 0 && n_embd > 0 && n_vocab > 0 && n_head > 0 && head_dim > 0, "sizes must be positive");
    need(n_rot > 0 && n_rot <= head_dim && n_rot % 2 == 0, "rope dims must be even and at most head_dim");
    need(o_groups > 0 && n_head % o_groups == 0, "head count must be a multiple of output groups");
    need(n_expert_used > 0 && n_expert_used <= n_expert, "expert_used_count must be in 1..expert_count");
    need(n_expert_shared == 0 || n_expert_shared == 1, "only 0 or 1 shared experts are supported");
    need(n_hash_layer >= 0 && n_hash_layer <= n_layer, "hash_layer_count must be in 0..block_count");
    need(hc_mult > 0 && hc_mult <= 16 && hc_iters > 0, "hyper-connection count/iterations out of range");
    need((int)compress_ratio.size() == n_layer, "one compress ratio per layer");
    need((int)swiglu_limit.size() == n_layer, "one swiglu clamp per layer");
    need(sliding_window > 0, "sliding window must be positive");
    bool any_csa = false;
    for (int l = 0; l < n_layer; ++l) any_csa |= is_csa(l);
    if (any_csa) {
        need(indexer_heads > 0 && indexer_dim > 0 && indexer_topk > 0, "CSA layers need indexer head_count/key_length/top_k");
        need(indexer_dim >= n_rot, "indexer key_length must be at least the rope dims");
    }
    if (yarn) need(yarn_factor > 0 && yarn_orig_ctx > 0, "YaRN needs a positive factor and original context");
}

void ModelConfig::to_gguf(gguf::Writer &w) const {
    validate();
    using gguf::Value;
    w.set(key::kArch, Value::str("deepseek4"));
    w.set(key::kBlockCount, Value::u32(n_layer));
    if (n_ctx_train > 0) w.set(key::kContextLength, Value::u32(n_ctx_train));
    w.set(key::kEmbedding, Value::u32(n_embd));
    w.set(key::kVocab, Value::u32(n_vocab));
    w.set(key::kHeads, Value::u32(n_head));
    w.set(key::kHeadsKV, Value::u32(1));
    w.set(key::kKeyLength, Value::u32(head_dim));
    w.set(key::kValueLength, Value::u32(head_dim));
    w.set(key::kRopeDims, Value::u32(n_rot));
    w.set(key::kQLora, Value::u32(q_lora));
    w.set(key::kOLora, Value::u32(o_lora));
    w.set(key::kOGroups, Value::u32(o_groups));
    w.set(key::kSlidingWindow, Value::u32(sliding_window));
    std::vector<uint32_t> ratios(compress_ratio.begin(), compress_ratio.end());
    w.set(key::kCompressRatios, Value::u32_array(ratios));
    w.set("deepseek4.attention.csa_compress_ratio", Value::u32(csa_ratio));
    w.set(key::kIndexerHeads, Value::u32(indexer_heads));
    w.set(key::kIndexerDim, Value::u32(indexer_dim));
    w.set(key::kIndexerTopK, Value::u32(indexer_topk));
    w.set(key::kRmsEps, Value::f32(rms_eps));
    w.set(key::kExperts, Value::u32(n_expert));
    w.set(key::kExpertsUsed, Value::u32(n_expert_used));
    w.set(key::kExpertsShared, Value::u32(n_expert_shared));
    w.set(key::kExpertFF, Value::u32(n_ff_exp));
    w.set(key::kExpertScale, Value::f32(expert_scale));
    w.set(key::kExpertNorm, Value::boolean(true));
    w.set(key::kExpertGating, Value::str("sqrtsoftplus"));
    w.set(key::kHashLayers, Value::u32(n_hash_layer));
    w.set(key::kSwigluClamp, Value::f32_array(swiglu_limit));
    w.set(key::kHcCount, Value::u32(hc_mult));
    w.set(key::kHcIters, Value::u32(hc_iters));
    w.set(key::kHcEps, Value::f32(hc_eps));
    w.set(key::kRopeBase, Value::f32(rope_base));
    w.set(key::kCompressRopeBase, Value::f32(compress_rope_base));
    w.set(key::kRopeScalingType, Value::str(yarn ? "yarn" : "none"));
    if (yarn) {
        w.set(key::kRopeScalingFactor, Value::f32(yarn_factor));
        w.set(key::kRopeOrigCtx, Value::u32(yarn_orig_ctx));
        w.set(key::kYarnBetaFast, Value::f32(yarn_beta_fast));
        w.set(key::kYarnBetaSlow, Value::f32(yarn_beta_slow));
    }
}

std::string ModelConfig::summary() const {
    int n_csa = 0, n_hca = 0;
    for (int l = 0; l < n_layer; ++l) n_csa += is_csa(l), n_hca += is_hca(l);
    std::ostringstream o;
    o << "deepseek4: " << n_layer << " layers (" << n_csa << " CSA, " << n_hca << " HCA, "
      << n_layer - n_csa - n_hca << " sliding), " << n_embd << " wide, " << n_head << "x" << head_dim
      << " heads, " << n_expert << " experts (" << n_expert_used << " used + " << n_expert_shared
      << " shared, " << n_ff_exp << " wide), vocab " << n_vocab;
    return o.str();
}

std::string blk_tensor(int layer, const char *suffix) {
    return "blk." + std::to_string(layer) + "." + suffix + ".weight";
}

std::string global_tensor(const char *name) { return std::string(name) + ".weight"; }

}  // namespace ds4
