// The wide packed panel of Q8_0 activations (q8_0_tile.cpp packs it; the AVX-512 VNNI tile
// and the AVX2 tile read it): per group of kPackCols columns and block, 8 slices x 16 lanes
// x 4 bytes (lane c: column c's bytes 4j..4j+3), then the 16 f32 scales. Where the tile has
// vpdpbusd (AVX-512 VNNI, AVX-VNNI) the bytes are stored as x + 128 (x ^ 0x80), its unsigned
// side; for the AVX2 tile (vpmaddubsw) as they are.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "engine/quant/blocks.h"
#include "engine/quant/kernels.h"

namespace ds4::quant::detail {

constexpr int64_t kSliceBytes = kPackCols * 4;
constexpr int64_t kScaleOff = 8 * kSliceBytes;
constexpr int64_t kGroupBlockBytes = kScaleOff + kPackCols * 4;

// What the tiles on an offset panel need of four weight rows for one block: minus 128 times
// the sum of each row's bytes (their accumulators' start), and each row's scale as f32.
struct alignas(32) RowSide {
    int32_t corr[4];
    float dw[4];
};

// Block b's f16 scales of rows w[0..3] as four f32 (RowSide::dw), in one conversion.
inline __m128 row_scales4(const BlockQ8_0 *const *w, int64_t b) {
    const uint64_t d4 = uint64_t(w[0][b].d) | uint64_t(w[1][b].d) << 16 | uint64_t(w[2][b].d) << 32 |
                        uint64_t(w[3][b].d) << 48;
    return _mm_cvtph_ps(_mm_cvtsi64_si128(int64_t(d4)));
}

// Whether q8_0_pack stores the wide panel offset (x + 128): for the tiles with vpdpbusd.
bool q8_0_panel_offset();

// The AVX2 tile (q8_0_tile_avx2.cpp): n_rows weight rows against the n_cols columns of a
// wide panel, out[c * out_col_stride + r], each result bit-identical to dot_q8_0.
void q8_0_tile_wide_avx2(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *panel, int64_t n_cols,
                         int64_t nb, float *out, size_t out_col_stride);

// The AVX-512 VNNI tile with the weight rows in the lanes (q8_0_tile_rows.cpp), on the same
// wide panel, nb blocks a row: out[c * out_col_stride + r], bit-identical to dot_q8_0.
void q8_0_tile_rows(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *panel, int64_t n_cols,
                    int64_t nb, float *out, size_t out_col_stride);

}  // namespace ds4::quant::detail
