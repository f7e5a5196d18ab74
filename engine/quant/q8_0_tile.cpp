// Q8_0 products against many activation rows on AVX-512 VNNI: the columns sit in the
// 16 lanes of a register, so one vpdpbusd multiplies a 4-byte slice of a weight row
// (broadcast) by the same slice of 16 activation rows, and a block's 8 slices sum to the
// exact integer block dots of 16 columns with no horizontal work. The float steps are the
// ones of dot_q8_0 (q8_0.cpp) lane for lane, so every result is bit-identical to vec_dot.
//
// vpdpbusd multiplies unsigned by signed bytes. The activations are packed as x + 128
// (x ^ 0x80), which adds 128 * sum(w) to each block dot; minus that goes into the integer
// sum, so the integer that comes out is exact. The correction depends on the weight row
// only: it is worked out once per row per call, or kept by the caller (q8_0_row_prep).
//
// From 33 columns, three groups go together (rows_x48): each broadcast weight slice then
// feeds three vpdpbusd instead of one, which matters where loads bound the kernel (Zen 5).
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
#include "engine/quant/simd.h"

namespace ds4::quant::detail {

namespace {

// Per column group and block: 8 slices x 16 lanes x 4 bytes, then 16 f32 scales.
constexpr int64_t kSliceBytes = kPackCols * 4;
constexpr int64_t kGroupBlockBytes = 8 * kSliceBytes + kPackCols * 4;
// Narrow layout, per block: 4 slice pairs x 16 lanes x 4 bytes, then the 8 scales, each
// twice, in the results' lane order (lane 2c + r: column c, row r of a pair).
constexpr int kNarrowCols = 8;
constexpr int64_t kNarrowBlockBytes = 4 * kSliceBytes + kPackCols * 4;

// A block of a row pair (2p, 2p + 1), at [p * nb + b]: side by side, so one 64-bit
// broadcast gives the narrow kernel both rows' values in its lane order.
struct PairPrep {
    int32_t neg_corr[2];   // -128 * sum of the block's weights
    float dw[2];           // the block's scale
};
static_assert(sizeof(PairPrep) == 2 * kRowPrepBytes);

// Row r's entries of a pair-layout prep.
struct RowRef {
    const PairPrep *p;
    int s;
    int32_t neg_corr(int64_t b) const { return p[b].neg_corr[s]; }
    float dw(int64_t b) const { return p[b].dw[s]; }
};
inline RowRef row_ref(const PairPrep *prep, int64_t r, int64_t nb) { return {prep + (r >> 1) * nb, int(r & 1)}; }

#define DS4_VNNI512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
// GCC 12 warns about the undefined pass-through operand inside its AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// Blocks [b_start, nb) of rows [0, n_rows) of w into prep (row 0 the first of a pair), a row
// and a block at a time; an odd count's last pair repeats its row, as the narrow kernel does.
DS4_VNNI512 void prep_rows_from(const uint8_t *w, size_t w_stride, int64_t n_rows, int64_t nb, int64_t b_start,
                                PairPrep *prep) {
    const __m256i ones = _mm256_set1_epi8(1), zero = _mm256_setzero_si256();
    for (int64_t r = 0; r < n_rows; ++r) {
        const BlockQ8_0 *wb = reinterpret_cast<const BlockQ8_0 *>(w + size_t(r) * w_stride);
        PairPrep *p = prep + (r >> 1) * nb;
        const int h = int(r & 1);
        const bool last_alone = h == 0 && r + 1 == n_rows;
        auto put = [&](int64_t b, int32_t sum, float d) {
            p[b].neg_corr[h] = -128 * sum;
            p[b].dw[h] = d;
            if (last_alone) {
                p[b].neg_corr[1] = p[b].neg_corr[0];
                p[b].dw[1] = d;
            }
        };
        int64_t b = b_start;
        for (; b + 4 <= nb; b += 4) {
            __m256i s[4];
            for (int k = 0; k < 4; ++k) s[k] = _mm256_dpbusd_epi32(zero, ones, simd::loadu(wb[b + k].qs));
            alignas(16) int32_t sums[4];
            _mm_store_si128(reinterpret_cast<__m128i *>(sums), simd::sum4_i32(s[0], s[1], s[2], s[3]));
            for (int k = 0; k < 4; ++k) put(b + k, sums[k], f16_to_f32_fast(wb[b + k].d));
        }
        for (; b < nb; ++b) {
            int32_t sum = 0;
            for (int i = 0; i < kQK8_0; ++i) sum += wb[b].qs[i];
            put(b, sum, f16_to_f32_fast(wb[b].d));
        }
    }
}

// Eight blocks from b of rows a and c (a row pair; c = a for an odd count's last row) into
// their PairPreps: the block sums of 16 (row, block)s reduced side by side, the scales by
// one gather, two permutes into the pair layout. A row and a block at a time this cost about
// half of a 16-column pass of the products; this way the tile without a kept prep measured
// x8 / x16 / x25 columns 87-89 -> 101-110, 134-140 -> 153-159, 130-133 -> 138-141 G
// weight-dots/s from cache.
DS4_VNNI512 void prep_pair8(const BlockQ8_0 *a, const BlockQ8_0 *c, int64_t b, PairPrep *out) {
    const __m512i ones = _mm512_set1_epi8(1), zero = _mm512_setzero_si512();
    // v[k]: row (k < 4 ? a : c), blocks b + 2 (k % 4) (lanes 0-7) and the next (8-15)
    __m512i v[8];
    for (int k = 0; k < 8; ++k) {
        const BlockQ8_0 *r = (k < 4 ? a : c) + b + 2 * (k % 4);
        const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(simd::loadu(r[0].qs)), simd::loadu(r[1].qs), 1);
        v[k] = _mm512_dpbusd_epi32(zero, ones, q);
    }
    // 128-bit lane L of t[h]: the partial sums (lanes 4L..4L+3 of v) of v[4h], v[4h+1], ...
    __m512i t[2];
    for (int h = 0; h < 2; ++h) {
        __m512i u[2];
        for (int i = 0; i < 2; ++i) {
            const __m512i x = v[4 * h + 2 * i], y = v[4 * h + 2 * i + 1];
            u[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(x, y), _mm512_unpackhi_epi32(x, y));
        }
        t[h] = _mm512_add_epi32(_mm512_unpacklo_epi64(u[0], u[1]), _mm512_unpackhi_epi64(u[0], u[1]));
    }
    // lane i: row a's block b + i, lane 8 + i: row c's (lanes 0-3 of each 128-bit lane of
    // t: v[0..3]; a block's first half-sum in lane 0 or 2 of the four, its second in 1 or 3)
    const __m512i lo = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 16, 24, 17, 25, 18, 26, 19, 27);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(4));
    const __m512i sums =
        _mm512_add_epi32(_mm512_permutex2var_epi32(t[0], lo, t[1]), _mm512_permutex2var_epi32(t[0], hi, t[1]));
    const __m512i neg_corr = _mm512_sub_epi32(zero, _mm512_slli_epi32(sums, 7));
    // the scales: a 32-bit gather at each block's start (d, then 2 bytes of its qs)
    const __m512i block_offs = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7),
                                                  _mm512_set1_epi32(int(sizeof(BlockQ8_0))));
    const int32_t row_c = int32_t(reinterpret_cast<const uint8_t *>(c) - reinterpret_cast<const uint8_t *>(a));
    const __m512i idx = _mm512_add_epi32(
        block_offs, _mm512_mask_set1_epi32(_mm512_set1_epi32(int32_t(b * int64_t(sizeof(BlockQ8_0)))), 0xFF00,
                                           int32_t(b * int64_t(sizeof(BlockQ8_0))) + row_c));
    const __m512i dwords = _mm512_i32gather_epi32(idx, a, 1);
    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dwords));
    // PairPrep i = {neg_corr a, neg_corr c, dw a, dw c}
    const __m512i p0 = _mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
    const __m512i p1 = _mm512_add_epi32(p0, _mm512_set1_epi32(4));
    const __m512i dwi = _mm512_castps_si512(dw);
    _mm512_storeu_si512(out + b, _mm512_permutex2var_epi32(neg_corr, p0, dwi));
    _mm512_storeu_si512(out + b + 4, _mm512_permutex2var_epi32(neg_corr, p1, dwi));
}

