// Q8_0 products against many activation rows on AVX-512 VNNI: the columns sit in the
// 16 lanes of a register, so one vpdpbusd multiplies a 4-byte slice of a weight row
// (broadcast) by the same slice of 16 activation rows, and a block's 8 slices sum to the
// exact integer block dots of 16 columns with no horizontal work. The float steps are the
// ones of dot_q8_0 (q8_0.cpp) lane for lane, so every result is bit-identical to vec_dot.
//
// vpdpbusd multiplies unsigned by signed bytes. The activations are the unsigned side,
// packed as x + 128, and the weights the signed side as they are, so a weight slice is a
// bare broadcast load and the tile's ALU ports (0 and 5 on Intel, the ones vpdpbusd needs)
// do nothing but the products and the float steps. x + 128 adds 128 * sum(w) to a block
// dot: a number per weight row and block, the same for every column. A short pass over each
// four rows' blocks works it out (and converts the rows' f16 scales) before their first
// column group, and the later groups reuse it, so the accumulator starts at minus that and
// the integer that comes out is exact. Before, the weights were the unsigned side (w ^ 0x80
// on each broadcast slice, the correction from the activations' block sums): that xor took
// one ALU op per broadcast, a fifth of the ports at four rows by 48 columns.
//
// From 17 columns, two or three groups go together (rows_xg): each broadcast weight slice
// then feeds two or three vpdpbusd instead of one, which matters where loads bound the
// kernel (Zen 5).
//
// Up to 8 columns (batched decode) take a narrow layout that keeps the lanes full: lane
// 2c + h holds column c's 4-byte slice 2s + h, so one vpdpbusd takes 8 weight bytes
// (broadcast as a pair of slices) against 8 columns; a permute of two rows' results adds
// each lane pair into one exact block dot per (row, column).
#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/quant/blocks.h"
#include "engine/quant/cache_aligned.h"
#include "engine/quant/half.h"
#include "engine/quant/kernels.h"
#include "engine/quant/q8_0_panel.h"
#include "engine/quant/simd.h"

namespace ds4::quant::detail {

namespace {

// Narrow layout, per block: 4 slice pairs x 16 lanes x 4 bytes, then the 8 scales and the 8
// corrections, each twice, in the results' lane order (lane 2c + r: column c, row r of a pair).
constexpr int kNarrowCols = 8;
constexpr int64_t kNarrowScaleOff = 4 * kSliceBytes;
constexpr int64_t kNarrowCorrOff = kNarrowScaleOff + kPackCols * 4;
constexpr int64_t kNarrowBlockBytes = kNarrowCorrOff + kPackCols * 4;

#define DS4_VNNI512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
// GCC 12 warns about the undefined pass-through operand inside its AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

inline uint32_t load_u32(const int8_t *p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

inline uint64_t load_u64(const int8_t *p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}

// A weight slice of 4 bytes in every lane, signed (the wide layout); of 8 bytes in every lane
// pair, made unsigned (the narrow layout).
DS4_VNNI512 inline __m512i weight_slice(const int8_t *p) { return _mm512_set1_epi32(int(load_u32(p))); }
DS4_VNNI512 inline __m512i weight_slice_pair(const int8_t *p) {
    return _mm512_xor_si512(_mm512_set1_epi64(int64_t(load_u64(p))), _mm512_set1_epi32(int(0x80808080u)));
}

// Pull [pf, pf_end) into L2 three lines at a time (see tile_wide).
inline void prefetch_some(const uint8_t *&pf, const uint8_t *pf_end) {
    for (int i = 0; i < 3 && pf < pf_end; ++i, pf += 64) _mm_prefetch(reinterpret_cast<const char *>(pf), _MM_HINT_T1);
}

// (a0 + a2) + (a1 + a3): the four chains summed in dot_q8_0's order.
DS4_VNNI512 inline __m512 sum_chains(const __m512 *a) {
    return _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]));
}

// block(b, k) for b = 0..nb-1 in order, k = b % 4 (the chain block b feeds): the inner
// loop unrolls, so k is a constant in each copy and the chains stay in registers.
template <class F>
DS4_VNNI512 inline void for_blocks(int64_t nb, F &&block) {
    for (int64_t b0 = 0; b0 < nb; b0 += 4) {
        const int nt = int(std::min<int64_t>(4, nb - b0));
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
            if (k >= nt) break;
            block(b0 + k, k);
        }
    }
}

