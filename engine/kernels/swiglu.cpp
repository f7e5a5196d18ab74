// SwiGLU with the reference's clamping over many floats: g[i] = silu(min(g[i], L)) *
// clamp(u[i], -L, L), silu(a) = a / (1 + exp(-a)).
//
// libm's expf, one call a value, was ~2% of a flash-shape prefill step (2048 values for
// every routed and shared expert row). Here the exp is vec_math.h's (within 1 ulp of
// libm's); the min, the clamp, the add and the division are the scalar expression's IEEE
// operations, so a result differs from the scalar one only where the two exps do. For
// a < -88 the exp is taken at 88: silu(a) is then a / 1.7e38 instead of -0, both nothing
// against any other product. The min and max follow std::min / std::clamp for NaN (the
// SSE rule returns the second operand where either is NaN, and the bound goes first).
// AVX-512 and AVX2 give the same bits.
#include <cstdint>
#include <cstdlib>

#include "engine/kernels/ops.h"
#include "engine/kernels/vec_math.h"

namespace ds4::ops {

namespace {

using namespace vec;

template <class V>
inline typename V::F swiglu_lanes(typename V::F g, typename V::F u, float lim) {
    const typename V::F a = V::min(V::set1(lim), g);                         // std::min(g, lim)
    const typename V::F b = V::min(V::set1(lim), V::max(V::set1(-lim), u));  // std::clamp(u, -lim, lim)
    const typename V::F e = vexp<V>(V::sub(V::set1(0.f), a));
    return V::mul(V::div(a, V::add(V::set1(1.f), e)), b);
}

template <class V>
inline void swiglu_all(float *g, const float *u, int64_t n, float lim) {
    int64_t i = 0;
    for (; i + V::kLanes <= n; i += V::kLanes) V::storeu(g + i, swiglu_lanes<V>(V::loadu(g + i), V::loadu(u + i), lim));
    if (i < n) {
        const typename V::Mask k = V::first(n - i);
        V::store(g + i, k, swiglu_lanes<V>(V::load(g + i, k), V::load(u + i, k), lim));
    }
}

}  // namespace

namespace detail {

DS4_AVX512 __attribute__((flatten)) void swiglu_avx512(float *g, const float *u, int64_t n, float lim) {
    swiglu_all<Avx512>(g, u, n, lim);
}

__attribute__((flatten)) void swiglu_avx2(float *g, const float *u, int64_t n, float lim) {
    swiglu_all<Avx2>(g, u, n, lim);
}

}  // namespace detail

void swiglu(float *g, const float *u, int64_t n, float lim) {
    if (detail::exp_shift_avx512_usable()) detail::swiglu_avx512(g, u, n, lim);
    else detail::swiglu_avx2(g, u, n, lim);
}

}  // namespace ds4::ops