// Rows [0, n_rows) of w into prep (row 0 the first of a pair); an odd count's last pair
// repeats its row, as the narrow kernel does.
DS4_VNNI512 void prep_rows(const uint8_t *w, size_t w_stride, int64_t n_rows, int64_t nb, PairPrep *prep) {
    // The gather's offsets are 32-bit: rows too far apart take the one-row path.
    const int64_t b8 = w_stride < (size_t(1) << 30) ? nb / 8 * 8 : 0;
    if (b8)
        for (int64_t r = 0; r < n_rows; r += 2) {
            const BlockQ8_0 *a = reinterpret_cast<const BlockQ8_0 *>(w + size_t(r) * w_stride);
            const BlockQ8_0 *c = r + 1 < n_rows ? reinterpret_cast<const BlockQ8_0 *>(w + size_t(r + 1) * w_stride) : a;
            for (int64_t b = 0; b < b8; b += 8) prep_pair8(a, c, b, prep + (r >> 1) * nb);
        }
    if (b8 < nb) prep_rows_from(w, w_stride, n_rows, nb, b8, prep);
}

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

// Pull [pf, pf_end) into L2 three lines at a time (see Rows; four lines a block for the
// narrow tile's six rows measured no faster).
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

// R weight rows against one packed group of 16 columns; out[r] holds row r's 16 results.
// pf..pf_end: weights to pull into L2 meanwhile (the next rows, on the first pass over a
// row block, when they still come from memory); three lines a block covers 4 rows.
template <int R>
DS4_VNNI512 inline void rows_x16(const BlockQ8_0 *const *w, const RowRef *prep, const uint8_t *panel,
                                 int64_t nb, const uint8_t *pf, const uint8_t *pf_end, __m512 *out) {
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
            dot[r][0] = _mm512_set1_epi32(prep[r].neg_corr(b));
            dot[r][1] = _mm512_setzero_si512();
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
            const __m512i x = _mm512_loadu_si512(pb + j * kSliceBytes);
            for (int r = 0; r < R; ++r)
                dot[r][j & 1] =
                    _mm512_dpbusd_epi32(dot[r][j & 1], x, _mm512_set1_epi32(int(load_u32(w[r][b].qs + 4 * j))));
        }
        const __m512 dx = _mm512_loadu_ps(pb + 8 * kSliceBytes);
        for (int r = 0; r < R; ++r)
            acc[r][k] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(prep[r].dw(b)), dx),
                                        _mm512_cvtepi32_ps(_mm512_add_epi32(dot[r][0], dot[r][1])), acc[r][k]);
    });
    for (int r = 0; r < R; ++r) out[r] = sum_chains(acc[r]);
}

