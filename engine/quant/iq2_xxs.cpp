// IQ2_XXS: 256 elements, f16 d; per 32: four 8-element grid points (magnitudes from a
// 256-entry codebook), 4 x 7 sign bits (8th implied by even parity) and a 4-bit scale.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "engine/quant/blocks.h"
#include "engine/quant/half.h"
#include "engine/quant/iq2xxs_tables.h"
#include "engine/quant/kernels.h"
#include "engine/quant/kquant_fit.h"
#include "engine/quant/simd.h"

namespace ds4::quant::detail {
namespace {

// Codebook transposed to floats for the quantizer's search: g[j][k] = magnitude of
// element j in entry k; gg[k] = |entry k|^2.
struct GridF {
    float g[8][256];
    float gg[256];
    GridF() {
        for (int k = 0; k < 256; ++k) {
            gg[k] = 0;
            for (int j = 0; j < 8; ++j) {
                g[j][k] = float(uint8_t(kIq2xxsGrid[k] >> (8 * j)));
                gg[k] += g[j][k] * g[j][k];
            }
        }
    }
};
const GridF &grid_f() {
    static const GridF g;
    return g;
}

// One group of 8: sign-folded targets and their correlation with every grid entry.
struct Group8 {
    float ag[256];
    uint8_t s7;
};

void prepare_group(const float *x, Group8 *g) {
    const GridF &G = grid_f();
    float a[8];
    uint32_t neg = 0;
    int jmin = 0;
    for (int j = 0; j < 8; ++j) {
        a[j] = std::fabs(x[j]);
        if (x[j] < 0) neg |= 1u << j;
        if (a[j] < a[jmin]) jmin = j;
    }
    if (__builtin_popcount(neg) & 1) {
        // odd count of negatives is not encodable: flip the smallest value's sign
        neg ^= 1u << jmin;
        a[jmin] = -a[jmin];
    }
    g->s7 = uint8_t(neg & 127);
    for (int k = 0; k < 256; ++k) g->ag[k] = 0;
    for (int j = 0; j < 8; ++j)
        for (int k = 0; k < 256; ++k) g->ag[k] += a[j] * G.g[j][k];
}

// Best entry for a group at scale s (> 0): minimises s^2*gg - 2*s*ag (first index on
// ties). Returns that error term (without the constant sum of squares) and the index.
inline float best_entry(const Group8 &g, float s, int *idx) {
    const GridF &G = grid_f();
    const __m256 vs = _mm256_set1_ps(s), two = _mm256_set1_ps(2.f);
    __m256 best = _mm256_set1_ps(INFINITY);
    __m256i bidx = _mm256_setzero_si256(), k = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i eight = _mm256_set1_epi32(8);
    for (int j = 0; j < 256; j += 8) {
        const __m256 e = _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(G.gg + j), vs),
                                       _mm256_mul_ps(two, _mm256_loadu_ps(g.ag + j)));
        const __m256 lt = _mm256_cmp_ps(e, best, _CMP_LT_OQ);
        best = _mm256_blendv_ps(best, e, lt);
        bidx = _mm256_blendv_epi8(bidx, k, _mm256_castps_si256(lt));
        k = _mm256_add_epi32(k, eight);
    }
    alignas(32) float bv[8];
    alignas(32) int bi[8];
    _mm256_store_ps(bv, best);
    _mm256_store_si256(reinterpret_cast<__m256i *>(bi), bidx);
    int l = 0;
    for (int i = 1; i < 8; ++i)
        if (bv[i] < bv[l] || (bv[i] == bv[l] && bi[i] < bi[l])) l = i;
    *idx = bi[l];
    return bv[l] * s;
}

float group32_error(const Group8 *g, float s, int *idx) {
    float e = 0;
    for (int l = 0; l < 4; ++l) e += best_entry(g[l], s, &idx[l]);
    return e;
}

// Continuous scale for a 32-group: coarse search, then alternate least-squares refits.
float fit_group32(const Group8 *g, float amax) {
    const GridF &G = grid_f();
    float best_s = 0, best_e = 0;
    int idx[4];
    for (int c = 0; c < 20; ++c) {
        // amax lands on grid value 7..48 (the grid's levels are 8, 25, 43)
        const float s = amax / (7.f * std::pow(48.f / 7.f, c / 19.f));
        const float e = group32_error(g, s, idx);
        if (c == 0 || e < best_e) {
            best_e = e;
            best_s = s;
        }
    }
    for (int it = 0; it < 3; ++it) {
        group32_error(g, best_s, idx);
        double num = 0, den = 0;
        for (int l = 0; l < 4; ++l) {
            num += g[l].ag[idx[l]];
            den += G.gg[idx[l]];
        }
        if (!(num > 0)) break;
        const float s = float(num / den);
        const float e = group32_error(g, s, idx);
        if (!(e < best_e)) break;
        best_e = e;
        best_s = s;
    }
    return best_s;
}

}  // namespace

