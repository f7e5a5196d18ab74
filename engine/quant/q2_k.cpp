// Q2_K: 256 elements in 16 sub-blocks of 16, x = d*sc*q - dmin*m with 4-bit sc/m, 2-bit q.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/quant/blocks.h"
#include "engine/quant/half.h"
#include "engine/quant/kernels.h"
#include "engine/quant/kquant_fit.h"
#include "engine/quant/simd.h"

namespace ds4::quant::detail {
namespace {

constexpr float kMaxF16 = 65504.f;

// Super-block scale for 4-bit sub-scales: returns the stored f16 and fills q[16] in 0..15.
uint16_t quantize_scales(const float *v, uint8_t *q) {
    const float vmax = *std::max_element(v, v + 16);
    if (!(vmax > 0)) {
        std::fill(q, q + 16, uint8_t(0));
        return 0;
    }
    const float iscale = 15.f / vmax;
    for (int j = 0; j < 16; ++j) q[j] = uint8_t(std::clamp(nearest_int(iscale * v[j]), 0, 15));
    return f32_to_f16_fast(std::min(vmax / 15.f, kMaxF16));
}

}  // namespace

void quant_q2_k(const float *src, void *dst, int64_t n) {
    BlockQ2_K *y = static_cast<BlockQ2_K *>(dst);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        float x[kQK_K], w[16], scales[16], mins[16];
        uint8_t L[kQK_K], qsc[16], qmin[16];
        sanitize(src + b * kQK_K, x, kQK_K);
        for (int j = 0; j < 16; ++j) {
            const float *xs = x + 16 * j;
            // weight errors by magnitude on top of a floor, so small values still count
            float s2 = 0;
            for (int i = 0; i < 16; ++i) s2 += xs[i] * xs[i];
            const float floor_w = std::sqrt(s2 / 16);
            for (int i = 0; i < 16; ++i) w[i] = floor_w + std::fabs(xs[i]);
            scales[j] = fit_scale_offset(16, 3, xs, w, L + 16 * j, &mins[j], -0.5f, 0.1f, 15);
        }
        y[b].d = quantize_scales(scales, qsc);
        y[b].dmin = quantize_scales(mins, qmin);
        for (int j = 0; j < 16; ++j) y[b].scales[j] = uint8_t(qsc[j] | (qmin[j] << 4));
        // requantize against the scales actually stored
        const float d = f16_to_f32_fast(y[b].d), dmin = f16_to_f32_fast(y[b].dmin);
        for (int j = 0; j < 16; ++j) {
            const float dl = d * qsc[j], ml = dmin * qmin[j];
            for (int i = 0; i < 16; ++i) {
                const int l = dl != 0 ? nearest_int((x[16 * j + i] + ml) / dl) : 0;
                L[16 * j + i] = uint8_t(std::clamp(l, 0, 3));
            }
        }
        for (int h = 0; h < 2; ++h)
            for (int l = 0; l < 32; ++l) {
                const uint8_t *q = L + 128 * h + l;
                y[b].qs[32 * h + l] = uint8_t(q[0] | (q[32] << 2) | (q[64] << 4) | (q[96] << 6));
            }
    }
}

void dequant_q2_k(const void *src, float *dst, int64_t n) {
    const BlockQ2_K *x = static_cast<const BlockQ2_K *>(src);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float d = f16_to_f32_fast(x[b].d), dmin = f16_to_f32_fast(x[b].dmin);
        float *y = dst + b * kQK_K;
        for (int h = 0; h < 2; ++h) {
            const uint8_t *q = x[b].qs + 32 * h;
            for (int k = 0; k < 4; ++k)
                for (int part = 0; part < 2; ++part) {
                    const uint8_t sc = x[b].scales[8 * h + 2 * k + part];
                    const float dl = d * float(sc & 15), ml = dmin * float(sc >> 4);
                    for (int l = 0; l < 16; ++l) *y++ = dl * float((q[16 * part + l] >> (2 * k)) & 3) - ml;
                }
        }
    }
}

