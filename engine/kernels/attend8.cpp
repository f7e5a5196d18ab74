#include "engine/kernels/attend8.h"

#include <immintrin.h>

#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <vector>

namespace ds4::ops {

#define DS4_AVX512 __attribute__((target("avx512f,avx512dq")))
// GCC 12 warns about the undefined pass-through operand inside its AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

bool attend8_usable(int64_t hd) {
    static const bool on = [] {
        if (const char *e = std::getenv("DS4_NO_AVX512"); e && *e && *e != '0') return false;
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
    }();
    return on && hd > 0 && hd % 16 == 0;
}

namespace {

// ops::dot's order for one (head, key) pair sits in 8 lanes: lane j is the fma chain over
// elements i = j (mod 8); the pairs, then the quads, then the halves are added as
// ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)). Two keys share a register (lanes 0-7
// and 8-15); this folds both and returns them in lanes 0 and 8.
DS4_AVX512 inline __m512 fold8(__m512 s) {
    s = _mm512_add_ps(s, _mm512_permute_ps(s, 0xB1));               // s0 + s1 in lane 0, s2 + s3 in lane 2
    s = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4E));               // (s0 + s1) + (s2 + s3) in lane 0
    return _mm512_add_ps(s, _mm512_shuffle_f32x4(s, s, 0xB1));      // + ((s4 + s5) + (s6 + s7)) from lane 4
}

}  // namespace

DS4_AVX512 void attend8_scores(const float *q, const float *const *rows, int64_t nk, int64_t hd, float scale,
                               float *lg) {
    // Each 8 elements of a head's query twice over (a register's two keys take the same
    // query slice), laid out once a call: a 256-bit broadcast issues on a permute pipe on Zen
    // 5, and one per two FMAs held the scores at ~98 G multiply-adds/s a core; from the copy,
    // by plain loads, ~118 (hd 512, 384 keys). (A masked load in place of each key pair's
    // 256-bit insert ran 2.7x slower.)
    thread_local std::vector<float> buf;
    if (buf.size() < size_t(16 * hd + 16)) buf.resize(size_t(16 * hd + 16));
    // on a cache line: a 512-bit load across two issues at half the rate
    float *twice = reinterpret_cast<float *>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t(63));
    // element i's slices of the 8 heads side by side (16 * i + 16 * h): the step reads one run
    for (int64_t i = 0; i < hd; i += 8)
        for (int h = 0; h < 8; ++h) {
            std::memcpy(twice + 16 * i + 16 * h, q + h * hd + i, 8 * sizeof(float));
            std::memcpy(twice + 16 * i + 16 * h + 8, q + h * hd + i, 8 * sizeof(float));
        }
    const float *qq = twice;
    // Four keys a pass (two registers of two), 8 heads: 16 accumulators.
    for (int64_t k0 = 0; k0 < nk; k0 += 4) {
        const float *r[4];
        for (int j = 0; j < 4; ++j) r[j] = rows[k0 + j < nk ? k0 + j : nk - 1];   // past the end: repeat, unused
        __m512 acc[8][2];
        for (int h = 0; h < 8; ++h) acc[h][0] = acc[h][1] = _mm512_setzero_ps();
        for (int64_t i = 0; i < hd; i += 8) {
            const __m512 ab = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(r[0] + i)), _mm256_loadu_ps(r[1] + i), 1);
            const __m512 cd = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(r[2] + i)), _mm256_loadu_ps(r[3] + i), 1);
            for (int h = 0; h < 8; ++h) {
                __m512 qv = _mm512_load_ps(qq + 16 * i + 16 * h);
                __asm__("" : "+v"(qv));   // one load for both keys' FMAs (folded, it is loaded twice)
                acc[h][0] = _mm512_fmadd_ps(qv, ab, acc[h][0]);
                acc[h][1] = _mm512_fmadd_ps(qv, cd, acc[h][1]);
            }
        }
        for (int h = 0; h < 8; ++h) {
            alignas(64) float v[2][16];
            _mm512_store_ps(v[0], fold8(acc[h][0]));
            _mm512_store_ps(v[1], fold8(acc[h][1]));
            const float d[4] = {v[0][0], v[0][8], v[1][0], v[1][8]};
            for (int j = 0; j < 4 && k0 + j < nk; ++j) lg[h * nk + k0 + j] = d[j] * scale;
        }
    }
}

DS4_AVX512 void attend8_output(const float *w, const float *const *rows, int64_t nk, int64_t hd, float *o) {
    // 32 output elements a pass (two registers) for 8 heads: 16 accumulators; every key in
    // order, so each element is the same fma chain as ops::axpy's.
    for (int64_t c = 0; c < hd; c += 32) {
        __m512 acc[8][2];
        for (int h = 0; h < 8; ++h) acc[h][0] = acc[h][1] = _mm512_setzero_ps();
        const bool two = c + 16 < hd;
        for (int64_t k = 0; k < nk; ++k) {
            const __m512 x0 = _mm512_loadu_ps(rows[k] + c);
            const __m512 x1 = two ? _mm512_loadu_ps(rows[k] + c + 16) : x0;
            for (int h = 0; h < 8; ++h) {
                const __m512 wv = _mm512_set1_ps(w[h * nk + k]);
                acc[h][0] = _mm512_fmadd_ps(wv, x0, acc[h][0]);
                acc[h][1] = _mm512_fmadd_ps(wv, x1, acc[h][1]);
            }
        }
        for (int h = 0; h < 8; ++h) {
            _mm512_storeu_ps(o + h * hd + c, acc[h][0]);
            if (two) _mm512_storeu_ps(o + h * hd + c + 16, acc[h][1]);
        }
    }
}

}  // namespace ds4::ops
