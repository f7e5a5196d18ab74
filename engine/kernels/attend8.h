// Attention of 8 heads of one row over the same key rows (K = V, as in V4's MQA): on
// AVX-512 each key row is read once for 8 heads instead of once per head, on AVX2 twice. The floats are
// those of ops::dot (scores) and ops::axpy (output) per head, operation for operation, so
// results are bit-identical to the per-head loop (tests/kernels). The softmax between the
// two stays with the caller.
#pragma once
#include <cstdint>

namespace ds4::ops {

// hd a multiple of 16.
bool attend8_usable(int64_t hd);
// The AVX-512 kernels where the CPU has AVX-512 F/DQ and DS4_NO_AVX512=1 is not set, else
// the AVX2 ones (the same floats). Tests flip it to compare.
bool &attend8_avx512();

// lg[h * nk + k] = dot(q + h * hd, rows[k], hd) * scale for 8 heads, as ops::dot.
void attend8_scores(const float *q, const float *const *rows, int64_t nk, int64_t hd, float scale, float *lg);

// o + h * hd = sum over k in order of w[h * nk + k] * rows[k] (zeroed first), as repeated
// ops::axpy, for 8 heads.
void attend8_output(const float *w, const float *const *rows, int64_t nk, int64_t hd, float *o);

}  // namespace ds4::ops
