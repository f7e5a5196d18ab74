#include "tools/convert/layout.h"

#include "engine/common/error.h"

namespace ds4::convert {

const char *role_name(Role r) {
    switch (r) {
    case Role::Embedding: return "embedding";
    case Role::Output: return "output";
    case Role::AttnProj: return "attention projection";
    case Role::CompressorProj: return "compressor projection";
    case Role::IndexerProj: return "indexer projection";
    case Role::Router: return "router";
    case Role::ExpertGate: return "expert gate";
    case Role::ExpertUp: return "expert up";
    case Role::ExpertDown: return "expert down";
    case Role::SharedExpert: return "shared expert";
    case Role::HcFn: return "hyper-connection fn";
    case Role::HcBase: return "hyper-connection base";
    case Role::HcScale: return "hyper-connection scale";
    case Role::Norm: return "norm";
    case Role::RouterBias: return "router bias";
    case Role::Sink: return "attention sink";
    case Role::Ape: return "position bias";
    case Role::HashTable: return "hash table";
    }
    return "?";
}

bool role_is_matrix(Role r) {
    switch (r) {
    case Role::Embedding: case Role::Output: case Role::AttnProj: case Role::CompressorProj:
    case Role::IndexerProj: case Role::Router: case Role::ExpertGate: case Role::ExpertUp:
    case Role::ExpertDown: case Role::SharedExpert:
        return true;
    default:
        return false;
    }
}

std::string TensorSpec::hf_name(int64_t e) const {
    if (n_stack == 0) return hf;
    std::string s = hf;
    size_t p = s.find("{E}");
    return s.replace(p, 3, std::to_string(e));
}

std::vector<int64_t> TensorSpec::hf_shape() const {
    std::vector<int64_t> s(ne.rbegin(), ne.rend());
    if (n_stack > 0) s.erase(s.begin());   // the stacking dim is not in the checkpoint
    return s;
}

int64_t TensorSpec::nelements() const {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    return n;
}

std::vector<TensorSpec> model_layout(const ModelConfig &c) {
    const int64_t E = c.n_embd, V = c.n_vocab, H = c.n_head, D = c.head_dim, QL = c.q_lora;
    const int64_t OG = c.o_groups, OL = c.o_lora, HC = c.hc_mult, NE = c.n_expert, FF = c.n_ff_exp;
    const int64_t IH = c.indexer_heads, ID = c.indexer_dim;
    const int64_t SFF = FF * c.n_expert_shared;
    const int64_t hc_mix = (2 + HC) * HC;   // pre (HC) + post (HC) + comb (HC x HC)
    if (OG <= 0 || (H * D) % OG != 0) failf("layout: n_head*head_dim %lld not divisible by o_groups %lld", (long long)(H * D), (long long)OG);

    std::vector<TensorSpec> v;
    auto add = [&](std::string gguf, std::string hf, Role role, int layer, std::vector<int64_t> ne, int64_t stack = 0) {
        v.push_back(TensorSpec{std::move(gguf), std::move(hf), role, layer, std::move(ne), stack});
    };

    add(global_tensor("token_embd"), "model.embed_tokens.weight", Role::Embedding, -1, {E, V});
    for (int l = 0; l < c.n_layer; l++) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        auto g = [&](const char *s) { return blk_tensor(l, s); };
        add(g("hc_attn_fn"), p + "hc_attn_fn", Role::HcFn, l, {HC * E, hc_mix});
        add(g("hc_attn_base"), p + "hc_attn_base", Role::HcBase, l, {hc_mix});
        add(g("hc_attn_scale"), p + "hc_attn_scale", Role::HcScale, l, {3});
        add(g("attn_norm"), p + "attn_norm.weight", Role::Norm, l, {E});
        add(g("attn_q_a"), p + "attn.wq_a.weight", Role::AttnProj, l, {E, QL});
        add(g("attn_q_a_norm"), p + "attn.q_norm.weight", Role::Norm, l, {QL});
        add(g("attn_q_b"), p + "attn.wq_b.weight", Role::AttnProj, l, {QL, H * D});
        add(g("attn_kv"), p + "attn.wkv.weight", Role::AttnProj, l, {E, D});
        add(g("attn_kv_a_norm"), p + "attn.norm.weight", Role::Norm, l, {D});
        add(g("attn_sinks"), p + "attn.attn_sink", Role::Sink, l, {H});
        add(g("attn_output_a"), p + "attn.wo_a.weight", Role::AttnProj, l, {H * D / OG, OG * OL});
        add(g("attn_output_b"), p + "attn.wo_b.weight", Role::AttnProj, l, {OG * OL, E});
        const int64_t r = c.compress_ratio[static_cast<size_t>(l)];
        if (r > 0) {
            // CSA windows overlap: the compressor projects to twice the width (two halves).
            const int64_t coff = c.is_csa(l) ? 2 : 1;
            add(g("attn_compressor_kv"), p + "attn.compressor.wkv.weight", Role::CompressorProj, l, {E, coff * D});
            add(g("attn_compressor_gate"), p + "attn.compressor.wgate.weight", Role::CompressorProj, l, {E, coff * D});
            add(g("attn_compressor_ape"), p + "attn.compressor.ape", Role::Ape, l, {coff * D, r});
            add(g("attn_compressor_norm"), p + "attn.compressor.norm.weight", Role::Norm, l, {D});
            if (c.is_csa(l)) {
                const std::string ip = p + "attn.indexer.";
                add(g("indexer_compressor_kv"), ip + "compressor.wkv.weight", Role::CompressorProj, l, {E, 2 * ID});
                add(g("indexer_compressor_gate"), ip + "compressor.wgate.weight", Role::CompressorProj, l, {E, 2 * ID});
                add(g("indexer_compressor_ape"), ip + "compressor.ape", Role::Ape, l, {2 * ID, r});
                add(g("indexer_compressor_norm"), ip + "compressor.norm.weight", Role::Norm, l, {ID});
                add(g("indexer.attn_q_b"), ip + "wq_b.weight", Role::IndexerProj, l, {QL, IH * ID});
                add(g("indexer.proj"), ip + "weights_proj.weight", Role::IndexerProj, l, {E, IH});
            }
        }
        add(g("hc_ffn_fn"), p + "hc_ffn_fn", Role::HcFn, l, {HC * E, hc_mix});
        add(g("hc_ffn_base"), p + "hc_ffn_base", Role::HcBase, l, {hc_mix});
        add(g("hc_ffn_scale"), p + "hc_ffn_scale", Role::HcScale, l, {3});
        add(g("ffn_norm"), p + "ffn_norm.weight", Role::Norm, l, {E});
        add(g("ffn_gate_inp"), p + "ffn.gate.weight", Role::Router, l, {E, NE});
        if (c.is_hash(l))
            add(g("ffn_gate_tid2eid"), p + "ffn.gate.tid2eid", Role::HashTable, l, {c.n_expert_used, V});
        else
            add(g("ffn_exp_probs_b"), p + "ffn.gate.bias", Role::RouterBias, l, {NE});
        add(g("ffn_gate_exps"), p + "ffn.experts.{E}.w1.weight", Role::ExpertGate, l, {E, FF, NE}, NE);
        add(g("ffn_up_exps"), p + "ffn.experts.{E}.w3.weight", Role::ExpertUp, l, {E, FF, NE}, NE);
        add(g("ffn_down_exps"), p + "ffn.experts.{E}.w2.weight", Role::ExpertDown, l, {FF, E, NE}, NE);
        if (c.n_expert_shared > 0) {
            add(g("ffn_gate_shexp"), p + "ffn.shared_experts.w1.weight", Role::SharedExpert, l, {E, SFF});
            add(g("ffn_up_shexp"), p + "ffn.shared_experts.w3.weight", Role::SharedExpert, l, {E, SFF});
            add(g("ffn_down_shexp"), p + "ffn.shared_experts.w2.weight", Role::SharedExpert, l, {SFF, E});
        }
    }
    add(global_tensor("output_hc_fn"), "model.hc_head.hc_fn", Role::HcFn, -1, {HC * E, HC});
    add(global_tensor("output_hc_base"), "model.hc_head.hc_base", Role::HcBase, -1, {HC});
    add(global_tensor("output_hc_scale"), "model.hc_head.hc_scale", Role::HcScale, -1, {1});
    add(global_tensor("output_norm"), "model.norm.weight", Role::Norm, -1, {E});
    add(global_tensor("output"), "head.weight", Role::Output, -1, {E, V});
    return v;
}

std::string canonical_hf_name(const std::string &name) {
    std::string s = name;
    if (s.rfind("layers.", 0) == 0) s = "model." + s;
    if (s == "embed.weight") return "model.embed_tokens.weight";
    if (s == "norm.weight") return "model.norm.weight";
    for (const char *k : {"fn", "base", "scale"})
        if (s == std::string("hc_head_") + k) return std::string("model.hc_head.hc_") + k;
    const std::string kvn = ".attn.kv_norm.weight";
    if (s.size() > kvn.size() && s.compare(s.size() - kvn.size(), kvn.size(), kvn) == 0)
        s.replace(s.size() - kvn.size(), kvn.size(), ".attn.norm.weight");
    return s;
}

}  // namespace ds4::convert