// Rows w[0..3] over nb blocks to side[0..nb). The byte sums: one vpdpbusd against bytes of
// 128 puts 128 times each 4-byte slice sum of two rows' blocks into the 16 lanes; pairs of
// lanes are added across two permutes, then within each 128-bit lane (one a row).
DS4_VNNI512 void row_side(const BlockQ8_0 *const *w, int64_t nb, RowSide *side) {
    const __m512i c128 = _mm512_set1_epi8(char(0x80));
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __m512i pick = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int64_t b = 0; b < nb; ++b) {
        const __m512i w01 = _mm512_inserti64x4(_mm512_castsi256_si512(simd::loadu(w[0][b].qs)), simd::loadu(w[1][b].qs), 1);
        const __m512i w23 = _mm512_inserti64x4(_mm512_castsi256_si512(simd::loadu(w[2][b].qs)), simd::loadu(w[3][b].qs), 1);
        const __m512i s01 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, w01);
        const __m512i s23 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, w23);
        // 128-bit lane r: four pair sums of row r, then their total in all four
        __m512i t = _mm512_add_epi32(_mm512_permutex2var_epi32(s01, even, s23), _mm512_permutex2var_epi32(s01, odd, s23));
        t = _mm512_add_epi32(t, _mm512_shuffle_epi32(t, _MM_PERM_BADC));
        t = _mm512_add_epi32(t, _mm512_shuffle_epi32(t, _MM_PERM_CDAB));
        const __m512i neg = _mm512_sub_epi32(_mm512_setzero_si512(), t);
        _mm_store_si128(reinterpret_cast<__m128i *>(side[b].corr), _mm512_castsi512_si128(_mm512_permutexvar_epi32(pick, neg)));
        _mm_store_ps(side[b].dw, row_scales4(w, b));
    }
}

// R weight rows against one packed group of 16 columns; out[r] holds row r's 16 results.
// pf..pf_end: weights to pull into L2 meanwhile (the next rows, on the first pass over a
// row block, when they still come from memory); three lines a block covers 4 rows.
template <int R>
DS4_VNNI512 inline void rows_x16(const BlockQ8_0 *const *w, const RowSide *side, const uint8_t *panel, int64_t nb,
                                 const uint8_t *pf, const uint8_t *pf_end, __m512 *out) {
    __m512 acc[R][4];
    for (int r = 0; r < R; ++r)
        for (int k = 0; k < 4; ++k) acc[r][k] = _mm512_setzero_ps();
    for_blocks(nb, [&](int64_t b, int k) DS4_VNNI512 {
        const uint8_t *pb = panel + b * kGroupBlockBytes;
        prefetch_some(pf, pf_end);
        // Two integer chains a row (even and odd slices): eight dependent vpdpbusd a
        // block would leave the units waiting on their latency.
        __m512i dot[R][2];
        for (int r = 0; r < R; ++r) {
            dot[r][0] = _mm512_set1_epi32(side[b].corr[r]);
            dot[r][1] = _mm512_setzero_si512();
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
            const __m512i x = _mm512_loadu_si512(pb + j * kSliceBytes);
            for (int r = 0; r < R; ++r)
                dot[r][j & 1] = _mm512_dpbusd_epi32(dot[r][j & 1], x, weight_slice(w[r][b].qs + 4 * j));
        }
        const __m512 dx = _mm512_loadu_ps(pb + kScaleOff);
        for (int r = 0; r < R; ++r)
            acc[r][k] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(side[b].dw[r]), dx),
                                        _mm512_cvtepi32_ps(_mm512_add_epi32(dot[r][0], dot[r][1])), acc[r][k]);
    });
    for (int r = 0; r < R; ++r) out[r] = sum_chains(acc[r]);
}

