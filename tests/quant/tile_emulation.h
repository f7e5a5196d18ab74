// Force-included (-include) into copies of q8_0_tile.cpp and q8_0_tile_avx2.cpp that
// emulate_tile.cmake moves into namespace ds4::quant::detail::emu: the AVX-512 and AVX-VNNI
// intrinsics come from SIMDe (portable code), so the VNNI tiles' arithmetic runs, and is
// checked bit for bit against vec_dot, on a CI machine that has neither instruction set.
// <immintrin.h> goes first: SIMDe's aliases are macros, and GCC's own declarations of the
// same names after them would become redefinitions.
#pragma once
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

// The few the tiles use that this SIMDe lacks, lane by lane.
template <class T, class V, class F>
inline simde__m512 emu_lanes_to_ps(V a, F f) {   // 16 lanes of T in a, each through f
    static_assert(sizeof(V) == 16 * sizeof(T));
    T t[16];
    float o[16];
    std::memcpy(t, &a, sizeof t);
    for (int i = 0; i < 16; ++i) o[i] = f(t[i]);
    return simde_mm512_loadu_ps(o);
}
inline simde__m512 emu_cvtepi32_ps(simde__m512i a) {
    return emu_lanes_to_ps<int32_t>(a, [](int32_t v) { return float(v); });
}
inline simde__m512 emu_cvtph_ps(simde__m256i a) {
    return emu_lanes_to_ps<uint16_t>(a, [](uint16_t v) { return _cvtsh_ss(v); });
}
inline simde__m512i emu_shuffle_epi32(simde__m512i a, int imm) {
    int32_t t[16], o[16];
    simde_mm512_storeu_si512(t, a);
    for (int l = 0; l < 4; ++l)
        for (int i = 0; i < 4; ++i) o[4 * l + i] = t[4 * l + ((imm >> (2 * i)) & 3)];
    return simde_mm512_loadu_si512(o);
}
#define _mm512_cvtepi32_ps emu_cvtepi32_ps
#define _mm512_cvtph_ps emu_cvtph_ps
#define _mm512_shuffle_epi32(a, imm) emu_shuffle_epi32(a, int(imm))

namespace ds4::quant::detail::emu {

// Which tile the copies run: the switches vnni_enabled() / avxvnni_enabled() become these.
bool &emu_vnni();
bool &emu_avxvnni();

// int8_dot.h's Isa and dot4_add, with vpdpbusd from SIMDe (found before detail's by lookup
// from inside emu).
enum class Isa { Avx2, Vnni512, AvxVnni };
template <Isa kIsa>
inline __m256i dot4_add(__m256i acc, __m256i u, __m256i s) {
    if constexpr (kIsa == Isa::Avx2)
        return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
    else
        return simde_mm256_dpbusd_epi32(acc, u, s);
}

void q8_0_tile_wide_avx2(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *panel, int64_t n_cols,
                         int64_t nb, float *out, size_t out_col_stride);
void q8_0_tile_rows(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *panel, int64_t n_cols,
                    int64_t nb, float *out, size_t out_col_stride);

}  // namespace ds4::quant::detail::emu
