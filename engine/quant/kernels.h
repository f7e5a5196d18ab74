// Per-format kernels behind the Type dispatch in quants.cpp (internal to engine/quant).
#pragma once
#include <cstddef>
#include <cstdint>

namespace ds4::quant::detail {

// One weight row against ncols (1..kMaxCols) activation rows: out[c] = dot(w, x[c]).
// Activation rows are in the format's activation type; n is the row length. Each weight
// block is decoded once for all columns, and column c's result is bit-identical to a
// call with that column alone (same operations in the same order).
constexpr int kMaxCols = 4;
using DotFn = void (*)(const uint8_t *w, const void *const *x, int ncols, int64_t n, float *out);
// n_rows weight rows against ncols (1..kMaxCols) activation rows: out[c][r], the DotFn's
// results bit for bit, with work that depends on the activations only done once.
using TileColsFn = void (*)(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const void *const *x, int ncols,
                            int64_t n, float *const *out);

// n_rows weight rows against one activation row: out[r], the DotFn's results bit for bit.
using RowsFn = void (*)(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const void *x, int64_t n, float *out);

void dot_f32(const uint8_t *w, const void *const *x, int ncols, int64_t n, float *out);
void dot_f16(const uint8_t *w, const void *const *x, int ncols, int64_t n, float *out);
void dot_bf16(const uint8_t *w, const void *const *x, int ncols, int64_t n, float *out);
// A RowsFn: on AVX-512 four rows a quarter apart a step (plain_kernels.cpp says why).
void rows_f32(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const void *x, int64_t n, float *out);
// F32 (0) / F16 (1) / BF16 (30) weight rows against many f32 activation rows, cut into
// chunks (vec_dot_tile on plain types): out[c * out_col_stride + r], the bits of dot_f32/f16/bf16.
void plain_tile(uint32_t type, const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *x,
                size_t x_row_stride, int64_t n_cols, int64_t n, float *out, size_t out_col_stride);
void dot_q8_0(const uint8_t *w, const void *const *x, int ncols, int64_t n, float *out);
// A RowsFn: four rows far apart a step of each in turn (q8_0.cpp says why).
void rows_q8_0(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const void *x, int64_t n, float *out);
void dot_q2_k(const uint8_t *w, const void *const *x, int ncols, int64_t n, float *out);
// A RowsFn: on AVX-512 VBMI four rows far apart side by side (q2_k.cpp says why).
void rows_q2_k(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const void *x, int64_t n, float *out);
void dot_q4_k(const uint8_t *w, const void *const *x, int ncols, int64_t n, float *out);
// A RowsFn: one row after another, on AVX-512 VNNI the activation row's sub-block sums made once.
void rows_q4_k(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const void *x, int64_t n, float *out);
// A TileColsFn: on AVX-512 VNNI the activations' block sums and scales gathered once per call.
void q4_k_tile_cols(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const void *const *x, int ncols, int64_t n,
                    float *const *out);
void dot_iq2_xxs(const uint8_t *w, const void *const *x, int ncols, int64_t n, float *out);

// IQ2_XXS and Q2_K dots use AVX-512 variants when the CPU has AVX-512 F/BW/VL/DQ (same
// results bit for bit; env DS4_NO_AVX512=1 disables them). Tests flip this to compare.
bool &avx512_enabled();
// The Q8_0 dot uses AVX-512 VNNI (vpdpbusd on 256-bit registers) when the CPU has it and
// AVX-512 is enabled (same results bit for bit; env DS4_NO_VNNI=1 disables it alone). Tests
// flip this where vnni_available().
bool vnni_available();
bool &vnni_enabled();
// Without AVX-512 VNNI, the Q8_0 kernels (dots, rows, tiles) take AVX-VNNI (the VEX vpdpbusd
// on 256-bit registers: Intel cores from Alder Lake on) where the CPU has it (same results
// bit for bit; env DS4_NO_AVXVNNI=1 disables it). Tests flip this where avxvnni_available().
bool avxvnni_available();
bool &avxvnni_enabled();

// Packed column tile for Q8_0 (q8_0_tile.cpp on AVX-512 VNNI, q8_0_tile_avx2.cpp without):
// activation rows are packed kPackCols to a group; results are bit-identical to dot_q8_0.
// With VNNI up to 8 columns take one narrow group; otherwise groups of kPackCols.
constexpr int kPackCols = 16;
int64_t q8_0_pack_groups(int64_t n_cols);
uint64_t q8_0_pack_bytes(int64_t n, int64_t n_cols);
void q8_0_pack(const void *x, size_t x_row_stride, int64_t n_cols, int64_t n, int64_t g0, int64_t g1, uint8_t *dst);
// A TileColsFn: the activations' block scales converted once for all rows.
void q8_0_tile_cols(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const void *const *x, int ncols, int64_t n,
                    float *const *out);

void q8_0_tile_packed(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *packed, int64_t n_cols,
                      int64_t n, float *out, size_t out_col_stride);
// On AVX-512 VNNI, 9 to this many columns go with the weight rows in the lanes
// (q8_0_tile_rows.cpp), where the column tile would leave lanes empty; the same results bit
// for bit. env DS4_Q8_ROWS_TILE_MAX=N sets it (0: never); tests flip it.
constexpr int64_t kQ8RowsTileMaxCols = 28;
int64_t &q8_0_rows_tile_max();
// Whether q8_0_tile_packed takes n_cols columns in the rows layout now (VNNI, 9 to
// q8_0_rows_tile_max() columns).
bool q8_0_rows_layout(int64_t n_cols);

// IQ2_XXS with transposed activations on AVX-512 VBMI + VNNI (iq2_xxs_packed.cpp):
// column c of the packed buffer is activation row c transposed; results are bit-identical
// to dot_iq2_xxs. env DS4_NO_VBMI=1 disables it; tests flip vbmi_enabled to compare.
bool vbmi_available();
bool &vbmi_enabled();
// Its 256-entry code lookups by two vpermi2b and a blend (one uop each on AMD Zen 4/5)
// instead of four vpermb (on Intel a vpermi2b is three uops): on for AMD CPUs, env
// DS4_IQ2_PERMUTES=two / =four chooses; the same results bit for bit (tests flip it).
bool &iq2_xxs_two_source_permutes();
uint64_t iq2_xxs_pack_bytes(int64_t n, int64_t n_cols);
void iq2_xxs_pack(const void *x, size_t x_row_stride, int64_t n, int64_t c0, int64_t c1, uint8_t *dst);
void iq2_xxs_tile_packed(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *packed, int64_t n_cols,
                         int64_t n, float *out, size_t out_col_stride);

// The AVX2 IQ2_XXS dot takes up to kWideCols columns: it decodes a 32-element chunk and
// uses it for every column, and eight columns' sums fit the registers beside it, so its
// costly decode is spread over twice the columns (tile from L2 on Zen 3: medians ~21 -> ~24
// G weight-dots/s; the Q2_K dot, whose float accumulators are vectors a column, measured
// ~7% slower at eight). iq2_xxs_max_cols: kWideCols on the AVX2 path, kMaxCols where an
// AVX-512 kernel runs.
constexpr int kWideCols = 8;
int iq2_xxs_max_cols();

// Instantiates F<1..kMaxCols> behind a runtime column count.
#define DS4_QUANT_COLS_DISPATCH(F, ...)          \
    switch (ncols) {                             \
        case 1: F<1>(__VA_ARGS__); break;        \
        case 2: F<2>(__VA_ARGS__); break;        \
        case 3: F<3>(__VA_ARGS__); break;        \
        default: F<4>(__VA_ARGS__); break;       \
    }
// The same for F<1..kWideCols>.
#define DS4_QUANT_WIDE_COLS_DISPATCH(F, ...)     \
    switch (ncols) {                             \
        case 1: F<1>(__VA_ARGS__); break;        \
        case 2: F<2>(__VA_ARGS__); break;        \
        case 3: F<3>(__VA_ARGS__); break;        \
        case 4: F<4>(__VA_ARGS__); break;        \
        case 5: F<5>(__VA_ARGS__); break;        \
        case 6: F<6>(__VA_ARGS__); break;        \
        case 7: F<7>(__VA_ARGS__); break;        \
        default: F<8>(__VA_ARGS__); break;       \
    }

void dequant_f16(const void *src, float *dst, int64_t n);
void dequant_bf16(const void *src, float *dst, int64_t n);
void dequant_q8_0(const void *src, float *dst, int64_t n);
void dequant_q8_k(const void *src, float *dst, int64_t n);
void dequant_q2_k(const void *src, float *dst, int64_t n);
void dequant_q4_k(const void *src, float *dst, int64_t n);
void dequant_iq2_xxs(const void *src, float *dst, int64_t n);

void quant_f16(const float *src, void *dst, int64_t n);
void quant_bf16(const float *src, void *dst, int64_t n);
void quant_q8_0(const float *src, void *dst, int64_t n);
void quant_q8_0_ref(const float *src, void *dst, int64_t n);   // scalar definition of quant_q8_0
void quant_q8_k(const float *src, void *dst, int64_t n);
void quant_q2_k(const float *src, void *dst, int64_t n);
void quant_q4_k(const float *src, void *dst, int64_t n);
void quant_iq2_xxs(const float *src, void *dst, int64_t n);

// Scalar references: element-by-element from the format definition.
void dequant_ref(uint32_t type, const void *src, float *dst, int64_t n);

}  // namespace ds4::quant::detail
