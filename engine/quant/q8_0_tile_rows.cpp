// Q8_0 products against 9 to a few dozen columns on AVX-512 VNNI with the weight rows in
// the 16 lanes instead of the columns. The column tile (q8_0_tile.cpp) fills its lanes only
// at multiples of 16 columns: 24 columns run as 32, 17 as 32. A trained router gives each
// routed expert ~24 rows of a 1024-row prefill step, and the routed experts are most of the
// prefill's int8 work. Here every column costs the same, whatever the count: a block of 16 weight rows
// is transposed once (8 slices, lane r holding row r's 4 bytes), and each column's 4-byte
// slice is a broadcast load from the wide panel (x + 128, the unsigned side) against it.
//
// Per block of 16 rows and column: 8 vpdpbusd and the 3 float steps of dot_q8_0 (the scale
// product, the conversion, the fma), lane for lane in dot_q8_0's order, so every result is
// bit-identical to vec_dot. Per block of 16 rows, once: the transpose (~32 shuffles), the
// rows' correction (minus 128 times their byte sums, 8 vpdpbusd) and their scales. The
// column tile takes 16 (11 G + 4) ops a block of 16 rows for G groups; this takes
// 11 C + ~46, fewer below ~28 columns and between 33 and ~44. Measured on the Xeon host
// (hash-routed flash-shape prefill, 2048 tokens, two cores) up to 28 columns took the routed
// experts 8-22% less time in five rounds of five; up to 44, more time than up to 28.
//
// Blocks are taken chain by chain (b = k, k + 4, ...; dot_q8_0's four float chains), so one
// float accumulator per output is live at a time and two row blocks by five columns fit the
// registers.
#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/quant/blocks.h"
#include "engine/quant/cache_aligned.h"
#include "engine/quant/kernels.h"
#include "engine/quant/q8_0_panel.h"
#include "engine/quant/simd.h"

namespace ds4::quant::detail {

namespace {

#define DS4_VNNI512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
// GCC 12 warns about the undefined pass-through operand inside its AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

constexpr int kLanes = 16;
constexpr int kPanels = 2;   // row blocks of 16 a step
constexpr int kCols = 5;     // columns a step: 1x8, 2x4 and 2x6 measured no better on the Xeon
                             // host (tile sweeps; 2x6 also in the hash-routed prefill, slower)
// Blocks transposed at a time: two row blocks' 16 (20 KB) stay in L1 while every column
// passes over them. Whole rows (128 blocks at 4096, 160 KB) sit in L2, and a block's step
// loads ~2 KB of them for ~66 cycles of vpdpbusd.
constexpr int64_t kChunk = 16;

// One block of 16 weight rows, transposed.
struct alignas(64) RowsBlock {
    __m512i slice[8];   // slice j, lane r: row r's bytes 4j..4j+3
    __m512i corr;       // lane r: -128 x the sum of row r's 32 bytes (the accumulator's start)
    __m512 dw;          // lane r: row r's scale
};

// Block b of rows wr[0..15] to dst. The 16 rows' bytes go as 8 registers of two rows each
// (row i low, row i + 8 high), then an 8 x 8 transpose of dwords within each 256-bit half.
DS4_VNNI512 void transpose_block(const BlockQ8_0 *const *wr, int64_t b, RowsBlock *dst) {
    __m512i z[8], t[8], u[8];
    for (int i = 0; i < 8; ++i)
        z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(simd::loadu(wr[i][b].qs)), simd::loadu(wr[i + 8][b].qs), 1);
    for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);       // dwords 0, 1 | 4, 5
        t[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);   // dwords 2, 3 | 6, 7
    }
    for (int h = 0; h < 2; ++h) {   // rows 4h..4h+3 of each half
        const __m512i *q = t + 4 * h;
        u[4 * h + 0] = _mm512_unpacklo_epi64(q[0], q[2]);   // dword 0 | 4
        u[4 * h + 1] = _mm512_unpackhi_epi64(q[0], q[2]);   // dword 1 | 5
        u[4 * h + 2] = _mm512_unpacklo_epi64(q[1], q[3]);   // dword 2 | 6
        u[4 * h + 3] = _mm512_unpackhi_epi64(q[1], q[3]);   // dword 3 | 7
    }
    // 128-bit lanes: u[j] holds rows 0-3 (and 8-11) of dwords j | j + 4, u[4 + j] rows 4-7
    // (and 12-15); slice j takes the low lane of each half of both, slice j + 4 the high.
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    const __m512i c128 = _mm512_set1_epi8(char(0x80));
    __m512i sum = _mm512_setzero_si512();
    for (int j = 0; j < 4; ++j) {
        const __m512i a = _mm512_permutex2var_epi64(u[j], lo, u[4 + j]);
        const __m512i c = _mm512_permutex2var_epi64(u[j], hi, u[4 + j]);
        _mm512_store_si512(&dst->slice[j], a);
        _mm512_store_si512(&dst->slice[j + 4], c);
        sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(sum, c128, a), c128, c);
    }
    _mm512_store_si512(&dst->corr, _mm512_sub_epi32(_mm512_setzero_si512(), sum));
    alignas(32) uint64_t d[4];
    for (int q = 0; q < 4; ++q)
        d[q] = uint64_t(wr[4 * q][b].d) | uint64_t(wr[4 * q + 1][b].d) << 16 | uint64_t(wr[4 * q + 2][b].d) << 32 |
               uint64_t(wr[4 * q + 3][b].d) << 48;
    _mm512_store_ps(&dst->dw, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i *>(d))));
}

