// The packed Q8_0 tile on AVX2 (no VNNI): the wide panel's columns sit in the 8 lanes of a
// register, so a broadcast 4-byte slice of a weight row meets the same slice of 8 columns
// in one vpmaddubsw, and a block's 8 slices sum to 8 exact integer block dots with no
// horizontal work. The float steps are dot_q8_0's lane for lane, so every result is
// bit-identical to vec_dot.
//
// vpmaddubsw multiplies unsigned by signed bytes and adds pairs into 16 bits (saturating):
// the unsigned side is |w| (the broadcast slice, made once per row and shared by every
// column unit) and the signed side x with w's signs, so a pair is at most 2 * 128 * 127,
// exact. (The VNNI tile's w + 128 would saturate here: 2 * 255 * 127.) vpmaddwd by ones then
// widens the pairs to the 4-byte slice dot.
//
// Per (row, slice, unit of 8 columns) that is vpsignb, vpmaddubsw, vpmaddwd and vpaddd for
// 32 multiply-adds. On Zen 3 a vpmaddwd issues about one a cycle (a vpmaddubsw ~1.7), which
// bounds the tile: from L2 46-49 G multiply-adds/s a core at 16-64 columns, a quarter to a
// third of the vpmaddubsw peak ds4-bench-quant reports. Before it, AVX2 prefill products ran
// q8_0_tile_cols (four columns a pass, the block sums horizontal): 25-27.
//
// Where the CPU has AVX-VNNI (no AVX-512: Intel clients from Alder Lake on; AMD Zen 5 takes
// the AVX-512 tile) the panel is packed offset, x + 128, and one VEX vpdpbusd takes it as the
// unsigned side against the weight slice as it is (the AVX-512 tile's scheme): no vpsignb and
// no abs, one instruction per 32 multiply-adds. Each four rows' -128 * sum(w) per block, the
// accumulators' start, and their f32 scales come from row_side on the first column pass.
// The integers are the exact block dots either way, so the bits do not change.
#include <algorithm>
#include <cstring>

#include "engine/quant/blocks.h"
#include "engine/quant/cache_aligned.h"
#include "engine/quant/half.h"
#include "engine/quant/int8_dot.h"
#include "engine/quant/q8_0_panel.h"
#include "engine/quant/simd.h"

