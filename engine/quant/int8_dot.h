// The int8 instruction of the Q8_0 kernels (q8_0.cpp, q8_0_tile_avx2.cpp) and its 4-byte dot.
#pragma once
#include <immintrin.h>

namespace ds4::quant::detail {

// vpmaddubsw + vpmaddwd (AVX2), or vpdpbusd on 256-bit registers in its EVEX form (AVX-512
// VNNI) or its VEX form (AVX-VNNI: Intel clients from Alder Lake on, which have no AVX-512;
// the EVEX form faults there, the VEX one on AVX-512 VNNI cores without AVX-VNNI such as Ice
// Lake and Zen 4).
enum class Isa { Avx2, Vnni512, AvxVnni };

// acc + in each 32-bit lane the dot of u's four unsigned bytes with s's four signed ones.
// The Avx2 form gives the same integers only while no byte pair's sum leaves 16 bits (its
// callers pass |w| and x with w's signs: at most 2 * 128 * 127); the tiles' offset panels
// (x + 128 against w, pairs up to 2 * 255 * 128) take the vpdpbusd forms only. vpdpbusd is
// asm so one template serves every path (an intrinsic would need the AVX-512 or AVX-VNNI
// target on every function that inlines it, and the AVX2 instantiation could then pick up
// VNNI code from the compiler); the caller checks the CPU has it.
template <Isa kIsa>
inline __m256i dot4_add(__m256i acc, __m256i u, __m256i s) {
    if constexpr (kIsa == Isa::Vnni512) {
        __asm__("%{evex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
        return acc;
    } else if constexpr (kIsa == Isa::AvxVnni) {
        __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(u), "x"(s));
        return acc;
    } else {
        return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
    }
}

}  // namespace ds4::quant::detail