// R weight rows against three packed groups (48 columns) at once: each broadcast weight
// slice feeds three vpdpbusd, where the one-group kernel loads a slice per vpdpbusd (on
// AMD Zen 5 its loads, not its vpdpbusd, bound it). Twelve outputs' four float chains do not
// fit the registers, so they live in ch (L1), chain k of row r, group g at (k * R + r) * 3 + g;
// the order of every float step is still dot_q8_0's.
template <int R>
DS4_VNNI512 inline void rows_x48(const BlockQ8_0 *const *w, const RowRef *prep, const uint8_t *panel,
                                 uint64_t group_bytes, int64_t nb, const uint8_t *pf, const uint8_t *pf_end,
                                 __m512 *ch) {
    constexpr int G = 3;
    for (int i = 0; i < 4 * R * G; ++i) ch[i] = _mm512_setzero_ps();
    for_blocks(nb, [&](int64_t b, int k) DS4_VNNI512 {
        const uint8_t *pb = panel + b * kGroupBlockBytes;
        prefetch_some(pf, pf_end);
        __m512i dot[R][G];   // one integer chain each: twelve are in flight
        for (int r = 0; r < R; ++r) {
            const __m512i c = _mm512_set1_epi32(prep[r].neg_corr(b));
            for (int g = 0; g < G; ++g) dot[r][g] = c;
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
            __m512i x[G];
            for (int g = 0; g < G; ++g) x[g] = _mm512_loadu_si512(pb + g * group_bytes + j * kSliceBytes);
            for (int r = 0; r < R; ++r) {
                const __m512i wv = _mm512_set1_epi32(int(load_u32(w[r][b].qs + 4 * j)));
                for (int g = 0; g < G; ++g) dot[r][g] = _mm512_dpbusd_epi32(dot[r][g], x[g], wv);
            }
        }
        for (int g = 0; g < G; ++g) {
            const __m512 dx = _mm512_loadu_ps(pb + g * group_bytes + 8 * kSliceBytes);
            for (int r = 0; r < R; ++r) {
                float *a = reinterpret_cast<float *>(ch + (k * R + r) * G + g);
                // kept in memory: without the barrier GCC holds all 48 chains in registers and spills
                __asm__ volatile("" ::: "memory");
                _mm512_store_ps(a, _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(prep[r].dw(b)), dx),
                                                   _mm512_cvtepi32_ps(dot[r][g]), _mm512_load_ps(a)));
            }
        }
    });
}

