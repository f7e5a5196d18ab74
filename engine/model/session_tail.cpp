// The engine's part of a session payload (ARCHITECTURE.md §4), written and read through
// SessionState::read/write so it does not depend on the backend that holds the caches.
#include <algorithm>
#include <cstring>

#include "engine/common/error.h"
#include "engine/model/session.h"

namespace ds4 {

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

// 64-bit checksum over 8-byte words (multiply + rotate per word, several GB/s); the tail
// is always a multiple of 4 bytes, a last half word is padded with zeros.
uint64_t session_tail_checksum(const uint8_t *p, size_t n) {
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


namespace {

// Tail bytes for n tokens under geometry g.
uint64_t tail_size(const ModelConfig &c, const CacheGeometry &g, int64_t n) {
    uint64_t b = 4 * 5 + 8 + 4 + 8;
    for (int l = 0; l < c.n_layer; ++l) {
        b += (uint64_t)(n - std::max<int64_t>(0, n - c.sliding_window + 1)) * c.head_dim * 4;
        for (const CompGeometry *cg : {&g.layers[l].comp, &g.layers[l].icomp}) {
            if (!cg->present()) continue;
            b += (uint64_t)(n - cg->needed_from(n)) * cg->width * 4 * 2;
            b += (uint64_t)(n / cg->ratio) * cg->dim * 4;
        }
    }
    return b + (uint64_t)c.n_vocab * 4;
}

struct CompCaches {
    const CompGeometry *g;
    Cache kv, gate, entries;
    int which;
};

std::vector<CompCaches> comps_of(const LayerGeometry &L) {
    std::vector<CompCaches> v;
    if (L.comp.present()) v.push_back({&L.comp, Cache::CompKv, Cache::CompGate, Cache::CompEntries, 0});
    if (L.icomp.present()) v.push_back({&L.icomp, Cache::IcompKv, Cache::IcompGate, Cache::IcompEntries, 1});
    return v;
}

}  // namespace

uint64_t Session::tail_bytes() const { return tail_size(m_.config(), state_->geometry(), pos()); }

std::vector<uint8_t> Session::save_tail() const {
    const ModelConfig &c = m_.config();
    const CacheGeometry &g = state_->geometry();
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
    std::vector<float> row;
    auto put = [&](int l, Cache which, int64_t first, int64_t count, int width) {
        if (count <= 0) return;
        row.resize((size_t)count * width);
        state_->read(l, which, first, count, row.data());
        o.raw(row.data(), row.size() * 4);
    };
    for (int l = 0; l < c.n_layer; ++l) {
        const int64_t w0 = std::max<int64_t>(0, n - c.sliding_window + 1);
        put(l, Cache::Kv, w0, n - w0, c.head_dim);
        for (const CompCaches &cc : comps_of(g.layers[l])) {
            for (int64_t p = cc.g->needed_from(n); p < n; ++p) {
                put(l, cc.kv, p, 1, cc.g->width);
                put(l, cc.gate, p, 1, cc.g->width);
            }
            put(l, cc.entries, 0, n / cc.g->ratio, cc.g->dim);
        }
    }
    o.raw(logits_.data(), logits_.size() * 4);
    o.pod(session_tail_checksum(buf.data(), buf.size()));
    return buf;
}

void Session::load_tail(const uint8_t *data, size_t size, std::span<const int32_t> toks) {
    check_idle("load_tail");
    const ModelConfig &c = m_.config();
    const CacheGeometry &g = state_->geometry();
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
    const uint64_t want = tail_size(c, g, (int64_t)n);
    if (want != size)
        failf("session tail has %zu bytes, expected %llu for %llu tokens", size, (unsigned long long)want, (unsigned long long)n);
    {
        uint64_t stored;
        std::memcpy(&stored, data + size - 8, 8);
        if (stored != session_tail_checksum(data, size - 8)) fail("session tail: checksum mismatch (the payload is corrupt)");
    }
    // Validated: now mutate.
    ++generation_;
    reset_state();
    std::vector<float> row;
    auto get = [&](int l, Cache which, int64_t first, int64_t count, int width) {
        if (count <= 0) return;
        row.resize((size_t)count * width);
        in.raw(row.data(), row.size() * 4);
        state_->write(l, which, first, count, row.data());
    };
    for (int l = 0; l < c.n_layer; ++l) {
        const int64_t w0 = std::max<int64_t>(0, (int64_t)n - c.sliding_window + 1);
        get(l, Cache::Kv, w0, (int64_t)n - w0, c.head_dim);
        for (const CompCaches &cc : comps_of(g.layers[l])) {
            for (int64_t p = cc.g->needed_from(n); p < (int64_t)n; ++p) {
                get(l, cc.kv, p, 1, cc.g->width);
                get(l, cc.gate, p, 1, cc.g->width);
            }
            get(l, cc.entries, 0, (int64_t)n / cc.g->ratio, cc.g->dim);
            state_->set_n_entries(l, cc.which, (int)(n / cc.g->ratio));
        }
    }
    in.raw(logits_.data(), logits_.size() * 4);
    tokens_.assign(toks.begin(), toks.end());
    has_logits_ = has != 0;
    valid_from_ = (int64_t)n;   // older ring rows were not saved
}

}  // namespace ds4
