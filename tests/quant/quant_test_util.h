// Helpers for the quant tests: random rows of any supported format with controllable
// block scales (every byte pattern of the block formats is a valid encoding).
#pragma once
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/quant/blocks.h"
#include "engine/quant/quants.h"

namespace qtest {

using ds4::quant::Type;

inline int64_t block_elems(Type t) {
    switch (t) {
        case Type::F32: case Type::F16: case Type::BF16: return 1;
        case Type::Q8_0: return 32;
        default: return 256;
    }
}
inline int64_t block_bytes(Type t) {
    switch (t) {
        case Type::F32: return 4;
        case Type::F16: case Type::BF16: return 2;
        case Type::Q8_0: return 34;
        case Type::Q2_K: return 84;
        case Type::Q4_K: return 144;
        case Type::IQ2_XXS: return 66;
        case Type::Q8_K: return 292;
        default: return 0;
    }
}
inline size_t row_size(Type t, int64_t n) { return size_t(n / block_elems(t) * block_bytes(t)); }

enum class Scale { Normal, Tiny, Huge, Zero, Negative, Mixed };

// f16 scale for one block under the given mode.
inline uint16_t pick_scale(Scale s, std::mt19937 &rng) {
    std::uniform_real_distribution<float> u(0.f, 1.f);
    switch (s) {
        case Scale::Normal: return ds4::quant::f32_to_f16(0.001f + 0.05f * u(rng));
        case Scale::Tiny: return uint16_t(1 + rng() % 0x3ff);                  // f16 subnormals
        case Scale::Huge: return uint16_t(0x7800 + rng() % 0x3ff);              // 32768 .. 65504
        case Scale::Zero: return 0;
        case Scale::Negative: return uint16_t(0x8000 | ds4::quant::f32_to_f16(0.001f + 0.05f * u(rng)));
        case Scale::Mixed: {
            const Scale m[] = {Scale::Normal, Scale::Tiny, Scale::Huge, Scale::Zero, Scale::Negative};
            return pick_scale(m[rng() % 5], rng);
        }
    }
    return 0;
}

// Random weight rows (rows x n) of type t.
inline std::vector<uint8_t> random_weights(Type t, int64_t rows, int64_t n, Scale s, std::mt19937 &rng) {
    const size_t rb = row_size(t, n);
    std::vector<uint8_t> buf(rb * size_t(rows));
    for (auto &b : buf) b = uint8_t(rng());
    std::normal_distribution<float> g(0.f, 1.f);
    const float mag = s == Scale::Tiny ? 1e-30f : s == Scale::Huge ? 1e30f : s == Scale::Zero ? 0.f : 1.f;
    const int64_t nblk = int64_t(buf.size()) / block_bytes(t);
    for (int64_t b = 0; b < nblk; ++b) {
        uint8_t *p = buf.data() + b * block_bytes(t);
        auto put16 = [&](size_t off, uint16_t v) { std::memcpy(p + off, &v, 2); };
        switch (t) {
            case Type::F32: case Type::F16: case Type::BF16: {
                const float pm = t == Type::F16 ? (s == Scale::Tiny ? 1e-6f : s == Scale::Huge ? 1e4f : mag) : mag;
                float v = g(rng) * pm;
                if (s == Scale::Negative) v = -std::fabs(v);
                if (t == Type::F16) v = std::fmax(-6e4f, std::fmin(6e4f, v));
                if (t == Type::F32) std::memcpy(p, &v, 4);
                else put16(0, t == Type::F16 ? ds4::quant::f32_to_f16(v) : ds4::quant::f32_to_bf16(v));
                break;
            }
            case Type::Q8_0: put16(0, pick_scale(s, rng)); if (s == Scale::Zero && rng() % 2) std::memset(p + 2, 0, 32); break;
            case Type::Q2_K: put16(80, pick_scale(s, rng)); put16(82, pick_scale(s, rng)); break;
            case Type::Q4_K: put16(0, pick_scale(s, rng)); put16(2, pick_scale(s, rng)); break;
            case Type::IQ2_XXS: put16(0, pick_scale(s, rng)); break;
            default: break;
        }
    }
    return buf;
}

inline std::vector<float> gaussian(int64_t n, float sigma, std::mt19937 &rng) {
    std::normal_distribution<float> g(0.f, sigma);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto &x : v) x = g(rng);
    return v;
}

inline const Type kAllWeightTypes[] = {Type::F32, Type::F16, Type::BF16, Type::Q8_0,
                                      Type::Q2_K, Type::Q4_K, Type::IQ2_XXS};

}  // namespace qtest
