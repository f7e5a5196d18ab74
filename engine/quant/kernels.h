// Per-format kernels behind the Type dispatch in quants.cpp (internal to engine/quant).
#pragma once
#include <cstddef>
#include <cstdint>

namespace ds4::quant::detail {

// out[r] = dot(row r of w, x) for r < nrows; rows are `stride` bytes apart; x is in the
// format's activation type; n is the row length in elements.
using RowsFn = void (*)(const uint8_t *w, size_t stride, int64_t nrows, const void *x, int64_t n, float *out);

void rows_f32(const uint8_t *w, size_t stride, int64_t nrows, const void *x, int64_t n, float *out);
void rows_f16(const uint8_t *w, size_t stride, int64_t nrows, const void *x, int64_t n, float *out);
void rows_bf16(const uint8_t *w, size_t stride, int64_t nrows, const void *x, int64_t n, float *out);
void rows_q8_0(const uint8_t *w, size_t stride, int64_t nrows, const void *x, int64_t n, float *out);
void rows_q2_k(const uint8_t *w, size_t stride, int64_t nrows, const void *x, int64_t n, float *out);
void rows_q4_k(const uint8_t *w, size_t stride, int64_t nrows, const void *x, int64_t n, float *out);
void rows_iq2_xxs(const uint8_t *w, size_t stride, int64_t nrows, const void *x, int64_t n, float *out);

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
void quant_q8_k(const float *src, void *dst, int64_t n);
void quant_q2_k(const float *src, void *dst, int64_t n);
void quant_q4_k(const float *src, void *dst, int64_t n);
void quant_iq2_xxs(const float *src, void *dst, int64_t n);

// Scalar references: element-by-element from the format definition.
void dequant_ref(uint32_t type, const void *src, float *dst, int64_t n);

}  // namespace ds4::quant::detail