// R weight rows against G packed groups (16 G columns) at once: each broadcast weight slice
// feeds G vpdpbusd, where the one-group kernel makes a broadcast per vpdpbusd (on AMD Zen 5
// its loads, not its vpdpbusd, bound it). The R G outputs' four float chains do not fit the
// registers, so they live in ch (L1), chain k of row r, group g at (k * R + r) * G + g; the
// order of every float step is still dot_q8_0's.
template <int R, int G>
DS4_VNNI512 inline void rows_xg(const BlockQ8_0 *const *w, const RowSide *side, const uint8_t *panel,
                                uint64_t group_bytes, int64_t nb, const uint8_t *pf, const uint8_t *pf_end,
                                __m512 *ch) {
    for (int i = 0; i < 4 * R * G; ++i) ch[i] = _mm512_setzero_ps();
    for_blocks(nb, [&](int64_t b, int k) DS4_VNNI512 {
        const uint8_t *pb = panel + b * kGroupBlockBytes;
        prefetch_some(pf, pf_end);
        __m512i dot[R][G];   // one integer chain each: R G are in flight
        for (int r = 0; r < R; ++r) {
            const __m512i c = _mm512_set1_epi32(side[b].corr[r]);
            for (int g = 0; g < G; ++g) dot[r][g] = c;
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
            __m512i x[G];
            for (int g = 0; g < G; ++g) x[g] = _mm512_loadu_si512(pb + g * group_bytes + j * kSliceBytes);
            for (int r = 0; r < R; ++r) {
                const __m512i wv = weight_slice(w[r][b].qs + 4 * j);
                for (int g = 0; g < G; ++g) dot[r][g] = _mm512_dpbusd_epi32(dot[r][g], x[g], wv);
            }
        }
        __m512 dw[R];   // converted before the barriers below, which would make every use reload
        for (int r = 0; r < R; ++r) dw[r] = _mm512_set1_ps(side[b].dw[r]);
        for (int g = 0; g < G; ++g) {
            const __m512 dx = _mm512_loadu_ps(pb + g * group_bytes + kScaleOff);
            for (int r = 0; r < R; ++r) {
                float *a = reinterpret_cast<float *>(ch + (k * R + r) * G + g);
                // kept in memory: without the barrier GCC holds all the chains in registers and spills
                __asm__ volatile("" ::: "memory");
                _mm512_store_ps(a, _mm512_fmadd_ps(_mm512_mul_ps(dw[r], dx), _mm512_cvtepi32_ps(dot[r][g]),
                                                   _mm512_load_ps(a)));
            }
        }
    });
}

// Rows [r0, r0 + R) against G groups (the last with nc_last columns) to out (column-major).
template <int R, int G>
DS4_VNNI512 void rows_group(const uint8_t *w, size_t w_stride, int64_t r0, const RowSide *side, const uint8_t *panel,
                            uint64_t group_bytes, int64_t nb, int nc_last, float *out, size_t out_col_stride,
                            const uint8_t *pf, const uint8_t *pf_end) {
    const BlockQ8_0 *wr[R];
    for (int r = 0; r < R; ++r) wr[r] = reinterpret_cast<const BlockQ8_0 *>(w + size_t(r0 + r) * w_stride);
    alignas(64) __m512 res[R * G];   // row r, group g at r * G + g
    if constexpr (G == 1) {
        rows_x16<R>(wr, side, panel, nb, pf, pf_end, res);
    } else {
        alignas(64) __m512 ch[4 * R * G];
        rows_xg<R, G>(wr, side, panel, group_bytes, nb, pf, pf_end, ch);
        for (int i = 0; i < R * G; ++i)   // chain k at ch[k * R * G + i]
            res[i] = _mm512_add_ps(_mm512_add_ps(ch[i], ch[2 * R * G + i]), _mm512_add_ps(ch[R * G + i], ch[3 * R * G + i]));
    }
    if constexpr (R == 4) {
        // Four rows of a column are four consecutive floats of out: transposed in registers
        // and stored 16 bytes a column. A float at a time, the stores cost the in = 1024 q_b
        // product (32 blocks a row) 18% of its time.
        for (int g = 0; g < G; ++g) {
            const __m512 t0 = _mm512_unpacklo_ps(res[g], res[G + g]), t1 = _mm512_unpackhi_ps(res[g], res[G + g]);
            const __m512 t2 = _mm512_unpacklo_ps(res[2 * G + g], res[3 * G + g]);
            const __m512 t3 = _mm512_unpackhi_ps(res[2 * G + g], res[3 * G + g]);
            // u[k], 128-bit lane L: rows 0-3 of column 4L + k
            const __m512 u[4] = {_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t2))),
                                 _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t2))),
                                 _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t1), _mm512_castps_pd(t3))),
                                 _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t1), _mm512_castps_pd(t3)))};
            float *o = out + size_t(g * kPackCols) * out_col_stride + size_t(r0);
            const int nc = g + 1 < G ? kPackCols : nc_last;
            for (int c = 0; c < nc; ++c) {
                const __m512 v = u[c % 4];
                __m128 col;
                switch (c / 4) {
                    case 0: col = _mm512_castps512_ps128(v); break;
                    case 1: col = _mm512_extractf32x4_ps(v, 1); break;
                    case 2: col = _mm512_extractf32x4_ps(v, 2); break;
                    default: col = _mm512_extractf32x4_ps(v, 3); break;
                }
                _mm_storeu_ps(o + size_t(c) * out_col_stride, col);
            }
        }
    } else {
        for (int r = 0; r < R; ++r)
            for (int g = 0; g < G; ++g) {
                alignas(64) float v[kPackCols];
                _mm512_store_ps(v, res[r * G + g]);
                float *o = out + size_t(g * kPackCols) * out_col_stride + size_t(r0 + r);
                for (int i = 0, nc = g + 1 < G ? kPackCols : nc_last; i < nc; ++i) o[size_t(i) * out_col_stride] = v[i];
            }
    }
}

