// Scale/offset fitting shared by the Q2_K and Q4_K quantizers.
#pragma once
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

inline int nearest_int(float v) { return int(__builtin_lrintf(v)); }

}  // namespace ds4::quant::detail
