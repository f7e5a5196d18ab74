// Small element-wise and reduction kernels of the forward pass (f32). Written as plain
// loops that the compiler vectorises for AVX2; the heavy lifting is in matmul.
#pragma once
#include <cstdint>

namespace ds4::ops {

// out = x / sqrt(mean(x^2) + eps) * w   (w may be nullptr: unweighted). out may alias x.
void rmsnorm(const float *x, int64_t n, const float *w, float eps, float *out);
// In-place softmax over n values.
void softmax(float *x, int64_t n);
float dot(const float *a, const float *b, int64_t n);
// y += a * x
void axpy(float a, const float *x, float *y, int64_t n);
// Interleaved-pair rotation of the trailing 2*n_pairs channels of x (length head_dim):
// (x0, x1) -> (x0 c - x1 s, x0 s + x1 c) with c, s per pair. sign = -1 rotates back.
void rope_apply(float *x, int64_t head_dim, int64_t n_pairs, const float *cos, const float *sin, float sign);
inline float sigmoid(float x) { return 1.f / (1.f + __builtin_expf(-x)); }
float silu(float x);
// torch.nn.functional.softplus (beta 1, threshold 20).
float softplus(float x);

}  // namespace ds4::ops