// Rows ahead of the narrow tile's three streams, pulled into L2 a line a block each (the
// rest at the end): the hardware prefetchers alone left one core short of its read rate.
struct NarrowPrefetch {
    const uint8_t *at[3] = {nullptr, nullptr, nullptr}, *end[3] = {nullptr, nullptr, nullptr};
    void step() {   // a line of each stream
        for (int s = 0; s < 3; ++s)
            if (at[s] < end[s]) {
                _mm_prefetch(reinterpret_cast<const char *>(at[s]), _MM_HINT_T1);
                at[s] += 64;
            }
    }
    void rest() {   // what the blocks left
        for (int s = 0; s < 3; ++s)
            for (; at[s] < end[s]; at[s] += 64) _mm_prefetch(reinterpret_cast<const char *>(at[s]), _MM_HINT_T1);
    }
};

// P pairs of weight rows (w[2p], w[2p + 1]) against the narrow panel of up to 8 columns;
// out[p] lane 2c + r holds row 2p + r's result for column c. The rows come as three streams
// (tile_narrow); pf pulls rows further on in each.
template <int P>
DS4_VNNI512 inline void pairs_x8(const BlockQ8_0 *const *w, const uint8_t *panel, int64_t nb, NarrowPrefetch &pf, __m512 *out) {
    // Lane 2c + r of a pair's sums: row r's column c, its halves from lanes 2c and 2c + 1.
    const __m512i even = _mm512_setr_epi32(0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    __m512 acc[P][4];
    for (int p = 0; p < P; ++p)
        for (int k = 0; k < 4; ++k) acc[p][k] = _mm512_setzero_ps();
    for_blocks(nb, [&](int64_t b, int k) DS4_VNNI512 {
        const uint8_t *pb = panel + b * kNarrowBlockBytes;
        pf.step();
        // Two integer chains a row (even and odd slice pairs).
        __m512i dot[2 * P][2];
        for (int q = 0; q < 2 * P; ++q) dot[q][0] = dot[q][1] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
            const __m512i x = _mm512_loadu_si512(pb + j * kSliceBytes);
            for (int q = 0; q < 2 * P; ++q)
                dot[q][j & 1] = _mm512_dpbusd_epi32(dot[q][j & 1], weight_slice_pair(w[q][b].qs + 8 * j), x);
        }
        const __m512 dx = _mm512_loadu_ps(pb + kNarrowScaleOff);
        const __m512i corr = _mm512_loadu_si512(pb + kNarrowCorrOff);
        for (int p = 0; p < P; ++p) {
            const __m512i a = _mm512_add_epi32(dot[2 * p][0], dot[2 * p][1]);
            const __m512i c = _mm512_add_epi32(dot[2 * p + 1][0], dot[2 * p + 1][1]);
            const __m512i sum = _mm512_add_epi32(
                _mm512_add_epi32(_mm512_permutex2var_epi32(a, even, c), _mm512_permutex2var_epi32(a, odd, c)), corr);
            // The pair's two f16 scales side by side in every lane pair, converted in one step.
            const uint32_t d2 = uint32_t(w[2 * p][b].d) | uint32_t(w[2 * p + 1][b].d) << 16;
            const __m512 dw = _mm512_cvtph_ps(_mm256_set1_epi32(int(d2)));
            acc[p][k] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(sum), acc[p][k]);
        }
    });
    for (int p = 0; p < P; ++p) out[p] = sum_chains(acc[p]);
    pf.rest();
}

