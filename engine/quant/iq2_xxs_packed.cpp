// IQ2_XXS products on AVX-512 VBMI + VNNI + GFNI, with the activations transposed once per product.
//
// An IQ2_XXS weight is a byte of an 8-byte codebook entry picked by an index byte, so in
// natural order every weight needs a 64-bit table lookup (a gather, ~32 a block: the old
// kernel ran at a third of the memory bandwidth). Transposed, it needs none: with two
// blocks' activations laid out position-major (x_j[k] = element j of index k), lane k of
// every register belongs to index k, and position j of 64 indices is one vpermb away.
//   - the lanes interleave the two blocks' 32-groups: dword 2g holds the 4 indices of the
//     first block's group g, dword 2g + 1 the second's, the order the index words already
//     have in the qs when the second block is loaded 4 bytes early, so one blend of two
//     loads gathers them (and one more the sign words), where a two-source permute of two
//     loads took 5 cycles on a permute pipe (Zen 5, from L2: 17.7 -> 16.25 cycles a pair);
//   - the codebook's levels (8, 25, 43) are stored as 2-bit codes, 4 positions a byte, in
//     two 256-byte tables (four vpermb each, the last three merge-masked by index bits 6-7:
//     a vpermi2b is three uops on Sapphire Rapids, a vpermb one; on AMD, where a vpermi2b is
//     one uop, two vpermi2b and a blend: iq2_xxs_two_source_permutes);
//   - the 7 stored sign bits of 64 indices are spread to bytes by one vpmultishiftqb and
//     completed to 8 (the parity bit) by one GF2P8AFFINEQB;
//   - a position pair's two codes and two signs make a 6-bit vpermb index into a 64-byte
//     table of w + 64 (so the weight is an unsigned byte for vpdpbusd): one vpternlog merge
//     of code bits with sign bits, for two of the four pairs after a 32-bit shift (two
//     index layouts, two tables); the 64 * sum(x) the + 64 adds per 32-group is packed
//     (negated) with the activations and starts the integer chain;
//   - each vpdpbusd adds 4 indices of one 32-group, so after the 8 positions lane g holds
//     32-group g's exact integer dot.
// Every 512-bit op here shares two ports (vpdpbusd either, the permutes port 5, the affine
// and shifts port 0), so the count of vector uops per block is the cost.
//
// The float steps are the ones of dot_iq2_xxs (iq2_xxs.cpp): per block the exact integer
// T_b = sum over 32-groups of (2 * scale + 1) * group dot, then a[b % 4] += s_b * T_b with
// s_b = (d_x / 8) * d_w, result (a0 + a2) + (a1 + a3); every result is bit-identical to
// vec_dot.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "engine/quant/blocks.h"
#include "engine/quant/half.h"
#include "engine/quant/iq2xxs_tables.h"
#include "engine/quant/kernels.h"
#include "engine/quant/simd.h"

