#include "engine/model/weights.h"

#include <string>

#include "engine/common/error.h"
#include "engine/quant/quants.h"

namespace ds4 {

namespace {

struct Binder {
    const gguf::Reader &r;
    ModelWeights &mw;
    const TensorPlan *plan = nullptr;
    bool dry = false;                        // check names and shapes only, read no data
    std::vector<std::string> *asked = nullptr;

    const gguf::TensorInfo &get(const std::string &name) {
        if (asked) asked->push_back(name);
        const gguf::TensorInfo *t = nullptr;
        if (plan) {
            auto it = plan->find(name);
            if (it == plan->end()) failf("bind plan has no entry for tensor %s", name.c_str());
            if (it->second >= r.tensors().size())
                failf("bind plan maps tensor %s to slot %zu of %zu", name.c_str(), it->second, r.tensors().size());
            t = &r.tensors()[it->second];
        } else {
            t = r.tensor(name);
        }
        if (!t) failf("model is missing tensor %s", name.c_str());
        if (!t->data && !dry) failf("tensor %s has no data mapped", name.c_str());
        return *t;
    }
    static std::string dims(const std::vector<int64_t> &ne) {
        std::string s = "[";
        for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
        return s + "]";
    }
    void expect(const gguf::TensorInfo &t, std::vector<int64_t> ne) {
        // Trailing 1-dims are equivalent: [n] == [n, 1].
        std::vector<int64_t> a = t.ne;
        while (a.size() > ne.size() && a.back() == 1) a.pop_back();
        while (ne.size() > a.size() && ne.back() == 1) ne.pop_back();
        if (a != ne)
            failf("tensor %s has shape %s, expected %s", t.name.c_str(), dims(t.ne).c_str(), dims(ne).c_str());
    }
    WeightView mat(const std::string &name, int64_t in, int64_t out) {
        const gguf::TensorInfo &t = get(name);
        expect(t, {in, out});
        if (t.type == gguf::Type::I32) failf("tensor %s: integer type cannot be a weight matrix", name.c_str());
        WeightView v;
        v.type = t.type;
        v.in = in;
        v.out = out;
        v.data = t.data;
        v.row_bytes = gguf::row_bytes(t.type, in);
        mw.mapped_bytes += t.nbytes;
        return v;
    }
    ExpertsView experts(const std::string &name, int64_t in, int64_t out, int64_t n) {
        const gguf::TensorInfo &t = get(name);
        expect(t, {in, out, n});
        ExpertsView e;
        e.first.type = t.type;
        e.first.in = in;
        e.first.out = out;
        e.first.data = t.data;
        e.first.row_bytes = gguf::row_bytes(t.type, in);
        e.n_expert = n;
        e.expert_bytes = e.first.row_bytes * (uint64_t)out;
        mw.mapped_bytes += t.nbytes;
        return e;
    }
    std::vector<float> vec(const std::string &name, std::vector<int64_t> ne) {
        const gguf::TensorInfo &t = get(name);
        expect(t, ne);
        int64_t n = 1;
        for (int64_t d : ne) n *= d;
        if (t.type == gguf::Type::I32) failf("tensor %s: expected a float tensor", name.c_str());
        if (dry) return {};
        std::vector<float> out((size_t)n);
        const int64_t row = t.ne[0];
        const uint64_t rb = gguf::row_bytes(t.type, row);
        for (int64_t i = 0; i < n / row; ++i) quant::dequantize_row(t.type, t.data + i * rb, out.data() + i * row, row);
        mw.owned_bytes += sizeof(float) * n;
        return out;
    }
    bool has(const std::string &name) { return plan ? plan->count(name) != 0 : r.tensor(name) != nullptr; }
};

void bind_with(Binder &b, const ModelConfig &c);

}  // namespace

ModelWeights ModelWeights::bind(const gguf::Reader &r, const ModelConfig &c, const TensorPlan *plan) {
    ModelWeights mw;
    Binder b{r, mw, plan};
    bind_with(b, c);
    return mw;
}

std::vector<std::string> ModelWeights::required_names(const gguf::Reader &r, const ModelConfig &c, const TensorPlan *plan) {
    ModelWeights mw;
    std::vector<std::string> names;
    Binder b{r, mw, plan, true, &names};
    bind_with(b, c);
    return names;
}

namespace {

void bind_with(Binder &b, const ModelConfig &c) {
    ModelWeights &mw = b.mw;
    const int64_t D = c.n_embd, hc = c.hc_mult, mix = (2 + hc) * hc;
    mw.token_embd = b.mat(global_tensor("token_embd"), D, c.n_vocab);
    mw.output = b.mat(global_tensor("output"), D, c.n_vocab);
    mw.output_norm = b.vec(global_tensor("output_norm"), {D});
    mw.output_hc_fn = b.mat(global_tensor("output_hc_fn"), hc * D, hc);
    mw.output_hc_base = b.vec(global_tensor("output_hc_base"), {hc});
    mw.output_hc_scale = b.vec(global_tensor("output_hc_scale"), {1});
    mw.layers.resize(c.n_layer);
    for (int l = 0; l < c.n_layer; ++l) {
        LayerWeights &L = mw.layers[l];
        auto N = [&](const char *s) { return blk_tensor(l, s); };
        L.attn_norm = b.vec(N("attn_norm"), {D});
        L.ffn_norm = b.vec(N("ffn_norm"), {D});
        L.hc_attn_fn = b.mat(N("hc_attn_fn"), hc * D, mix);
        L.hc_ffn_fn = b.mat(N("hc_ffn_fn"), hc * D, mix);
        L.hc_attn_base = b.vec(N("hc_attn_base"), {mix});
        L.hc_ffn_base = b.vec(N("hc_ffn_base"), {mix});
        L.hc_attn_scale = b.vec(N("hc_attn_scale"), {3});
        L.hc_ffn_scale = b.vec(N("hc_ffn_scale"), {3});
        const int64_t HD = (int64_t)c.n_head * c.head_dim;
        L.q_a = b.mat(N("attn_q_a"), D, c.q_lora);
        L.q_a_norm = b.vec(N("attn_q_a_norm"), {c.q_lora});
        L.q_b = b.mat(N("attn_q_b"), c.q_lora, HD);
        L.kv = b.mat(N("attn_kv"), D, c.head_dim);
        L.kv_norm = b.vec(N("attn_kv_a_norm"), {c.head_dim});
        L.sinks = b.vec(N("attn_sinks"), {c.n_head});
        L.o_a = b.mat(N("attn_output_a"), HD / c.o_groups, (int64_t)c.o_groups * c.o_lora);
        L.o_b = b.mat(N("attn_output_b"), (int64_t)c.o_groups * c.o_lora, D);
        const int ratio = c.compress_ratio[l];
        if (ratio) {
            CompressorWeights &C = L.comp;
            C.dim = c.head_dim;
            C.width = c.is_csa(l) ? 2 * c.head_dim : c.head_dim;
            C.kv = b.mat(N("attn_compressor_kv"), D, C.width);
            C.gate = b.mat(N("attn_compressor_gate"), D, C.width);
            C.ape = b.vec(N("attn_compressor_ape"), {C.width, ratio});
            C.norm = b.vec(N("attn_compressor_norm"), {c.head_dim});
        }
        if (c.is_csa(l)) {
            CompressorWeights &I = L.icomp;
            I.dim = c.indexer_dim;
            I.width = 2 * c.indexer_dim;
            I.kv = b.mat(N("indexer_compressor_kv"), D, I.width);
            I.gate = b.mat(N("indexer_compressor_gate"), D, I.width);
            I.ape = b.vec(N("indexer_compressor_ape"), {I.width, ratio});
            I.norm = b.vec(N("indexer_compressor_norm"), {c.indexer_dim});
            L.i_q_b = b.mat(N("indexer.attn_q_b"), c.q_lora, (int64_t)c.indexer_heads * c.indexer_dim);
            L.i_proj = b.mat(N("indexer.proj"), D, c.indexer_heads);
        }
        L.gate_inp = b.mat(N("ffn_gate_inp"), D, c.n_expert);
        if (c.is_hash(l)) {
            const gguf::TensorInfo &t = b.get(N("ffn_gate_tid2eid"));
            b.expect(t, {c.n_expert_used, c.n_vocab});
            if (t.type != gguf::Type::I32) failf("tensor %s must be i32", t.name.c_str());
            L.tid2eid = reinterpret_cast<const int32_t *>(t.data);
            if (!b.dry)
                for (int64_t i = 0; i < (int64_t)c.n_expert_used * c.n_vocab; ++i)
                    if (L.tid2eid[i] < 0 || L.tid2eid[i] >= c.n_expert)
                        failf("tensor %s: expert id %d out of range at %lld", t.name.c_str(), L.tid2eid[i], (long long)i);
        } else {
            // ds4's own files name the router bias exp_probs_b.bias; our converter (tools/convert)
            // writes ffn_exp_probs_b.weight. Accept both.
            std::string alias = "blk." + std::to_string(l) + ".exp_probs_b.bias";
            L.probs_b = b.vec(b.has(N("ffn_exp_probs_b")) ? N("ffn_exp_probs_b") : alias, {c.n_expert});
        }
        L.gate_exps = b.experts(N("ffn_gate_exps"), D, c.n_ff_exp, c.n_expert);
        L.up_exps = b.experts(N("ffn_up_exps"), D, c.n_ff_exp, c.n_expert);
        L.down_exps = b.experts(N("ffn_down_exps"), c.n_ff_exp, D, c.n_expert);
        if (c.n_expert_shared) {
            L.gate_sh = b.mat(N("ffn_gate_shexp"), D, c.n_ff_exp);
            L.up_sh = b.mat(N("ffn_up_shexp"), D, c.n_ff_exp);
            L.down_sh = b.mat(N("ffn_down_shexp"), c.n_ff_exp, D);
        }
    }
}

}  // namespace
}  // namespace ds4
