#include "tools/make_model/random_fill.h"

#include <cmath>
#include <cstring>

#include "engine/common/error.h"
#include "engine/quant/blocks.h"
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

void fast_q8_0_row(uint64_t key, const Dist &d, int64_t row, int64_t ne0, uint8_t *dst) {
    if (d.kind != Dist::Normal || d.a != 0.f) fail("fast_q8_0_row: only zero-mean matrices");
    if (ne0 % quant::kQK8_0 != 0) fail("fast_q8_0_row: row not a multiple of 32");
    // Codes uniform over -127..127 have std sqrt(127 * 128 / 3).
    const uint16_t dh = quant::f32_to_f16(static_cast<float>(d.b / std::sqrt(127.0 * 128.0 / 3.0)));
    const int64_t nb = ne0 / quant::kQK8_0;
    auto *blocks = reinterpret_cast<quant::BlockQ8_0 *>(dst);
    for (int64_t b = 0; b < nb; b++) {
        const uint64_t base = static_cast<uint64_t>(row * nb + b) * 4;
        quant::BlockQ8_0 &blk = blocks[b];
        blk.d = dh;
        for (int k = 0; k < 4; k++) {
            uint64_t h = at(key, base + static_cast<uint64_t>(k));
            int8_t q[8];
            std::memcpy(q, &h, 8);
            for (int j = 0; j < 8; j++) blk.qs[k * 8 + j] = q[j] == -128 ? static_cast<int8_t>(-127) : q[j];
        }
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
