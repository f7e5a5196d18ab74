// Inline f16/bf16 <-> f32 conversions for the kernels. The portable (bit-manipulation)
// versions are the reference; the F16C ones must agree with them bit for bit.
#pragma once
#include <cstdint>
#include <cstring>
#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace ds4::quant {

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline float f16_to_f32_soft(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000) << 16;
    const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) {
        // zero or subnormal: m * 2^-24 is exact in f32
        const float v = float(m) * 0x1p-24f;
        return bits_f32(f32_bits(v) | sign);
    }
    if (e == 31) return bits_f32(sign | 0x7f800000u | (m ? 0x400000u | (m << 13) : 0u));
    return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

// Round to nearest even; overflow -> Inf; NaN stays NaN (quiet, payload truncated).
inline uint16_t f32_to_f16_soft(float f) {
    const uint32_t x = f32_bits(f);
    const uint16_t sign = uint16_t((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return uint16_t(sign | 0x7e00 | ((ax >> 13) & 0x3ff));
    if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00);   // >= 65520 rounds to Inf
    if (ax < 0x38800000u) {
        // Below the smallest normal: adding 0.5 puts round(|f| * 2^24) (rounded by the
        // FPU, nearest-even) into the low mantissa bits.
        const float t = bits_f32(ax) + 0.5f;
        return uint16_t(sign | (f32_bits(t) - 0x3f000000u));
    }
    const uint32_t odd = (ax >> 13) & 1;
    const uint32_t r = ax + 0xc8000fffu + odd;   // rebias exponent (-112 << 23) + rounding
    return uint16_t(sign | (r >> 13));
}

inline float f16_to_f32_fast(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return f16_to_f32_soft(h);
#endif
}

inline uint16_t f32_to_f16_fast(float f) {
#if defined(__F16C__)
    return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    return f32_to_f16_soft(f);
#endif
}

inline float bf16_to_f32_inline(uint16_t h) { return bits_f32(uint32_t(h) << 16); }

inline uint16_t f32_to_bf16_inline(float f) {
    const uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40);   // quiet NaN
    return uint16_t((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

}  // namespace ds4::quant