namespace {

// Per 128-bit lane: broadcast 16-bit element 2k (low lane) / 2k+1 (high lane).
alignas(32) constexpr uint8_t kScaleShuffle[4][32] = {
    {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3},
    {4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7},
    {8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11},
    {12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13,
     14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15},
};

template <int C>
void dot_cols(const uint8_t *wv, const void *const *xv, int64_t n, float *out) {
    const BlockQ2_K *w = reinterpret_cast<const BlockQ2_K *>(wv);
    const BlockQ8_K *x[C];
    __m256 acc[C], accm[C];
    for (int c = 0; c < C; ++c) {
        x[c] = static_cast<const BlockQ8_K *>(xv[c]);
        acc[c] = accm[c] = _mm256_setzero_ps();
    }
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(0xF);
    __m256i shuf[4];
    for (int k = 0; k < 4; ++k) shuf[k] = _mm256_load_si256(reinterpret_cast<const __m256i *>(kScaleShuffle[k]));
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        simd::prefetch_ahead(w + b);
        const BlockQ2_K &wb = w[b];
        const float dw = f16_to_f32_fast(wb.d), dminw = f16_to_f32_fast(wb.dmin);
        const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(wb.scales));
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m4));
        const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc8, m4));
        if constexpr (C == 1) {
            // Decode (one activation row): quants and scales made where they are used, so the
            // block is not kept in (spilled) arrays. Same integer sums in the same lanes.
            const BlockQ8_K &xb = x[0][b];
            const __m256i pm = _mm256_madd_epi16(mins, simd::loadu(xb.bsums));
            accm[0] = _mm256_fmadd_ps(_mm256_set1_ps(xb.d * dminw), _mm256_cvtepi32_ps(pm), accm[0]);
            __m256i sum0 = _mm256_setzero_si256(), sum1 = sum0;
            for (int h = 0; h < 2; ++h) {
                const __m256i s = h == 0 ? _mm256_permute2x128_si256(sc16, sc16, 0x00)
                                         : _mm256_permute2x128_si256(sc16, sc16, 0x11);
                const __m256i q = simd::loadu(wb.qs + 32 * h);
                const int8_t *xq = xb.qs + 128 * h;
                for (int k = 0; k < 4; k += 2) {
                    const __m256i q0 = _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), m3);
                    const __m256i q1 = _mm256_and_si256(_mm256_srli_epi16(q, 2 * k + 2), m3);
                    const __m256i p0 = _mm256_maddubs_epi16(q0, simd::loadu(xq + 32 * k));
                    const __m256i p1 = _mm256_maddubs_epi16(q1, simd::loadu(xq + 32 * k + 32));
                    sum0 = _mm256_add_epi32(sum0, _mm256_madd_epi16(p0, _mm256_shuffle_epi8(s, shuf[k])));
                    sum1 = _mm256_add_epi32(sum1, _mm256_madd_epi16(p1, _mm256_shuffle_epi8(s, shuf[k + 1])));
                }
            }
            acc[0] = _mm256_fmadd_ps(_mm256_set1_ps(xb.d * dw), _mm256_cvtepi32_ps(_mm256_add_epi32(sum0, sum1)), acc[0]);
            continue;
        }
        // Each 32-element chunk's quants and scale vector decoded and used by every column
        // before the next: decoded for the whole block first, their 16 registers spilled. The
        // integer sums are exact, so their order does not matter.
        for (int c = 0; c < C; ++c) {
            const BlockQ8_K &xb = x[c][b];
            const __m256i pm = _mm256_madd_epi16(mins, simd::loadu(xb.bsums));
            accm[c] = _mm256_fmadd_ps(_mm256_set1_ps(xb.d * dminw), _mm256_cvtepi32_ps(pm), accm[c]);
        }
        __m256i sum[C];
        for (int c = 0; c < C; ++c) sum[c] = _mm256_setzero_si256();
        for (int h = 0; h < 2; ++h) {
            const __m256i s = h == 0 ? _mm256_permute2x128_si256(sc16, sc16, 0x00)
                                     : _mm256_permute2x128_si256(sc16, sc16, 0x11);
            const __m256i q = simd::loadu(wb.qs + 32 * h);
            for (int k = 0; k < 4; ++k) {
                const __m256i q2 = _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), m3);
                const __m256i sc = _mm256_shuffle_epi8(s, shuf[k]);
                for (int c = 0; c < C; ++c)
                    sum[c] = _mm256_add_epi32(
                        sum[c], _mm256_madd_epi16(_mm256_maddubs_epi16(q2, simd::loadu(x[c][b].qs + 128 * h + 32 * k)), sc));
            }
        }
        for (int c = 0; c < C; ++c)
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(x[c][b].d * dw), _mm256_cvtepi32_ps(sum[c]), acc[c]);
    }
    for (int c = 0; c < C; ++c) out[c] = simd::hsum(acc[c]) - simd::hsum(accm[c]);
}