namespace ds4::quant::detail {

namespace {

// Two blocks' activations, position-major (8 x 64 bytes; byte 4 * (2g + h) + i of position
// j: element j of index 4g + i of block h), then -64 * the sum of each 32-group (int32,
// dword 2g + h): the weights go in as w + 64 (unsigned), which adds 64 * sum(x).
constexpr int64_t kPairBytes = 9 * 64;

int64_t pairs_of(int64_t n) { return (n / kQK_K + 1) / 2; }

// Per column: the transposed activations of every block pair, then (d_x / 8) per block
// (0 for the missing half of an odd last pair), padded to a cache line.
uint64_t col_bytes(int64_t n) {
    const int64_t p = pairs_of(n);
    return uint64_t(p * kPairBytes + (p * 8 + 63) / 64 * 64);
}

struct Tables {
    alignas(64) uint8_t code[2][256];   // entry k: 2-bit level codes of positions 0-3 / 4-7
    // Two layouts of a position pair's 6-bit index: codes in bits 0-3 and signs in 4-5
    // (level[0]), signs in bits 0-1 and codes in 2-5 (level[1]); [h] is the pair's position h.
    alignas(64) uint8_t level[2][2][64];
    alignas(64) uint8_t sign_shift[64];   // bit offsets of index k's 7 sign bits in its qword
    Tables() {
        for (int k = 0; k < 256; ++k)
            for (int h = 0; h < 2; ++h) {
                uint8_t c = 0;
                for (int j = 0; j < 4; ++j) {
                    const uint8_t m = uint8_t(kIq2xxsGrid[k] >> (8 * (4 * h + j)));
                    c |= uint8_t((m == 8 ? 0 : m == 25 ? 1 : 2) << (2 * j));
                }
                code[h][k] = c;
            }
        static constexpr int kLevels[4] = {8, 25, 43, 0};
        for (int h = 0; h < 2; ++h)
            for (int i = 0; i < 64; ++i) {
                const int m0 = kLevels[(i >> (2 * h)) & 3], m1 = kLevels[(i >> (2 + 2 * h)) & 3];
                level[0][h][i] = uint8_t(64 + ((i >> (4 + h)) & 1 ? -m0 : m0));
                level[1][h][i] = uint8_t(64 + ((i >> h) & 1 ? -m1 : m1));
            }
        // Lane k is index k % 4 of 32-group k / 8 of block (k / 4) % 2; its sign word is
        // dword k / 4 of the sign words' register: qword k / 8, half (k / 4) % 2.
        for (int k = 0; k < 64; ++k) sign_shift[k] = uint8_t(32 * ((k / 4) % 2) + 7 * (k % 4));
    }
};
const Tables &tables() {
    static const Tables t;
    return t;
}

#define DS4_VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,gfni")))
// The per-step helpers must inline: called, they reload their constant tables every step.
#define DS4_VBMI_INLINE DS4_VBMI __attribute__((always_inline)) inline
// GCC 12 warns about the undefined pass-through operand inside its AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// From a byte's 7 stored sign bits (bit 7 ignored) to the 8 signs in the order the index
// merges below want them: bits 0-1 signs 2, 3; bits 2-3 signs 6, 7; bits 4-5 signs 0, 1;
// bits 6-7 signs 4, 5 (sign 7 is the parity of the stored 7).
constexpr int kSignOrder[8] = {2, 3, 6, 7, 0, 1, 4, 5};
constexpr long long kSignMatrix = simd::affine_matrix(kSignOrder, true);

// vpternlog truth table of (a & c) | (b & ~c): bit (a << 2 | b << 1 | c).
constexpr int kTakeLowNibble = [] {
    int imm = 0;
    for (int a = 0; a < 2; ++a)
        for (int b = 0; b < 2; ++b)
            for (int c = 0; c < 2; ++c)
                if ((a & c) | (b & (1 - c))) imm |= 1 << (a * 4 + b * 2 + c);
    return imm;
}();

// Column counts up to this run two vpdpbusd chains a column (see pair_sums; one chain for
// one column measured ~1% slower).
constexpr int kChainCols = 2;

DS4_VBMI inline __m512i load64(const void *p) { return _mm512_loadu_si512(p); }


// Transposes one q8_K row into its packed column.
DS4_VBMI void pack_col(const BlockQ8_K *x, int64_t nb, uint8_t *dst) {
    // Within 64 bytes (8 indices), byte 8j + i takes element 8i + j: position j of 8 indices.
    alignas(64) uint8_t perm[64];
    for (int j = 0; j < 8; ++j)
        for (int i = 0; i < 8; ++i) perm[8 * j + i] = uint8_t(8 * i + j);
    const __m512i tr = load64(perm);
    const int64_t np = pairs_of(nb * kQK_K);
    float *scale = reinterpret_cast<float *>(dst + np * kPairBytes);
    for (int64_t p = 0; p < np; ++p) {
        uint8_t *out = dst + p * kPairBytes;
        for (int h = 0; h < 2; ++h) {
            const int64_t b = 2 * p + h;
            if (b >= nb) {
                for (int j = 0; j < 9; ++j)
                    for (int g = 0; g < 8; ++g) std::memset(out + 64 * j + 4 * (2 * g + h), 0, 4);
                scale[b] = 0.f;
                continue;
            }
            scale[b] = 0.125f * x[b].d;
            for (int q = 0; q < 4; ++q) {   // indices 8q..8q+7 of the block: groups 2q and 2q + 1
                alignas(64) uint8_t t[64];
                _mm512_store_si512(t, _mm512_permutexvar_epi8(tr, load64(x[b].qs + 64 * q)));
                for (int j = 0; j < 8; ++j)
                    for (int e = 0; e < 2; ++e)
                        std::memcpy(out + 64 * j + 4 * (2 * (2 * q + e) + h), t + 8 * j + 4 * e, 4);
            }
            for (int g = 0; g < 8; ++g) {
                const int32_t sum = -64 * (int32_t(x[b].bsums[2 * g]) + int32_t(x[b].bsums[2 * g + 1]));
                std::memcpy(out + 8 * 64 + 4 * (2 * g + h), &sum, 4);
            }
        }
    }
    std::memset(dst + np * kPairBytes + np * 8, 0, col_bytes(nb * kQK_K) - uint64_t(np * kPairBytes + np * 8));
}

// The two blocks at w (the second absent when !two) against C packed columns: per column,
// dword 2g + h holds block h's 32-group g's exact integer dot times its multiplier
// 2 * scale + 1.
// NP pairs side by side (each step for all of them before the next), so the out-of-order
// window sees independent work while one pair waits on its permute and vpdpbusd latencies.
template <int C, int NP, bool K2>
DS4_VBMI_INLINE void pair_sums(const Tables &T, const uint8_t *w, const bool *two, const uint8_t *const *xc,
                               int64_t p, __m512i (*sums)[C]) {
    constexpr int64_t kB = sizeof(BlockIQ2_XXS);
    __m512i idx[NP], sgsc[NP], sg[NP], c[NP][2];
    for (int q = 0; q < NP; ++q) {
        const uint8_t *wq = w + 2 * kB * q;
        // The qs of a block are 8 x [4 index bytes][sign/scale word]. Loaded 4 bytes late,
        // the first block's sign words sit in the even dwords; loaded 4 bytes early, the
        // second block's index words sit in the odd ones. An absent second block (an odd
        // last pair) reads from a zero-padded copy: the loads reach 4 bytes past the first.
        alignas(64) uint8_t padded[2 * kB + 8];
        if (!two[q]) {
            std::memcpy(padded, wq, kB);
            std::memset(padded + kB, 0, sizeof(padded) - kB);
            wq = padded;
        }
        const __m512i a = load64(wq + 2), b = load64(wq + kB + 2);   // the two blocks' qs
        idx[q] = _mm512_mask_blend_epi32(0xAAAA, a, _mm512_shuffle_epi32(b, _MM_PERM_CCAA));
        sgsc[q] = _mm512_mask_blend_epi32(0xAAAA, _mm512_shuffle_epi32(a, _MM_PERM_DDBB), b);
    }
    for (int q = 0; q < NP; ++q) {
        const __m512i s7 = _mm512_multishift_epi64_epi8(load64(T.sign_shift), sgsc[q]);
        sg[q] = _mm512_gf2p8affine_epi64_epi8(s7, _mm512_set1_epi64(kSignMatrix), 0);
        const __mmask64 b7 = _mm512_movepi8_mask(idx[q]);
        if constexpr (K2) {
            // AMD (Zen 4/5): a vpermi2b is one uop, so two of them cover the 256 entries and a
            // blend picks by index bit 7 (Zen 5, from cache: 92-94 -> 112-115 G weights/s).
            for (int h = 0; h < 2; ++h) {
                const uint8_t *t = T.code[h];
                const __m512i lo = _mm512_permutex2var_epi8(load64(t), idx[q], load64(t + 64));
                const __m512i hi = _mm512_permutex2var_epi8(load64(t + 128), idx[q], load64(t + 192));
                c[q][h] = _mm512_mask_blend_epi8(b7, lo, hi);
            }
        } else {
            // A 256-entry table is four 64-entry vpermb (on Intel a vpermi2b costs three uops,
            // a vpermb one), each later one merged where index bits 6-7 pick its quarter.
            const __mmask64 b6 = _mm512_test_epi8_mask(idx[q], _mm512_set1_epi8(0x40));
            const __mmask64 b76 = _kand_mask64(b7, b6);
            for (int h = 0; h < 2; ++h) {
                const uint8_t *t = T.code[h];
                __m512i v = _mm512_permutexvar_epi8(idx[q], load64(t));
                v = _mm512_mask_permutexvar_epi8(v, b6, idx[q], load64(t + 64));
                v = _mm512_mask_permutexvar_epi8(v, b7, idx[q], load64(t + 128));
                c[q][h] = _mm512_mask_permutexvar_epi8(v, b76, idx[q], load64(t + 192));
            }
        }
    }
    // Per position pair a 6-bit permute index of its two codes and two signs, one merge
    // each: the code byte's low nibble with the sign byte's high one, or (the code byte
    // shifted right by 2: the high pair in bits 2-5) its bits 2-7 with the signs' bits 0-1;
    // the sign byte shifted right by 2 serves the second code byte. The shifts are 32-bit:
    // a neighbour byte's bits land only in bits 6-7, which vpermb ignores (and on Zen 5 they
    // issue beside the permutes, where the affine moves they replace took a permute pipe).
    const __m512i low = _mm512_set1_epi8(0x0F), low2 = _mm512_set1_epi8(0x03);
    __m512i ix[NP][4];   // positions 0-1, 2-3, 4-5, 6-7
    for (int q = 0; q < NP; ++q) {
        const __m512i s2 = _mm512_srli_epi32(sg[q], 2);
        ix[q][0] = _mm512_ternarylogic_epi32(c[q][0], sg[q], low, kTakeLowNibble);
        ix[q][1] = _mm512_ternarylogic_epi32(sg[q], _mm512_srli_epi32(c[q][0], 2), low2, kTakeLowNibble);
        ix[q][2] = _mm512_ternarylogic_epi32(c[q][1], s2, low, kTakeLowNibble);
        ix[q][3] = _mm512_ternarylogic_epi32(s2, _mm512_srli_epi32(c[q][1], 2), low2, kTakeLowNibble);
    }
    // Unsigned weights (w + 64) against the signed activations: each chain starts at minus
    // the packed 64 * sum(x) of its 32-group, so it ends at the exact group dot.
    __m512i acc[NP][C][2];
    for (int q = 0; q < NP; ++q)
        for (int k = 0; k < C; ++k) {
            acc[q][k][0] = load64(xc[k] + (p + q) * kPairBytes + 8 * 64);
            acc[q][k][1] = _mm512_setzero_si512();
        }
    for (int j = 0; j < 8; ++j)
        for (int q = 0; q < NP; ++q) {
            const __m512i v = _mm512_permutexvar_epi8(ix[q][j / 2], load64(T.level[(j / 2) & 1][j & 1]));
            // up to two columns: two chains each against the vpdpbusd latency; more columns
            // are chains enough (and two each would not fit the registers)
            const int ch = C <= kChainCols ? (j & 1) : 0;
            for (int k = 0; k < C; ++k)
                acc[q][k][ch] = _mm512_dpbusd_epi32(acc[q][k][ch], v, load64(xc[k] + (p + q) * kPairBytes + 64 * j));
        }
    for (int q = 0; q < NP; ++q) {
        // multipliers 2 * scale + 1
        const __m512i m = _mm512_or_si512(_mm512_srli_epi32(sgsc[q], 27), _mm512_set1_epi32(1));
        for (int k = 0; k < C; ++k) {
            const __m512i dot = C <= kChainCols ? _mm512_add_epi32(acc[q][k][0], acc[q][k][1]) : acc[q][k][0];
            sums[q][k] = _mm512_mullo_epi32(dot, m);
        }
    }
}

// Four blocks of one row from pair p on: a[k] (column k's a[b % 4], one per lane) takes
// them in order.
template <int C, bool K2>
DS4_VBMI_INLINE void four_blocks(const Tables &T, const uint8_t *wr, int64_t p, int64_t nb, const uint8_t *const *xc,
                                 const float *const *sc, __m128 *a) {
    constexpr int64_t kBlock = sizeof(BlockIQ2_XXS);
    const uint8_t *wp = wr + p * 2 * kBlock;
    // the weights 8 KB ahead (4 blocks span up to 6 lines); measured from memory on an
    // Emerald Rapids VM: 2 KB 9.6-9.8, 4 KB 9.8-10.0, 8 KB 10.1-10.4, 16 KB 9.5-10.0 GB/s.
    // Not on AMD (the K2 kernel): on Zen 5 the hardware prefetchers keep the two streams
    // up by themselves and the prefetches took load slots (from memory 28.7-29.2 -> 30.0-30.9).
    if constexpr (!K2) simd::prefetch_ahead<8192, 5>(wp);
    const bool four = 2 * p + 3 < nb;
    __m512i t[2][C];
    const bool two[2] = {true, four};
    // Both rows of a step read the same activations: hidden from the compiler, which
    // otherwise keeps the first row's loads for the second and spills them (a store each).
    const uint8_t *x[C];
    for (int k = 0; k < C; ++k) {
        x[k] = xc[k] + p * kPairBytes;
        asm("" : "+r"(x[k]));
    }
    pair_sums<C, 2, K2>(T, wp, two, x, 0, t);
    const __m512i *t0 = t[0], *t1 = t[1];
    uint16_t h[4] = {0, 0, 0, 0};   // a missing fourth block is not read (it may lie past a mapping)
    for (int i = 0; i < (four ? 4 : 3); ++i) std::memcpy(&h[i], wp + i * kBlock, 2);
    uint64_t hw;
    std::memcpy(&hw, h, 8);
    const __m128 dw = _mm_cvtph_ps(_mm_cvtsi64_si128(int64_t(hw)));
    for (int k = 0; k < C; ++k) {
        // a 128-bit lane of t0 holds [block 4q, 4q+1, 4q, 4q+1] partial sums, of t1 the same
        // of blocks 4q+2, 4q+3: [4q, 4q+1, 4q+2, 4q+3] in each lane (two in-lane unpacks
        // and an add, off the permute pipes), then over the lanes
        __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi64(t0[k], t1[k]), _mm512_unpackhi_epi64(t0[k], t1[k]));
        u = _mm512_add_epi32(u, _mm512_shuffle_i32x4(u, u, _MM_SHUFFLE(1, 0, 3, 2)));
        u = _mm512_add_epi32(u, _mm512_shuffle_i32x4(u, u, _MM_SHUFFLE(2, 3, 0, 1)));
        const __m128i tb = _mm512_castsi512_si128(u);
        const __m128 s = _mm_mul_ps(_mm_loadu_ps(sc[k] + 2 * p), dw);
        a[k] = _mm_fmadd_ps(s, _mm_cvtepi32_ps(tb), a[k]);
    }
}

// The rest of a row from pair p (an odd last pair or nothing), then its results.
template <int C, bool K2>
DS4_VBMI inline void finish_row(const Tables &T, const uint8_t *wr, int64_t p, int64_t np, int64_t nb,
                                const uint8_t *const *xc, const float *const *sc, const __m128 *a, float *const *out,
                                int64_t r) {
    constexpr int64_t kBlock = sizeof(BlockIQ2_XXS);
    alignas(16) float al[C][4];
    for (int k = 0; k < C; ++k) _mm_store_ps(al[k], a[k]);
    if (p < np) {   // an odd last pair: slots 0 and 1
        const uint8_t *wp = wr + p * 2 * kBlock;
        const bool two = 2 * p + 1 < nb;
        __m512i tt[1][C];
        pair_sums<C, 1, K2>(T, wp, &two, xc, p, tt);
        const __m512i *t0 = tt[0];
        uint16_t ha, hb = 0;
        std::memcpy(&ha, wp, 2);
        if (two) std::memcpy(&hb, wp + kBlock, 2);
        for (int k = 0; k < C; ++k) {
            // even dwords: the first block's groups, odd: the second's
            __m512i t = _mm512_add_epi32(t0[k], _mm512_shuffle_epi32(t0[k], _MM_PERM_BADC));
            t = _mm512_add_epi32(t, _mm512_shuffle_i32x4(t, t, _MM_SHUFFLE(1, 0, 3, 2)));
            t = _mm512_add_epi32(t, _mm512_shuffle_i32x4(t, t, _MM_SHUFFLE(2, 3, 0, 1)));
            al[k][0] = std::fma(sc[k][2 * p] * f16_to_f32_fast(ha), float(_mm512_cvtsi512_si32(t)), al[k][0]);
            if (two) {
                const int32_t tb = _mm_extract_epi32(_mm512_castsi512_si128(t), 1);
                al[k][1] = std::fma(sc[k][2 * p + 1] * f16_to_f32_fast(hb), float(tb), al[k][1]);
            }
        }
    }
    for (int k = 0; k < C; ++k) out[k][r] = (al[k][0] + al[k][2]) + (al[k][1] + al[k][3]);
}

// Rows r and r + half side by side, four blocks of each in turn, so one core's weight reads
// come from two streams far apart, which the hardware prefetchers follow side by side. With
// one stream this kernel waited on memory even with its software prefetch (it keeps the core
// too busy for the out-of-order window to run far ahead): from memory on a Sapphire Rapids
// VM one stream ran 9.8-10.1 GB/s (76-77% of a plain read), two 10.7-11.3 (80-84%), at the
// same speed from L1.
template <int C, bool K2>
DS4_VBMI void rows_cols(const uint8_t *w, size_t w_stride, int64_t n_rows, const uint8_t *const *xc,
                        const float *const *sc, int64_t nb, float *const *out) {
    const Tables &T = tables();
    const int64_t np = (nb + 1) / 2;
    const int64_t half = n_rows / 2;
    for (int64_t r = 0; r < half; ++r) {
        const uint8_t *wa = w + size_t(r) * w_stride, *wb = w + size_t(r + half) * w_stride;
        __m128 a[C], b[C];
        for (int k = 0; k < C; ++k) a[k] = b[k] = _mm_setzero_ps();
        int64_t p = 0;
        for (; p + 2 <= np; p += 2) {
            four_blocks<C, K2>(T, wa, p, nb, xc, sc, a);
            four_blocks<C, K2>(T, wb, p, nb, xc, sc, b);
        }
        finish_row<C, K2>(T, wa, p, np, nb, xc, sc, a, out, r);
        finish_row<C, K2>(T, wb, p, np, nb, xc, sc, b, out, r + half);
    }
    for (int64_t r = 2 * half; r < n_rows; ++r) {   // the odd row left
        const uint8_t *wr = w + size_t(r) * w_stride;
        __m128 a[C];
        for (int k = 0; k < C; ++k) a[k] = _mm_setzero_ps();
        int64_t p = 0;
        for (; p + 2 <= np; p += 2) four_blocks<C, K2>(T, wr, p, nb, xc, sc, a);
        finish_row<C, K2>(T, wr, p, np, nb, xc, sc, a, out, r);
    }
}

}  // namespace

