#include "tools/make_model/random_fill.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/common/error.h"
#include "engine/quant/blocks.h"
#include "engine/quant/iq2xxs_tables.h"
#include "engine/quant/quants.h"

namespace ds4::make_model {

namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

// splitmix64's output at stream position i of the stream `key`.
inline uint64_t at(uint64_t key, uint64_t i) { return mix64(key + i * kGolden); }

}  // namespace

uint64_t tensor_key(uint64_t seed, const std::string &name) {
    uint64_t h = 1469598103934665603ull;   // FNV-1a of the name, then mixed with the seed
    for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
    return mix64(h ^ mix64(seed));
}

Dist role_dist(const convert::TensorSpec &spec) {
    using convert::Role;
    switch (spec.role) {
    case Role::Embedding: return {Dist::Normal, 0.f, 1.f};
    case Role::Norm: return {Dist::Uniform, 0.7f, 1.3f};
    case Role::Sink: return {Dist::Normal, 0.f, 1.f};
    case Role::Ape: return {Dist::Normal, 0.f, 0.5f};
    case Role::HcBase: return {Dist::Normal, 0.f, 0.5f};
    case Role::HcScale: return {Dist::Uniform, 0.5f, 1.5f};
    case Role::RouterBias: return {Dist::Normal, 0.f, 0.5f};
    case Role::HashTable: fail("role_dist: the hash table is not a float tensor");
    default:
        // Linear maps (and hc fn): unit-variance outputs for unit-variance inputs.
        return {Dist::Normal, 0.f, static_cast<float>(1.0 / std::sqrt(static_cast<double>(spec.ne[0])))};
    }
}

void exact_values(uint64_t key, const Dist &d, int64_t first, int64_t n, float *out) {
    for (int64_t k = 0; k < n; k++) {
        const uint64_t h = at(key, static_cast<uint64_t>(first + k));
        if (d.kind == Dist::Uniform) {
            out[k] = d.a + (d.b - d.a) * static_cast<float>((h >> 40) * 0x1.0p-24);
        } else {
            // Box-Muller on the two 32-bit halves.
            const double u1 = (static_cast<double>(h >> 32) + 0.5) * 0x1.0p-32;
            const double u2 = static_cast<double>(h & 0xffffffffu) * 0x1.0p-32;
            const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
            out[k] = static_cast<float>(d.a + d.b * z);
        }
    }
}

void fast_values(uint64_t key, const Dist &d, int64_t first, int64_t n, float *out) {
    if (d.kind == Dist::Uniform) return exact_values(key, d, first, n, out);
    // Sum of four 16-bit uniforms: mean 4 * 32767.5, std 65536 / sqrt(3) (to 1e-9).
    const float scale = static_cast<float>(d.b * std::sqrt(3.0) / 65536.0);
    for (int64_t k = 0; k < n; k++) {
        const uint64_t h = at(key, static_cast<uint64_t>(first + k));
        const int64_t s = static_cast<int64_t>(h & 0xffff) + static_cast<int64_t>((h >> 16) & 0xffff) +
                          static_cast<int64_t>((h >> 32) & 0xffff) + static_cast<int64_t>(h >> 48);
        out[k] = d.a + static_cast<float>(s - 131070) * scale;
    }
}

bool fast_block_supported(gguf::Type t) {
    return t == gguf::Type::Q8_0 || t == gguf::Type::Q4_K || t == gguf::Type::Q2_K || t == gguf::Type::IQ2_XXS;
}

namespace {

// Hashed bytes of block b: the block's own stream positions, so any block can be made alone.
void block_bytes(uint64_t key, uint64_t block, uint8_t *dst, size_t n) {
    const uint64_t words = (n + 7) / 8;
    for (uint64_t k = 0; k < words; k++) {
        const uint64_t h = at(key, block * 64 + k);
        std::memcpy(dst + k * 8, &h, std::min<size_t>(8, n - k * 8));
    }
}

// Root mean square of the IQ2_XXS grid magnitudes (a uniformly random grid point).
double iq2_grid_rms() {
    static const double rms = [] {
        double s = 0;
        for (uint64_t g : quant::kIq2xxsGrid)
            for (int j = 0; j < 8; j++) {
                const double m = static_cast<double>((g >> (8 * j)) & 0xff);
                s += m * m;
            }
        return std::sqrt(s / (256.0 * 8.0));
    }();
    return rms;
}

}  // namespace

