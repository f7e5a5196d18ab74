// The CUDA executor: the backend operations (engine/backend/backend.h) on one stream, over
// weights placed in device memory in their GGUF encodings and session caches in device
// memory. Per-row tables (positions, ring addresses, attention descriptors) are built on
// the host per operation and uploaded from pinned memory (HostStage). Routed experts of a
// step with few rows are grouped on the device (cuda_moe.cu: no synchronisation until the
// logits); a bigger step copies the router's choices back and groups on the host, one
// launch set per chosen expert (DS4_CUDA_HOST_MOE=1 forces that path, for comparisons).
// DS4_CUDA_PROFILE=1 prints the time of each operation (cuda_profile.h). Steps of up to 16 rows
// are recorded and run as CUDA graphs, a layer at a time (cuda_graph.h; DS4_CUDA_GRAPH=0 launches
// every kernel on the stream): every stream operation here that is not a kernel settles first.
//
// Block-quantised weights multiply activations quantised as the CPU does (cuda_qmatmul.cu).
// An input is quantised once per type it meets: the normed rows XN and the query latent QR
// feed several products across operations, so their quantised forms are kept until the
// operation that rewrites them (norm, q_kv) or the next step; routed experts gather their
// rows from XN's quantised form. DS4_CUDA_F32_ACTIVATIONS=1 multiplies f32 activations
// with every weight type instead (the kernels before the integer path; for comparisons).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_buffer.h"
#include "cuda/cuda_expert_cache.h"
#include "cuda/cuda_graph.h"
#include "cuda/cuda_kernels.h"
#include "cuda/cuda_profile.h"
#include "cuda/cuda_state.h"
#include "cuda/cuda_weights.h"
#include "engine/backend/expert_source.h"

namespace ds4::cuda {

namespace {

#define PROFILE(name) OpProfile::Scope prof_scope_(&profile_, name, s_, R_ > 1)

// Pinned host memory for a step's uploads (row tables, descriptors): a copy from pageable
// memory makes the host wait for a staging copy every time; from here it is queued like a
// launch. Append-only within a step, so nothing queued is overwritten; reset() only once the
// stream has drained. The memory is mapped into the device's address space: a small table
// is read by the kernels where it lies (up to 4 KB), with no copy in the stream -- a
// decode step had over a hundred such copies, each a stream operation of its own between
// two kernels that could otherwise overlap (pdl_enter). DS4_CUDA_ZERO_COPY=0 copies every
// table (for comparisons).
size_t zero_copy_bytes() {
    static const size_t n = [] {
        const char *e = std::getenv("DS4_CUDA_ZERO_COPY");
        return e && *e == '0' ? size_t(0) : size_t(4096);
    }();
    return n;
}
class HostStage {
public:
    ~HostStage() {
        reset();
        if (p_) cudaFreeHost(p_);
    }
    void *put(const void *src, size_t n) {
        used_ = (used_ + 15) & ~size_t(15);
        if (used_ + n > cap_) {
            if (p_) retired_.push_back(p_);
            cap_ = std::max<size_t>({2 * cap_, n, 64 << 10});
            DS4_CUDA_CHECK(cudaHostAlloc(&p_, cap_, cudaHostAllocMapped));
            DS4_CUDA_CHECK(cudaHostGetDevicePointer(&dev_, p_, 0));
            used_ = 0;
        }
        void *d = static_cast<uint8_t *>(p_) + used_;
        std::memcpy(d, src, n);
        used_ += n;
        return d;
    }
    // The device's address of what put() just returned.
    void *device_alias(void *host) const { return static_cast<uint8_t *>(dev_) + (static_cast<uint8_t *>(host) - static_cast<uint8_t *>(p_)); }
    void reset() {
        for (void *p : retired_) cudaFreeHost(p);
        retired_.clear();
        used_ = 0;
    }

private:
    void *p_ = nullptr, *dev_ = nullptr;
    size_t cap_ = 0, used_ = 0;
    std::vector<void *> retired_;
};

template <class T>
T *to_device(DeviceBuffer<T> &buf, const std::vector<T> &v, cudaStream_t s, HostStage &stage, bool zero_copy = true) {
    const size_t n = v.size() * sizeof(T);
    if (zero_copy && n > 0 && n <= zero_copy_bytes()) return static_cast<T *>(stage.device_alias(stage.put(v.data(), n)));
    T *d = buf.need(std::max<size_t>(1, v.size()));
    settle(s);
    if (!v.empty()) DS4_CUDA_CHECK(cudaMemcpyAsync(d, stage.put(v.data(), n), n, cudaMemcpyHostToDevice, s));
    return d;
}

class CudaExecutor final : public Executor {
public:
    CudaExecutor(const ModelConfig &c, const DeviceWeights &dw) : c_(c), dw_(dw) {
        const char *e = std::getenv("DS4_CUDA_F32_ACTIVATIONS");
        f32_act_ = e && *e && *e != '0';
        const char *hm = std::getenv("DS4_CUDA_HOST_MOE");
        host_moe_ = hm && *hm && *hm != '0';
        const char *fu = std::getenv("DS4_CUDA_FUSE");
        fuse_ = !(fu && *fu == '0');
        moe_err_.zeros(1);
        DS4_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
    }
    ~CudaExecutor() override {
        if (std::getenv("DS4_CUDA_PROFILE") && graphs_.stats().replays) {
            const StepGraphs::Stats &g = graphs_.stats();
            std::fprintf(stderr, "DS4_CUDA_PROFILE: graphs: %llu run (%.1f kernels each), %llu built, %llu kernels updated\n",
                         (unsigned long long)g.replays, (double)g.nodes / g.replays, (unsigned long long)g.built,
                         (unsigned long long)g.node_updates);
        }
        cudaStreamDestroy(s_);
    }

    void begin(const StepLayout &lay) override {
        DS4_CUDA_CHECK(cudaStreamSynchronize(s_));   // idle after the last head(); not after a failed step
        stage_.reset();
        lay_ = lay;
        R_ = lay.rows();
        const size_t R = R_, D = c_.n_embd, hc = c_.hc_mult, hq = (size_t)c_.n_head * c_.head_dim;
        H_.need(R * hc * D), X_.need(R * D), XN_.need(R * D), A_.need(R * D);
        post_.need(R * hc), comb_.need(R * hc * hc), qr_.need(R * c_.q_lora), q_.need(R * hq), o_.need(R * hq);
        h_tokens_.assign(lay.tokens.begin(), lay.tokens.end());
        h_pos_.assign(lay.pos.begin(), lay.pos.end());
        // Copied, not read where they lie: every rope launch of every layer reads the positions
        // (each thread its row's), and from mapped host memory each read crossed PCIe: a
        // one-row norm_rope took 14.0 us against 7.3 copied, rope_quant 12.2 against 5.0 (H100,
        // ncu). One copy a step, before the step's graphs record.
        tokens_ = to_device(tokens_buf_, h_tokens_, s_, stage_, false);
        pos_ = to_device(pos_buf_, h_pos_, s_, stage_, false);
        forget(nullptr);
        profile_.step_begin(s_, R_);
        hc_posts_ = 0;
        pend_ = {};
        producers_ = 0;
        prod_xn_ = prod_qr_ = prod_o_ = -1;
        if (!profile_.on()) graphs_.begin(s_, R_);
        ++stats_.steps;
        stats_.rows += R;
    }

    void embed(const WeightView &te) override {
        PROFILE("embed");
        const int D = c_.n_embd, hc = c_.hc_mult;
        dequant_rows(s_, te.type, dw_.device(te.data), te.row_bytes, D, tokens_, R_, H_.get(), (int64_t)hc * D);
        settle(s_);
        for (int k = 1; k < hc; ++k)
            DS4_CUDA_CHECK(cudaMemcpy2DAsync(H_.get() + (size_t)k * D, sizeof(float) * hc * D, H_.get(), sizeof(float) * hc * D,
                                             sizeof(float) * D, R_, cudaMemcpyDeviceToDevice, s_));
    }

