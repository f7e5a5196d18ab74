// IQ2_XXS codebook tables (format data).
#pragma once
#include <cstdint>

namespace ds4::quant {

// 256 grid points; byte j of entry k is the magnitude of element j.
extern const uint64_t kIq2xxsGrid[256];

// 7 stored sign bits -> 8 sign bits: bit 7 makes the count of set bits even.
constexpr uint8_t iq2_signs_from7(uint32_t s7) {
    return uint8_t(s7 | ((__builtin_popcount(s7) & 1u) << 7));
}

}  // namespace ds4::quant