namespace ds4::quant::detail {

namespace {

constexpr int kUnitCols = 8;   // columns a register holds

inline uint32_t load_u32(const int8_t *p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// Pull [pf, pf_end) into L2 two lines at a time: the first column pass over a row block
// finds its weights in memory, the later ones in L2.
inline void prefetch_some(const uint8_t *&pf, const uint8_t *pf_end) {
    for (int i = 0; i < 2 && pf < pf_end; ++i, pf += 64) _mm_prefetch(reinterpret_cast<const char *>(pf), _MM_HINT_T1);
}

// Rows w[0..3] over nb blocks to side[0..nb) (AVX-VNNI): per row one vpdpbusd against bytes
// of 128 gives 128 times the block's eight slice sums, which three hadds and an add total.
void row_side(const BlockQ8_0 *const *w, int64_t nb, RowSide *side) {
    const __m256i c128 = _mm256_set1_epi8(char(0x80));
    for (int64_t b = 0; b < nb; ++b) {
        __m256i s[4];
        for (int q = 0; q < 4; ++q) s[q] = dot4_add<Isa::AvxVnni>(_mm256_setzero_si256(), c128, simd::loadu(w[q][b].qs));
        // lane q of each half: row q's sums of slices 0-3 (low half) and 4-7 (high)
        const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
        const __m128i t = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
        _mm_store_si128(reinterpret_cast<__m128i *>(side[b].corr), _mm_sub_epi32(_mm_setzero_si128(), t));
        _mm_store_ps(side[b].dw, row_scales4(w, b));
    }
}

// R weight rows against U units of 8 columns (unit u's bytes at x[u], its block b at
// x[u] + b * kGroupBlockBytes; side: the rows' sums and scales, AVX-VNNI only). ch holds the
// 4 float chains of every (row, unit), chain k of row r, unit u at (k * R + r) * U + u: in
// registers they would not fit beside the integer sums, so they live in L1, and every float
// step is still dot_q8_0's.
template <Isa kIsa, int R, int U>
inline void rows_units(const BlockQ8_0 *const *w, const RowSide *side, const uint8_t *const *x, int64_t nb,
                       const uint8_t *pf, const uint8_t *pf_end, __m256 *ch) {
    constexpr bool kOffset = kIsa == Isa::AvxVnni;   // the panel holds x + 128
    for (int i = 0; i < 4 * R * U; ++i) ch[i] = _mm256_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += 4) {
        const int nt = int(std::min<int64_t>(4, nb - b0));
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
            if (k >= nt) break;
            const int64_t b = b0 + k;
            const int64_t off = b * kGroupBlockBytes;
            prefetch_some(pf, pf_end);
            __m256i dot[R][U];
            for (int r = 0; r < R; ++r) {
                const __m256i c = kOffset ? _mm256_set1_epi32(side[b].corr[r]) : _mm256_setzero_si256();
                for (int u = 0; u < U; ++u) dot[r][u] = c;
            }
#pragma GCC unroll 8
            for (int j = 0; j < 8; ++j) {
                __m256i xv[U];
                for (int u = 0; u < U; ++u)
                    xv[u] = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x[u] + off + j * kSliceBytes));
                for (int r = 0; r < R; ++r) {
                    const __m256i ws = _mm256_set1_epi32(int(load_u32(w[r][b].qs + 4 * j)));
                    if constexpr (kOffset) {
                        for (int u = 0; u < U; ++u) dot[r][u] = dot4_add<kIsa>(dot[r][u], xv[u], ws);
                    } else {
                        const __m256i wa = _mm256_abs_epi8(ws);
                        for (int u = 0; u < U; ++u) dot[r][u] = dot4_add<kIsa>(dot[r][u], wa, _mm256_sign_epi8(xv[u], ws));
                    }
                }
            }
            __m256 dw[R];
            for (int r = 0; r < R; ++r) dw[r] = _mm256_set1_ps(kOffset ? side[b].dw[r] : f16_to_f32_fast(w[r][b].d));
            for (int u = 0; u < U; ++u) {
                const __m256 dx = _mm256_loadu_ps(reinterpret_cast<const float *>(x[u] + off + kScaleOff));
                for (int r = 0; r < R; ++r) {
                    float *a = reinterpret_cast<float *>(ch + (k * R + r) * U + u);
                    // kept in memory: without the barrier GCC holds every chain in registers and spills
                    __asm__ volatile("" ::: "memory");
                    _mm256_store_ps(a, _mm256_fmadd_ps(_mm256_mul_ps(dw[r], dx), _mm256_cvtepi32_ps(dot[r][u]),
                                                       _mm256_load_ps(a)));
                }
            }
        }
    }
}

// Rows [r0, r0 + R) against U units from unit u0 on; nc: the columns left from unit u0.
template <Isa kIsa, int R, int U>
void rows_block(const uint8_t *w, size_t w_stride, int64_t r0, const RowSide *side, const uint8_t *panel,
                uint64_t group_bytes, int64_t u0, int64_t nc, int64_t nb, float *out, size_t out_col_stride,
                const uint8_t *pf, const uint8_t *pf_end) {
    const BlockQ8_0 *wr[R];
    for (int r = 0; r < R; ++r) wr[r] = reinterpret_cast<const BlockQ8_0 *>(w + size_t(r0 + r) * w_stride);
    const uint8_t *x[U];
    for (int u = 0; u < U; ++u) {
        const int64_t unit = u0 + u;
        x[u] = panel + uint64_t(unit / 2) * group_bytes + uint64_t(unit % 2) * (kUnitCols * 4);
    }
    alignas(32) __m256 ch[4 * R * U];
    rows_units<kIsa, R, U>(wr, side, x, nb, pf, pf_end, ch);
    for (int u = 0; u < U; ++u) {
        const int cols = int(std::min<int64_t>(kUnitCols, nc - int64_t(u) * kUnitCols));
        if (cols <= 0) break;
        float *o = out + size_t((u0 + u) * kUnitCols) * out_col_stride + size_t(r0);
        alignas(32) float v[R][kUnitCols];
        for (int r = 0; r < R; ++r) {
            const int i = r * U + u;   // chain k at ch[k * R * U + i]
            _mm256_store_ps(v[r], _mm256_add_ps(_mm256_add_ps(ch[i], ch[2 * R * U + i]),
                                                _mm256_add_ps(ch[R * U + i], ch[3 * R * U + i])));
        }
        for (int c = 0; c < cols; ++c)
            for (int r = 0; r < R; ++r) o[size_t(c) * out_col_stride + size_t(r)] = v[r][c];
    }
}