// AVX-512 (F/BW): 64 elements per register (two shifts of the same quant bytes), scales
// spread by a 16-bit permute. Integer sums fold back to the AVX2 lane layout before the
// float steps, so results are bit-identical to dot_cols.
#define DS4_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

template <int C>
DS4_AVX512 void dot_cols_avx512(const uint8_t *wv, const void *const *xv, int64_t n, float *out) {
    const BlockQ2_K *w = reinterpret_cast<const BlockQ2_K *>(wv);
    const BlockQ8_K *x[C];
    __m256 acc[C], accm[C];
    for (int c = 0; c < C; ++c) {
        x[c] = static_cast<const BlockQ8_K *>(xv[c]);
        acc[c] = accm[c] = _mm256_setzero_ps();
    }
    const __m512i m3 = _mm512_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(0xF);
    // 64-element chunk j: low half shifted by 4*(j%2), high half by 4*(j%2)+2; 128-bit lane
    // L holds sub-block 4j+L
    const __m512i shift[2] = {_mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1),
                              _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1)};
    __m512i pick[4];
    for (int j = 0; j < 4; ++j) {
        alignas(64) int16_t ix[32];
        for (int i = 0; i < 32; ++i) ix[i] = int16_t(4 * j + i / 8);
        pick[j] = _mm512_load_si512(ix);
    }
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        simd::prefetch_ahead(w + b);
        const BlockQ2_K &wb = w[b];
        const float dw = f16_to_f32_fast(wb.d), dminw = f16_to_f32_fast(wb.dmin);
        const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(wb.scales));
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m4));
        const __m512i sc512 = _mm512_zextsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(sc8, m4)));
        __m512i q2[4], sc[4];
        for (int j = 0; j < 4; ++j) {
            const __m512i q = _mm512_broadcast_i64x4(simd::loadu(wb.qs + 32 * (j / 2)));
            q2[j] = _mm512_and_si512(_mm512_srlv_epi16(q, shift[j % 2]), m3);
            sc[j] = _mm512_permutexvar_epi16(pick[j], sc512);
        }
        for (int c = 0; c < C; ++c) {
            const BlockQ8_K &xb = x[c][b];
            const __m256i pm = _mm256_madd_epi16(mins, simd::loadu(xb.bsums));
            accm[c] = _mm256_fmadd_ps(_mm256_set1_ps(xb.d * dminw), _mm256_cvtepi32_ps(pm), accm[c]);
            __m512i sum = _mm512_setzero_si512();
            for (int j = 0; j < 4; ++j) {
                const __m512i p = _mm512_maddubs_epi16(q2[j], _mm512_loadu_si512(xb.qs + 64 * j));
                sum = _mm512_add_epi32(sum, _mm512_madd_epi16(p, sc[j]));
            }
            const __m256i s256 = _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64(sum, 1));
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(xb.d * dw), _mm256_cvtepi32_ps(s256), acc[c]);
        }
    }
    for (int c = 0; c < C; ++c) out[c] = simd::hsum(acc[c]) - simd::hsum(accm[c]);
}