    void hc_pre(const WeightView &fn, const float *base, const float *scale) override {
        PROFILE("hc_pre");
        const int hc = c_.hc_mult, D = c_.n_embd, nmix = (2 + hc) * hc;
        float *mix = mix_.need((size_t)R_ * nmix);
        if (fn.empty()) fail("matmul: weight not bound");
        if (f32_act_ || !matmul_rms(s_, fn.type, wdev(fn.data), (int64_t)hc * D, nmix, fn.row_bytes, H_.get(), R_, (int64_t)hc * D,
                                    c_.rms_eps, mix, nmix)) {
            float *flat = flat_.need((size_t)R_ * hc * D);
            rmsnorm_rows(s_, H_.get(), (int64_t)hc * D, nullptr, (int64_t)hc * D, nullptr, c_.rms_eps, flat, (int64_t)hc * D, R_);
            mm(fn, flat, R_, (int64_t)hc * D, mix, nmix);
        } else {
            stats_.weight_bytes += fn.bytes();
        }
        hc_pre_mix(s_, mix, dw_.device(base), dw_.device(scale), H_.get(), hc, D, c_.hc_iters, c_.hc_eps, post_.get(),
                   comb_.get(), X_.get(), R_);
    }

    void norm(const float *w) override {
        PROFILE("norm");
        forget(XN_.get());
        norm_quant(X_.get(), dw_.device(w), XN_.get(), c_.n_embd, prod_xn_);
    }

    void hc_post() override {
        PROFILE("hc_post");
        if (pend_.on) {   // the FFN's output, summed here
            hc_post_moe(s_, H_.get(), pend_.y, pend_.P, pend_.g, pend_.shared, post_.get(), comb_.get(), c_.hc_mult, c_.n_embd, R_);
            pend_ = {};
        } else {
            cuda::hc_post(s_, H_.get(), A_.get(), post_.get(), comb_.get(), c_.hc_mult, c_.n_embd, R_);
        }
        if (++hc_posts_ % 2 == 0) graphs_.layer_done();   // attention's and the FFN's: a layer
    }

    // Its sessions' steps never exceed their rings (CudaBackend::attention_in_pieces() is
    // false), so the schedule only ever names the whole step.
    void attention_rows(int r0, int r1) override {
        if (r0 != 0 || r1 != R_) failf("internal: the CUDA executor runs a step's attention whole (rows [%d, %d) of %d)", r0, r1, R_);
    }
    void q_kv(int layer, const LayerWeights &L, const Rope &rope) override {
        PROFILE("q_kv");
        const ModelConfig &c = c_;
        const int H = c.n_head, hd = c.head_dim, D = c.n_embd;
        float *kvb = kvb_.need((size_t)R_ * hd);
        forget(qr_.get());
        if (!mm_pair(L.q_a, L.kv, XN_.get(), D, qr_.get(), kvb)) {
            mm(L.q_a, XN_.get(), R_, D, qr_.get(), c.q_lora);
            mm(L.kv, XN_.get(), R_, D, kvb, hd);
        }
        norm_quant(qr_.get(), dw_.device(L.q_a_norm.data()), qr_.get(), c.q_lora, prod_qr_);
        mm(L.q_b, qr_.get(), R_, c.q_lora, q_.get(), (int64_t)H * hd);
        h_ptrs_.resize(R_);
        for (const StepSegment &sg : lay_.segs) {
            DevLayer &dl = st(sg).layers[layer];
            st(sg).will_write(dl.kv.get(), dl.cap_kv, hd, sg.n0, sg.n, s_);
            for (int i = 0; i < sg.n; ++i) h_ptrs_[sg.row0 + i] = dl.kv.get() + ((sg.n0 + i) % dl.cap_kv) * hd;
        }
        // q's heads and the kv head normed and rotated, kv written into the ring: one launch
        norm_rope_q_kv(s_, q_.get(), H, kvb, dw_.device(L.kv_norm.data()), to_device(ptrs_buf_, h_ptrs_, s_, stage_), hd, c.rms_eps,
                       pos_, dw_.device(rope.inv_freq.data()), rope.n_pairs, R_);
    }

    void compress(int layer, int which, const CompressorWeights &cw, const Rope &rope) override {
        PROFILE("compress");
        const int wd = cw.width;
        float *p1 = p1_.need((size_t)R_ * wd), *p2 = p2_.need((size_t)R_ * wd);
        if (!mm_pair_f32(cw.kv, cw.gate, XN_.get(), p1, p2)) {
            mm(cw.kv, XN_.get(), R_, c_.n_embd, p1, wd);
            mm(cw.gate, XN_.get(), R_, c_.n_embd, p2, wd);
        }
        for (const StepSegment &sg : lay_.segs) {
            CudaSessionState &ss = st(sg);
            DevComp &cs = which ? ss.layers[layer].icomp : ss.layers[layer].comp;
            const CompGeometry &g = cs.g;
            if (g.width != wd || g.dim != cw.dim) fail("internal: compressor shape differs from the session's");
            ss.will_write(cs.kv.get(), g.cap, wd, sg.n0, sg.n, s_);
            ss.will_write(cs.gate.get(), g.cap, wd, sg.n0, sg.n, s_);
            comp_ring_write(s_, p1, p2, sg.row0, dw_.device(cw.ape.data()), wd, g.ratio, sg.n0, sg.n, cs.kv.get(), cs.gate.get(),
                            g.cap);
            const int first = ss.n_entries(layer, which), last = (int)((sg.n0 + sg.n) / g.ratio);
            if (last > g.max_entries) failf("internal: compressed entries exceed capacity (%d > %d)", last, g.max_entries);
            ss.need_entries(cs, last, s_);
            comp_emit(s_, cs.kv.get(), cs.gate.get(), g.cap, wd, g.dim, g.ratio, g.overlap, first, last, cs.entries.get(),
                      dw_.device(cw.norm.data()), c_.rms_eps, dw_.device(rope.inv_freq.data()), rope.n_pairs);
            ss.set_n_entries(layer, which, last);
        }
    }

    void indexer_topk(int layer, const LayerWeights &L, const Rope &rope, int topk) override {
        PROFILE("indexer_topk");
        const ModelConfig &c = c_;
        const int IH = c.indexer_heads, Id = c.indexer_dim;
        float *iq = iq_.need((size_t)R_ * IH * Id), *iw = iw_.need((size_t)R_ * IH);
        mm(L.i_q_b, qr_.get(), R_, c.q_lora, iq, (int64_t)IH * Id);
        mm(L.i_proj, XN_.get(), R_, c.n_embd, iw, IH);
        norm_rope_heads(s_, iq, IH, Id, false, nullptr, 0.f, pos_, dw_.device(rope.inv_freq.data()), rope.n_pairs, 1.f, R_);
        h_cptrs_.resize(R_);
        h_nvis_.resize(R_);
        int most = 1;
        for (int r = 0; r < R_; ++r) {
            const StepSegment &sg = lay_.segs[lay_.seg[r]];
            const DevComp &ic = st(sg).layers[layer].icomp;
            h_cptrs_[r] = ic.entries.get();
            h_nvis_[r] = std::min<int>(sg.state->n_entries(layer, 1), (int)((lay_.pos[r] + 1) / ic.g.ratio));
            most = std::max(most, h_nvis_[r]);
        }
        const int *nvis = to_device(nvis_buf_, h_nvis_, s_, stage_);
        float *scores = scores_.need((size_t)R_ * most);
        indexer_scores(s_, iq, iw, IH, Id, to_device(cptrs_buf_, h_cptrs_, s_, stage_), nvis, most, scores, R_);
        topk_ = topk;
        topk_rows(s_, scores, most, nvis, topk, sel_.need((size_t)R_ * topk), nsel_.need(R_), R_);
        h_nsel_.resize(R_);
        for (int r = 0; r < R_; ++r) h_nsel_[r] = std::min(topk, h_nvis_[r]);
    }