template <Isa kIsa, int U>
void rows_any(int m, const uint8_t *w, size_t w_stride, int64_t r0, const RowSide *side, const uint8_t *panel,
              uint64_t group_bytes, int64_t u0, int64_t nc, int64_t nb, float *out, size_t out_col_stride,
              const uint8_t *pf, const uint8_t *pf_end) {
    switch (m) {
        case 4: rows_block<kIsa, 4, U>(w, w_stride, r0, side, panel, group_bytes, u0, nc, nb, out, out_col_stride, pf, pf_end); break;
        case 3: rows_block<kIsa, 3, U>(w, w_stride, r0, side, panel, group_bytes, u0, nc, nb, out, out_col_stride, pf, pf_end); break;
        case 2: rows_block<kIsa, 2, U>(w, w_stride, r0, side, panel, group_bytes, u0, nc, nb, out, out_col_stride, pf, pf_end); break;
        default: rows_block<kIsa, 1, U>(w, w_stride, r0, side, panel, group_bytes, u0, nc, nb, out, out_col_stride, pf, pf_end); break;
    }
}

template <Isa kIsa>
void tile_wide(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *panel, int64_t n_cols, int64_t nb,
               float *out, size_t out_col_stride) {
    // Four rows and two units (16 columns) a step: from L2 on Zen 3, 47-49 G multiply-adds/s
    // against 46-47 for two rows and two units (fewer spills, more broadcasts a column).
    constexpr int kRows = 4, kUnits = 2;
    const uint64_t group_bytes = uint64_t(nb) * kGroupBlockBytes;
    const int64_t units = (n_cols + kUnitCols - 1) / kUnitCols;
    thread_local CacheAlignedVector<RowSide> side;   // AVX-VNNI: made on the first column pass
    if (kIsa == Isa::AvxVnni && side.size() < size_t((n_rows + kRows - 1) / kRows) * size_t(nb))
        side.resize(size_t((n_rows + kRows - 1) / kRows) * size_t(nb));
    for (int64_t u0 = 0; u0 < units; u0 += kUnits) {
        const int nu = int(std::min<int64_t>(kUnits, units - u0));
        const int64_t nc = n_cols - u0 * kUnitCols;
        // The first pass pulls the next rows into L2 while it works.
        const bool first = u0 == 0;
        for (int64_t r = 0; r < n_rows; r += kRows) {
            const int m = int(std::min<int64_t>(kRows, n_rows - r));
            RowSide *sd = kIsa == Isa::AvxVnni ? side.data() + size_t(r / kRows) * size_t(nb) : nullptr;
            const uint8_t *pf = nullptr, *pf_end = nullptr;
            if (first) {
                if (kIsa == Isa::AvxVnni) {
                    const BlockQ8_0 *wr[4];
                    for (int q = 0; q < 4; ++q)
                        wr[q] = reinterpret_cast<const BlockQ8_0 *>(w + size_t(r + std::min(q, m - 1)) * w_row_stride);
                    row_side(wr, nb, sd);
                }
                pf = w + size_t(std::min<int64_t>(r + kRows, n_rows)) * w_row_stride;
                pf_end = w + size_t(std::min<int64_t>(r + 2 * kRows, n_rows)) * w_row_stride;
            }
            if (nu == 2)
                rows_any<kIsa, 2>(m, w, w_row_stride, r, sd, panel, group_bytes, u0, nc, nb, out, out_col_stride, pf, pf_end);
            else
                rows_any<kIsa, 1>(m, w, w_row_stride, r, sd, panel, group_bytes, u0, nc, nb, out, out_col_stride, pf, pf_end);
        }
    }
}

}  // namespace

void q8_0_tile_wide_avx2(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *panel, int64_t n_cols,
                         int64_t nb, float *out, size_t out_col_stride) {
    if (avxvnni_enabled())
        tile_wide<Isa::AvxVnni>(w, w_row_stride, n_rows, panel, n_cols, nb, out, out_col_stride);
    else
        tile_wide<Isa::Avx2>(w, w_row_stride, n_rows, panel, n_cols, nb, out, out_col_stride);
}

}  // namespace ds4::quant::detail