// No importance matrix: plain squared error. Sign parity is fixed by flipping the
// smallest magnitude in each group of 8; the grid search is exhaustive per group; each
// 32-group's scale comes from a 20-point search plus least-squares refits, then the 4-bit
// level is chosen among the 3 nearest. Quality on Gaussian data: rel-RMSE 0.330 (ggml's
// quantize_iq2_xxs with a uniform importance matrix: 0.344). About 4 M weights/s/thread.
void quant_iq2_xxs(const float *src, void *dst, int64_t n) {
    BlockIQ2_XXS *y = static_cast<BlockIQ2_XXS *>(dst);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        float x[kQK_K], s32[8];
        Group8 groups[32];
        sanitize(src + b * kQK_K, x, kQK_K);
        std::memset(&y[b], 0, sizeof(BlockIQ2_XXS));
        float smax = 0;
        for (int ib = 0; ib < 8; ++ib) {
            float amax = 0;
            for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[32 * ib + i]));
            for (int l = 0; l < 4; ++l) prepare_group(x + 32 * ib + 8 * l, &groups[4 * ib + l]);
            s32[ib] = amax > 0 ? fit_group32(groups + 4 * ib, amax) : 0.f;
            smax = std::max(smax, s32[ib]);
        }
        if (!(smax > 0)) continue;
        // the largest group scale gets the top 4-bit level: s = d * (2*15 + 1) / 8
        y[b].d = f32_to_f16_fast(std::min(smax * 8.f / 31.f, 65504.f));
        const float d = f16_to_f32_fast(y[b].d);
        if (!(d > 0)) {
            y[b].d = 0;
            continue;
        }
        for (int ib = 0; ib < 8; ++ib) {
            const int ls0 = std::clamp(nearest_int((8.f * s32[ib] / d - 1.f) / 2.f), 0, 15);
            int best_ls = ls0, best_idx[4] = {0, 0, 0, 0};
            float best_e = 0;
            bool first = true;
            for (int ls = std::max(0, ls0 - 1); ls <= std::min(15, ls0 + 1); ++ls) {
                int idx[4];
                const float e = group32_error(groups + 4 * ib, d * float(2 * ls + 1) / 8.f, idx);
                if (first || e < best_e) {
                    first = false;
                    best_e = e;
                    best_ls = ls;
                    std::copy(idx, idx + 4, best_idx);
                }
            }
            uint32_t aux[2] = {0, uint32_t(best_ls) << 28};
            for (int l = 0; l < 4; ++l) {
                aux[0] |= uint32_t(best_idx[l]) << (8 * l);
                aux[1] |= uint32_t(groups[4 * ib + l].s7) << (7 * l);
            }
            std::memcpy(y[b].qs + 4 * ib, aux, 8);
        }
    }
}

void dequant_iq2_xxs(const void *src, float *dst, int64_t n) {
    const BlockIQ2_XXS *x = static_cast<const BlockIQ2_XXS *>(src);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float d = f16_to_f32_fast(x[b].d);
        float *y = dst + b * kQK_K;
        for (int ib = 0; ib < 8; ++ib) {
            uint32_t aux[2];
            std::memcpy(aux, x[b].qs + 4 * ib, 8);
            const float db = d * (0.5f + float(aux[1] >> 28)) * 0.25f;
            for (int l = 0; l < 4; ++l) {
                const uint64_t g = kIq2xxsGrid[(aux[0] >> (8 * l)) & 255];
                const uint8_t s = iq2_signs_from7((aux[1] >> (7 * l)) & 127);
                for (int j = 0; j < 8; ++j)
                    y[j] = db * float(uint8_t(g >> (8 * j))) * ((s >> j) & 1 ? -1.f : 1.f);
                y += 8;
            }
        }
    }
}