    void attend(int layer, const AttnSpec &spec, const float *sinks, const Rope &rope) override {
        PROFILE("attend");
        forget(o_.get());
        const int H = c_.n_head, hd = c_.head_dim;
        h_desc_.resize(R_);
        int max_keys = 1;
        for (int r = 0; r < R_; ++r) {
            const StepSegment &sg = lay_.segs[lay_.seg[r]];
            const DevLayer &dl = st(sg).layers[layer];
            AttnRow d{dl.kv.get(), nullptr, nullptr, lay_.pos[r], dl.cap_kv, 0};
            if (spec.ratio) {
                d.entries = dl.comp.entries.get();
                if (spec.indexed) {
                    d.sel = sel_.get() + (size_t)r * topk_;
                    d.n_ent = h_nsel_[r];
                } else {
                    d.n_ent = std::min<int>(sg.state->n_entries(layer, 0), (int)((lay_.pos[r] + 1) / spec.ratio));
                }
            }
            h_desc_[r] = d;
            max_keys = std::max<int>(max_keys, (int)std::min<int64_t>(spec.window, lay_.pos[r] + 1) + d.n_ent);
        }
        float *scratch = attn_scratch_.need(attend_scratch_floats(R_, H, hd, max_keys));
        cuda::attend(s_, q_.get(), to_device(desc_buf_, h_desc_, s_, stage_), H, hd, spec.window, dw_.device(sinks), scratch, max_keys,
                     o_.get(), R_);
        // rotated back, and quantised here for the output projection when it took that last step
        const int want = producer(prod_o_);
        const gguf::Type at = want & 1 ? gguf::Type::Q8_0 : gguf::Type::Q8_K;
        const int qk = at == gguf::Type::Q8_0 ? 32 : 256;
        if (want && hd % qk == 0) {
            uint64_t qrow = 0;
            uint8_t *q = claim(at, o_.get(), R_, (int64_t)H * hd, (int64_t)H * hd, &qrow);
            rope_heads_quant(s_, qk, o_.get(), H, hd, pos_, dw_.device(rope.inv_freq.data()), rope.n_pairs, -1.f, q, qrow, R_);
        } else {
            norm_rope_heads(s_, o_.get(), H, hd, false, nullptr, 0.f, pos_, dw_.device(rope.inv_freq.data()), rope.n_pairs, -1.f, R_);
        }
    }

    void out_proj(const LayerWeights &L) override {
        PROFILE("out_proj");
        const ModelConfig &c = c_;
        const int H = c.n_head, hd = c.head_dim, G = c.o_groups, gin = H * hd / G, gl = c.o_lora;
        float *oa = oa_.need((size_t)R_ * G * gl);
        if (!f32_act_ && act_type(L.o_a.type) != gguf::Type::F32) {
            // every group in one launch, over O quantised once (slices start on block boundaries)
            uint64_t qrow = 0;
            const uint8_t *xq = quantised(L.o_a.type, o_.get(), R_, (int64_t)H * hd, (int64_t)H * hd, &qrow);
            {
                OpProfile::Scope prof_mm(&profile_, "  matmul grouped o_a", s_, R_ > 1, L.o_a.row_bytes * (uint64_t)G * gl);
                matmul_q_grouped(s_, L.o_a.type, dw_.device(L.o_a.data), L.o_a.in, (int64_t)G * gl, L.o_a.row_bytes, xq, qrow,
                                 (int64_t)H * hd, gl, R_, oa, (int64_t)G * gl);
            }
            stats_.weight_bytes += L.o_a.row_bytes * (uint64_t)G * gl;
            mm(L.o_b, oa, R_, (int64_t)G * gl, A_.get(), c.n_embd);
            return;
        }
        for (int g = 0; g < G; ++g)
            mm(L.o_a.rows((int64_t)g * gl, gl), o_.get() + (size_t)g * gin, R_, (int64_t)H * hd, oa + (size_t)g * gl,
               (int64_t)G * gl);
        mm(L.o_b, oa, R_, (int64_t)G * gl, A_.get(), c.n_embd);
    }

    void route(int layer, const LayerWeights &L, bool hash_routed) override {
        PROFILE("route");
        const int E = c_.n_expert, K = c_.n_expert_used;
        float *lg = router_.need((size_t)R_ * E);
        mm(L.gate_inp, XN_.get(), R_, c_.n_embd, lg, E);
        int *ids = ids_.need((size_t)R_ * K);
        float *w = wts_.need((size_t)R_ * K);
        cuda::route(s_, lg, E, K, hash_routed ? dw_.device(L.tid2eid) : nullptr, tokens_,
                    hash_routed ? nullptr : dw_.device(L.probs_b.data()), c_.expert_scale, ids, w, R_);
        ids_on_host_ = false;
        if (!device_moe(L)) fetch_routes(layer);
    }

    // Whether this step's routed experts can be grouped on the device (no copy back, no
    // synchronisation): few pairs, integer products, gate and up quantised alike.
    bool device_moe(const LayerWeights &L) const {
        if (host_moe_ || f32_act_ || (int64_t)R_ * c_.n_expert_used > kDeviceMoePairs) return false;
        const gguf::Type g = L.gate_exps.first.type, u = L.up_exps.first.type, d = L.down_exps.first.type;
        return moe_type_supported(g) && moe_type_supported(u) && moe_type_supported(d) && act_type(g) == act_type(u);
    }

    // The router's choices to the host (the host-grouped path), checked.
    void fetch_routes(int layer) {
        if (ids_on_host_) return;
        const int E = c_.n_expert, K = c_.n_expert_used;
        settle(s_);
        h_ids_.resize((size_t)R_ * K);
        h_wts_.resize((size_t)R_ * K);
        DS4_CUDA_CHECK(cudaMemcpyAsync(h_ids_.data(), ids_.get(), h_ids_.size() * sizeof(int), cudaMemcpyDeviceToHost, s_));
        DS4_CUDA_CHECK(cudaMemcpyAsync(h_wts_.data(), wts_.get(), h_wts_.size() * sizeof(float), cudaMemcpyDeviceToHost, s_));
        DS4_CUDA_CHECK(cudaStreamSynchronize(s_));
        for (int id : h_ids_)
            if (id < 0 || id >= E) failf("router chose expert %d (layer %d has %d)", id, layer, E);
        ids_on_host_ = true;
    }

    void routed_experts_on_device(int layer, const LayerWeights &L) {
        const int D = c_.n_embd, E = c_.n_expert, K = c_.n_expert_used, P = R_ * K;
        const int64_t F = L.gate_exps.first.out;
        const MoeGroups g{moe_n_used_.need(1), moe_used_.need(P), moe_off_.need(P + 1), moe_prow_.need(P), moe_pw_.need(P),
                          moe_err_.get()};
        moe_group(s_, ids_.get(), wts_.get(), P, K, E, g);
        const WeightView &gv = L.gate_exps.first, &uv = L.up_exps.first, &dv = L.down_exps.first;
        const ExpertMats m{static_cast<const uint8_t *>(dw_.device(gv.data)),
                           static_cast<const uint8_t *>(dw_.device(uv.data)),
                           static_cast<const uint8_t *>(dw_.device(dv.data)),
                           L.gate_exps.expert_bytes, L.up_exps.expert_bytes, L.down_exps.expert_bytes,
                           gv.row_bytes, uv.row_bytes, dv.row_bytes, gv.type, uv.type, dv.type};
        const int max_used = std::min(E, P);
        uint64_t qrow = 0;
        const uint8_t *xq = quantised(gv.type, XN_.get(), R_, D, D, &qrow);
        float *h = g_.need((size_t)P * F);
        moe_gate_up(s_, m, D, F, xq, qrow, g, max_used, R_ == 1, h, c_.swiglu_limit[layer]);
        uint64_t hrow = 0;
        const uint8_t *hq = quantised(dv.type, h, P, F, F, &hrow);
        float *y = eout_.need((size_t)P * D);
        moe_down(s_, m, F, D, hq, hrow, g, max_used, R_ == 1, y);
        if (fuse_) pend_ = {true, y, P, g, nullptr};   // summed by hc_post, with the shared expert's output
        else moe_combine(s_, y, D, P, g, A_.get(), R_);
        // bytes of the experts read: exact for one row, an upper bound when rows share experts
        stats_.weight_bytes += (uint64_t)max_used * (gv.bytes() + uv.bytes() + dv.bytes());
    }