template <int R>
DS4_VNNI512 void rows_group3(const uint8_t *w, size_t w_stride, int64_t r0, const PairPrep *prep, const uint8_t *panel,
                             uint64_t group_bytes, int64_t nb, int nc_last, float *out, size_t out_col_stride,
                             const uint8_t *pf, const uint8_t *pf_end) {
    const BlockQ8_0 *wr[R];
    RowRef pr[R];
    for (int r = 0; r < R; ++r) {
        wr[r] = reinterpret_cast<const BlockQ8_0 *>(w + size_t(r0 + r) * w_stride);
        pr[r] = row_ref(prep, r0 + r, nb);
    }
    alignas(64) __m512 ch[4 * R * 3];
    rows_x48<R>(wr, pr, panel, group_bytes, nb, pf, pf_end, ch);
    for (int r = 0; r < R; ++r)
        for (int g = 0; g < 3; ++g) {
            const __m512 *c = ch + r * 3 + g;   // chain k at c[k * R * 3]
            alignas(64) float v[kPackCols];
            _mm512_store_ps(v, _mm512_add_ps(_mm512_add_ps(c[0], c[2 * R * 3]), _mm512_add_ps(c[R * 3], c[3 * R * 3])));
            float *o = out + size_t(g * kPackCols) * out_col_stride + size_t(r0 + r);
            for (int i = 0, nc = g < 2 ? kPackCols : nc_last; i < nc; ++i) o[size_t(i) * out_col_stride] = v[i];
        }
}

template <int R>
DS4_VNNI512 void rows_group(const uint8_t *w, size_t w_stride, int64_t r0, const PairPrep *prep, const uint8_t *panel,
                            int64_t nb, int nc, float *out, size_t out_col_stride, const uint8_t *pf = nullptr,
                            const uint8_t *pf_end = nullptr) {
    const BlockQ8_0 *wr[R];
    RowRef pr[R];
    for (int r = 0; r < R; ++r) {
        wr[r] = reinterpret_cast<const BlockQ8_0 *>(w + size_t(r0 + r) * w_stride);
        pr[r] = row_ref(prep, r0 + r, nb);
    }
    __m512 res[R];
    rows_x16<R>(wr, pr, panel, nb, pf, pf_end, res);
    for (int r = 0; r < R; ++r) {
        alignas(64) float v[kPackCols];
        _mm512_store_ps(v, res[r]);
        for (int c = 0; c < nc; ++c) out[size_t(c) * out_col_stride + size_t(r0 + r)] = v[c];
    }
}