namespace {

// pshufb tables: parity of a nibble in bit 7; sign-byte expansion (group l of a 32-group
// -> 8 bytes) for the four 32-groups held in one 128-bit lane; bit j of each byte.
alignas(32) constexpr uint8_t kNibbleParity[32] = {0, 128, 128, 0, 128, 0, 0, 128, 128, 0, 0, 128, 0, 128, 128, 0,
                                                   0, 128, 128, 0, 128, 0, 0, 128, 128, 0, 0, 128, 0, 128, 128, 0};
struct Expand {
    alignas(32) uint8_t c[4][32];
    constexpr Expand() : c() {
        for (int g = 0; g < 4; ++g)
            for (int i = 0; i < 32; ++i) c[g][i] = uint8_t(4 * g + i / 8);
    }
};
constexpr Expand kExpand;
alignas(32) constexpr uint8_t kBit[32] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128,
                                          1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};

// The float steps of every IQ2_XXS kernel (the packed one in iq2_xxs_packed.cpp too): each
// block's exact integer dot T (scales applied), a[b % 4] += s * T with s = (d_x / 8) * d_w,
// result (a0 + a2) + (a1 + a3). So a result does not depend on the kernel or the columns.
inline void block_step(float s, int32_t t, float &a) { a = std::fma(s, float(t), a); }
inline float block_sum(const float *a) { return (a[0] + a[2]) + (a[1] + a[3]); }

inline __m256i load32(const uint8_t *p) { return _mm256_load_si256(reinterpret_cast<const __m256i *>(p)); }

// All 8 sign/scale words of a block at once. Returns the sign bytes (4 per 32-group, bit 7
// = parity) and the multipliers 2*scale+1 (in both 16-bit halves of a 32-bit lane), in
// 32-group order (0, 1, 4, 5 | 2, 3, 6, 7), the order of the odd-word shuffle.
inline void decode_signs_scales(const BlockIQ2_XXS &wb, __m256i *sg_out, __m256i *sc_out) {
    const __m256i parity = load32(kNibbleParity);
    const __m256i m7 = _mm256_set1_epi32(127), m4 = _mm256_set1_epi8(15);
    const __m256i q0 = simd::loadu(wb.qs), q1 = simd::loadu(wb.qs + 16);
    const __m256i a1 = _mm256_castps_si256(
        _mm256_shuffle_ps(_mm256_castsi256_ps(q0), _mm256_castsi256_ps(q1), _MM_SHUFFLE(3, 1, 3, 1)));
    __m256i sg = _mm256_and_si256(a1, m7);
    sg = _mm256_or_si256(sg, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(a1, 7), m7), 8));
    sg = _mm256_or_si256(sg, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(a1, 14), m7), 16));
    sg = _mm256_or_si256(sg, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(a1, 21), m7), 24));
    sg = _mm256_or_si256(sg, _mm256_xor_si256(_mm256_shuffle_epi8(parity, _mm256_and_si256(sg, m4)),
                                              _mm256_shuffle_epi8(parity, _mm256_and_si256(_mm256_srli_epi16(sg, 4), m4))));
    __m256i scv = _mm256_srli_epi32(a1, 28);
    scv = _mm256_add_epi32(_mm256_add_epi32(scv, scv), _mm256_set1_epi32(1));
    *sg_out = sg;
    *sc_out = _mm256_or_si256(scv, _mm256_slli_epi32(scv, 16));
}

