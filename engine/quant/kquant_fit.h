// Scale/offset fitting shared by the Q2_K and Q4_K quantizers.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace ds4::quant::detail {

// Fits x[i] ~= scale * L[i] - offset with integer L in 0..nmax and offset >= 0, minimising
// sum w[i] * err^2: starts from the min/max grid, then tries nstep+1 stretched grids
// (iscale = (nmax + rmin + k * rdelta) / range) and solves the 2x2 least-squares problem
// for each, keeping the best. Returns scale (0 for a constant block).
float fit_scale_offset(int n, int nmax, const float *x, const float *w, uint8_t *L, float *offset, float rmin,
                       float rdelta, int nstep);

// Quantizer input hygiene: non-finite values become 0.
void sanitize(const float *src, float *dst, int n);

// Round to nearest (even) without a libm call; out-of-range inputs saturate, NaN -> 0.
inline int nearest_int(float v) {
    if (!(v == v)) return 0;
    v = v < -1e9f ? -1e9f : (v > 1e9f ? 1e9f : v);
    return _mm_cvtss_si32(_mm_set_ss(v));
}

}  // namespace ds4::quant::detail
