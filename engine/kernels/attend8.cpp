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

bool &attend8_avx512() {
    static bool on = [] {
        if (const char *e = std::getenv("DS4_NO_AVX512"); e && *e && *e != '0') return false;
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
    }();
    return on;
}

bool attend8_usable(int64_t hd) { return hd > 0 && hd % 16 == 0; }

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

namespace {

DS4_AVX512 void scores_avx512(const float *q, const float *const *rows, int64_t nk, int64_t hd, float scale,
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

DS4_AVX512 void output_avx512(const float *w, const float *const *rows, int64_t nk, int64_t hd, float *o) {
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

// AVX2: 16 registers hold 8 accumulators beside their operands, so a pass takes 4 heads and
// two keys (scores) or two 8-element slices (output), and each key row is read twice for 8
// heads, not 8 times. Lane j of a score accumulator is ops::dot's chain j, so the same fold
// gives the same floats.
inline float fold8_avx2(__m256 s) {
    s = _mm256_add_ps(s, _mm256_permute_ps(s, 0xB1));   // s0 + s1 in lane 0, s2 + s3 in lane 2
    s = _mm256_add_ps(s, _mm256_permute_ps(s, 0x4E));   // (s0 + s1) + (s2 + s3) in lane 0
    return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)));
}

void scores_avx2(const float *q, const float *const *rows, int64_t nk, int64_t hd, float scale, float *lg) {
    for (int h0 = 0; h0 < 8; h0 += 4)
        for (int64_t k0 = 0; k0 < nk; k0 += 2) {
            const bool two = k0 + 1 < nk;
            const float *r0 = rows[k0], *r1 = rows[two ? k0 + 1 : k0];
            __m256 acc[4][2];
            for (int h = 0; h < 4; ++h) acc[h][0] = acc[h][1] = _mm256_setzero_ps();
            for (int64_t i = 0; i < hd; i += 8) {
                const __m256 a = _mm256_loadu_ps(r0 + i), b = _mm256_loadu_ps(r1 + i);
                for (int h = 0; h < 4; ++h) {
                    const __m256 qv = _mm256_loadu_ps(q + (h0 + h) * hd + i);
                    acc[h][0] = _mm256_fmadd_ps(qv, a, acc[h][0]);
                    acc[h][1] = _mm256_fmadd_ps(qv, b, acc[h][1]);
                }
            }
            for (int h = 0; h < 4; ++h) {
                lg[(h0 + h) * nk + k0] = fold8_avx2(acc[h][0]) * scale;
                if (two) lg[(h0 + h) * nk + k0 + 1] = fold8_avx2(acc[h][1]) * scale;
            }
        }
}

void output_avx2(const float *w, const float *const *rows, int64_t nk, int64_t hd, float *o) {
    for (int h0 = 0; h0 < 8; h0 += 4)
        for (int64_t c = 0; c < hd; c += 16) {
            __m256 acc[4][2];
            for (int h = 0; h < 4; ++h) acc[h][0] = acc[h][1] = _mm256_setzero_ps();
            for (int64_t k = 0; k < nk; ++k) {
                const __m256 x0 = _mm256_loadu_ps(rows[k] + c), x1 = _mm256_loadu_ps(rows[k] + c + 8);
                for (int h = 0; h < 4; ++h) {
                    const __m256 wv = _mm256_broadcast_ss(w + (h0 + h) * nk + k);
                    acc[h][0] = _mm256_fmadd_ps(wv, x0, acc[h][0]);
                    acc[h][1] = _mm256_fmadd_ps(wv, x1, acc[h][1]);
                }
            }
            for (int h = 0; h < 4; ++h) {
                _mm256_storeu_ps(o + (h0 + h) * hd + c, acc[h][0]);
                _mm256_storeu_ps(o + (h0 + h) * hd + c + 8, acc[h][1]);
            }
        }
}

}  // namespace

void attend8_scores(const float *q, const float *const *rows, int64_t nk, int64_t hd, float scale, float *lg) {
    if (attend8_avx512()) scores_avx512(q, rows, nk, hd, scale, lg);
    else scores_avx2(q, rows, nk, hd, scale, lg);
}

void attend8_output(const float *w, const float *const *rows, int64_t nk, int64_t hd, float *o) {
    if (attend8_avx512()) output_avx512(w, rows, nk, hd, o);
    else output_avx2(w, rows, nk, hd, o);
}

}  // namespace ds4::ops