    // Whether a big step's experts can run as expert tiles on the tensor cores.
    bool tiled_moe(const LayerWeights &L) const {
        if (f32_act_) return false;
        const gguf::Type g = L.gate_exps.first.type, u = L.up_exps.first.type, d = L.down_exps.first.type;
        return mma_type_supported(g) && mma_type_supported(u) && mma_type_supported(d) && act_type(g) == act_type(u);
    }

    // The host-grouped pairs (used_, off_, h_rows_, h_rw_) as tiles of up to kMmaTilePairs
    // pairs of one expert: gate and up for every tile in one launch each, then down, then each
    // row's pairs summed in ascending expert order.
    void routed_experts_tiled(int layer, const LayerWeights &L) {
        const int D = c_.n_embd, K = c_.n_expert_used, P = (int)h_rows_.size();
        const WeightView &gv = L.gate_exps.first, &uv = L.up_exps.first, &dv = L.down_exps.first;
        const int64_t F = gv.out;
        h_tiles_.clear();
        for (size_t u = 0; u < used_.size(); ++u)
            for (int p = off_[u]; p < off_[u + 1]; p += kMmaTilePairs)
                h_tiles_.push_back({used_[u], p, std::min(kMmaTilePairs, off_[u + 1] - p)});
        // each row's pair positions, ascending (= ascending expert)
        h_ppos_.assign((size_t)R_ * K, 0);
        std::vector<int> fill(R_, 0);
        for (int p = 0; p < P; ++p) h_ppos_[(size_t)h_rows_[p] * K + fill[h_rows_[p]]++] = p;
        for (int r = 0; r < R_; ++r)
            if (fill[r] != K) failf("internal: row %d has %d routed pairs, not %d", r, fill[r], K);
        const MmaTile *tiles = to_device(tiles_buf_, h_tiles_, s_, stage_);
        const int *rows = to_device(rows_buf_, h_rows_, s_, stage_);
        const float *rw = to_device(rw_buf_, h_rw_, s_, stage_);
        const int *pos = to_device(ppos_buf_, h_ppos_, s_, stage_);
        const int nt = (int)h_tiles_.size();
        uint64_t qrow = 0;
        const uint8_t *xq = quantised(gv.type, XN_.get(), R_, D, D, &qrow);
        float *g = g_.need((size_t)P * F), *u = u_.need((size_t)P * F);
        matmul_q_mma_tiles(s_, gv.type, dw_.device(gv.data), L.gate_exps.expert_bytes, D, F, gv.row_bytes, xq, qrow, rows, tiles,
                           nt, g, F);
        matmul_q_mma_tiles(s_, uv.type, dw_.device(uv.data), L.up_exps.expert_bytes, D, F, uv.row_bytes, xq, qrow, rows, tiles,
                           nt, u, F);
        swiglu(s_, g, u, (int64_t)P * F, c_.swiglu_limit[layer]);
        uint64_t hrow = 0;
        const uint8_t *hq = quantised(dv.type, g, P, F, F, &hrow);
        float *y = eout_.need((size_t)P * D);
        matmul_q_mma_tiles(s_, dv.type, dw_.device(dv.data), L.down_exps.expert_bytes, F, D, dv.row_bytes, hq, hrow, nullptr,
                           tiles, nt, y, D);
        moe_combine_pos(s_, y, D, pos, rw, K, A_.get(), R_);
        stats_.weight_bytes += (uint64_t)used_.size() * (gv.bytes() + uv.bytes() + dv.bytes());
    }

    // Groups the fetched routes by expert on the host: used_ (ascending), off_, h_rows_, h_rw_.
    void group_on_host() {
        const int E = c_.n_expert, K = c_.n_expert_used;
        by_e_.assign(E, {});
        for (int t = 0; t < R_; ++t)
            for (int k = 0; k < K; ++k) by_e_[h_ids_[(size_t)t * K + k]].push_back(t * K + k);
        used_.clear();
        h_rows_.clear();
        h_rw_.clear();
        off_.clear();
        for (int e = 0; e < E; ++e) {
            if (by_e_[e].empty()) continue;
            used_.push_back(e);
            off_.push_back((int)h_rows_.size());
            for (int tk : by_e_[e]) h_rows_.push_back(tk / K), h_rw_.push_back(h_wts_[tk]);
        }
        off_.push_back((int)h_rows_.size());
    }

    void routed_experts(int layer, const LayerWeights &L, ExpertSource &experts) override {
        PROFILE("routed_experts");
        if (auto *vc = dynamic_cast<DeviceExpertCache *>(&experts)) return routed_experts_streamed(layer, L, *vc);
        if (device_moe(L) && dynamic_cast<ResidentExperts *>(&experts)) return routed_experts_on_device(layer, L);
        fetch_routes(layer);
        const int D = c_.n_embd, K = c_.n_expert_used;
        group_on_host();
        const bool tc = (int64_t)R_ * K > kDeviceMoePairs;
        if (tc && tiled_moe(L) && dynamic_cast<ResidentExperts *>(&experts)) return routed_experts_tiled(layer, L);
        views_.resize(used_.size());
        experts.acquire(layer, used_, views_.data());
        const int *rows = to_device(rows_buf_, h_rows_, s_, stage_);
        const float *rw = to_device(rw_buf_, h_rw_, s_, stage_);
        settle(s_);
        DS4_CUDA_CHECK(cudaMemsetAsync(A_.get(), 0, sizeof(float) * R_ * D, s_));
        for (size_t u = 0; u < used_.size(); ++u) expert_pairs(layer, (int)u, views_[u], rows, rw, tc);
    }

    // The pairs of the host-grouped expert used_[u] through its weights v, added into A.
    void expert_pairs(int layer, int u, const ExpertView &v, const int *rows, const float *rw, bool tc) {
        const int D = c_.n_embd, m = off_[u + 1] - off_[u];
        float *eout = eout_.need((size_t)std::max(m, R_) * D);
        const gguf::Type at = act_type(v.gate.type);
        if (!f32_act_ && at != gguf::Type::F32 && act_type(v.up.type) == at) {
            // a row's quantised form depends on that row only: gather XN's
            uint64_t qrow = 0;
            const uint8_t *xq = quantised(v.gate.type, XN_.get(), R_, D, D, &qrow);
            uint8_t *eq = ein_q_.need((size_t)m * qrow);
            gather_bytes(s_, xq, qrow, rows + off_[u], eq, m);
            ffn(v.gate, v.up, v.down, nullptr, eq, qrow, m, eout, c_.swiglu_limit[layer], tc);
        } else {
            float *ein = ein_.need((size_t)m * D);
            gather_rows(s_, XN_.get(), D, rows + off_[u], ein, m);
            ffn(v.gate, v.up, v.down, ein, nullptr, 0, m, eout, c_.swiglu_limit[layer], tc);
        }
        scatter_add_rows(s_, eout, D, rows + off_[u], rw + off_[u], A_.get(), m);
    }