bool vbmi_available() {
    return vnni_available() && __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("gfni");
}

bool &vbmi_enabled() {
    static bool on = [] {
        if (const char *e = std::getenv("DS4_NO_VBMI"); e && *e && *e != '0') return false;
        return vbmi_available();
    }();
    return on;
}

bool &iq2_xxs_two_source_permutes() {
    static bool on = [] {
        if (const char *e = std::getenv("DS4_IQ2_PERMUTES"); e && *e) return std::strcmp(e, "two") == 0;
        return bool(__builtin_cpu_is("amd"));
    }();
    return on;
}

uint64_t iq2_xxs_pack_bytes(int64_t n, int64_t n_cols) { return col_bytes(n) * uint64_t(n_cols); }

void iq2_xxs_pack(const void *x, size_t x_row_stride, int64_t n, int64_t c0, int64_t c1, uint8_t *dst) {
    const uint64_t cb = col_bytes(n);
    for (int64_t c = c0; c < c1; ++c)
        pack_col(reinterpret_cast<const BlockQ8_K *>(static_cast<const uint8_t *>(x) + size_t(c) * x_row_stride),
                 n / kQK_K, dst + uint64_t(c) * cb);
}

void iq2_xxs_tile_packed(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *packed, int64_t n_cols,
                         int64_t n, float *out, size_t out_col_stride) {
    const uint64_t cb = col_bytes(n);
    const int64_t nb = n / kQK_K, np = pairs_of(n);
    // Column groups of up to 4 outer, as vec_dot_tile: the group's activations stay in L1.
    for (int64_t c0 = 0; c0 < n_cols; c0 += kMaxCols) {
        const int nc = int(std::min<int64_t>(kMaxCols, n_cols - c0));
        const uint8_t *xc[kMaxCols];
        const float *sc[kMaxCols];
        float *o[kMaxCols];
        for (int k = 0; k < nc; ++k) {
            xc[k] = packed + uint64_t(c0 + k) * cb;
            sc[k] = reinterpret_cast<const float *>(xc[k] + np * kPairBytes);
            o[k] = out + size_t(c0 + k) * out_col_stride;
        }
        if (iq2_xxs_two_source_permutes())
            switch (nc) {
                case 1: rows_cols<1, true>(w, w_row_stride, n_rows, xc, sc, nb, o); break;
                case 2: rows_cols<2, true>(w, w_row_stride, n_rows, xc, sc, nb, o); break;
                case 3: rows_cols<3, true>(w, w_row_stride, n_rows, xc, sc, nb, o); break;
                default: rows_cols<4, true>(w, w_row_stride, n_rows, xc, sc, nb, o); break;
            }
        else
            switch (nc) {
                case 1: rows_cols<1, false>(w, w_row_stride, n_rows, xc, sc, nb, o); break;
                case 2: rows_cols<2, false>(w, w_row_stride, n_rows, xc, sc, nb, o); break;
                case 3: rows_cols<3, false>(w, w_row_stride, n_rows, xc, sc, nb, o); break;
                default: rows_cols<4, false>(w, w_row_stride, n_rows, xc, sc, nb, o); break;
            }
    }
}

}  // namespace ds4::quant::detail
