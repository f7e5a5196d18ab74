// The parts of attention's softmax, many weights at a time: the maximum, and x[i] = exp(x[i]
// - m) with their sum. A libm expf per weight, a scalar max and a sequential double sum were
// ~20% of a flash-shape prefill step's attention on Zen 5.
//
// The exp is vec_math.h's (softmax has t <= 0; below -86 it gives 0: nothing against the
// largest weight, 1). AVX-512 and AVX2 run the same operations lane for lane, so both give
// the same bits. The sum is in double, 8 lanes (lane j takes i = j mod 8, in order), then
// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), on both.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "engine/kernels/ops.h"
#include "engine/kernels/vec_math.h"

namespace ds4::ops {

namespace {

using namespace vec;

// One channel block of softmax_pool: lanes are channels, the slots go in order.
template <class V>
inline void pool_block(const float *const *gate, const float *const *val, int n, int64_t c, typename V::Mask m,
                       float *out) {
    typename V::F mx = V::set1(-std::numeric_limits<float>::infinity());
    for (int k = 0; k < n; ++k) mx = V::max(V::load(gate[k] + c, m), mx);   // a NaN gate is passed over
    typename V::D den_lo = V::dzero(), den_hi = den_lo, acc_lo = den_lo, acc_hi = den_lo;
    for (int k = 0; k < n; ++k) {
        const typename V::F e = vexp<V>(V::sub(V::load(gate[k] + c, m), mx));
        const typename V::F v = V::load(val[k] + c, m);
        den_lo = V::dadd(den_lo, V::lo(e));
        den_hi = V::dadd(den_hi, V::hi(e));
        acc_lo = V::dadd(acc_lo, V::dmul(V::lo(e), V::lo(v)));
        acc_hi = V::dadd(acc_hi, V::dmul(V::hi(e), V::hi(v)));
    }
    V::store(out + c, m, V::narrow(V::ddiv(acc_lo, den_lo), V::ddiv(acc_hi, den_hi)));
}

template <class V>
inline void pool_all(const float *const *gate, const float *const *val, int n, int64_t dim, float *out) {
    int64_t c = 0;
    for (; c + V::kLanes <= dim; c += V::kLanes) pool_block<V>(gate, val, n, c, V::all(), out);
    if (c < dim) pool_block<V>(gate, val, n, c, V::first(dim - c), out);
}

// exp_shift for one width: the exponentials in place, their sum in 8 double lanes (element i
// to lane i mod 8, in order) then pairs. Lanes past n add +0, which leaves a lane as it was
// (the lanes hold sums of exponentials: +0 or more, or NaN).
template <class V>
inline double exp_shift_all(float *x, int64_t n, float m) {
    const typename V::F mv = V::set1(m);
    typename V::Sum sum = V::sum_zero();
    int64_t i = 0;
    for (; i + V::kLanes <= n; i += V::kLanes) {   // full steps: plain loads and stores (masked ones cost ~15%)
        const typename V::F e = vexp<V>(V::sub(V::loadu(x + i), mv));
        V::storeu(x + i, e);
        sum = V::sum_add(sum, e);
    }
    if (i < n) {
        const typename V::Mask k = V::first(n - i);
        const typename V::F e = V::keep(k, vexp<V>(V::sub(V::load(x + i, k), mv)));
        V::store(x + i, k, e);
        sum = V::sum_add(sum, e);
    }
    alignas(64) double l[8];
    V::sum_lanes(sum, l);
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

}  // namespace

namespace detail {

DS4_AVX512 __attribute__((flatten)) double exp_shift_avx512(float *x, int64_t n, float m) {
    return exp_shift_all<Avx512>(x, n, m);
}

__attribute__((flatten)) double exp_shift_avx2(float *x, int64_t n, float m) { return exp_shift_all<Avx2>(x, n, m); }

DS4_AVX512 __attribute__((flatten)) void softmax_pool_avx512(const float *const *gate, const float *const *val, int n, int64_t dim,
                                    float *out) {
    pool_all<Avx512>(gate, val, n, dim, out);
}

__attribute__((flatten)) void softmax_pool_avx2(const float *const *gate, const float *const *val, int n, int64_t dim, float *out) {
    pool_all<Avx2>(gate, val, n, dim, out);
}

bool exp_shift_avx512_usable() {
    static const bool on = [] {
        if (const char *e = std::getenv("DS4_NO_AVX512"); e && *e && *e != '0') return false;
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
    }();
    return on;
}

}  // namespace detail

double exp_shift(float *x, int64_t n, float m) {
    return detail::exp_shift_avx512_usable() ? detail::exp_shift_avx512(x, n, m) : detail::exp_shift_avx2(x, n, m);
}

void softmax_pool(const float *const *gate, const float *const *val, int n, int64_t dim, float *out) {
    if (detail::exp_shift_avx512_usable()) detail::softmax_pool_avx512(gate, val, n, dim, out);
    else detail::softmax_pool_avx2(gate, val, n, dim, out);
}

float max_of(const float *x, int64_t n, float init) {
    // max is exact, so any order gives the same value; a NaN anywhere gives NaN
    __m256 acc = _mm256_set1_ps(init), nan = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        acc = _mm256_max_ps(v, acc);   // a NaN in v gives acc: noted apart
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    if (_mm256_movemask_ps(nan)) return std::numeric_limits<float>::quiet_NaN();
    alignas(32) float l[8];
    _mm256_store_ps(l, acc);
    float m = l[0];
    for (int j = 1; j < 8; ++j) m = std::isnan(l[j]) || l[j] > m ? l[j] : m;
    for (; i < n; ++i) m = std::isnan(x[i]) || x[i] > m ? x[i] : m;
    return m;
}

int64_t argmax_first(const float *x, int64_t n) {
    if (n <= 0) return -1;
    if (std::isnan(x[0])) return 0;   // std::max_element keeps a NaN first element
    // The largest non-NaN value (max is exact; a NaN lane never wins: max_ps returns its
    // second operand, the accumulator, when either is NaN), then the first index holding it.
    __m256 acc = _mm256_set1_ps(x[0]);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_max_ps(_mm256_loadu_ps(x + i), acc);
    alignas(32) float l[8];
    _mm256_store_ps(l, acc);
    float m = l[0];
    for (int j = 1; j < 8; ++j) m = l[j] > m ? l[j] : m;
    for (; i < n; ++i) m = x[i] > m ? x[i] : m;
    const __m256 mv = _mm256_set1_ps(m);
    for (i = 0; i + 8 <= n; i += 8) {
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), mv, _CMP_EQ_OQ));
        if (hit) return i + __builtin_ctz(unsigned(hit));
    }
    for (; i < n; ++i)
        if (x[i] == m) return i;
    return 0;   // not reached: m is one of x
}

}  // namespace ds4::ops