// P pairs of weight rows (w[2p], w[2p + 1]) against the narrow panel of up to 8 columns;
// out[p] lane 2c + r holds row 2p + r's result for column c. prep[p]: pair p's blocks.
template <int P>
DS4_VNNI512 inline void pairs_x8(const BlockQ8_0 *const *w, const PairPrep *const *prep, const uint8_t *panel,
                                 int64_t nb, const uint8_t *pf, const uint8_t *pf_end, __m512 *out) {
    // Lane 2c + r of a pair's sums: row r's column c, its halves from lanes 2c and 2c + 1.
    const __m512i even = _mm512_setr_epi32(0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    __m512 acc[P][4];
    for (int p = 0; p < P; ++p)
        for (int k = 0; k < 4; ++k) acc[p][k] = _mm512_setzero_ps();
    for_blocks(nb, [&](int64_t b, int k) DS4_VNNI512 {
        const uint8_t *pb = panel + b * kNarrowBlockBytes;
        prefetch_some(pf, pf_end);
        // Two integer chains a row (even and odd slice pairs).
        __m512i dot[2 * P][2];
        for (int q = 0; q < 2 * P; ++q) dot[q][0] = dot[q][1] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
            const __m512i x = _mm512_loadu_si512(pb + j * kSliceBytes);
            for (int q = 0; q < 2 * P; ++q)
                dot[q][j & 1] = _mm512_dpbusd_epi32(dot[q][j & 1], x,
                                                    _mm512_set1_epi64(int64_t(load_u64(w[q][b].qs + 8 * j))));
        }
        const __m512 dx = _mm512_loadu_ps(pb + 4 * kSliceBytes);
        for (int p = 0; p < P; ++p) {
            // The pair's corrections and scales side by side: one broadcast each.
            uint64_t c2, d2;
            std::memcpy(&c2, prep[p][b].neg_corr, 8);
            std::memcpy(&d2, prep[p][b].dw, 8);
            const __m512i a = _mm512_add_epi32(dot[2 * p][0], dot[2 * p][1]);
            const __m512i c = _mm512_add_epi32(dot[2 * p + 1][0], dot[2 * p + 1][1]);
            const __m512i sum = _mm512_add_epi32(
                _mm512_add_epi32(_mm512_permutex2var_epi32(a, even, c), _mm512_permutex2var_epi32(a, odd, c)),
                _mm512_set1_epi64(int64_t(c2)));
            const __m512 dw = _mm512_castsi512_ps(_mm512_set1_epi64(int64_t(d2)));
            acc[p][k] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(sum), acc[p][k]);
        }
    });
    for (int p = 0; p < P; ++p) out[p] = sum_chains(acc[p]);
}