// Row pairs starting at rows pr[0..P) (rows past n_rows repeat the last row and are not
// written).
template <int P>
DS4_VNNI512 void rows_narrow(const uint8_t *w, size_t w_stride, const int64_t *pr, int64_t n_rows, const uint8_t *panel,
                             int64_t nb, int nc, float *out, size_t out_col_stride, NarrowPrefetch &pf) {
    const BlockQ8_0 *wr[2 * P];
    for (int q = 0; q < 2 * P; ++q) {
        const int64_t r = std::min<int64_t>(pr[q / 2] + q % 2, n_rows - 1);
        wr[q] = reinterpret_cast<const BlockQ8_0 *>(w + size_t(r) * w_stride);
    }
    __m512 res[P];
    pairs_x8<P>(wr, panel, nb, pf, res);
    for (int p = 0; p < P; ++p) {
        alignas(64) float v[kPackCols];
        _mm512_store_ps(v, res[p]);
        for (int h = 0; h < 2; ++h) {
            const int64_t r = pr[p] + h;
            if (r >= n_rows) break;
            for (int c = 0; c < nc; ++c) out[size_t(c) * out_col_stride + size_t(r)] = v[2 * c + h];
        }
    }
}

void pack_narrow(const void *x, size_t x_row_stride, int nc, int64_t n, uint8_t *dst) {
    const int64_t nb = n / kQK8_0;
    for (int64_t b = 0; b < nb; ++b) {
        uint8_t *pb = dst + b * kNarrowBlockBytes;
        uint32_t slices[4 * kPackCols];
        float dx[kPackCols];
        int32_t corr[kPackCols];
        for (int c = 0; c < kNarrowCols; ++c) {
            const BlockQ8_0 *blk = c < nc ? &reinterpret_cast<const BlockQ8_0 *>(static_cast<const uint8_t *>(x) +
                                                                                 size_t(c) * x_row_stride)[b]
                                          : nullptr;
            int32_t sum = 0;
            if (blk)
                for (int i = 0; i < kQK8_0; ++i) sum += blk->qs[i];
            for (int j = 0; j < 4; ++j)
                for (int h = 0; h < 2; ++h) slices[j * kPackCols + 2 * c + h] = blk ? load_u32(blk->qs + 8 * j + 4 * h) : 0;
            // the results' lane order; a missing column: x = 0 and scale 0, so its (unused) results are 0
            dx[2 * c] = dx[2 * c + 1] = blk ? f16_to_f32_fast(blk->d) : 0.f;
            corr[2 * c] = corr[2 * c + 1] = -128 * sum;
        }
        std::memcpy(pb, slices, sizeof slices);
        std::memcpy(pb + kNarrowScaleOff, dx, sizeof dx);
        std::memcpy(pb + kNarrowCorrOff, corr, sizeof corr);
    }
}

void pack_wide(const void *x, size_t x_row_stride, int nc, int64_t n, bool flip, uint8_t *dst);
void tile_wide(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *packed, int64_t n_cols,
               int64_t nb, float *out, size_t out_col_stride);

}  // namespace

// The narrow layout is the VNNI tile's alone: the AVX2 tile takes any column count wide.
static bool narrow(int64_t n_cols) { return n_cols <= kNarrowCols && vnni_enabled(); }

bool q8_0_panel_offset() { return vnni_enabled() || avxvnni_enabled(); }