template <int C>
void dot_cols(const uint8_t *wv, const void *const *xv, int64_t n, float *out) {
    const BlockIQ2_XXS *w = reinterpret_cast<const BlockIQ2_XXS *>(wv);
    const BlockQ8_K *x[C];
    float acc[C][4] = {};
    for (int c = 0; c < C; ++c) x[c] = static_cast<const BlockQ8_K *>(xv[c]);
    const long long *grid = reinterpret_cast<const long long *>(kIq2xxsGrid);
    const __m256i bit = load32(kBit), one8 = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        simd::prefetch_ahead(w + b);
        const BlockIQ2_XXS &wb = w[b];
        __m256i sg, scv;
        decode_signs_scales(wb, &sg, &scv);
        const __m256i sg_lo = _mm256_permute2x128_si256(sg, sg, 0x00), sg_hi = _mm256_permute2x128_si256(sg, sg, 0x11);
        const __m256i sc_lo = _mm256_permute2x128_si256(scv, scv, 0x00), sc_hi = _mm256_permute2x128_si256(scv, scv, 0x11);
        const uint8_t *idx = reinterpret_cast<const uint8_t *>(wb.qs);
        if constexpr (C == 1) {
            // Decode (one activation row): each 32-group decoded where it is used, so nothing
            // of the block is kept in (spilled) arrays. Same integer sums in the same lanes.
            const int8_t *xq = x[0][b].qs;
            auto group = [&](int ib, __m256i sgv, __m256i scale, int slot) {
                const __m256i gv =
                    _mm256_set_epi64x(grid[idx[8 * ib + 3]], grid[idx[8 * ib + 2]], grid[idx[8 * ib + 1]], grid[idx[8 * ib]]);
                const __m256i sb = _mm256_shuffle_epi8(sgv, load32(kExpand.c[slot]));
                const __m256i smv = _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(sb, bit), bit), one8);
                return _mm256_madd_epi16(_mm256_maddubs_epi16(gv, _mm256_sign_epi8(simd::loadu(xq + 32 * ib), smv)), scale);
            };
            __m256i sum0 = group(0, sg_lo, _mm256_shuffle_epi32(sc_lo, 0x00), 0);
            __m256i sum1 = group(1, sg_lo, _mm256_shuffle_epi32(sc_lo, 0x55), 1);
            sum0 = _mm256_add_epi32(sum0, group(2, sg_hi, _mm256_shuffle_epi32(sc_hi, 0x00), 0));
            sum1 = _mm256_add_epi32(sum1, group(3, sg_hi, _mm256_shuffle_epi32(sc_hi, 0x55), 1));
            sum0 = _mm256_add_epi32(sum0, group(4, sg_lo, _mm256_shuffle_epi32(sc_lo, 0xaa), 2));
            sum1 = _mm256_add_epi32(sum1, group(5, sg_lo, _mm256_shuffle_epi32(sc_lo, 0xff), 3));
            sum0 = _mm256_add_epi32(sum0, group(6, sg_hi, _mm256_shuffle_epi32(sc_hi, 0xaa), 2));
            sum1 = _mm256_add_epi32(sum1, group(7, sg_hi, _mm256_shuffle_epi32(sc_hi, 0xff), 3));
            block_step(0.125f * x[0][b].d * f16_to_f32_fast(wb.d), simd::hsum_i32(_mm256_add_epi32(sum0, sum1)),
                       acc[0][b & 3]);
            continue;
        }
        // Each 32-group decoded (grid magnitudes, sign multipliers +-1, scale) and used by every
        // column before the next: decoded for the whole block first, the 24 registers of it
        // spilled. The block's integer sums are exact, so their order does not matter.
        __m256i sum[C];
        for (int c = 0; c < C; ++c) sum[c] = _mm256_setzero_si256();
        auto group = [&](int ib, __m256i sgv, __m256i scale, int slot) {
            const __m256i g =
                _mm256_set_epi64x(grid[idx[8 * ib + 3]], grid[idx[8 * ib + 2]], grid[idx[8 * ib + 1]], grid[idx[8 * ib]]);
            const __m256i sb = _mm256_shuffle_epi8(sgv, load32(kExpand.c[slot]));
            const __m256i sm = _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(sb, bit), bit), one8);
            for (int c = 0; c < C; ++c) {
                const __m256i p = _mm256_maddubs_epi16(g, _mm256_sign_epi8(simd::loadu(x[c][b].qs + 32 * ib), sm));
                sum[c] = _mm256_add_epi32(sum[c], _mm256_madd_epi16(p, scale));
            }
        };
        group(0, sg_lo, _mm256_shuffle_epi32(sc_lo, 0x00), 0);
        group(1, sg_lo, _mm256_shuffle_epi32(sc_lo, 0x55), 1);
        group(2, sg_hi, _mm256_shuffle_epi32(sc_hi, 0x00), 0);
        group(3, sg_hi, _mm256_shuffle_epi32(sc_hi, 0x55), 1);
        group(4, sg_lo, _mm256_shuffle_epi32(sc_lo, 0xaa), 2);
        group(5, sg_lo, _mm256_shuffle_epi32(sc_lo, 0xff), 3);
        group(6, sg_hi, _mm256_shuffle_epi32(sc_hi, 0xaa), 2);
        group(7, sg_hi, _mm256_shuffle_epi32(sc_hi, 0xff), 3);
        const float dw = f16_to_f32_fast(wb.d);
        for (int c = 0; c < C; ++c)
            block_step(0.125f * x[c][b].d * dw, simd::hsum_i32(sum[c]), acc[c][b & 3]);
    }
    for (int c = 0; c < C; ++c) out[c] = block_sum(acc[c]);
}