// Rows [r0, r0 + 2P) (r0 even; rows past n_rows repeat the last row and are not written).
template <int P>
DS4_VNNI512 void rows_narrow(const uint8_t *w, size_t w_stride, int64_t r0, int64_t n_rows, const PairPrep *prep,
                             const uint8_t *panel, int64_t nb, int nc, float *out, size_t out_col_stride,
                             const uint8_t *pf, const uint8_t *pf_end) {
    const BlockQ8_0 *wr[2 * P];
    const PairPrep *pr[P];
    for (int q = 0; q < 2 * P; ++q) {
        const int64_t r = std::min<int64_t>(r0 + q, n_rows - 1);
        wr[q] = reinterpret_cast<const BlockQ8_0 *>(w + size_t(r) * w_stride);
    }
    for (int p = 0; p < P; ++p) pr[p] = prep + (r0 / 2 + p) * nb;
    __m512 res[P];
    pairs_x8<P>(wr, pr, panel, nb, pf, pf_end, res);
    for (int p = 0; p < P; ++p) {
        alignas(64) float v[kPackCols];
        _mm512_store_ps(v, res[p]);
        for (int h = 0; h < 2; ++h) {
            const int64_t r = r0 + 2 * p + h;
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
        for (int c = 0; c < kNarrowCols; ++c) {
            const BlockQ8_0 *blk = c < nc ? &reinterpret_cast<const BlockQ8_0 *>(static_cast<const uint8_t *>(x) +
                                                                                 size_t(c) * x_row_stride)[b]
                                          : nullptr;
            for (int j = 0; j < 4; ++j)
                for (int h = 0; h < 2; ++h)
                    slices[j * kPackCols + 2 * c + h] = blk ? load_u32(blk->qs + 8 * j + 4 * h) ^ 0x80808080u : 0x80808080u;
            dx[2 * c] = dx[2 * c + 1] = blk ? f16_to_f32_fast(blk->d) : 0.f;   // the results' lane order
        }
        std::memcpy(pb, slices, sizeof slices);
        std::memcpy(pb + 4 * kSliceBytes, dx, sizeof dx);
    }
}

void pack_wide(const void *x, size_t x_row_stride, int nc, int64_t n, uint8_t *dst);
void tile_wide(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *packed, int64_t n_cols,
               int64_t nb, PairPrep *fill, const PairPrep *prep, float *out, size_t out_col_stride);

}  // namespace

int64_t q8_0_pack_groups(int64_t n_cols) { return n_cols <= kNarrowCols ? 1 : (n_cols + kPackCols - 1) / kPackCols; }

uint64_t q8_0_pack_bytes(int64_t n, int64_t n_cols) {
    const uint64_t nb = uint64_t(n / kQK8_0);
    return n_cols <= kNarrowCols ? nb * kNarrowBlockBytes : uint64_t(q8_0_pack_groups(n_cols)) * nb * kGroupBlockBytes;
}