int64_t q8_0_pack_groups(int64_t n_cols) { return narrow(n_cols) ? 1 : (n_cols + kPackCols - 1) / kPackCols; }

uint64_t q8_0_pack_bytes(int64_t n, int64_t n_cols) {
    const uint64_t nb = uint64_t(n / kQK8_0);
    return narrow(n_cols) ? nb * kNarrowBlockBytes : uint64_t(q8_0_pack_groups(n_cols)) * nb * kGroupBlockBytes;
}

void q8_0_pack(const void *x, size_t x_row_stride, int64_t n_cols, int64_t n, int64_t g0, int64_t g1, uint8_t *dst) {
    const uint8_t *xp = static_cast<const uint8_t *>(x);
    if (narrow(n_cols)) {
        if (g0 < g1) pack_narrow(xp, x_row_stride, int(n_cols), n, dst);
        return;
    }
    const uint64_t gb = uint64_t(n / kQK8_0) * kGroupBlockBytes;
    for (int64_t g = g0; g < g1; ++g) {
        const int64_t c0 = g * kPackCols;
        pack_wide(xp + size_t(c0) * x_row_stride, x_row_stride, int(std::min<int64_t>(kPackCols, n_cols - c0)), n,
                  q8_0_panel_offset(), dst + uint64_t(g) * gb);
    }
}

namespace {

// Rows r[0..7] (eight columns' 8 slices each) to out[j] = slice j of the eight columns.
inline void transpose8x8(const __m256i *r, __m256i *out) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);       // slices 0, 1 | 4, 5
        t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);   // slices 2, 3 | 6, 7
    }
    for (int h = 0; h < 2; ++h) {   // columns 4h..4h+3
        const __m256i *q = t + 4 * h;
        u[4 * h + 0] = _mm256_unpacklo_epi64(q[0], q[2]);   // slice 0 | 4
        u[4 * h + 1] = _mm256_unpackhi_epi64(q[0], q[2]);   // slice 1 | 5
        u[4 * h + 2] = _mm256_unpacklo_epi64(q[1], q[3]);   // slice 2 | 6
        u[4 * h + 3] = _mm256_unpackhi_epi64(q[1], q[3]);   // slice 3 | 7
    }
    for (int j = 0; j < 4; ++j) {
        out[j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x20);
        out[4 + j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x31);
    }
}

// Sixteen columns' blocks to the group layout: two 8 x 8 transposes of 4-byte slices a block
// (a slice at a time this took ~2.5% of a flash-shape prefill step); flip: stored as x + 128
// (vpdpbusd's unsigned side).
void pack_wide(const void *x, size_t x_row_stride, int nc, int64_t n, bool flip, uint8_t *dst) {
    const int64_t nb = n / kQK8_0;
    const uint8_t *xp = static_cast<const uint8_t *>(x);
    const __m256i bias = _mm256_set1_epi8(flip ? char(0x80) : 0);
    for (int64_t b = 0; b < nb; ++b) {
        uint8_t *pb = dst + b * kGroupBlockBytes;
        alignas(64) float dx[kPackCols];
        for (int h = 0; h < 2; ++h) {
            __m256i r[8], o[8];
            for (int i = 0; i < 8; ++i) {
                const int c = 8 * h + i;
                if (c < nc) {   // a missing column: x = 0 and scale 0, so its (unused) results are 0
                    const BlockQ8_0 &blk = reinterpret_cast<const BlockQ8_0 *>(xp + size_t(c) * x_row_stride)[b];
                    r[i] = simd::loadu(blk.qs);
                    dx[c] = f16_to_f32_fast(blk.d);
                } else {
                    r[i] = _mm256_setzero_si256();
                    dx[c] = 0;
                }
            }
            transpose8x8(r, o);
            for (int j = 0; j < 8; ++j)
                _mm256_storeu_si256(reinterpret_cast<__m256i *>(pb + j * kSliceBytes + 32 * h), _mm256_xor_si256(o[j], bias));
        }
        std::memcpy(pb + kScaleOff, dx, sizeof dx);
    }
}

