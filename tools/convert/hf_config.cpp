#include "tools/convert/hf_config.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/common/error.h"

namespace ds4::convert {

namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string &key, const std::string &why) {
    fail("config.json: " + key + ": " + why);
}

const json *get(const json &j, const char *key) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return nullptr;
    return &*it;
}

const json &need(const json &j, const char *key, const std::string &path = "") {
    const json *v = get(j, key);
    if (!v) fail("config.json: missing key " + path + key);
    return *v;
}

int64_t as_int(const json &v, const std::string &key) {
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
        double d = v.get<double>();
        if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
    }
    bad(key, "expected an integer, got " + v.dump());
}

int to_int(const json &v, const std::string &key, int64_t lo = 1) {
    int64_t x = as_int(v, key);
    if (x < lo || x > INT32_MAX) bad(key, "value " + std::to_string(x) + " out of range");
    return static_cast<int>(x);
}

double as_num(const json &v, const std::string &key) {
    if (!v.is_number()) bad(key, "expected a number, got " + v.dump());
    double d = v.get<double>();
    if (!std::isfinite(d)) bad(key, "not finite");
    return d;
}

int need_int(const json &j, const char *key, int64_t lo = 1) { return to_int(need(j, key), key, lo); }

std::string as_str(const json &v, const std::string &key) {
    if (!v.is_string()) bad(key, "expected a string, got " + v.dump());
    return v.get<std::string>();
}

// Rotary dims: qk_rope_head_dim and/or head_dim * partial_rotary_factor; all spellings that
// are present must agree.
int rope_dims(const json &j, int head_dim) {
    int n_rot = -1;
    std::string from;
    auto take = [&](int v, const std::string &key) {
        if (n_rot >= 0 && v != n_rot)
            bad(key, "gives " + std::to_string(v) + " rotary dims but " + from + " gives " + std::to_string(n_rot));
        n_rot = v;
        from = key;
    };
    if (const json *v = get(j, "qk_rope_head_dim")) take(to_int(*v, "qk_rope_head_dim"), "qk_rope_head_dim");
    auto from_factor = [&](const json &f, const std::string &key) {
        double prf = as_num(f, key);
        double d = head_dim * prf;
        long r = std::lround(d);
        if (prf <= 0 || prf > 1 || std::fabs(d - static_cast<double>(r)) > 1e-6)
            bad(key, "head_dim " + std::to_string(head_dim) + " x " + f.dump() + " is not a whole number of dims");
        take(static_cast<int>(r), key);
    };
    if (const json *v = get(j, "partial_rotary_factor")) from_factor(*v, "partial_rotary_factor");
    if (const json *rp = get(j, "rope_parameters"); rp && rp->is_object())
        for (const char *sub : {"main", "compress"})
            if (const json *s = get(*rp, sub); s && s->is_object())
                if (const json *v = get(*s, "partial_rotary_factor"))
                    from_factor(*v, std::string("rope_parameters.") + sub + ".partial_rotary_factor");
    if (n_rot < 0) fail("config.json: missing key qk_rope_head_dim (or partial_rotary_factor)");
    if (n_rot == 0 || n_rot % 2 != 0 || n_rot > head_dim)
        bad(from, "rotary dims " + std::to_string(n_rot) + " must be even and within head_dim " + std::to_string(head_dim));
    return n_rot;
}