// AVX-512 VBMI + VNNI + GFNI: the sub-block scale goes into the weight bytes before the dot.
// A 64-byte chunk j holds elements 64j..64j+63, so its 128-bit lane L is sub-block 4j + L,
// and one vpshufb per chunk gives the scaled weights from a per-block table whose lane L,
// byte 4j + q, holds q * scale(4j + L). The index is the chunk's 2-bit field moved to bits
// 0-1 with j in bits 2-3: one GF2P8AFFINEQB (its matrix differs per half, its constant is
// 4j). One vpdpbusd then adds sc * q * x in the lanes where dot_cols adds them, so the
// integers are dot_cols' lane for lane. The scale and min terms share one 512-bit float
// accumulator (even lanes: acc of dot_cols, odd: accm), so results stay bit-identical.
#define DS4_VBMI_Q2 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,gfni")))

// GF2P8AFFINEQB matrices: bits 2-3 take the byte's 2-bit field f (the chunks of natural
// order take f in their low half, f + 1 in the high half: qwords 0-3 are the low half).
constexpr long long field_matrix(int f) {
    const int src[8] = {-1, -1, 2 * f, 2 * f + 1, -1, -1, -1, -1};
    return simd::affine_matrix(src);
}

// The kernel's constants, made once per call, and one block's work.
struct VbmiQ2 {
    __m512i lo4, field[2], spread, q_times, interleave, interleave_hi, widen2;
    __m512i field_u[4], spread_u;   // the field-major order (weights_field_major)
    __m256i widen;   // byte j to the low byte of 16-bit lane j
    DS4_VBMI_Q2 VbmiQ2() {
        lo4 = _mm512_set1_epi8(0x0F);
        // chunks 0 and 2 take fields 0 (low half) and 1 (high); chunks 1 and 3 fields 2 and 3
        field[0] = _mm512_set_epi64(field_matrix(1), field_matrix(1), field_matrix(1), field_matrix(1),
                                    field_matrix(0), field_matrix(0), field_matrix(0), field_matrix(0));
        field[1] = _mm512_set_epi64(field_matrix(3), field_matrix(3), field_matrix(3), field_matrix(3),
                                    field_matrix(2), field_matrix(2), field_matrix(2), field_matrix(2));
        // table byte 16L + 4q + j takes the scale of sub-block 4j + L, times q: the two bytes
        // of a 16-bit word share q, so one vpmullw scales them (q * scale < 256: no carry)
        alignas(64) uint8_t spread_ix[64];
        alignas(64) uint16_t q_word[32];
        for (int i = 0; i < 64; ++i) spread_ix[i] = uint8_t(4 * (i % 4) + i / 16);
        for (int i = 0; i < 32; ++i) q_word[i] = uint16_t((i % 8) / 2);
        spread = _mm512_load_si512(spread_ix);
        q_times = _mm512_load_si512(q_word);
        // field-major: chunk f's lane L is sub-block 8 (L / 2) + 2f + L % 2
        for (int i = 0; i < 64; ++i) {
            const int L = i / 16, f = i % 4;
            spread_ix[i] = uint8_t(8 * (L / 2) + 2 * f + L % 2);
        }
        spread_u = _mm512_load_si512(spread_ix);
        for (int f = 0; f < 4; ++f) field_u[f] = _mm512_set1_epi64(field_matrix(f));
        // lane 2i: the scale sum's lane i; lane 2i + 1: the min sum's lane i
        interleave = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        alignas(32) uint8_t w_ix[32];
        for (int i = 0; i < 32; ++i) w_ix[i] = uint8_t(i / 2);
        widen = _mm256_load_si256(reinterpret_cast<const __m256i *>(w_ix));
        // two blocks' min nibbles: 16-bit lanes 0-15 from the first, 16-31 from the second
        alignas(64) uint8_t w2_ix[64];
        for (int i = 0; i < 64; ++i) w2_ix[i] = uint8_t(i < 32 ? i / 2 : 64 + (i - 32) / 2);
        widen2 = _mm512_load_si512(w2_ix);
        // as interleave, with the min sums from lanes 8-15 of the second operand
        interleave_hi = _mm512_setr_epi32(0, 24, 1, 25, 2, 26, 3, 27, 4, 28, 5, 29, 6, 30, 7, 31);
    }