// P row blocks of a chunk of blocks (rb[p * kChunk + i]: block b0 + i) against C columns
// (their panel blocks at col[c], scales after the slices). ch: the outputs' four float
// chains, chain k of column c and row block p at (c * kPanels + p) * 4 + k, carried from
// chunk to chunk. pf..pf_end: the next rows, pulled into L2 a few lines a block meanwhile.
template <int P, int C>
DS4_VNNI512 void rows_x_cols(const RowsBlock *rb, int64_t b0, int64_t nblk, const uint8_t *const *col, __m512 *ch,
                             const uint8_t *&pf, const uint8_t *pf_end, int64_t pf_lines) {
    for (int k = 0; k < 4; ++k) {   // b0 is a multiple of 4: block b0 + i feeds chain i % 4
        __m512 acc[P][C];
        for (int p = 0; p < P; ++p)
            for (int c = 0; c < C; ++c) acc[p][c] = _mm512_load_ps(&ch[(c * kPanels + p) * 4 + k]);
        for (int64_t i = k; i < nblk; i += 4) {
            for (int64_t l = 0; l < pf_lines && pf < pf_end; ++l, pf += 64)
                _mm_prefetch(reinterpret_cast<const char *>(pf), _MM_HINT_T1);
            const uint64_t off = uint64_t(b0 + i) * kGroupBlockBytes;
            __m512i dot[P][C];
            for (int p = 0; p < P; ++p)
                for (int c = 0; c < C; ++c) dot[p][c] = _mm512_load_si512(&rb[p * kChunk + i].corr);
#pragma GCC unroll 8
            for (int j = 0; j < 8; ++j) {
                __m512i wv[P];
                for (int p = 0; p < P; ++p) wv[p] = _mm512_load_si512(&rb[p * kChunk + i].slice[j]);
                for (int c = 0; c < C; ++c) {
                    uint32_t xs;
                    std::memcpy(&xs, col[c] + off + j * kSliceBytes, 4);
                    const __m512i xv = _mm512_set1_epi32(int(xs));
                    for (int p = 0; p < P; ++p) dot[p][c] = _mm512_dpbusd_epi32(dot[p][c], xv, wv[p]);
                }
            }
            for (int c = 0; c < C; ++c) {
                float dxs;
                std::memcpy(&dxs, col[c] + off + kScaleOff, 4);
                const __m512 dx = _mm512_set1_ps(dxs);
                for (int p = 0; p < P; ++p)
                    acc[p][c] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_load_ps(&rb[p * kChunk + i].dw), dx),
                                                _mm512_cvtepi32_ps(dot[p][c]), acc[p][c]);
            }
        }
        for (int p = 0; p < P; ++p)
            for (int c = 0; c < C; ++c) _mm512_store_ps(&ch[(c * kPanels + p) * 4 + k], acc[p][c]);
    }
}

template <int P, int C>
DS4_VNNI512 void rows_x_some(int nc, const RowsBlock *rb, int64_t b0, int64_t nblk, const uint8_t *const *col,
                             __m512 *ch, const uint8_t *&pf, const uint8_t *pf_end, int64_t pf_lines) {
    if constexpr (C > 1) {
        if (nc < C) return rows_x_some<P, C - 1>(nc, rb, b0, nblk, col, ch, pf, pf_end, pf_lines);
    }
    rows_x_cols<P, C>(rb, b0, nblk, col, ch, pf, pf_end, pf_lines);
}

}  // namespace