void compress_layout(const json &j, ModelConfig &c) {
    int csa = -1, hca = -1;
    if (const json *cr = get(j, "compress_rates")) {
        if (!cr->is_object()) bad("compress_rates", "expected an object");
        if (const json *v = get(*cr, "compressed_sparse_attention"))
            csa = to_int(*v, "compress_rates.compressed_sparse_attention");
        if (const json *v = get(*cr, "heavily_compressed_attention"))
            hca = to_int(*v, "compress_rates.heavily_compressed_attention");
    }
    if (const json *v = get(j, "compress_rate_csa")) csa = to_int(*v, "compress_rate_csa");
    if (const json *v = get(j, "compress_rate_hca")) hca = to_int(*v, "compress_rate_hca");

    c.compress_ratio.clear();
    if (const json *lt = get(j, "layer_types")) {
        if (!lt->is_array() || static_cast<int>(lt->size()) != c.n_layer)
            bad("layer_types", "expected an array of num_hidden_layers (" + std::to_string(c.n_layer) + ") strings");
        for (size_t i = 0; i < lt->size(); i++) {
            const std::string key = "layer_types[" + std::to_string(i) + "]";
            const std::string t = as_str((*lt)[i], key);
            if (t == "sliding_attention") {
                c.compress_ratio.push_back(0);
            } else if (t == "compressed_sparse_attention") {
                if (csa < 0) fail("config.json: missing key compress_rates.compressed_sparse_attention");
                c.compress_ratio.push_back(csa);
            } else if (t == "heavily_compressed_attention") {
                if (hca < 0) fail("config.json: missing key compress_rates.heavily_compressed_attention");
                c.compress_ratio.push_back(hca);
            } else {
                bad(key, "unknown attention type '" + t + "'");
            }
        }
    } else if (const json *crs = get(j, "compress_ratios")) {
        // Older DeepSeek configs: one ratio per layer, possibly followed by the MTP layers'.
        if (!crs->is_array()) bad("compress_ratios", "expected an array");
        int extra = 0;
        if (const json *v = get(j, "num_nextn_predict_layers")) extra = to_int(*v, "num_nextn_predict_layers", 0);
        const int n = static_cast<int>(crs->size());
        if (n != c.n_layer && n != c.n_layer + extra)
            bad("compress_ratios", "has " + std::to_string(n) + " entries for " + std::to_string(c.n_layer) + " layers");
        int smallest = 0;
        for (int i = 0; i < c.n_layer; i++) {
            int r = to_int((*crs)[static_cast<size_t>(i)], "compress_ratios[" + std::to_string(i) + "]", 0);
            c.compress_ratio.push_back(r);
            if (r > 0 && (smallest == 0 || r < smallest)) smallest = r;
        }
        if (csa < 0) csa = smallest ? smallest : 4;
    } else {
        fail("config.json: missing key layer_types (or compress_ratios)");
    }
    if (csa > 0 && hca > 0 && csa == hca)
        bad("compress_rates", "CSA and HCA use the same ratio " + std::to_string(csa) + "; the layer kinds would be indistinguishable");
    for (size_t i = 0; i < c.compress_ratio.size(); i++) {
        int r = c.compress_ratio[i];
        if (r == 1) bad("layer " + std::to_string(i), "compress ratio 1 is not a compression");
        if (hca < 0 && r != 0 && r != csa) hca = r;
        if (r != 0 && r != csa && r != hca)
            bad("compress_ratios", "layer " + std::to_string(i) + " uses ratio " + std::to_string(r) +
                                       " but only two compressed kinds exist (CSA " + std::to_string(csa) + ", HCA " +
                                       std::to_string(hca) + ")");
    }
    c.csa_ratio = csa > 0 ? csa : 4;
}

void hash_layers(const json &j, ModelConfig &c) {
    if (const json *mt = get(j, "mlp_layer_types")) {
        if (!mt->is_array() || static_cast<int>(mt->size()) != c.n_layer)
            bad("mlp_layer_types", "expected an array of num_hidden_layers (" + std::to_string(c.n_layer) + ") strings");
        int n_hash = 0;
        bool routed_seen = false;
        for (size_t i = 0; i < mt->size(); i++) {
            const std::string key = "mlp_layer_types[" + std::to_string(i) + "]";
            const std::string t = as_str((*mt)[i], key);
            if (t == "hash_moe") {
                if (routed_seen) bad(key, "hash_moe after a moe layer: hash-routed layers must come first");
                n_hash++;
            } else if (t == "moe") {
                routed_seen = true;
            } else {
                bad(key, "unsupported MLP type '" + t + "' (supported: hash_moe, moe)");
            }
        }
        c.n_hash_layer = n_hash;
    } else if (const json *v = get(j, "num_hash_layers")) {
        c.n_hash_layer = to_int(*v, "num_hash_layers", 0);
        if (c.n_hash_layer > c.n_layer) bad("num_hash_layers", "more hash layers than layers");
    } else {
        fail("config.json: missing key mlp_layer_types (or num_hash_layers)");
    }
}

// Reads one rope block (nested rope_parameters.main/compress, or the legacy rope_scaling).
struct Rope {
    bool have_theta = false;
    double theta = 0;
    bool yarn = false;
    double factor = 1, beta_fast = 32, beta_slow = 1;
    int orig_ctx = 0;
};