    // Block wb's scaled weights, chunk j in v[j] (raw: its first 64 bytes), and its d, dmin
    // repeated over 16 lanes.
    DS4_VBMI_Q2 __attribute__((always_inline)) inline __m512 weights(const BlockQ2_K &wb, __m512i raw,
                                                                     __m512i *v) const {
        const __m512i table = _mm512_mullo_epi16(_mm512_and_si512(_mm512_permutexvar_epi8(spread, raw), lo4), q_times);
        for (int j = 0; j < 4; ++j) {
            const __m512i q = _mm512_broadcast_i64x4(simd::loadu(wb.qs + 32 * (j / 2)));
            v[j] = _mm512_shuffle_epi8(table, _mm512_gf2p8affine_epi64_epi8(q, field[j % 2], j));
        }
        uint32_t dd;
        std::memcpy(&dd, &wb.d, 4);   // d, dmin
        return _mm512_cvtph_ps(_mm256_set1_epi32(int(dd)));
    }

    // The same in field-major order: chunk f is field f of all 64 qs bytes (elements
    // 32f..32f+31, then 128 + 32f..), so the qs are one load, not two broadcasts (a 256-bit
    // broadcast issues on a permute pipe on Zen 5); its activations are field_major_row's.
    DS4_VBMI_Q2 __attribute__((always_inline)) inline __m512 weights_field_major(const BlockQ2_K &wb, __m512i raw,
                                                                                 __m512i *v) const {
        const __m512i table = _mm512_mullo_epi16(_mm512_and_si512(_mm512_permutexvar_epi8(spread_u, raw), lo4), q_times);
        const __m512i q = _mm512_loadu_si512(wb.qs);
        v[0] = _mm512_shuffle_epi8(table, _mm512_gf2p8affine_epi64_epi8(q, field_u[0], 0));
        v[1] = _mm512_shuffle_epi8(table, _mm512_gf2p8affine_epi64_epi8(q, field_u[1], 1));
        v[2] = _mm512_shuffle_epi8(table, _mm512_gf2p8affine_epi64_epi8(q, field_u[2], 2));
        v[3] = _mm512_shuffle_epi8(table, _mm512_gf2p8affine_epi64_epi8(q, field_u[3], 3));
        uint32_t dd;
        std::memcpy(&dd, &wb.d, 4);   // d, dmin
        return _mm512_cvtph_ps(_mm256_set1_epi32(int(dd)));
    }

