#include "engine/model/session.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "engine/common/error.h"
#include "engine/kernels/ops.h"
#include "engine/model/session_impl.h"
#include "engine/quant/quants.h"

namespace ds4 {

Session::Session(const Model &m, int ctx, int prefill_cap, int rewind_slack)
    : m_(m), ctx_(ctx), prefill_cap_(prefill_cap > 0 ? prefill_cap : 256), slack_(std::max(0, rewind_slack)) {
    const ModelConfig &c = m.config();
    if (ctx <= 0) failf("context size must be positive (got %d)", ctx);
    if (ctx > (1 << 24)) failf("context size %d is too large", ctx);
    prefill_cap_ = std::min(prefill_cap_, ctx);
    impl_ = new Impl();
    impl_->layers.resize(c.n_layer);
    for (int l = 0; l < c.n_layer; ++l) {
        LayerState &L = impl_->layers[l];
        L.cap_kv = std::min(ctx, c.sliding_window - 1 + prefill_cap_ + slack_);
        L.kv.assign((size_t)L.cap_kv * c.head_dim, 0.f);
        const int r = c.compress_ratio[l];
        if (!r) continue;
        auto init = [&](CompState &cs, int dim, bool overlap) {
            cs.ratio = r;
            cs.dim = dim;
            cs.overlap = overlap;
            cs.width = overlap ? 2 * dim : dim;
            cs.cap = std::min(ctx, 2 * r + prefill_cap_ + slack_);
            cs.max_entries = ctx / r;
            cs.kv.assign((size_t)cs.cap * cs.width, 0.f);
            cs.gate.assign((size_t)cs.cap * cs.width, 0.f);
            cs.entries.assign((size_t)cs.max_entries * dim, 0.f);
        };
        init(L.comp, c.head_dim, c.is_csa(l));
        if (c.is_csa(l)) init(L.icomp, c.indexer_dim, true);
    }
    logits_.assign(c.n_vocab, 0.f);
}

Session::~Session() { delete impl_; }

uint64_t Session::memory_bytes() const {
    uint64_t b = logits_.size() * sizeof(float);
    for (const LayerState &L : impl_->layers) {
        b += L.kv.size() * sizeof(float);
        for (const CompState *cs : {&L.comp, &L.icomp})
            b += (cs->kv.size() + cs->gate.size() + cs->entries.size()) * sizeof(float);
    }
    return b;
}

uint64_t Session::scratch_bytes() const {
    const Impl &S = *impl_;
    uint64_t b = S.xq.capacity();
    for (const std::vector<float> *v : {&S.H, &S.flat, &S.mix, &S.post, &S.comb, &S.X, &S.XN, &S.A, &S.qr, &S.q, &S.o,
                                        &S.oa, &S.p1, &S.p2, &S.iq, &S.iw, &S.head, &S.g, &S.u, &S.ein, &S.eout,
                                        &S.kvb, &S.router, &S.expert_w, &S.logits_out})
        b += v->capacity() * sizeof(float);
    b += (S.expert_ids.capacity() + S.expert_order.capacity()) * sizeof(int);
    for (const auto &v : S.sel) b += v.capacity() * sizeof(int);
    for (const auto &v : S.by_expert) b += v.capacity() * sizeof(std::pair<int, float>);
    for (const TaskScratch &t : S.tasks)
        b += (t.cos.capacity() + t.sin.capacity() + t.f.capacity()) * sizeof(float) +
             t.rows.capacity() * sizeof(const float *) + t.scores.capacity() * sizeof(IndexScore);
    return b;
}

void Session::reset_state() {
    tokens_.clear();
    has_logits_ = false;
    valid_from_ = 0;
    for (LayerState &L : impl_->layers) {
        L.comp.n_entries = 0;
        L.icomp.n_entries = 0;
    }
}

void Session::invalidate() {
    reset_state();
    ++generation_;
}

void Session::check_tokens(std::span<const int32_t> toks) const {
    const int V = m_.config().n_vocab;
    for (size_t i = 0; i < toks.size(); ++i)
        if (toks[i] < 0 || toks[i] >= V)
            failf("token id %d at index %zu is out of range (vocabulary has %d tokens)", toks[i], i, V);
}

bool Session::can_rewind_in_place(int p) const {
    const int64_t n = pos();
    if (p < 0 || p > n) return false;
    if (p == n) return true;
    const ModelConfig &c = m_.config();
    for (int l = 0; l < c.n_layer; ++l) {
        const LayerState &L = impl_->layers[l];
        const int64_t kv_need = std::max<int64_t>(0, p - c.sliding_window + 1);
        if (kv_need < p && kv_need < std::max<int64_t>(valid_from_, n - L.cap_kv)) return false;
        for (const CompState *cs : {&L.comp, &L.icomp}) {
            if (!cs->ratio) continue;
            const int64_t need = cs->needed_from(p);
            if (need < p && need < std::max<int64_t>(valid_from_, n - cs->cap)) return false;
        }
    }
    return true;
}

void Session::rewind(int p) {
    if (p < 0 || p > pos()) failf("rewind to %d: position must be in 0..%d", p, pos());
    if (p == pos()) return;
    ++generation_;
    if (!can_rewind_in_place(p)) {
        // The rings no longer hold what position p needs: rebuild from the history.
        std::vector<int32_t> keep(tokens_.begin(), tokens_.begin() + p);
        reset_state();
        if (!keep.empty()) {
            try {
                for (size_t s = 0; s < keep.size(); s += prefill_cap_)
                    forward(std::span<const int32_t>(keep).subspan(s, std::min<size_t>(prefill_cap_, keep.size() - s)), nullptr);
            } catch (...) {
                invalidate();
                throw;
            }
        }
        return;
    }
    tokens_.resize(p);
    for (LayerState &L : impl_->layers) {
        for (CompState *cs : {&L.comp, &L.icomp})
            if (cs->ratio) cs->n_entries = p / cs->ratio;
    }
    has_logits_ = false;
}

void Session::sync(std::span<const int32_t> toks, const Progress &progress, std::vector<float> *all_logits) {
    if (toks.empty()) fail("sync: empty prompt");
    if ((int64_t)toks.size() > ctx_)
        failf("prompt of %zu tokens does not fit the context of %d tokens", toks.size(), ctx_);
    check_tokens(toks);
    size_t common = 0;
    while (common < tokens_.size() && common < toks.size() && tokens_[common] == toks[common]) ++common;
    if (!all_logits && common == toks.size() && common == tokens_.size() && has_logits_) return;
    // Re-evaluate at least the last token so its logits are fresh. all_logits receives one
    // row per token evaluated here, i.e. for positions keep..toks.size()-1.
    size_t keep = std::min(common, toks.size() - 1);
    if (keep != tokens_.size()) {
        if (can_rewind_in_place((int)keep)) {
            rewind((int)keep);
        } else {
            reset_state();
            ++generation_;
            keep = 0;
        }
    }
    if (all_logits) all_logits->clear();
    const int total = (int)toks.size();
    try {
        for (size_t s = keep; s < toks.size(); s += prefill_cap_) {
            const size_t n = std::min<size_t>(prefill_cap_, toks.size() - s);
            forward(toks.subspan(s, n), all_logits);
            if (progress) progress((int)(s + n), total);
        }
    } catch (...) {
        invalidate();
        throw;
    }
}

void Session::eval(int32_t token) {
    if (pos() >= ctx_) failf("context full: the session holds %d tokens (context %d)", pos(), ctx_);
    const int32_t t[1] = {token};
    check_tokens(t);
    try {
        forward(t, nullptr);
    } catch (...) {
        invalidate();
        throw;
    }
}

const std::vector<float> &Session::logits() const {
    if (!has_logits_) fail("no logits: evaluate a token first");
    return logits_;
}

int Session::argmax() const {
    const std::vector<float> &l = logits();
    return (int)(std::max_element(l.begin(), l.end()) - l.begin());
}

static uint64_t next_rand(uint64_t *s) {
    // splitmix64: a tiny, well-mixed generator; the caller owns the state.
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int Session::sample(const SamplingParams &p, uint64_t *rng) const {
    const std::vector<float> &l = logits();
    if (p.temperature <= 0.f) return argmax();
    if (!rng) fail("sample: rng state is required when temperature > 0");
    if (!(p.top_p > 0.f && p.top_p <= 1.f)) failf("sample: top_p %g must be in (0, 1]", p.top_p);
    if (!(p.min_p >= 0.f && p.min_p < 1.f)) failf("sample: min_p %g must be in [0, 1)", p.min_p);
    if (p.top_k < 0) failf("sample: top_k %d must be >= 0", p.top_k);
    std::vector<int> idx(l.size());
    std::iota(idx.begin(), idx.end(), 0);
    auto by_logit = [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
    size_t k = idx.size();
    if (p.top_k > 0 && (size_t)p.top_k < k) {
        k = p.top_k;
        std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by_logit);
    } else {
        std::sort(idx.begin(), idx.end(), by_logit);
    }
    idx.resize(k);
    std::vector<double> pr(k);
    const double mx = l[idx[0]];
    double sum = 0;
    for (size_t i = 0; i < k; ++i) sum += pr[i] = std::exp(((double)l[idx[i]] - mx) / p.temperature);
    size_t keep = k;
    if (p.top_p < 1.f) {
        double acc = 0;
        for (size_t i = 0; i < k; ++i) {
            acc += pr[i] / sum;
            if (acc >= p.top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    if (p.min_p > 0.f) {
        size_t j = 1;
        while (j < keep && pr[j] >= p.min_p * pr[0]) ++j;
        keep = j;
    }
    double tot = 0;
    for (size_t i = 0; i < keep; ++i) tot += pr[i];
    const double u = (double)(next_rand(rng) >> 11) * (1.0 / 9007199254740992.0) * tot;
    double acc = 0;
    for (size_t i = 0; i < keep; ++i) {
        acc += pr[i];
        if (u < acc) return idx[i];
    }
    return idx[keep - 1];
}

std::vector<std::pair<int, float>> Session::top_logprobs(int n) const {
    const std::vector<float> &l = logits();
    const float mx = *std::max_element(l.begin(), l.end());
    double s = 0;
    for (float v : l) s += std::exp((double)v - mx);
    const float lse = mx + (float)std::log(s);
    n = std::max(0, std::min<int>(n, (int)l.size()));
    std::vector<int> idx(l.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(),
                      [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    std::vector<std::pair<int, float>> out;
    for (int i = 0; i < n; ++i) out.emplace_back(idx[i], l[idx[i]] - lse);
    return out;
}


// ---- payload tail -----------------------------------------------------------------
//
// Layout (little-endian): "DS4T", u32 version, u32 n_layer, u32 head_dim, u32 n_vocab,
// u64 n_tokens, u32 has_logits; then per layer: the K=V rows of positions
// [max(0, n-W+1), n); per compressor (main, then indexer): kv and gate projections of
// positions [needed_from(n), n) and the n/ratio entries; then n_vocab logits; finally a
// u64 checksum of everything before it (the host's header CRC covers only header and
// tokens, and a flipped bit in the caches must not load silently). All counts follow
// from n and the model, so the size must match exactly.

namespace {

constexpr uint32_t kTailMagic = 0x54345344;   // "DS4T"
constexpr uint32_t kTailVersion = 2;

// 64-bit checksum over 8-byte words (multiply + rotate per word, several GB/s); the tail
// is always a multiple of 4 bytes, a last half word is padded with zeros.
uint64_t tail_checksum(const uint8_t *p, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        std::memcpy(&w, p + i, 8);
        h = (h ^ (w * 0xff51afd7ed558ccdull)) * 0xc4ceb9fe1a85ec53ull;
        h = (h << 27) | (h >> 37);
    }
    if (i < n) {
        uint64_t w = 0;
        std::memcpy(&w, p + i, n - i);
        h = (h ^ (w * 0xff51afd7ed558ccdull)) * 0xc4ceb9fe1a85ec53ull;
    }
    h ^= h >> 33;
    return h * 0xff51afd7ed558ccdull ^ (h >> 29);
}

struct Out {
    std::vector<uint8_t> &b;
    void raw(const void *p, size_t n) {
        const uint8_t *s = static_cast<const uint8_t *>(p);
        b.insert(b.end(), s, s + n);
    }
    template <class T> void pod(T v) { raw(&v, sizeof v); }
};

struct In {
    const uint8_t *p, *end;
    void raw(void *dst, size_t n) {
        if ((size_t)(end - p) < n) fail("session tail is truncated");
        std::memcpy(dst, p, n);
        p += n;
    }
    template <class T> T pod() {
        T v;
        raw(&v, sizeof v);
        return v;
    }
};

}  // namespace

uint64_t Session::tail_bytes() const {
    const ModelConfig &c = m_.config();
    const int64_t n = pos();
    uint64_t b = 4 * 5 + 8 + 4 + 8;
    for (int l = 0; l < c.n_layer; ++l) {
        const LayerState &L = impl_->layers[l];
        b += (uint64_t)(n - std::max<int64_t>(0, n - c.sliding_window + 1)) * c.head_dim * 4;
        for (const CompState *cs : {&L.comp, &L.icomp}) {
            if (!cs->ratio) continue;
            b += (uint64_t)(n - cs->needed_from(n)) * cs->width * 4 * 2;
            b += (uint64_t)(n / cs->ratio) * cs->dim * 4;
        }
    }
    return b + (uint64_t)c.n_vocab * 4;
}

std::vector<uint8_t> Session::save_tail() const {
    const ModelConfig &c = m_.config();
    const int64_t n = pos();
    std::vector<uint8_t> buf;
    buf.reserve(tail_bytes());
    Out o{buf};
    o.pod(kTailMagic);
    o.pod(kTailVersion);
    o.pod((uint32_t)c.n_layer);
    o.pod((uint32_t)c.head_dim);
    o.pod((uint32_t)c.n_vocab);
    o.pod((uint64_t)n);
    o.pod((uint32_t)has_logits_);
    for (int l = 0; l < c.n_layer; ++l) {
        LayerState &L = impl_->layers[l];
        for (int64_t p = std::max<int64_t>(0, n - c.sliding_window + 1); p < n; ++p) o.raw(L.kv_row(p, c.head_dim), 4 * c.head_dim);
        for (CompState *cs : {&L.comp, &L.icomp}) {
            if (!cs->ratio) continue;
            for (int64_t p = cs->needed_from(n); p < n; ++p) {
                o.raw(cs->kv_row(p), 4 * cs->width);
                o.raw(cs->gate_row(p), 4 * cs->width);
            }
            o.raw(cs->entries.data(), (size_t)(n / cs->ratio) * cs->dim * 4);
        }
    }
    o.raw(logits_.data(), logits_.size() * 4);
    o.pod(tail_checksum(buf.data(), buf.size()));
    return buf;
}

void Session::load_tail(const uint8_t *data, size_t size, std::span<const int32_t> toks) {
    const ModelConfig &c = m_.config();
    if (!data && size) fail("session tail: null data");
    In in{data, data + size};
    if (in.pod<uint32_t>() != kTailMagic) fail("session tail: bad magic");
    const uint32_t ver = in.pod<uint32_t>();
    if (ver != kTailVersion) failf("session tail: version %u is not supported (expected %u)", ver, kTailVersion);
    const uint32_t nl = in.pod<uint32_t>(), hd = in.pod<uint32_t>(), nv = in.pod<uint32_t>();
    if ((int)nl != c.n_layer || (int)hd != c.head_dim || (int)nv != c.n_vocab)
        failf("session tail is for another model shape (%u layers, head %u, vocab %u)", nl, hd, nv);
    const uint64_t n = in.pod<uint64_t>();
    const uint32_t has = in.pod<uint32_t>();
    if (n != toks.size()) failf("session tail holds %llu tokens but %zu token ids were given", (unsigned long long)n, toks.size());
    if ((int64_t)n > ctx_) failf("session of %llu tokens does not fit the context of %d", (unsigned long long)n, ctx_);
    if (has > 1) fail("session tail: bad logits flag");
    check_tokens(toks);
    // Size check against a shadow with pos() = n before touching anything.
    {
        uint64_t want = 4 * 5 + 8 + 4 + 8;
        for (int l = 0; l < c.n_layer; ++l) {
            const LayerState &L = impl_->layers[l];
            want += (uint64_t)(n - std::max<int64_t>(0, (int64_t)n - c.sliding_window + 1)) * c.head_dim * 4;
            for (const CompState *cs : {&L.comp, &L.icomp}) {
                if (!cs->ratio) continue;
                want += (uint64_t)(n - cs->needed_from(n)) * cs->width * 8 + (uint64_t)(n / cs->ratio) * cs->dim * 4;
            }
        }
        want += (uint64_t)c.n_vocab * 4;
        if (want != size)
            failf("session tail has %zu bytes, expected %llu for %llu tokens", size, (unsigned long long)want, (unsigned long long)n);
    }
    {
        uint64_t stored;
        std::memcpy(&stored, data + size - 8, 8);
        if (stored != tail_checksum(data, size - 8)) fail("session tail: checksum mismatch (the payload is corrupt)");
    }
    // Validated: now mutate.
    ++generation_;
    reset_state();
    for (int l = 0; l < c.n_layer; ++l) {
        LayerState &L = impl_->layers[l];
        for (int64_t p = std::max<int64_t>(0, (int64_t)n - c.sliding_window + 1); p < (int64_t)n; ++p) in.raw(L.kv_row(p, c.head_dim), 4 * c.head_dim);
        for (CompState *cs : {&L.comp, &L.icomp}) {
            if (!cs->ratio) continue;
            for (int64_t p = cs->needed_from(n); p < (int64_t)n; ++p) {
                in.raw(cs->kv_row(p), 4 * cs->width);
                in.raw(cs->gate_row(p), 4 * cs->width);
            }
            cs->n_entries = (int)(n / cs->ratio);
            in.raw(cs->entries.data(), (size_t)cs->n_entries * cs->dim * 4);
        }
    }
    in.raw(logits_.data(), logits_.size() * 4);
    tokens_.assign(toks.begin(), toks.end());
    has_logits_ = has != 0;
    valid_from_ = (int64_t)n;   // older ring rows were not saved
}

}  // namespace ds4
