// Tensor element formats: conversion to/from f32 and dot products.
//
// Block layouts are the standard GGML ones (so ds4/llama.cpp GGUF files load unchanged):
//   F32, F16, BF16: plain.      Q8_0: 32 elems = f16 d + 32 x int8              (34 B)
//   Q2_K: 256 elems, 84 B.      Q4_K: 256 elems, 144 B.      IQ2_XXS: 256 elems, 66 B.
// Everything here works on rows; callers pass n = elements in the row (a multiple of the
// block size). Kernels are AVX2 (x86-64-v3) with scalar reference versions used by tests;
// the IQ2_XXS and Q2_K dots switch to AVX-512 variants at run time where the CPU has
// AVX-512 F/BW/VL/DQ (bit-identical results; DS4_NO_AVX512=1 turns them off), and IQ2_XXS
// products to a transposed-activation kernel on AVX-512 VBMI + VNNI + GFNI (tile_pack
// below; DS4_NO_VBMI=1 turns it off).
#pragma once
#include <cstddef>
#include <cstdint>

#include "engine/gguf/gguf.h"

namespace ds4::quant {

using gguf::Type;

// Row of n elements of type t -> f32.
void dequantize_row(Type t, const void *src, float *dst, int64_t n);
// f32 row -> type t (F32/F16/BF16/Q8_0/Q2_K/Q4_K/IQ2_XXS). Throws for types without a
// quantizer.
void quantize_row(Type t, const float *src, void *dst, int64_t n);

// Activations are quantized once per row to this format for the fused integer dots:
// Q8_0 weights use Q8_0 activations; K/IQ formats use Q8_K (256 elems: f32 d, 256 x int8,
// 16 x int16 block sums = 292 B).
Type vec_dot_type(Type weight_type);   // F32/F16/BF16 -> F32
uint64_t vec_dot_row_bytes(Type weight_type, int64_t n);
void quantize_activation(Type weight_type, const float *x, void *dst, int64_t n);

// dot(weight_row, activation_row) where the activation row is in vec_dot_type(t)
// format (f32 for plain weight types).
float vec_dot(Type t, const void *w, const void *x, int64_t n);

// GEMV helper: out[r] = vec_dot(t, w + r * w_row_stride, x, n) for r < n_rows, bit for bit.
// Q8_0 and Q2_K (on VBMI) take four rows a quarter of the rows apart a step of each in
// turn, and IQ2_XXS's packed kernel two: sequential streams far apart read faster from
// memory than one (Zen 5: Q8_0 70-75% of a plain read with one, 97-100% with four); the
// other formats go one row after another (adjacent rows interleaved measured 2-4x slower;
// for Q4_K, rows far apart measured slower with the weights in a file's page cache).
// Thread-safe: callers split row ranges over threads.
void vec_dot_rows(Type t, const void *w, size_t w_row_stride, int64_t n_rows, const void *x, int64_t n, float *out);

// GEMM helper for prefill: out[c * out_col_stride + r] = vec_dot(t, w + r * w_row_stride,
// x + c * x_row_stride, n) for r < n_rows, c < n_cols (activation rows in vec_dot_type(t)
// format). Each weight block is decoded once for up to 4 activation rows; every result is
// bit-identical to the vec_dot of that pair. Activation rows are taken 4 at a time with
// all n_rows weight rows passing under them, so pass a row block that fits in L2 (e.g.
// ~256 KB of weights) and split row blocks over threads. Thread-safe like vec_dot_rows.
// F32 / F16 / BF16 weights take a chunked tile instead (the same bits): the rows cut into
// chunks of 1024 elements, and per chunk every weight row passes over every activation row,
// the partial sums kept between chunks, so called with all of a few long weight rows (the
// hyper-connection mix, 24 rows of 16384) and a share of the tokens, each activation row is
// read once.
void vec_dot_tile(Type t, const void *w, size_t w_row_stride, int64_t n_rows, const void *x, size_t x_row_stride,
                  int64_t n_cols, int64_t n, float *out, size_t out_col_stride);

// Packed activations, where the CPU has a kernel that wants the activation rows in its own
// layout: Q8_0 for kTilePackMinCols columns or more on AVX-512 VNNI, kTilePackMinColsAvxVnni
// on AVX-VNNI, kTilePackMinColsAvx2 on AVX2 (columns in the lanes), IQ2_XXS on AVX-512 VBMI
// + VNNI + GFNI for any column count, one row included (each row transposed position-major,
// so the codebook lookups become byte permutes). The rows are repacked once per product and
// each row block then runs vec_dot_tile_packed. Results are
// bit-identical to vec_dot. tile_pack_bytes is 0 where no packed path applies: use
// vec_dot_tile / vec_dot_rows there. tile_pack writes column groups [g0, g1) of
// tile_pack_groups(t, n_cols), so threads can split the packing. The kernels read the
// packed panel in 64-byte loads: give it a buffer on a cache line (CacheAlignedVector).
// 4: from memory, 4 columns ran 10% faster packed (narrow) than by q8_0_tile_cols on Zen 5; 3 ran 15% slower.
constexpr int64_t kTilePackMinCols = 4;
// Q8_0 on AVX2 (no VNNI) packs from 8 columns: its tile fills 8-column units, and from L2
// on Zen 3 four columns ran ~30% slower packed than by q8_0_tile_cols, six level, eight
// 25-45% faster.
constexpr int64_t kTilePackMinColsAvx2 = 8;
// With AVX-VNNI (no AVX-512) from 5: on the Xeon host (DS4_NO_AVX512=1, one core) 4 / 6 / 7
// columns ran 37-39 / 54-57 / 62-68 G weight-dots/s packed against 39-42 / 37-39 / 38-42 by
// q8_0_tile_cols, the packed rate in step with the lanes filled (5: ~47 against ~40).
constexpr int64_t kTilePackMinColsAvxVnni = 5;
// The int8 instruction the packed Q8_0 tile runs on this CPU now: "avx512-vnni" (512-bit
// registers' vpdpbusd), "avx-vnni" (the VEX vpdpbusd) or "avx2" (vpmaddubsw + vpmaddwd).
const char *q8_0_tile_isa();
uint64_t tile_pack_bytes(Type t, int64_t n, int64_t n_cols);
// Whether the packed tile for t against n_cols columns streams its weight rows with its
// working set in L1 (Q8_0's rows-in-lanes tile on AVX-512 VNNI): callers give it long runs
// of rows rather than L2-sized blocks, so its prefetch of the next rows is not cut short.
bool tile_streams_rows(Type t, int64_t n_cols);
int64_t tile_pack_groups(Type t, int64_t n_cols);
void tile_pack(Type t, const void *x, size_t x_row_stride, int64_t n_cols, int64_t n, int64_t g0, int64_t g1,
               void *packed);
void vec_dot_tile_packed(Type t, const void *w, size_t w_row_stride, int64_t n_rows, const void *packed,
                         int64_t n_cols, int64_t n, float *out, size_t out_col_stride);

// Reference (scalar, obviously-correct) versions for tests.
void dequantize_row_ref(Type t, const void *src, float *dst, int64_t n);
float vec_dot_ref(Type t, const void *w, const void *x, int64_t n);

// f16 / bf16 scalar conversions.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);   // round to nearest even

}  // namespace ds4::quant