Rope read_rope(const json &r, const std::string &path, bool allow_yarn) {
    Rope o;
    if (!r.is_object()) bad(path, "expected an object");
    std::string type = "default";
    if (const json *v = get(r, "rope_type")) type = as_str(*v, path + ".rope_type");
    else if (const json *v2 = get(r, "type")) type = as_str(*v2, path + ".type");
    if (const json *v = get(r, "rope_theta")) {
        o.have_theta = true;
        o.theta = as_num(*v, path + ".rope_theta");
    }
    if (type == "default") return o;
    if (type != "yarn") bad(path + ".rope_type", "unsupported rope type '" + type + "' (supported: default, yarn)");
    if (!allow_yarn) bad(path + ".rope_type", "YaRN on the sliding-window layers is not supported");
    o.yarn = true;
    o.factor = as_num(need(r, "factor", path + "."), path + ".factor");
    o.orig_ctx = to_int(need(r, "original_max_position_embeddings", path + "."), path + ".original_max_position_embeddings");
    if (const json *v = get(r, "beta_fast")) o.beta_fast = as_num(*v, path + ".beta_fast");
    if (const json *v = get(r, "beta_slow")) o.beta_slow = as_num(*v, path + ".beta_slow");
    if (const json *v = get(r, "attention_factor")) {
        double af = as_num(*v, path + ".attention_factor");
        if (af != 1.0)
            bad(path + ".attention_factor", "is " + v->dump() + "; YaRN magnitude scaling is not implemented (DeepSeek-V4 uses 1.0)");
    }
    for (const char *k : {"mscale", "mscale_all_dim"})
        if (const json *v = get(r, k))
            if (as_num(*v, path + "." + k) != 0.0 && as_num(*v, path + "." + k) != 1.0)
                bad(path + "." + k, "YaRN magnitude scaling is not implemented");
    if (o.factor < 1.0) bad(path + ".factor", "must be >= 1");
    return o;
}

void rope(const json &j, ModelConfig &c) {
    Rope main, comp;
    if (const json *rp = get(j, "rope_parameters")) {
        if (!rp->is_object()) bad("rope_parameters", "expected an object");
        if (get(*rp, "main") || get(*rp, "compress")) {
            if (const json *m = get(*rp, "main")) main = read_rope(*m, "rope_parameters.main", false);
            if (const json *m = get(*rp, "compress")) comp = read_rope(*m, "rope_parameters.compress", true);
        } else {
            // A flat block: DeepSeek-V4 applies its scaling to the compressed layers only.
            comp = read_rope(*rp, "rope_parameters", true);
        }
    } else if (const json *rs = get(j, "rope_scaling")) {
        comp = read_rope(*rs, "rope_scaling", true);
    }
    if (!main.have_theta) {
        const json &v = need(j, "rope_theta");
        main.theta = as_num(v, "rope_theta");
    }
    if (!comp.have_theta) {
        const json &v = need(j, "compress_rope_theta");
        comp.theta = as_num(v, "compress_rope_theta");
    }
    if (main.theta <= 0) bad("rope_theta", "must be positive");
    if (comp.theta <= 0) bad("compress_rope_theta", "must be positive");
    c.rope_base = static_cast<float>(main.theta);
    c.compress_rope_base = static_cast<float>(comp.theta);
    c.yarn = comp.yarn;
    if (comp.yarn) {
        c.yarn_factor = static_cast<float>(comp.factor);
        c.yarn_orig_ctx = comp.orig_ctx;
        c.yarn_beta_fast = static_cast<float>(comp.beta_fast);
        c.yarn_beta_slow = static_cast<float>(comp.beta_slow);
    } else {
        c.yarn_factor = 1.f;
        c.yarn_orig_ctx = 0;
    }
}

int token_id(const json &j, const char *key) {
    const json *v = get(j, key);
    if (!v) return -1;
    if (v->is_array()) {
        if (v->empty()) return -1;
        return to_int((*v)[0], std::string(key) + "[0]", 0);
    }
    return to_int(*v, key, 0);
}

}  // namespace