    // The next layer's likely experts from this layer's MoE input (hash-routed layers: exactly,
    // from the tokens) into h_pred_; a device guess is copied back with the routes.
    void predict_next(int layer, const LayerWeights &N) {
        const int E = c_.n_expert, K = c_.n_expert_used;
        h_pred_.resize((size_t)R_ * K);
        if (c_.is_hash(layer + 1)) {
            for (int t = 0; t < R_; ++t)
                for (int k = 0; k < K; ++k) h_pred_[(size_t)t * K + k] = N.tid2eid[(size_t)h_tokens_[t] * K + k];
            return;
        }
        float *lg = pred_lg_.need((size_t)R_ * E);
        mm(N.gate_inp, XN_.get(), R_, c_.n_embd, lg, E);
        int *ids = pred_ids_.need((size_t)R_ * K);
        cuda::route(s_, lg, E, K, nullptr, tokens_, dw_.device(N.probs_b.data()), c_.expert_scale, ids,
                    pred_w_.need((size_t)R_ * K), R_);
        settle(s_);
        DS4_CUDA_CHECK(cudaMemcpyAsync(h_pred_.data(), ids, h_pred_.size() * sizeof(int), cudaMemcpyDeviceToHost, s_));
    }

    // Routed experts from the VRAM expert cache (SSD streaming). The routes come to the host
    // (the cache must know which experts to have), the layer's experts are taken in groups of
    // at most the cache's slots, and each group runs the kernels the resident path runs for
    // this step -- device-grouped, expert tiles or one expert at a time -- with the slots in
    // place of the stacked tensors, so the logits are the resident path's bit for bit. Then
    // the next layer's predicted experts are read and uploaded while this layer's kernels run.
    void routed_experts_streamed(int layer, const LayerWeights &L, DeviceExpertCache &vc) {
        const int D = c_.n_embd, E = c_.n_expert, K = c_.n_expert_used, P = R_ * K;
        graphs_.stop();   // the cache's uploads and events order themselves on the stream
        vc_ = &vc;
        const LayerWeights *N = vc.predictor(layer);
        const bool had_routes = ids_on_host_;
        if (N) predict_next(layer, *N);
        fetch_routes(layer);
        if (N && had_routes) DS4_CUDA_CHECK(cudaStreamSynchronize(s_));   // the guess's copy
        group_on_host();
        const WeightView &gv = L.gate_exps.first, &uv = L.up_exps.first, &dv = L.down_exps.first;
        const int64_t F = gv.out;
        const float lim = c_.swiglu_limit[layer];
        const int U = (int)used_.size(), C = (int)vc.max_acquire();
        const uint64_t sb = vc.slot_bytes();
        const uint8_t *pg = vc.arena() + vc.piece_offset(0), *pu = vc.arena() + vc.piece_offset(1),
                      *pd = vc.arena() + vc.piece_offset(2);
        const bool dev = device_moe(L), tc = (int64_t)P > kDeviceMoePairs, tiled = !dev && tc && tiled_moe(L);
        h_slot_.resize(U);
        uint64_t qrow = 0, hrow = 0;
        const uint8_t *xq = nullptr;
        uint8_t *hq = nullptr;
        float *h = nullptr, *u = nullptr, *y = nullptr;
        const int *rows = nullptr, *pos = nullptr;
        const float *rw = nullptr;
        MoeGroups g{};
        if (dev || tiled) {
            xq = quantised(gv.type, XN_.get(), R_, D, D, &qrow);
            hrow = act_row_bytes(dv.type, F);
            hq = hq_.need((size_t)P * hrow);
            h = g_.need((size_t)P * F), y = eout_.need((size_t)P * D);
        }
        if (dev) {
            g = {moe_n_used_.need(1), moe_used_.need(P), moe_off_.need(P + 1), moe_prow_.need(P), moe_pw_.need(P), moe_err_.get()};
            moe_group(s_, ids_.get(), wts_.get(), P, K, E, g);
        } else if (tiled) {
            u = u_.need((size_t)P * F);
            h_ppos_.assign((size_t)R_ * K, 0);
            std::vector<int> fill(R_, 0);
            for (int p = 0; p < P; ++p) h_ppos_[(size_t)h_rows_[p] * K + fill[h_rows_[p]]++] = p;
            rows = to_device(rows_buf_, h_rows_, s_, stage_);
            rw = to_device(rw_buf_, h_rw_, s_, stage_);
            pos = to_device(ppos_buf_, h_ppos_, s_, stage_);
        } else {
            rows = to_device(rows_buf_, h_rows_, s_, stage_);
            rw = to_device(rw_buf_, h_rw_, s_, stage_);
            settle(s_);
            DS4_CUDA_CHECK(cudaMemsetAsync(A_.get(), 0, sizeof(float) * R_ * D, s_));
        }
        for (int u0 = 0; u0 < U; u0 += C) {
            const int n = std::min(C, U - u0), p0 = off_[u0], p1 = off_[u0 + n];
            vc.acquire_slots(layer, std::span<const int>(used_).subspan(u0, n), s_, h_slot_.data() + u0);
            if (dev) {
                h_slot_of_.assign(E, 0);
                for (int i = u0; i < u0 + n; ++i) h_slot_of_[used_[i]] = h_slot_[i];
                ExpertMats m{pg, pu, pd, sb, sb, sb, gv.row_bytes, uv.row_bytes, dv.row_bytes, gv.type, uv.type, dv.type};
                m.slot = to_device(slot_buf_, h_slot_of_, s_, stage_);
                moe_gate_up(s_, m, D, F, xq, qrow, g, n, R_ == 1, h, lim, u0);
                quantize_act(s_, dv.type, h + (size_t)p0 * F, p1 - p0, F, F, hq + (size_t)p0 * hrow, hrow);
                moe_down(s_, m, F, D, hq, hrow, g, n, R_ == 1, y, u0);
            } else if (tiled) {
                h_tiles_.clear();
                for (int i = u0; i < u0 + n; ++i)
                    for (int p = off_[i]; p < off_[i + 1]; p += kMmaTilePairs)
                        h_tiles_.push_back({h_slot_[i], p, std::min(kMmaTilePairs, off_[i + 1] - p)});
                const MmaTile *tiles = to_device(tiles_buf_, h_tiles_, s_, stage_);
                const int nt = (int)h_tiles_.size();
                matmul_q_mma_tiles(s_, gv.type, pg, sb, D, F, gv.row_bytes, xq, qrow, rows, tiles, nt, h, F);
                matmul_q_mma_tiles(s_, uv.type, pu, sb, D, F, uv.row_bytes, xq, qrow, rows, tiles, nt, u, F);
                swiglu(s_, h + (size_t)p0 * F, u + (size_t)p0 * F, (int64_t)(p1 - p0) * F, lim);
                quantize_act(s_, dv.type, h + (size_t)p0 * F, p1 - p0, F, F, hq + (size_t)p0 * hrow, hrow);
                matmul_q_mma_tiles(s_, dv.type, pd, sb, F, D, dv.row_bytes, hq, hrow, nullptr, tiles, nt, y, D);
            } else {
                for (int i = u0; i < u0 + n; ++i) {
                    const uint8_t *sp = vc.arena() + (uint64_t)h_slot_[i] * sb;
                    ExpertView v{gv, uv, dv};
                    v.gate.data = sp + vc.piece_offset(0), v.up.data = sp + vc.piece_offset(1), v.down.data = sp + vc.piece_offset(2);
                    expert_pairs(layer, i, v, rows, rw, tc);
                }
            }
            vc.done(s_);
        }
        if (dev) moe_combine(s_, y, D, P, g, A_.get(), R_);
        else if (tiled) moe_combine_pos(s_, y, D, pos, rw, K, A_.get(), R_);
        if (dev || tiled) stats_.weight_bytes += (uint64_t)U * (gv.bytes() + uv.bytes() + dv.bytes());
        if (N) {
            pred_mark_.assign(E, 0);
            for (int e : h_pred_)
                if (e >= 0 && e < E) pred_mark_[e] = 1;
            pred_list_.clear();
            for (int e = 0; e < E; ++e)
                if (pred_mark_[e]) pred_list_.push_back(e);
            vc.prefetch(layer + 1, pred_list_);
        }
    }