    // acc += (x_d * (d, dmin)) * (the chunks' dot with the activations xq (xb's qs, in the
    // chunks' order), interleaved with the min sums pm taken from lanes 0-7 of pm, or 8-15
    // where hi): dot_cols' float step for one block. Either order adds the same products into
    // each of the eight lanes the halves are summed to, so the bits are the same.
    DS4_VBMI_Q2 __attribute__((always_inline)) inline __m512 add_block(const __m512i *v, const int8_t *xq,
                                                                       const BlockQ8_K &xb, __m512 dwm, __m512i pm,
                                                                       bool hi, __m512 acc) const {
        __m512i s2[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        for (int j = 0; j < 4; ++j) s2[j % 2] = _mm512_dpbusd_epi32(s2[j % 2], v[j], _mm512_loadu_si512(xq + 64 * j));
        const __m512i sum = _mm512_add_epi32(s2[0], s2[1]);
        const __m256i s256 = _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64(sum, 1));
        const __m512i both = _mm512_permutex2var_epi32(_mm512_castsi256_si512(s256), hi ? interleave_hi : interleave, pm);
        return _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(xb.d), dwm), _mm512_cvtepi32_ps(both), acc);
    }

    // Weight block wb against block b of C activation rows, into acc[c].
    template <int C>
    DS4_VBMI_Q2 __attribute__((always_inline)) inline void block(const BlockQ2_K &wb, const BlockQ8_K *const *x,
                                                                 int64_t b, __m512 *acc) const {
        // scales, qs and d lie in the block's first 80 bytes: a 64-byte read stays inside it
        const __m512i raw = _mm512_loadu_si512(wb.scales);
        // 16-bit lane j: m_j (the byte's high nibble)
        const __m256i mins = _mm256_srli_epi16(
            _mm256_maskz_permutexvar_epi8(0x55555555u, widen, _mm512_castsi512_si256(raw)), 4);
        __m512i v[4];
        const __m512 dwm = weights(wb, raw, v);
        for (int c = 0; c < C; ++c) {
            const __m256i pm = _mm256_madd_epi16(mins, simd::loadu(x[c][b].bsums));
            acc[c] = add_block(v, x[c][b].qs, x[c][b], dwm, _mm512_castsi256_si512(pm), false, acc[c]);
        }
    }

    // Blocks wa and wb (of two rows) against block b of one activation row (xq: the block as
    // field_major_row lays it out), into acc[0] and acc[1]: the operations of block<1> on
    // each, but the two min sums share one widening permute, shift and vpmaddwd.
    DS4_VBMI_Q2 __attribute__((always_inline)) inline void block_pair(const BlockQ2_K &wa, const BlockQ2_K &wb,
                                                                      const BlockQ8_K &xb, const int8_t *xq,
                                                                      __m512 *acc) const {
        const __m512i raw[2] = {_mm512_loadu_si512(wa.scales), _mm512_loadu_si512(wb.scales)};
        const __m512i mins = _mm512_srli_epi16(
            _mm512_maskz_permutex2var_epi8(0x5555555555555555ULL, raw[0], widen2, raw[1]), 4);
        const __m512i pm = _mm512_madd_epi16(mins, _mm512_load_si512(xq + kQK_K));
        const BlockQ2_K *w[2] = {&wa, &wb};
        for (int r = 0; r < 2; ++r) {
            __m512i v[4];
            const __m512 dwm = weights_field_major(*w[r], raw[r], v);
            acc[r] = add_block(v, xq, xb, dwm, pm, r == 1, acc[r]);
        }
    }

    // dot_cols' final sums from an accumulator.
    DS4_VBMI_Q2 static float result(__m512 acc) {
        const __m512 a = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15), acc);
        return simd::hsum(_mm512_castps512_ps256(a)) -
               simd::hsum(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    }
};

// 4 KB ahead: this kernel keeps up with memory, and 2 KB left it waiting (from memory on an
// Emerald Rapids VM: 11.6-12.3 GB/s at 2 KB, 12.1-13.3 at 4 KB, 11.5-12.6 at 8 KB)
constexpr int kAhead = 4096;

template <int C>
DS4_VBMI_Q2 void dot_cols_vbmi(const uint8_t *wv, const void *const *xv, int64_t n, float *out) {
    const BlockQ2_K *w = reinterpret_cast<const BlockQ2_K *>(wv);
    const BlockQ8_K *x[C];
    __m512 acc[C];
    for (int c = 0; c < C; ++c) {
        x[c] = static_cast<const BlockQ8_K *>(xv[c]);
        acc[c] = _mm512_setzero_ps();
    }
    static const VbmiQ2 k;   // constants made once
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        simd::prefetch_ahead<kAhead, 2>(w + b);
        k.block<C>(w[b], x, b, acc);
    }
    for (int c = 0; c < C; ++c) out[c] = VbmiQ2::result(acc[c]);
}