HfConfig parse_hf_config(const json &j) {
    if (!j.is_object()) fail("config.json: not a JSON object");
    HfConfig h;
    ModelConfig &c = h.cfg;

    if (const json *v = get(j, "model_type")) {
        std::string mt = as_str(*v, "model_type");
        if (mt != "deepseek_v4") bad("model_type", "is '" + mt + "', expected 'deepseek_v4'");
    }
    c.n_layer = need_int(j, "num_hidden_layers");
    c.n_embd = need_int(j, "hidden_size");
    c.n_vocab = need_int(j, "vocab_size");
    c.n_ctx_train = need_int(j, "max_position_embeddings");
    c.n_head = need_int(j, "num_attention_heads");
    if (const json *v = get(j, "num_key_value_heads"))
        if (to_int(*v, "num_key_value_heads") != 1)
            bad("num_key_value_heads", "is " + v->dump() + "; DeepSeek-V4 attention has one shared K=V head");
    c.head_dim = need_int(j, "head_dim");
    c.n_rot = rope_dims(j, c.head_dim);
    c.q_lora = need_int(j, "q_lora_rank");
    c.o_lora = need_int(j, "o_lora_rank");
    c.o_groups = need_int(j, "o_groups");
    c.sliding_window = need_int(j, "sliding_window");
    compress_layout(j, c);
    c.indexer_heads = need_int(j, "index_n_heads");
    c.indexer_dim = need_int(j, "index_head_dim");
    c.indexer_topk = need_int(j, "index_topk");
    c.rms_eps = static_cast<float>(as_num(need(j, "rms_norm_eps"), "rms_norm_eps"));

    c.n_expert = need_int(j, "n_routed_experts");
    c.n_expert_used = need_int(j, "num_experts_per_tok");
    c.n_expert_shared = 1;
    if (const json *v = get(j, "n_shared_experts")) c.n_expert_shared = to_int(*v, "n_shared_experts", 0);
    c.n_ff_exp = need_int(j, "moe_intermediate_size");
    c.expert_scale = static_cast<float>(as_num(need(j, "routed_scaling_factor"), "routed_scaling_factor"));
    if (const json *v = get(j, "scoring_func")) {
        std::string s = as_str(*v, "scoring_func");
        if (s != "sqrtsoftplus") bad("scoring_func", "'" + s + "' is not supported (only sqrtsoftplus)");
    }
    if (const json *v = get(j, "norm_topk_prob")) {
        if (!v->is_boolean()) bad("norm_topk_prob", "expected a boolean");
        if (!v->get<bool>()) bad("norm_topk_prob", "false is not supported (routing weights are always renormalised)");
    }
    if (const json *v = get(j, "topk_method")) {
        std::string s = as_str(*v, "topk_method");
        if (s != "noaux_tc" && s != "greedy") bad("topk_method", "'" + s + "' is not supported");
    }
    if (const json *v = get(j, "hidden_act")) {
        std::string s = as_str(*v, "hidden_act");
        if (s != "silu") bad("hidden_act", "'" + s + "' is not supported (only silu)");
    }
    hash_layers(j, c);

    const json &sl = need(j, "swiglu_limit");
    c.swiglu_limit.clear();
    if (sl.is_array()) {
        if (static_cast<int>(sl.size()) != c.n_layer)
            bad("swiglu_limit", "has " + std::to_string(sl.size()) + " entries for " + std::to_string(c.n_layer) + " layers");
        for (size_t i = 0; i < sl.size(); i++)
            c.swiglu_limit.push_back(static_cast<float>(as_num(sl[i], "swiglu_limit[" + std::to_string(i) + "]")));
    } else {
        c.swiglu_limit.assign(static_cast<size_t>(c.n_layer), static_cast<float>(as_num(sl, "swiglu_limit")));
    }

    c.hc_mult = need_int(j, "hc_mult");
    c.hc_iters = need_int(j, "hc_sinkhorn_iters");
    c.hc_eps = static_cast<float>(as_num(need(j, "hc_eps"), "hc_eps"));
    rope(j, c);

    h.bos_token_id = token_id(j, "bos_token_id");
    h.eos_token_id = token_id(j, "eos_token_id");
    if (const json *v = get(j, "tie_word_embeddings")) {
        if (!v->is_boolean()) bad("tie_word_embeddings", "expected a boolean");
        h.tie_word_embeddings = v->get<bool>();
    }
    for (int id : {h.bos_token_id, h.eos_token_id})
        if (id >= c.n_vocab) bad("bos_token_id/eos_token_id", "token id " + std::to_string(id) + " is outside the vocabulary");

    try {
        c.validate();
    } catch (const Error &e) {
        fail(std::string("config.json describes an invalid model: ") + e.what());
    }
    return h;
}

HfConfig read_hf_config(const std::string &path) {
    std::ifstream f(path);
    if (!f) fail("cannot read " + path);
    json j;
    try {
        j = json::parse(f);
    } catch (const json::exception &e) {
        fail(path + " is not valid JSON: " + e.what());
    }
    return parse_hf_config(j);
}

}  // namespace ds4::convert