    void shared_expert(int layer, const LayerWeights &L) override {
        PROFILE("shared_expert");
        // eout_ holds the routed experts' outputs while their sum waits for hc_post
        float *eout = (pend_.on ? sh_out_ : eout_).need((size_t)R_ * c_.n_embd);
        ffn(L.gate_sh, L.up_sh, L.down_sh, XN_.get(), nullptr, 0, R_, eout, c_.swiglu_limit[layer]);
        if (pend_.on) pend_.shared = eout;
        else add(s_, A_.get(), eout, (int64_t)R_ * c_.n_embd);
    }

    void head(const ModelWeights &w, std::span<const int> rows, float *logits) override {
        PROFILE("head");
        const int hc = c_.hc_mult, D = c_.n_embd, nt = (int)rows.size(), V = c_.n_vocab;
        if (nt == 0) {   // a prompt's middle chunk: no logits wanted
            graphs_.stop();
            profile_.step_enqueued(s_);
            return;
        }
        h_idx_.assign(rows.begin(), rows.end());
        const int32_t *idx = to_device(idx_buf_, h_idx_, s_, stage_);
        float *flat = flat_.need((size_t)nt * hc * D), *mix = mix_.need((size_t)nt * hc), *y = head_.need((size_t)nt * D);
        rmsnorm_rows(s_, H_.get(), (int64_t)hc * D, idx, (int64_t)hc * D, nullptr, c_.rms_eps, flat, (int64_t)hc * D, nt);
        mm(w.output_hc_fn, flat, nt, (int64_t)hc * D, mix, hc);
        hyper_head(s_, H_.get(), idx, mix, dw_.device(w.output_hc_base.data()), dw_.device(w.output_hc_scale.data()), hc, D,
                   c_.hc_eps, dw_.device(w.output_norm.data()), c_.rms_eps, y, nt);
        float *lg = logits_.need((size_t)nt * V);
        mm(w.output, y, nt, D, lg, V);
        graphs_.stop();
        profile_.step_enqueued(s_);
        DS4_CUDA_CHECK(cudaMemcpyAsync(logits, lg, sizeof(float) * nt * V, cudaMemcpyDeviceToHost, s_));
        int err = 0;
        DS4_CUDA_CHECK(cudaMemcpyAsync(&err, moe_err_.get(), sizeof err, cudaMemcpyDeviceToHost, s_));
        DS4_CUDA_CHECK(cudaStreamSynchronize(s_));
        profile_.step_end();
        if (err) {
            DS4_CUDA_CHECK(cudaMemset(moe_err_.get(), 0, sizeof(int)));
            failf("router chose an expert outside the layer's %d (routed pair %d of a step)", c_.n_expert, err - 1);
        }
    }

    void upload(Act a, const float *src, size_t n) override {
        if (n != act_width(c_, a) * R_) failf("upload: %zu floats given, the step holds %zu", n, act_width(c_, a) * R_);
        forget(nullptr);
        sum_pending();
        settle(s_);
        DS4_CUDA_CHECK(cudaMemcpyAsync(act(a).get(), src, n * sizeof(float), cudaMemcpyHostToDevice, s_));
        DS4_CUDA_CHECK(cudaStreamSynchronize(s_));
    }
    void download(Act a, float *dst, size_t n) const override {
        if (n != act_width(c_, a) * R_) failf("download: %zu floats asked, the step holds %zu", n, act_width(c_, a) * R_);
        const_cast<CudaExecutor *>(this)->sum_pending();
        settle(s_);
        DS4_CUDA_CHECK(cudaMemcpyAsync(dst, const_cast<CudaExecutor *>(this)->act(a).get(), n * sizeof(float),
                                       cudaMemcpyDeviceToHost, s_));
        DS4_CUDA_CHECK(cudaStreamSynchronize(s_));
    }
    const ExecutorStats &stats() const override { return stats_; }
    uint64_t scratch_bytes() const override {
        uint64_t b = 0;
        for (const DeviceBuffer<float> *v : {&H_, &X_, &XN_, &A_, &post_, &comb_, &qr_, &q_, &o_, &flat_, &mix_, &kvb_, &p1_,
                                             &p2_, &iq_, &iw_, &scores_, &attn_scratch_, &oa_, &router_, &wts_, &ein_, &eout_,
                                             &sh_out_, &g_, &u_, &head_, &logits_, &rw_buf_})
            b += v->bytes();
        for (const QuantIn &q : qin_) b += q.buf.bytes();
        return b + xq_tmp_.bytes() + ein_q_.bytes() + hq_.bytes() + pred_lg_.bytes();
    }

private:
    static CudaSessionState &st(const StepSegment &sg) { return *static_cast<CudaSessionState *>(sg.state); }

    // x (n_tok rows of n at stride xs) quantised for weights of type t: XN, QR and O are kept
    // per activation type until forget(); anything else goes to the scratch row buffer.
    const uint8_t *quantised(gguf::Type t, const float *x, int64_t n_tok, int64_t xs, int64_t n, uint64_t *qrow) {
        const gguf::Type at = act_type(t);
        *qrow = act_row_bytes(t, n);
        const bool keep = x == XN_.get() || x == qr_.get() || x == o_.get();
        if (keep)
            for (QuantIn &q : qin_)
                if (q.valid && q.x == x && q.at == at && q.n_tok == n_tok && q.xs == xs && q.n == n) return q.buf.get();
        uint8_t *q = nullptr;
        if (keep) {
            q = claim(at, x, n_tok, xs, n, qrow);
            // the producer of x quantises for this type from the next step on (norm_quant, attend)
            const int p = x == XN_.get() ? prod_xn_ : x == qr_.get() ? prod_qr_ : prod_o_;
            if (p >= 0 && n_tok == R_) hints_[p] |= at == gguf::Type::Q8_0 ? 1 : 2;
        } else {
            q = xq_tmp_.need((size_t)n_tok * *qrow);
        }
        quantize_act(s_, t, x, n_tok, xs, n, q, *qrow);
        return q;
    }
    // A kept slot for x's quantised form of activation type at (Q8_0 or Q8_K), marked valid:
    // the caller fills it in this step's stream order.
    uint8_t *claim(gguf::Type at, const float *x, int64_t n_tok, int64_t xs, int64_t n, uint64_t *qrow) {
        // act_row_bytes takes a weight type: Q8_0 weights take Q8_0 activations, Q2_K ones Q8_K
        *qrow = act_row_bytes(at == gguf::Type::Q8_0 ? gguf::Type::Q8_0 : gguf::Type::Q2_K, n);
        QuantIn *slot = &qin_[next_qin_++ % kQuantIn];
        for (QuantIn &q : qin_)
            if (!q.valid) slot = &q;
        slot->x = x, slot->at = at, slot->n_tok = n_tok, slot->xs = xs, slot->n = n, slot->valid = true;
        return slot->buf.need((size_t)n_tok * *qrow);
    }
    // A producer of an activation that integer products read (a norm, the attention output):
    // its index in the step, and what the products asked of its output the last time this
    // index ran (bit 0: Q8_0, bit 1: Q8_K). The producer quantises that in its own launch; a
    // hint that no longer holds costs a quantisation nobody reads, never a wrong one.
    int producer(int &index) {
        if (!fuse_ || f32_act_) return index = -1, 0;
        index = producers_++;
        if ((int)hints_.size() <= index) hints_.resize(index + 1, 0);
        return hints_[index];
    }
    // rows of x normed by w into out (may alias x), with the quantised forms its products asked
    // for last step made in the same launch.
    void norm_quant(const float *x, const float *w, float *out, int64_t n, int &index) {
        const int want = producer(index);
        uint8_t *q0 = nullptr, *qk = nullptr;
        uint64_t r0 = 0, rk = 0;
        if ((want & 1) && n % 32 == 0) q0 = claim(gguf::Type::Q8_0, out, R_, n, n, &r0);
        if ((want & 2) && n % 256 == 0) qk = claim(gguf::Type::Q8_K, out, R_, n, n, &rk);
        if (q0 || qk) rmsnorm_quant_rows(s_, x, n, n, w, c_.rms_eps, out, n, q0, r0, qk, rk, R_);
        else rmsnorm_rows(s_, x, n, nullptr, n, w, c_.rms_eps, out, n, R_);
    }
    // Drops the kept quantised forms of x (all of them for null).
    void forget(const float *x) {
        for (QuantIn &q : qin_)
            if (!x || q.x == x) q.valid = false;
    }