// The narrow panel: six rows a step, a pair from each of three streams far apart (rows r,
// r + q and r + 2q, q a third of the rows), which the hardware prefetchers follow side by
// side; the rows left over (fewer than six) as one stream.
void tile_narrow(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *panel, int nc, int64_t nb,
                 float *out, size_t out_col_stride) {
    // Six rows (three pairs) a step: measured 10-15% faster than four, from memory and from
    // L2, on one core and two (eight would not fit the registers).
    constexpr int64_t G = 6;
    const int64_t part = n_rows / G * 2;   // rows a stream, even
    // Each stream's row pair two steps ahead goes to L2 meanwhile, a line a block. On the Xeon
    // host, routed experts of 1-8 columns (memory-bound: ~27 MB of weights for a
    // few tokens) took 5-19% less time; one step ahead and four did as well as two.
    constexpr int64_t kAhead = 2;
    for (int64_t r = 0; r < part; r += 2) {
        const int64_t pr[3] = {r, part + r, 2 * part + r};
        NarrowPrefetch pf;
        if (r + 2 * kAhead < part)
            for (int s = 0; s < 3; ++s) {
                pf.at[s] = w + size_t(pr[s] + 2 * kAhead) * w_row_stride;
                pf.end[s] = pf.at[s] + 2 * w_row_stride;
            }
        rows_narrow<3>(w, w_row_stride, pr, n_rows, panel, nb, nc, out, out_col_stride, pf);
    }
    for (int64_t r = 3 * part; r < n_rows; r += G) {
        const int64_t m = std::min<int64_t>(G, n_rows - r);
        const int64_t pr[3] = {r, r + 2, r + 4};
        NarrowPrefetch pf;
        if (m > 4) rows_narrow<3>(w, w_row_stride, pr, n_rows, panel, nb, nc, out, out_col_stride, pf);
        else if (m > 2) rows_narrow<2>(w, w_row_stride, pr, n_rows, panel, nb, nc, out, out_col_stride, pf);
        else rows_narrow<1>(w, w_row_stride, pr, n_rows, panel, nb, nc, out, out_col_stride, pf);
    }
}

}  // namespace

bool q8_0_rows_layout(int64_t n_cols) { return vnni_enabled() && !narrow(n_cols) && n_cols <= q8_0_rows_tile_max(); }

void q8_0_tile_packed(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *packed, int64_t n_cols,
                      int64_t n, float *out, size_t out_col_stride) {
    const int64_t nb = n / kQK8_0;
    if (narrow(n_cols)) {
        tile_narrow(w, w_row_stride, n_rows, packed, int(n_cols), nb, out, out_col_stride);
        return;
    }
    // The rows tile stores 16 consecutive floats a column, whole lines, once per 16 rows: it
    // writes in place, over all n_rows in one call, so its prefetch of the next rows runs on
    // to the end of the caller's run (staged, it stopped every 256 rows).
    if (q8_0_rows_layout(n_cols)) {
        q8_0_tile_rows(w, w_row_stride, n_rows, packed, n_cols, nb, out, out_col_stride);
        return;
    }
    // The results go to a column-major buffer of up to kStageRows rows first, then a column
    // at a time to out. Written in place, each kernel call's 16 columns land out_col_stride
    // apart; the callers' strides are matrix heights (4096 floats, 32768 for q_b), powers of
    // two, so those lines all fall in one L1 set and one L2 set and evict each other. Staged,
    // the flash-shape prefill's out_proj went 39-45 -> 35-37 ms a step and its routed experts
    // 130 -> 123 (a 48-column variant written in place ran q_kv 2.5x slower).
    constexpr int64_t kStageRows = 256;
    thread_local CacheAlignedVector<float> staged;
    const int64_t rows_max = std::min(n_rows, kStageRows);
    const size_t ls = size_t((rows_max + 15) / 16 * 16 + 16);   // padded off a power of two
    if (staged.size() < ls * size_t(n_cols)) staged.resize(ls * size_t(n_cols));
    for (int64_t r0 = 0; r0 < n_rows; r0 += kStageRows) {
        const int64_t nr = std::min(kStageRows, n_rows - r0);
        if (vnni_enabled())
            tile_wide(w + size_t(r0) * w_row_stride, w_row_stride, nr, packed, n_cols, nb, staged.data(), ls);
        else
            q8_0_tile_wide_avx2(w + size_t(r0) * w_row_stride, w_row_stride, nr, packed, n_cols, nb, staged.data(), ls);
        for (int64_t c = 0; c < n_cols; ++c)
            std::memcpy(out + size_t(c) * out_col_stride + size_t(r0), staged.data() + size_t(c) * ls,
                        sizeof(float) * size_t(nr));
    }
}