void fast_block_row(gguf::Type t, uint64_t key, const Dist &d, int64_t row, int64_t ne0, uint8_t *dst) {
    if (d.kind != Dist::Normal || d.a != 0.f) fail("fast_block_row: only zero-mean matrices");
    const int64_t be = gguf::type_block_elems(t);
    if (ne0 % be != 0) fail("fast_block_row: row not a whole number of blocks");
    const int64_t nb = ne0 / be;
    const double sd = d.b;
    switch (t) {
    case gguf::Type::Q8_0: {
        // Codes uniform over -127..127 have std sqrt(127 * 128 / 3).
        const uint16_t dh = quant::f32_to_f16(static_cast<float>(sd / std::sqrt(127.0 * 128.0 / 3.0)));
        auto *blk = reinterpret_cast<quant::BlockQ8_0 *>(dst);
        for (int64_t b = 0; b < nb; b++) {
            block_bytes(key, static_cast<uint64_t>(row * nb + b), reinterpret_cast<uint8_t *>(blk[b].qs), 32);
            for (int8_t &q : blk[b].qs)
                if (q == -128) q = -127;
            blk[b].d = dh;
        }
        return;
    }
    case gguf::Type::Q4_K: {
        // x = d*63*q - dmin*63, q uniform in 0..15 (mean 7.5, std sqrt(255/12)).
        const double dd = sd / (63.0 * std::sqrt(255.0 / 12.0));
        const uint16_t dh = quant::f32_to_f16(static_cast<float>(dd)), mh = quant::f32_to_f16(static_cast<float>(7.5 * dd));
        auto *blk = reinterpret_cast<quant::BlockQ4_K *>(dst);
        for (int64_t b = 0; b < nb; b++) {
            block_bytes(key, static_cast<uint64_t>(row * nb + b), blk[b].qs, sizeof blk[b].qs);
            std::memset(blk[b].scales, 0xff, sizeof blk[b].scales);   // every 6-bit scale and min = 63
            blk[b].d = dh;
            blk[b].dmin = mh;
        }
        return;
    }
    case gguf::Type::Q2_K: {
        // x = d*15*q - dmin*15, q uniform in 0..3 (mean 1.5, std sqrt(15/12)).
        const double dd = sd / (15.0 * std::sqrt(15.0 / 12.0));
        const uint16_t dh = quant::f32_to_f16(static_cast<float>(dd)), mh = quant::f32_to_f16(static_cast<float>(1.5 * dd));
        auto *blk = reinterpret_cast<quant::BlockQ2_K *>(dst);
        for (int64_t b = 0; b < nb; b++) {
            block_bytes(key, static_cast<uint64_t>(row * nb + b), blk[b].qs, sizeof blk[b].qs);
            std::memset(blk[b].scales, 0xff, sizeof blk[b].scales);   // scale 15, min 15
            blk[b].d = dh;
            blk[b].dmin = mh;
        }
        return;
    }
    case gguf::Type::IQ2_XXS: {
        // x = d * (0.5 + 15) / 4 * grid * sign with random grid points and signs.
        const uint16_t dh = quant::f32_to_f16(static_cast<float>(sd / (15.5 / 4.0 * iq2_grid_rms())));
        auto *blk = reinterpret_cast<quant::BlockIQ2_XXS *>(dst);
        for (int64_t b = 0; b < nb; b++) {
            block_bytes(key, static_cast<uint64_t>(row * nb + b), reinterpret_cast<uint8_t *>(blk[b].qs), sizeof blk[b].qs);
            for (int g = 0; g < 8; g++) blk[b].qs[4 * g + 3] |= 0xf000;   // sub-block scale 15 (bits 28..31)
            blk[b].d = dh;
        }
        return;
    }
    default:
        fail(std::string("fast_block_row: no direct synthesis for ") + gguf::type_name(t));
    }
}

std::vector<int32_t> hash_table(uint64_t key, int n_used, int n_expert, int64_t vocab) {
    if (n_used <= 0 || n_used > n_expert) fail("hash_table: need 1 <= n_used <= n_expert");
    std::vector<int32_t> t(static_cast<size_t>(vocab) * static_cast<size_t>(n_used));
    for (int64_t tok = 0; tok < vocab; tok++) {
        int32_t *row = t.data() + tok * n_used;
        uint64_t attempt = 0;
        for (int j = 0; j < n_used;) {
            const uint64_t h = at(key ^ 0x5bd1e995u, static_cast<uint64_t>(tok) * 4096 + attempt++);
            const int32_t e = static_cast<int32_t>(h % static_cast<uint64_t>(n_expert));
            bool dup = false;
            for (int k = 0; k < j; k++) dup |= row[k] == e;
            if (!dup) row[j++] = e;
        }
    }
    return t;
}

}  // namespace ds4::make_model