void q8_0_pack(const void *x, size_t x_row_stride, int64_t n_cols, int64_t n, int64_t g0, int64_t g1, uint8_t *dst) {
    const uint8_t *xp = static_cast<const uint8_t *>(x);
    if (n_cols <= kNarrowCols) {
        if (g0 < g1) pack_narrow(xp, x_row_stride, int(n_cols), n, dst);
        return;
    }
    const uint64_t gb = uint64_t(n / kQK8_0) * kGroupBlockBytes;
    for (int64_t g = g0; g < g1; ++g) {
        const int64_t c0 = g * kPackCols;
        pack_wide(xp + size_t(c0) * x_row_stride, x_row_stride, int(std::min<int64_t>(kPackCols, n_cols - c0)), n,
                  dst + uint64_t(g) * gb);
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
// (a slice at a time this took ~2.5% of a flash-shape prefill step).
void pack_wide(const void *x, size_t x_row_stride, int nc, int64_t n, uint8_t *dst) {
    const int64_t nb = n / kQK8_0;
    const uint8_t *xp = static_cast<const uint8_t *>(x);
    const __m256i flip = _mm256_set1_epi8(char(0x80));
    for (int64_t b = 0; b < nb; ++b) {
        uint8_t *pb = dst + b * kGroupBlockBytes;
        alignas(64) float dx[kPackCols];
        for (int h = 0; h < 2; ++h) {
            __m256i r[8], o[8];
            for (int i = 0; i < 8; ++i) {
                const int c = 8 * h + i;
                if (c < nc) {   // a missing column: x = 0 and scale 0, so its (unused) results are 0
                    const BlockQ8_0 &blk = reinterpret_cast<const BlockQ8_0 *>(xp + size_t(c) * x_row_stride)[b];
                    r[i] = _mm256_xor_si256(simd::loadu(blk.qs), flip);
                    dx[c] = f16_to_f32_fast(blk.d);
                } else {
                    r[i] = flip;
                    dx[c] = 0;
                }
            }
            transpose8x8(r, o);
            for (int j = 0; j < 8; ++j)
                _mm256_storeu_si256(reinterpret_cast<__m256i *>(pb + j * kSliceBytes + 32 * h), o[j]);
        }
        std::memcpy(pb + 8 * kSliceBytes, dx, sizeof dx);
    }
}

// The narrow panel: six rows a step, corrections worked out just before each step's rows
// (unless kept: cached).
// fill: where to work the corrections out, or null where prep holds them already.
void tile_narrow(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *panel, int nc, int64_t nb,
                 PairPrep *fill, const PairPrep *prep, float *out, size_t out_col_stride) {
    // Six rows (three pairs) a step: measured 10-15% faster than four, from memory and from
    // L2, on one core and two (eight would not fit the registers).
    constexpr int64_t G = 6;
    for (int64_t r = 0; r < n_rows; r += G) {
        const int64_t m = std::min<int64_t>(G, n_rows - r);
        if (fill) prep_rows(w + size_t(r) * w_row_stride, w_row_stride, m, nb, fill + (r / 2) * nb);
        const uint8_t *pf = w + size_t(std::min<int64_t>(r + G, n_rows)) * w_row_stride;
        const uint8_t *pf_end = w + size_t(std::min<int64_t>(r + 2 * G, n_rows)) * w_row_stride;
        if (m > 4) rows_narrow<3>(w, w_row_stride, r, n_rows, prep, panel, nb, nc, out, out_col_stride, pf, pf_end);
        else if (m > 2) rows_narrow<2>(w, w_row_stride, r, n_rows, prep, panel, nb, nc, out, out_col_stride, pf, pf_end);
        else rows_narrow<1>(w, w_row_stride, r, n_rows, prep, panel, nb, nc, out, out_col_stride, pf, pf_end);
    }
}

}  // namespace

void q8_0_row_prep(const uint8_t *w, size_t w_row_stride, int64_t n_rows, int64_t n, uint8_t *dst) {
    prep_rows(w, w_row_stride, n_rows, n / kQK8_0, reinterpret_cast<PairPrep *>(dst));
}

void q8_0_tile_packed(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *packed, int64_t n_cols,
                      int64_t n, float *out, size_t out_col_stride, const uint8_t *cached) {
    const int64_t nb = n / kQK8_0;
    thread_local std::vector<PairPrep> scratch;
    PairPrep *fill = nullptr;
    if (!cached) {
        if (scratch.size() < size_t((n_rows + 1) / 2 * nb)) scratch.resize(size_t((n_rows + 1) / 2 * nb));
        fill = scratch.data();
    }
    const PairPrep *prep = cached ? reinterpret_cast<const PairPrep *>(cached) : fill;
    if (n_cols <= kNarrowCols) {
        tile_narrow(w, w_row_stride, n_rows, packed, int(n_cols), nb, fill, prep, out, out_col_stride);
        return;
    }
    // The results go to a column-major buffer of up to kStageRows rows first, then a column
    // at a time to out. Written in place, each kernel call's 16 columns land out_col_stride
    // apart; the callers' strides are matrix heights (4096 floats, 32768 for q_b), powers of
    // two, so those lines all fall in one L1 set and one L2 set and evict each other. Staged,
    // the flash-shape prefill's out_proj went 39-45 -> 35-37 ms a step and its routed experts
    // 130 -> 123 (a 48-column variant written in place ran q_kv 2.5x slower).
    constexpr int64_t kStageRows = 256;   // even: row pairs share a prep entry
    thread_local CacheAlignedVector<float> staged;
    const int64_t rows_max = std::min(n_rows, kStageRows);
    const size_t ls = size_t((rows_max + 15) / 16 * 16 + 16);   // padded off a power of two
    if (staged.size() < ls * size_t(n_cols)) staged.resize(ls * size_t(n_cols));
    for (int64_t r0 = 0; r0 < n_rows; r0 += kStageRows) {
        const int64_t nr = std::min(kStageRows, n_rows - r0);
        const int64_t pairs = r0 / 2 * nb;
        tile_wide(w + size_t(r0) * w_row_stride, w_row_stride, nr, packed, n_cols, nb, fill ? fill + pairs : nullptr,
                  prep + pairs, staged.data(), ls);
        for (int64_t c = 0; c < n_cols; ++c)
            std::memcpy(out + size_t(c) * out_col_stride + size_t(r0), staged.data() + size_t(c) * ls,
                        sizeof(float) * size_t(nr));
    }
}

namespace {

void tile_wide(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *packed, int64_t n_cols,
               int64_t nb, PairPrep *fill, const PairPrep *prep, float *out, size_t out_col_stride) {
    const uint64_t group_bytes = uint64_t(nb) * kGroupBlockBytes;
    // Groups three at a time where more than two are left (rows_x48: from cache on Zen 5,
    // 4096 x 4096 against 256 columns 542 -> 623 G/s on two cores), what is left a group at a
    // time (two groups together measured no faster than one after the other).
    for (int64_t c0 = 0; c0 < n_cols;) {
        const bool three = n_cols - c0 > 2 * kPackCols;   // the third group may be part-filled
        const int nc3 = int(std::min<int64_t>(kPackCols, n_cols - c0 - 2 * kPackCols));
        const uint8_t *panel = packed + uint64_t(c0 / kPackCols) * group_bytes;
        const int nc = int(std::min<int64_t>(kPackCols, n_cols - c0));
        float *o = out + size_t(c0) * out_col_stride;
        // The first pass works out each row's corrections just before using them (unless
        // kept), so the first pass over the weights (from memory) overlaps the products.
        const bool first = c0 == 0;
        for (int64_t r = 0; r < n_rows; r += 4) {
            const int m = int(std::min<int64_t>(4, n_rows - r));
            const uint8_t *pf = nullptr, *pf_end = nullptr;
            if (first) {
                if (fill) prep_rows(w + size_t(r) * w_row_stride, w_row_stride, m, nb, fill + (r / 2) * nb);
                pf = w + size_t(std::min<int64_t>(r + 4, n_rows)) * w_row_stride;
                pf_end = w + size_t(std::min<int64_t>(r + 8, n_rows)) * w_row_stride;
            }
            if (three) {
                switch (m) {
                    case 4: rows_group3<4>(w, w_row_stride, r, prep, panel, group_bytes, nb, nc3, o, out_col_stride, pf, pf_end); break;
                    case 3: rows_group3<3>(w, w_row_stride, r, prep, panel, group_bytes, nb, nc3, o, out_col_stride, pf, pf_end); break;
                    case 2: rows_group3<2>(w, w_row_stride, r, prep, panel, group_bytes, nb, nc3, o, out_col_stride, pf, pf_end); break;
                    default: rows_group3<1>(w, w_row_stride, r, prep, panel, group_bytes, nb, nc3, o, out_col_stride, pf, pf_end); break;
                }
            } else {
                switch (m) {
                    case 4: rows_group<4>(w, w_row_stride, r, prep, panel, nb, nc, o, out_col_stride, pf, pf_end); break;
                    case 3: rows_group<3>(w, w_row_stride, r, prep, panel, nb, nc, o, out_col_stride, pf, pf_end); break;
                    case 2: rows_group<2>(w, w_row_stride, r, prep, panel, nb, nc, o, out_col_stride, pf, pf_end); break;
                    default: rows_group<1>(w, w_row_stride, r, prep, panel, nb, nc, o, out_col_stride, pf, pf_end); break;
                }
            }
        }
        c0 += three ? 3 * kPackCols : kPackCols;   // past n_cols after a part-filled third group
    }
}

}  // namespace

}  // namespace ds4::quant::detail