// AVX-512 (F/BW/VL/DQ) variant: two 32-groups per register, the sign bytes used directly as
// a 64-bit negation mask. Integer sums are folded back to the AVX2 lane layout before
// the float steps, so results are bit-identical to dot_cols.
#define DS4_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
// GCC 12 flags the intrinsics' own undefined-upper-half temporaries.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// Grid entries i[0..3] and i[8..11] in the eight 64-bit lanes, with one gather: the kernel
// is bound by its uop count, and building the vector from 64-bit loads and inserts (or
// merge-masked broadcasts) cost more. Measured on an Emerald Rapids VM: 4.7-4.9 against
// 4.4-4.5 GB/s from cache. (Cores with the Downfall microcode fix gather slowly; none was
// at hand to measure.)
DS4_AVX512 inline __m512i grid8(const long long *grid, const uint8_t *i) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i *>(i));
    const __m128i pick = _mm_shuffle_epi8(raw, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, -1, -1, -1, -1, -1, -1, -1, -1));
    return _mm512_i32gather_epi64(_mm256_cvtepu8_epi32(pick), grid, 8);
}

template <int C>
DS4_AVX512 void dot_cols_avx512(const uint8_t *wv, const void *const *xv, int64_t n, float *out) {
    const BlockIQ2_XXS *w = reinterpret_cast<const BlockIQ2_XXS *>(wv);
    const BlockQ8_K *x[C];
    float acc[C][4] = {};
    for (int c = 0; c < C; ++c) x[c] = static_cast<const BlockQ8_K *>(xv[c]);
    const long long *grid = reinterpret_cast<const long long *>(kIq2xxsGrid);
    const __m512i zero = _mm512_setzero_si512();
    // lanes of the decoded scale vector holding 32-groups (2p, 2p+1), each spread over 8 lanes
    const __m512i pick[4] = {
        _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
        _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5),
        _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3),
        _mm512_setr_epi32(6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7)};
    // byte offset of the sign bytes of 32-groups (2p, 2p+1) in the decoded sign vector
    constexpr int kSignOff[4] = {0, 16, 8, 24};
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        simd::prefetch_ahead(w + b);
        const BlockIQ2_XXS &wb = w[b];
        __m256i sg, scv;
        decode_signs_scales(wb, &sg, &scv);
        alignas(32) uint8_t sgb[32];
        _mm256_store_si256(reinterpret_cast<__m256i *>(sgb), sg);
        const __m512i sc512 = _mm512_zextsi256_si512(scv);
        const uint8_t *idx = reinterpret_cast<const uint8_t *>(wb.qs);
        __m512i g[4], sc[4];
        __mmask64 neg[4];
        for (int p = 0; p < 4; ++p) {
            g[p] = grid8(grid, idx + 16 * p);
            sc[p] = _mm512_permutexvar_epi32(pick[p], sc512);
            uint64_t m;
            std::memcpy(&m, sgb + kSignOff[p], 8);
            neg[p] = _cvtu64_mask64(m);
        }
        const float dw = f16_to_f32_fast(wb.d);
        for (int c = 0; c < C; ++c) {
            const int8_t *xq = x[c][b].qs;
            __m512i sum = _mm512_setzero_si512();
            for (int p = 0; p < 4; ++p) {
                const __m512i xv = _mm512_loadu_si512(xq + 64 * p);
                const __m512i xs = _mm512_mask_sub_epi8(xv, neg[p], zero, xv);
                sum = _mm512_add_epi32(sum, _mm512_madd_epi16(_mm512_maddubs_epi16(g[p], xs), sc[p]));
            }
            const __m256i s256 = _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64(sum, 1));
            block_step(0.125f * x[c][b].d * dw, simd::hsum_i32(s256), acc[c][b & 3]);
        }
    }
    for (int c = 0; c < C; ++c) out[c] = block_sum(acc[c]);
}

#pragma GCC diagnostic pop

}  // namespace

void dot_iq2_xxs(const uint8_t *w, const void *const *x, int ncols, int64_t n, float *out) {
    if (avx512_enabled()) {
        DS4_QUANT_COLS_DISPATCH(dot_cols_avx512, w, x, n, out)
    } else {
        DS4_QUANT_WIDE_COLS_DISPATCH(dot_cols, w, x, n, out)
    }
}

int iq2_xxs_max_cols() { return avx512_enabled() ? kMaxCols : kWideCols; }

}  // namespace ds4::quant::detail