// The activation row laid out once per call for block_pair, kFieldMajorBytes a block on
// cache lines: its qs in field-major order (elements 32f..32f+31, then 128 + 32f.., for
// f = 0..3), then its 16 block sums twice (a 256-bit broadcast issues on a permute pipe).
constexpr size_t kFieldMajorBytes = kQK_K + 64;

inline const int8_t *field_major_row(const BlockQ8_K *x, int64_t nb) {
    thread_local std::vector<int8_t> buf;
    if (buf.size() < size_t(nb) * kFieldMajorBytes + 64) buf.resize(size_t(nb) * kFieldMajorBytes + 64);
    int8_t *row = reinterpret_cast<int8_t *>((reinterpret_cast<uintptr_t>(buf.data()) + 63) & ~uintptr_t(63));
    for (int64_t b = 0; b < nb; ++b) {
        int8_t *o = row + size_t(b) * kFieldMajorBytes;
        for (int f = 0; f < 4; ++f) {
            std::memcpy(o + 64 * f, x[b].qs + 32 * f, 32);
            std::memcpy(o + 64 * f + 32, x[b].qs + 128 + 32 * f, 32);
        }
        std::memcpy(o + kQK_K, x[b].bsums, 32);
        std::memcpy(o + kQK_K + 32, x[b].bsums, 32);
    }
    return row;
}

// Rows r, r + q, r + 2q, r + 3q (q = n_rows / 4) against one activation row, a block of each
// in turn: four weight streams far apart for the hardware prefetchers (two: 88-91% of a plain
// read from memory, four 89-94%, near the kernel's rate from cache), two block_pair calls a
// step.

DS4_VBMI_Q2 void rows_vbmi(const uint8_t *w, size_t stride, int64_t n_rows, const BlockQ8_K *x, int64_t n, float *out) {
    static const VbmiQ2 k;   // constants made once
    const int64_t nb = n / kQK_K, part = n_rows / 4;
    const int8_t *xq = part > 0 ? field_major_row(x, nb) : nullptr;
    for (int64_t r = 0; r < part; ++r) {
        const BlockQ2_K *ws[4];
        for (int i = 0; i < 4; ++i) ws[i] = reinterpret_cast<const BlockQ2_K *>(w + size_t(r + i * part) * stride);
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int64_t b = 0; b < nb; ++b) {
            for (int i = 0; i < 4; ++i) simd::prefetch_ahead<kAhead, 2>(ws[i] + b);
            k.block_pair(ws[0][b], ws[1][b], x[b], xq + b * kFieldMajorBytes, acc);
            k.block_pair(ws[2][b], ws[3][b], x[b], xq + b * kFieldMajorBytes, acc + 2);
        }
        for (int i = 0; i < 4; ++i) out[r + i * part] = VbmiQ2::result(acc[i]);
    }
    for (int64_t r = 4 * part; r < n_rows; ++r) {
        const void *xv = x;
        dot_cols_vbmi<1>(w + size_t(r) * stride, &xv, n, out + r);
    }
}

#pragma GCC diagnostic pop

}  // namespace

void dot_q2_k(const uint8_t *w, const void *const *x, int ncols, int64_t n, float *out) {
    if (avx512_enabled() && vbmi_enabled()) {
        DS4_QUANT_COLS_DISPATCH(dot_cols_vbmi, w, x, n, out)
    } else if (avx512_enabled()) {
        DS4_QUANT_COLS_DISPATCH(dot_cols_avx512, w, x, n, out)
    } else {
        DS4_QUANT_COLS_DISPATCH(dot_cols, w, x, n, out)
    }
}

void rows_q2_k(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const void *x, int64_t n, float *out) {
    if (avx512_enabled() && vbmi_enabled()) {
        rows_vbmi(w, w_row_stride, n_rows, static_cast<const BlockQ8_K *>(x), n, out);
        return;
    }
    for (int64_t r = 0; r < n_rows; ++r) dot_q2_k(w + size_t(r) * w_row_stride, &x, 1, n, out + r);
}

}  // namespace ds4::quant::detail