    // tensor_cores: false keeps the dp4a kernels for many rows too (the host-grouped experts of a
    // step the device path could group: both paths then give the same bits).
    void mm(const WeightView &w, const float *x, int64_t n_tok, int64_t xs, float *y, int64_t ys, bool tensor_cores = true) {
        if (w.empty()) fail("matmul: weight not bound");
        if (f32_act_ || act_type(w.type) == gguf::Type::F32) {
            const std::string pname = profile_.on() ? mm_name(w) : std::string();
            OpProfile::Scope prof_mm(&profile_, pname.c_str(), s_, n_tok > 1, w.bytes());
            cuda::matmul(s_, w.type, wdev(w.data), w.in, w.out, w.row_bytes, x, n_tok, xs, y, ys);
            stats_.weight_bytes += w.bytes();
            return;
        }
        uint64_t qrow = 0;
        const uint8_t *xq = quantised(w.type, x, n_tok, xs, w.in, &qrow);
        mmq(w, xq, qrow, n_tok, y, ys, tensor_cores);
    }
    // One token's products by a and b over the same input x (D elements, quantised once) in one
    // launch; false when they do not pair (types, f32 activations, several rows).
    bool mm_pair(const WeightView &a, const WeightView &b, const float *x, int64_t D, float *ya, float *yb) {
        if (R_ != 1 || f32_act_ || a.empty() || b.empty() || a.type != b.type || act_type(a.type) == gguf::Type::F32 ||
            a.in != D || b.in != D)
            return false;
        uint64_t qrow = 0;
        const uint8_t *xq = quantised(a.type, x, 1, D, D, &qrow);
        if (!matmul_q_pair(s_, a.type, D, wdev(a.data), a.out, a.row_bytes, ya, wdev(b.data), b.out, b.row_bytes, yb, xq, qrow))
            return false;
        stats_.weight_bytes += a.bytes() + b.bytes();
        return true;
    }
    // The same for weights that take f32 activations (a decode step's compressor kv and gate).
    bool mm_pair_f32(const WeightView &a, const WeightView &b, const float *x, float *ya, float *yb) {
        if (R_ != 1 || a.empty() || b.empty() || a.type != b.type || a.in != b.in || (!f32_act_ && act_type(a.type) != gguf::Type::F32))
            return false;
        if (!matmul_pair(s_, a.type, a.in, wdev(a.data), a.out, a.row_bytes, ya, wdev(b.data), b.out, b.row_bytes, yb, x)) return false;
        stats_.weight_bytes += a.bytes() + b.bytes();
        return true;
    }
    // Device address of a weight: a VRAM expert slot as it is, anything else through the
    // placed tensors.
    const void *wdev(const uint8_t *p) const { return vc_ && vc_->contains(p) ? p : dw_.device(p); }
    static std::string mm_name(const WeightView &w) {
        return "  matmul " + std::string(gguf::type_name(w.type)) + " " + std::to_string(w.in) + "x" + std::to_string(w.out);
    }
    void mmq(const WeightView &w, const uint8_t *xq, uint64_t qrow, int64_t n_tok, float *y, int64_t ys, bool tensor_cores = true) {
        const std::string pname = profile_.on() ? mm_name(w) : std::string();
        OpProfile::Scope prof_mm(&profile_, pname.c_str(), s_, n_tok > 1, w.bytes());
        matmul_q(s_, w.type, wdev(w.data), w.in, w.out, w.row_bytes, xq, qrow, n_tok, y, ys, tensor_cores);
        stats_.weight_bytes += w.bytes();
    }

    // Clamped SwiGLU expert over m rows: f32 rows `in` (stride D), or rows already quantised
    // for the gate and up weights (xq, qrow).
    void ffn(const WeightView &gate, const WeightView &up, const WeightView &down, const float *in, const uint8_t *xq,
             uint64_t qrow, int m, float *out, float lim, bool tensor_cores = true) {
        const int D = c_.n_embd, F = (int)gate.out;
        float *g = g_.need((size_t)m * F), *u = u_.need((size_t)m * F);
        if (!xq && !f32_act_ && act_type(gate.type) != gguf::Type::F32 && act_type(up.type) == act_type(gate.type))
            xq = quantised(gate.type, in, m, D, D, &qrow);   // once for both
        if (xq && m == 1 && gate.type == up.type && gate.in == up.in &&
            matmul_q_pair(s_, gate.type, gate.in, wdev(gate.data), F, gate.row_bytes, g, wdev(up.data), up.out, up.row_bytes, u, xq,
                          qrow)) {
            stats_.weight_bytes += gate.bytes() + up.bytes();   // one launch for both (a decode step's shared expert)
        } else if (xq) {
            mmq(gate, xq, qrow, m, g, F, tensor_cores);
            mmq(up, xq, qrow, m, u, F, tensor_cores);
        } else {
            mm(gate, in, m, D, g, F);
            mm(up, in, m, D, u, F);
        }
        const gguf::Type dat = act_type(down.type);
        const int qk = dat == gguf::Type::Q8_0 ? 32 : 256;
        if (fuse_ && !f32_act_ && dat != gguf::Type::F32 && F % qk == 0) {
            // SwiGLU and the down product's quantisation in one launch
            const uint64_t hrow = act_row_bytes(down.type, F);
            uint8_t *hq = xq_tmp_.need((size_t)m * hrow);
            swiglu_quant(s_, qk, g, u, F, lim, hq, hrow, m);
            mmq(down, hq, hrow, m, out, D, tensor_cores);
            return;
        }
        swiglu(s_, g, u, (int64_t)m * F, lim);
        mm(down, g, m, F, out, D, tensor_cores);
    }

    // A made now, where something other than hc_post reads it (a download, a test's op).
    void sum_pending() {
        if (!pend_.on) return;
        moe_combine(s_, pend_.y, c_.n_embd, pend_.P, pend_.g, A_.get(), R_);
        if (pend_.shared) add(s_, A_.get(), pend_.shared, (int64_t)R_ * c_.n_embd);
        pend_ = {};
    }

    DeviceBuffer<float> &act(Act a) {
        switch (a) {
        case Act::H: return H_;
        case Act::X: return X_;
        case Act::XN: return XN_;
        case Act::A: return A_;
        case Act::Post: return post_;
        case Act::Comb: return comb_;
        case Act::QR: return qr_;
        case Act::Q: return q_;
        case Act::O: return o_;
        }
        fail("internal: unknown activation");
    }