namespace {

template <int G>
void rows_groups(const uint8_t *w, size_t w_row_stride, int64_t r, int m, const RowSide *side, const uint8_t *panel,
                 uint64_t group_bytes, int64_t nb, int nc_last, float *o, size_t out_col_stride, const uint8_t *pf, const uint8_t *pf_end) {
    switch (m) {
        case 4: rows_group<4, G>(w, w_row_stride, r, side, panel, group_bytes, nb, nc_last, o, out_col_stride, pf, pf_end); break;
        case 3: rows_group<3, G>(w, w_row_stride, r, side, panel, group_bytes, nb, nc_last, o, out_col_stride, pf, pf_end); break;
        case 2: rows_group<2, G>(w, w_row_stride, r, side, panel, group_bytes, nb, nc_last, o, out_col_stride, pf, pf_end); break;
        default: rows_group<1, G>(w, w_row_stride, r, side, panel, group_bytes, nb, nc_last, o, out_col_stride, pf, pf_end); break;
    }
}

void tile_wide(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *packed, int64_t n_cols,
               int64_t nb, float *out, size_t out_col_stride) {
    const uint64_t group_bytes = uint64_t(nb) * kGroupBlockBytes;
    // Each row block's sums and scales (row_side), made on the first column pass.
    thread_local CacheAlignedVector<RowSide> side;
    const size_t side_len = size_t((n_rows + 3) / 4) * size_t(nb);
    if (side.size() < side_len) side.resize(side_len);
    // Groups three at a time where more than two are left, two where two are (the last of
    // them may be part-filled), one where one is; four left go two and two, not three and a
    // lone one. From L2 on Zen 5, four rows against 48 / 32 / 16 columns ran 383 / 375 / 327 G
    // multiply-adds/s on one core.
    for (int64_t c0 = 0; c0 < n_cols;) {
        const int64_t left = n_cols - c0, groups = (left + kPackCols - 1) / kPackCols;
        const int G = groups == 4 ? 2 : int(std::min<int64_t>(groups, 3));
        const int nc_last = int(std::min<int64_t>(kPackCols, left - (G - 1) * kPackCols));
        const uint8_t *panel = packed + uint64_t(c0 / kPackCols) * group_bytes;
        float *o = out + size_t(c0) * out_col_stride;
        // The first pass pulls the next rows into L2 while it works (the weights come from
        // memory then); later passes find them there.
        const bool first = c0 == 0;
        for (int64_t r = 0; r < n_rows; r += 4) {
            const int m = int(std::min<int64_t>(4, n_rows - r));
            RowSide *sd = side.data() + size_t(r / 4) * size_t(nb);
            const uint8_t *pf = nullptr, *pf_end = nullptr;
            if (first) {
                const BlockQ8_0 *wr[4];
                for (int q = 0; q < 4; ++q)
                    wr[q] = reinterpret_cast<const BlockQ8_0 *>(w + size_t(r + std::min(q, m - 1)) * w_row_stride);
                row_side(wr, nb, sd);
                pf = w + size_t(std::min<int64_t>(r + 4, n_rows)) * w_row_stride;
                pf_end = w + size_t(std::min<int64_t>(r + 8, n_rows)) * w_row_stride;
            }
            if (G == 3) rows_groups<3>(w, w_row_stride, r, m, sd, panel, group_bytes, nb, nc_last, o, out_col_stride, pf, pf_end);
            else if (G == 2) rows_groups<2>(w, w_row_stride, r, m, sd, panel, group_bytes, nb, nc_last, o, out_col_stride, pf, pf_end);
            else rows_groups<1>(w, w_row_stride, r, m, sd, panel, group_bytes, nb, nc_last, o, out_col_stride, pf, pf_end);
        }
        c0 += G * kPackCols;   // past n_cols after a part-filled last group
    }
}

}  // namespace

}  // namespace ds4::quant::detail
