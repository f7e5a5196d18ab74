// CPU executor: step set-up, embedding, hyper-connections, norms, the output head and the
// activation hooks.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "engine/common/error.h"
#include "engine/cpu/cpu_executor.h"
#include "engine/cpu/cpu_grain.h"
#include "engine/kernels/matmul.h"
#include "engine/kernels/ops.h"
#include "engine/quant/quants.h"

namespace ds4 {

CpuExecutor::CpuExecutor(const ModelConfig &c, int n_threads) : c_(c), pool_(n_threads), mm_(pool_) {
    tasks_.resize((size_t)pool_.size());
}

void CpuExecutor::begin(const StepLayout &lay) {
    lay_ = lay;
    R_ = lay.rows();
    alay_ = lay;
    ar0_ = 0;
    const size_t R = (size_t)R_, D = c_.n_embd, hc = c_.hc_mult;
    grow(H_, R * hc * D);
    grow(X_, R * D);
    grow(XN_, R * D);
    grow(A_, R * D);
    grow(post_, R * hc);
    grow(comb_, R * hc * hc);
    grow(qr_, R * c_.q_lora);
    grow(q_, R * c_.n_head * c_.head_dim);
    grow(o_, R * c_.n_head * c_.head_dim);
    prof_.step(R_);
    ++stats_.steps;
    stats_.rows += R;
}

void CpuExecutor::embed(const WeightView &token_embd) {
    CpuOpTimer timer(prof_, CpuOp::Embed, mm_.weight_bytes);
    const int D = c_.n_embd, hc = c_.hc_mult;
    for (int t = 0; t < R_; ++t) {
        float *h = H_.data() + (size_t)t * hc * D;
        quant::dequantize_row(token_embd.type, token_embd.row(lay_.tokens[t]), h, D);
        for (int k = 1; k < hc; ++k) std::memcpy(h + (size_t)k * D, h, sizeof(float) * D);
    }
}

void CpuExecutor::hc_pre(const WeightView &fn, const float *base, const float *scale) {
    CpuOpTimer timer(prof_, CpuOp::HcPre, mm_.weight_bytes);
    const ModelConfig &c = c_;
    const int hc = c.hc_mult, D = c.n_embd, nmix = (2 + hc) * hc;
    const float *H = H_.data();
    float *post = post_.data(), *comb = comb_.data(), *X = X_.data();
    grow(flat_, (size_t)R_ * hc * D);
    grow(mix_, (size_t)R_ * nmix);
    pool_.parallel_for(R_, cpu_grain((int64_t)hc * D), [&](int64_t b, int64_t e, int) {
        for (int64_t t = b; t < e; ++t)
            ops::rmsnorm(H + t * hc * D, (int64_t)hc * D, nullptr, c.rms_eps, flat_.data() + t * hc * D);
    });
    matmul(mm_, fn, flat_.data(), R_, (int64_t)hc * D, mix_.data(), nmix);
    // A row's pre/post weights and row-softmaxed mix matrix, then Sinkhorn's normalisation
    // (~640 divisions a row) for up to kSinkhornLanes rows at once, then each row's stream
    // collapse.
    pool_.parallel_for(R_, cpu_grain((int64_t)hc * D + 40 * hc * hc * c.hc_iters), [&](int64_t b, int64_t e, int) {
        constexpr int L = ops::kSinkhornLanes;
        for (int64_t t0 = b; t0 < e; t0 += L) {
            const int n = (int)std::min<int64_t>(L, e - t0);
            float pre[L][16];
            float *cbs[L];
            for (int i = 0; i < n; ++i) {
                const int64_t t = t0 + i;
                const float *m = mix_.data() + (size_t)t * nmix;
                for (int k = 0; k < hc; ++k) {
                    pre[i][k] = ops::sigmoid(m[k] * scale[0] + base[k]) + c.hc_eps;
                    post[t * hc + k] = 2.f * ops::sigmoid(m[hc + k] * scale[1] + base[hc + k]);
                }
                float *cb = comb + (size_t)t * hc * hc;
                for (int j = 0; j < hc; ++j) {
                    for (int k = 0; k < hc; ++k) cb[j * hc + k] = m[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
                    ops::softmax(cb + j * hc, hc);
                    for (int k = 0; k < hc; ++k) cb[j * hc + k] += c.hc_eps;
                }
                cbs[i] = cb;
            }
            ops::sinkhorn(cbs, n, hc, c.hc_iters, c.hc_eps);
            for (int i = 0; i < n; ++i) {
                const int64_t t = t0 + i;
                float *xo = X + (size_t)t * D;
                const float *h = H + (size_t)t * hc * D;
                for (int d = 0; d < D; ++d) xo[d] = 0;
                for (int k = 0; k < hc; ++k) ops::axpy(pre[i][k], h + (size_t)k * D, xo, D);
            }
        }
    });
}

void CpuExecutor::norm(const float *w) {
    CpuOpTimer timer(prof_, CpuOp::Norm, mm_.weight_bytes);
    const int D = c_.n_embd;
    for (int t = 0; t < R_; ++t) ops::rmsnorm(X_.data() + (size_t)t * D, D, w, c_.rms_eps, XN_.data() + (size_t)t * D);
}

void CpuExecutor::hc_post() {
    CpuOpTimer timer(prof_, CpuOp::HcPost, mm_.weight_bytes);
    const int hc = c_.hc_mult, D = c_.n_embd;
    pool_.parallel_for(R_, cpu_grain((int64_t)hc * hc * D), [&](int64_t b, int64_t e, int th) {
        ScratchVec &old = tasks_[th].f;
        grow(old, (size_t)hc * D);
        for (int64_t t = b; t < e; ++t) {
            float *h = H_.data() + t * hc * D;
            std::memcpy(old.data(), h, sizeof(float) * hc * D);
            const float *cb = comb_.data() + t * hc * hc;
            const float *o = A_.data() + t * D;
            for (int k = 0; k < hc; ++k) {
                float *hk = h + (size_t)k * D;
                const float pk = post_[t * hc + k];
                for (int d = 0; d < D; ++d) hk[d] = pk * o[d];
                for (int j = 0; j < hc; ++j) ops::axpy(cb[j * hc + k], old.data() + (size_t)j * D, hk, D);
            }
        }
    });
}

void CpuExecutor::head(const ModelWeights &w, std::span<const int> rows, float *logits) {
    CpuOpTimer timer(prof_, CpuOp::Head, mm_.weight_bytes);
    const int hc = c_.hc_mult, D = c_.n_embd, nt = (int)rows.size();
    if (nt == 0) return;
    // Hyper-head: collapse the streams with sigmoid weights, final norm, output head.
    grow(flat_, (size_t)nt * hc * D);
    grow(mix_, (size_t)nt * hc);
    for (int i = 0; i < nt; ++i)
        ops::rmsnorm(H_.data() + (size_t)rows[i] * hc * D, (int64_t)hc * D, nullptr, c_.rms_eps, flat_.data() + (size_t)i * hc * D);
    matmul(mm_, w.output_hc_fn, flat_.data(), nt, (int64_t)hc * D, mix_.data(), hc);
    grow(head_, (size_t)nt * D);
    for (int i = 0; i < nt; ++i) {
        float *y = head_.data() + (size_t)i * D;
        const float *h = H_.data() + (size_t)rows[i] * hc * D;
        std::fill(y, y + D, 0.f);
        for (int k = 0; k < hc; ++k) {
            const float p = ops::sigmoid(mix_[(size_t)i * hc + k] * w.output_hc_scale[0] + w.output_hc_base[k]) + c_.hc_eps;
            ops::axpy(p, h + (size_t)k * D, y, D);
        }
        ops::rmsnorm(y, D, w.output_norm.data(), c_.rms_eps, y);
    }
    matmul(mm_, w.output, head_.data(), nt, D, logits, c_.n_vocab);
    stats_.weight_bytes = mm_.weight_bytes;
}

ScratchVec &CpuExecutor::act(Act a) {
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

void CpuExecutor::upload(Act a, const float *src, size_t n) {
    if (n != act_width(c_, a) * R_) failf("upload: %zu floats given, the step holds %zu", n, act_width(c_, a) * R_);
    std::memcpy(act(a).data(), src, n * sizeof(float));
}

void CpuExecutor::download(Act a, float *dst, size_t n) const {
    if (n != act_width(c_, a) * R_) failf("download: %zu floats asked, the step holds %zu", n, act_width(c_, a) * R_);
    std::memcpy(dst, const_cast<CpuExecutor *>(this)->act(a).data(), n * sizeof(float));
}

const ExecutorStats &CpuExecutor::stats() const {
    stats_.weight_bytes = mm_.weight_bytes;
    return stats_;
}

uint64_t CpuExecutor::scratch_bytes() const {
    uint64_t b = mm_.xq.capacity() + mm_.xpack.capacity() + ffn_.bytes();
    for (const auto &l : lanes_)
        b += l->mm.xq.capacity() + l->mm.xpack.capacity() + l->ffn.bytes() + l->in.capacity() * sizeof(float);
    b += token_rows_.capacity() * sizeof(token_rows_[0]) + (by_size_.capacity() + filled_.capacity()) * sizeof(int) +
         first_row_.capacity() * sizeof(size_t);
    for (const ScratchVec *v : {&H_, &X_, &XN_, &A_, &post_, &comb_, &qr_, &q_, &o_, &flat_, &mix_, &p1_, &p2_, &kvb_,
                              &iq_, &iw_, &oa_, &head_, &ein_, &eout_, &router_, &expert_w_})
        b += v->capacity() * sizeof(float);
    b += (expert_ids_.capacity() + expert_order_.capacity() + used_.capacity()) * sizeof(int);
    b += (pred_ids_.capacity() + pred_top_.capacity()) * sizeof(int) + pred_mark_.capacity() + pred_scores_.capacity() * sizeof(float);
    b += views_.capacity() * sizeof(ExpertView);
    for (const auto &v : sel_) b += v.capacity() * sizeof(int);
    for (const auto &v : by_expert_) b += v.capacity() * sizeof(std::pair<int, float>);
    for (const TaskScratch &t : tasks_)
        b += (t.cos.capacity() + t.sin.capacity() + t.f.capacity()) * sizeof(float) +
             t.rows.capacity() * sizeof(const float *) + t.order.capacity() * sizeof(int);
    b += iscore_.capacity() * sizeof(IndexScore) + ioff_.capacity() * sizeof(int64_t);
    return b;
}

}  // namespace ds4