    const ModelConfig &c_;
    const DeviceWeights &dw_;
    cudaStream_t s_ = nullptr;
    ExecutorStats stats_;
    OpProfile profile_;
    StepGraphs graphs_;
    int hc_posts_ = 0;
    HostStage stage_;
    StepLayout lay_;
    int R_ = 0, topk_ = 0;
    bool f32_act_ = false, host_moe_ = false, ids_on_host_ = false, fuse_ = true;
    std::vector<uint8_t> hints_;   // per producer index of a step: the quantised forms asked of it
    int producers_ = 0, prod_xn_ = -1, prod_qr_ = -1, prod_o_ = -1;
    // The FFN's output A as the routed experts left it on the device path: their outputs y and
    // pairs g, and the shared expert's output once it ran; hc_post sums it (hc_post_moe).
    struct PendingA {
        bool on = false;
        const float *y = nullptr;
        int P = 0;
        MoeGroups g{};
        const float *shared = nullptr;
    } pend_;
    static constexpr int64_t kDeviceMoePairs = 512;   // rows x K grouped on the device at most
    DeviceBuffer<int> moe_n_used_, moe_used_, moe_off_, moe_prow_, moe_err_;
    DeviceBuffer<float> moe_pw_;
    const int32_t *tokens_ = nullptr;
    const int64_t *pos_ = nullptr;

    struct QuantIn {
        const float *x = nullptr;
        gguf::Type at = gguf::Type::F32;
        int64_t n_tok = 0, xs = 0, n = 0;
        bool valid = false;
        DeviceBuffer<uint8_t> buf;
    };
    static constexpr int kQuantIn = 6;
    QuantIn qin_[kQuantIn];   // XN, QR and O, each for Q8_0 and Q8_K weights
    unsigned next_qin_ = 0;
    DeviceBuffer<uint8_t> xq_tmp_, ein_q_;
    DeviceBuffer<float> H_, X_, XN_, A_, post_, comb_, qr_, q_, o_, flat_, mix_, kvb_, p1_, p2_, iq_, iw_, scores_,
        attn_scratch_, oa_, router_, wts_, ein_, eout_, sh_out_, g_, u_, head_, logits_, rw_buf_;
    DeviceBuffer<int32_t> tokens_buf_, idx_buf_;
    DeviceBuffer<int64_t> pos_buf_;
    DeviceBuffer<int> nvis_buf_, sel_, nsel_, ids_, rows_buf_;
    DeviceBuffer<float *> ptrs_buf_;
    DeviceBuffer<const float *> cptrs_buf_;
    DeviceBuffer<AttnRow> desc_buf_;
    std::vector<int32_t> h_tokens_, h_idx_;
    std::vector<int64_t> h_pos_;
    std::vector<float *> h_ptrs_;
    std::vector<const float *> h_cptrs_;
    std::vector<int> h_nvis_, h_nsel_, h_ids_, h_rows_, used_, off_;
    std::vector<float> h_wts_, h_rw_;
    std::vector<AttnRow> h_desc_;
    std::vector<MmaTile> h_tiles_;
    std::vector<int> h_ppos_;   // each row's routed pair positions
    DeviceBuffer<MmaTile> tiles_buf_;
    DeviceBuffer<int> ppos_buf_;
    std::vector<std::vector<int>> by_e_;
    std::vector<ExpertView> views_;
    // SSD streaming (routed_experts_streamed)
    const DeviceExpertCache *vc_ = nullptr;
    DeviceBuffer<uint8_t> hq_;
    DeviceBuffer<float> pred_lg_, pred_w_;
    DeviceBuffer<int> pred_ids_, slot_buf_;
    std::vector<int> h_slot_, h_slot_of_, h_pred_, pred_list_;
    std::vector<uint8_t> pred_mark_;
};

class CudaBackend final : public Backend {
public:
    CudaBackend(const ModelConfig &c, const gguf::Reader &r, const ModelWeights &w, const Rope &main, const Rope &comp,
                const std::function<void(uint64_t, uint64_t)> &progress, const DeviceShareOptions &share,
                bool stream_experts)
        : c_(c),
          dw_(r, w,
              {{main.inv_freq.data(), main.inv_freq.size() * sizeof(float)},
               {comp.inv_freq.data(), comp.inv_freq.size() * sizeof(float)}},
              share, progress, stream_experts) {
        init_quant_tables();
        init_qmatmul_tables();
    }
    std::string name() const override { return "cuda"; }
    // ds4 (antirez) prefills in chunks of up to 2048 too; 256 left the tensor cores a quarter
    // full and read every routed expert once per 256 tokens (prefill 1290 -> see the issue notes).
    int prefill_chunk() const override { return 2048; }
    DeviceInfo device_info() const override {
        DeviceInfo d;
        int dev = 0;
        cudaDeviceProp p{};
        if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&p, dev) == cudaSuccess) d.name = p.name;
        size_t fr = 0, tot = 0;
        if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) d.free = fr, d.total = tot;
        d.weight_bytes = dw_.bytes();
        return d;
    }
    std::unique_ptr<SessionState> make_state(const CacheGeometry &g) const override {
        return std::make_unique<CudaSessionState>(g);
    }
    // 1 GiB copied device to device (one untimed copy, then five timed on a stream of its
    // own); 0 when the memory is not there -- a benchmark then prints no ceiling.
    double device_copy_bytes_per_s() const override {
        const size_t n = size_t(1) << 30;
        void *a = nullptr, *b = nullptr;
        cudaStream_t st = nullptr;
        cudaEvent_t e0 = nullptr, e1 = nullptr;
        double rate = 0;
        if (cudaMalloc(&a, n) == cudaSuccess && cudaMalloc(&b, n) == cudaSuccess &&
            cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess && cudaEventCreate(&e0) == cudaSuccess &&
            cudaEventCreate(&e1) == cudaSuccess && cudaMemsetAsync(a, 1, n, st) == cudaSuccess &&
            cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st) == cudaSuccess && cudaEventRecord(e0, st) == cudaSuccess) {
            bool ok = true;
            for (int i = 0; i < 5 && ok; ++i) ok = cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st) == cudaSuccess;
            float ms = 0;
            if (ok && cudaEventRecord(e1, st) == cudaSuccess && cudaEventSynchronize(e1) == cudaSuccess &&
                cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess && ms > 0)
                rate = 5.0 * 2.0 * (double)n / (ms * 1e-3);
        }
        cudaGetLastError();   // a failed allocation leaves nothing sticky behind
        if (e1) cudaEventDestroy(e1);
        if (e0) cudaEventDestroy(e0);
        if (st) cudaStreamDestroy(st);
        cudaFree(b);
        cudaFree(a);
        return rate;
    }
    std::unique_ptr<Executor> make_executor(int) const override { return std::make_unique<CudaExecutor>(c_, dw_); }
    DeviceShareState device_share() const override { return dw_.share(); }

private:
    const ModelConfig &c_;
    DeviceWeights dw_;
};

}  // namespace

bool cuda_device_available(std::string *why) {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        if (why) *why = e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device";
        return false;
    }
    return true;
}

std::unique_ptr<Backend> make_cuda_backend(const ModelConfig &c, const gguf::Reader &r, const ModelWeights &w,
                                           const Rope &rope_main, const Rope &rope_compress,
                                           const std::function<void(uint64_t, uint64_t)> &progress,
                                           const DeviceShareOptions &share, bool stream_experts) {
    std::string why;
    if (!cuda_device_available(&why)) fail("CUDA backend: no usable GPU (" + why + ")");
    size_t fr = 0, tot = 0;
    DS4_CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    // Weights plus a margin for caches, scratch and the CUDA context's own needs; imported
    // weights take no new device memory (a failed import that then uploads fails in cudaMalloc).
    uint64_t need = share.import_fd >= 0 ? 0 : r.total_tensor_bytes() + w.owned_bytes;
    const uint64_t margin = 512ull << 20;
    if (stream_experts && need) need -= routed_expert_bytes(r);
    if (need + margin > fr)
        failf("CUDA backend: the model needs %.2f GiB of VRAM for its weights (+%.2f GiB working margin), %.2f GiB of "
              "%.2f GiB are free",
              need / 1073741824.0, margin / 1073741824.0, fr / 1073741824.0, tot / 1073741824.0);
    return std::make_unique<CudaBackend>(c, r, w, rope_main, rope_compress, progress, share, stream_experts);
}

}  // namespace ds4::cuda