DS4_VNNI512 void q8_0_tile_rows(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *panel,
                                int64_t n_cols, int64_t nb, float *out, size_t out_col_stride) {
    const uint64_t group_bytes = uint64_t(nb) * kGroupBlockBytes;
    thread_local CacheAlignedVector<RowsBlock> blocks;
    thread_local CacheAlignedVector<float> chains;   // 16 floats a chain
    if (blocks.size() < size_t(kPanels * kChunk)) blocks.resize(size_t(kPanels * kChunk));
    if (chains.size() < size_t(n_cols * kPanels * 4 * 16)) chains.resize(size_t(n_cols * kPanels * 4 * 16));
    thread_local std::vector<const uint8_t *> col;   // each column's place in the panel
    col.resize(size_t(n_cols));
    for (int64_t c = 0; c < n_cols; ++c) col[size_t(c)] = panel + uint64_t(c / kPackCols) * group_bytes + uint64_t(c % kPackCols) * 4;
    const int64_t step_rows = kPanels * kLanes;
    for (int64_t r0 = 0; r0 < n_rows; r0 += step_rows) {
        const int64_t m = std::min(step_rows, n_rows - r0);
        const int np = int((m + kLanes - 1) / kLanes);
        const BlockQ8_0 *wr[kPanels][kLanes];   // rows past the last repeat it (their lanes are not stored)
        for (int p = 0; p < np; ++p)
            for (int i = 0; i < kLanes; ++i)
                wr[p][i] = reinterpret_cast<const BlockQ8_0 *>(
                    w + size_t(std::min<int64_t>(r0 + p * kLanes + i, n_rows - 1)) * w_row_stride);
        std::memset(chains.data(), 0, sizeof(float) * size_t(n_cols * kPanels * 4 * 16));
        // The next rows come from memory: pulled into L2 over this step's passes.
        const uint8_t *pf = w + size_t(std::min(r0 + step_rows, n_rows)) * w_row_stride;
        const uint8_t *pf_end = w + size_t(std::min(r0 + 2 * step_rows, n_rows)) * w_row_stride;
        const int64_t passes = (n_cols + kCols - 1) / kCols * nb;
        const int64_t pf_lines = (int64_t(pf_end - pf) / 64 + passes - 1) / std::max<int64_t>(passes, 1);
        for (int64_t b0 = 0; b0 < nb; b0 += kChunk) {
            const int64_t nblk = std::min<int64_t>(kChunk, nb - b0);
            for (int p = 0; p < np; ++p)
                for (int64_t i = 0; i < nblk; ++i) transpose_block(wr[p], b0 + i, &blocks[size_t(p * kChunk + i)]);
            for (int64_t c0 = 0; c0 < n_cols; c0 += kCols) {
                const int nc = int(std::min<int64_t>(kCols, n_cols - c0));
                __m512 *ch = reinterpret_cast<__m512 *>(chains.data()) + c0 * kPanels * 4;
                if (np == 2) rows_x_some<2, kCols>(nc, blocks.data(), b0, nblk, col.data() + c0, ch, pf, pf_end, pf_lines);
                else rows_x_some<1, kCols>(nc, blocks.data(), b0, nblk, col.data() + c0, ch, pf, pf_end, pf_lines);
            }
        }
        // (a0 + a2) + (a1 + a3), dot_q8_0's order
        for (int64_t c = 0; c < n_cols; ++c)
            for (int p = 0; p < np; ++p) {
                const __m512 *a = reinterpret_cast<const __m512 *>(chains.data()) + (c * kPanels + p) * 4;
                const __m512 r = _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]));
                const int64_t rp = r0 + p * kLanes, valid = std::min<int64_t>(kLanes, n_rows - rp);
                float *o = out + size_t(c) * out_col_stride + size_t(rp);
                if (valid == kLanes) {
                    _mm512_storeu_ps(o, r);
                } else {
                    alignas(64) float v[kLanes];
                    _mm512_store_ps(v, r);
                    std::memcpy(o, v, sizeof(float) * size_t(valid));
                }
            }
    }
}

}  // namespace ds4::quant::detail
