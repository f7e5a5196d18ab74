// Q4_K: 256 elements in 8 sub-blocks of 32, x = d*sc*q - dmin*m with 6-bit sc/m packed
// into 12 bytes, 4-bit q.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/quant/blocks.h"
#include "engine/quant/cache_aligned.h"
#include "engine/quant/half.h"
#include "engine/quant/kernels.h"
#include "engine/quant/kquant_fit.h"
#include "engine/quant/simd.h"

namespace ds4::quant::detail {
namespace {

constexpr float kMaxF16 = 65504.f;

uint16_t quantize_scales(const float *v, uint8_t *q) {
    const float vmax = *std::max_element(v, v + 8);
    if (!(vmax > 0)) {
        std::fill(q, q + 8, uint8_t(0));
        return 0;
    }
    const float iscale = 63.f / vmax;
    for (int j = 0; j < 8; ++j) q[j] = uint8_t(std::clamp(nearest_int(iscale * v[j]), 0, 63));
    return f32_to_f16_fast(std::min(vmax / 63.f, kMaxF16));
}

// All 8 scales and 8 mins from the packed 12 bytes: out[0..7] = scales, out[8..15] = mins.
inline void unpack_scales(const uint8_t *s, uint8_t *out) {
    uint32_t u[3];
    std::memcpy(u, s, 12);
    const uint32_t lo6 = 0x3f3f3f3f, lo4 = 0x0f0f0f0f, lo2 = 0x03030303;
    const uint32_t sc_lo = u[0] & lo6;                                   // scales 0..3
    const uint32_t mn_lo = u[1] & lo6;                                   // mins 0..3
    const uint32_t sc_hi = (u[2] & lo4) | (((u[0] >> 6) & lo2) << 4);    // scales 4..7
    const uint32_t mn_hi = ((u[2] >> 4) & lo4) | (((u[1] >> 6) & lo2) << 4);   // mins 4..7
    const uint32_t v[4] = {sc_lo, sc_hi, mn_lo, mn_hi};
    std::memcpy(out, v, 16);
}

}  // namespace

void quant_q4_k(const float *src, void *dst, int64_t n) {
    BlockQ4_K *y = static_cast<BlockQ4_K *>(dst);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        float x[kQK_K], w[32], scales[8], mins[8];
        uint8_t L[kQK_K], qsc[8], qmin[8];
        sanitize(src + b * kQK_K, x, kQK_K);
        for (int j = 0; j < 8; ++j) {
            const float *xs = x + 32 * j;
            float s2 = 0;
            for (int i = 0; i < 32; ++i) s2 += xs[i] * xs[i];
            const float floor_w = std::sqrt(s2 / 32);
            for (int i = 0; i < 32; ++i) w[i] = floor_w + std::fabs(xs[i]);
            scales[j] = fit_scale_offset(32, 15, xs, w, L + 32 * j, &mins[j], -1.f, 0.1f, 20);
        }
        y[b].d = quantize_scales(scales, qsc);
        y[b].dmin = quantize_scales(mins, qmin);
        std::memset(y[b].scales, 0, 12);
        for (int j = 0; j < 8; ++j) {
            uint8_t *s = y[b].scales;
            if (j < 4) {
                s[j] = qsc[j];
                s[j + 4] = qmin[j];
            } else {
                s[j + 4] = uint8_t((qsc[j] & 0xF) | ((qmin[j] & 0xF) << 4));
                s[j - 4] |= uint8_t((qsc[j] >> 4) << 6);
                s[j] |= uint8_t((qmin[j] >> 4) << 6);
            }
        }
        const float d = f16_to_f32_fast(y[b].d), dmin = f16_to_f32_fast(y[b].dmin);
        for (int j = 0; j < 8; ++j) {
            const float dl = d * qsc[j], ml = dmin * qmin[j];
            for (int i = 0; i < 32; ++i) {
                const int l = dl != 0 ? nearest_int((x[32 * j + i] + ml) / dl) : 0;
                L[32 * j + i] = uint8_t(std::clamp(l, 0, 15));
            }
        }
        for (int c = 0; c < 4; ++c)
            for (int l = 0; l < 32; ++l) y[b].qs[32 * c + l] = uint8_t(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
    }
}

void dequant_q4_k(const void *src, float *dst, int64_t n) {
    const BlockQ4_K *x = static_cast<const BlockQ4_K *>(src);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float d = f16_to_f32_fast(x[b].d), dmin = f16_to_f32_fast(x[b].dmin);
        uint8_t sm[16];
        unpack_scales(x[b].scales, sm);
        float *y = dst + b * kQK_K;
        for (int c = 0; c < 4; ++c) {
            const uint8_t *q = x[b].qs + 32 * c;
            const float d1 = d * float(sm[2 * c]), m1 = dmin * float(sm[8 + 2 * c]);
            const float d2 = d * float(sm[2 * c + 1]), m2 = dmin * float(sm[8 + 2 * c + 1]);
            for (int l = 0; l < 32; ++l) y[l] = d1 * float(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; ++l) y[32 + l] = d2 * float(q[l] >> 4) - m2;
            y += 64;
        }
    }
}

namespace {

// Byte-shuffle controls broadcasting 16-bit element j of a 128-bit lane.
struct Bcast16 {
    alignas(32) uint8_t c[8][32];
    constexpr Bcast16() : c() {
        for (int j = 0; j < 8; ++j)
            for (int i = 0; i < 32; ++i) c[j][i] = uint8_t(2 * j + (i & 1));
    }
};
constexpr Bcast16 kBcast16;

// A block's eight sub-block sums of an activation block (the pairs of its 16-element sums).
inline __m128i sub_block_sums(const BlockQ8_K &x) {
    return _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(x.bsums)),
                          _mm_loadu_si128(reinterpret_cast<const __m128i *>(x.bsums + 8)));
}

template <int C>
void dot_cols(const uint8_t *wv, const void *const *xv, int64_t n, float *out) {
    const BlockQ4_K *w = reinterpret_cast<const BlockQ4_K *>(wv);
    const BlockQ8_K *x[C];
    __m256 acc[C];
    float accm[C];
    for (int c = 0; c < C; ++c) {
        x[c] = static_cast<const BlockQ8_K *>(xv[c]);
        acc[c] = _mm256_setzero_ps();
        accm[c] = 0;
    }
    const __m256i m4 = _mm256_set1_epi8(0xF);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        // 4 KB ahead, every line of a 144-byte block: from memory it waited on its loads
        // (on an Emerald Rapids VM: 7.2 GB/s without, 10.9-11.3 at 2 KB, 12.2-12.5 at 4 KB)
        simd::prefetch_ahead<4096, 3>(w + b);
        const BlockQ4_K &wb = w[b];
        const float dw = f16_to_f32_fast(wb.d), dminw = f16_to_f32_fast(wb.dmin);
        alignas(16) uint8_t sm[16];
        unpack_scales(wb.scales, sm);
        const __m256i sm16 = _mm256_cvtepu8_epi16(_mm_load_si128(reinterpret_cast<const __m128i *>(sm)));
        const __m128i mins = _mm256_extracti128_si256(sm16, 1);
        const __m256i scales = _mm256_permute2x128_si256(sm16, sm16, 0x00);
        // sums over the 32-element sub-blocks
        for (int c = 0; c < C; ++c)
            accm[c] += x[c][b].d * dminw * float(simd::hsum_i32(_mm_madd_epi16(mins, sub_block_sums(x[c][b]))));
        // Each 32-byte slice's two sub-blocks decoded and used by every column before the next:
        // decoded for the whole block first, their 16 registers spilled. The integer sums are
        // exact, so their order does not matter.
        __m256i sum[C][2];
        for (int c = 0; c < C; ++c) sum[c][0] = sum[c][1] = _mm256_setzero_si256();
        for (int k = 0; k < 4; ++k) {
            const __m256i q = simd::loadu(wb.qs + 32 * k);
            const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            const __m256i sl = _mm256_shuffle_epi8(scales, _mm256_load_si256(reinterpret_cast<const __m256i *>(kBcast16.c[2 * k])));
            const __m256i sh =
                _mm256_shuffle_epi8(scales, _mm256_load_si256(reinterpret_cast<const __m256i *>(kBcast16.c[2 * k + 1])));
            for (int c = 0; c < C; ++c) {
                const int8_t *xq = x[c][b].qs + 64 * k;
                sum[c][0] = _mm256_add_epi32(sum[c][0], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, simd::loadu(xq)), sl));
                sum[c][1] = _mm256_add_epi32(sum[c][1], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, simd::loadu(xq + 32)), sh));
            }
        }
        for (int c = 0; c < C; ++c)
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(x[c][b].d * dw), _mm256_cvtepi32_ps(_mm256_add_epi32(sum[c][0], sum[c][1])),
                                     acc[c]);
    }
    for (int c = 0; c < C; ++c) out[c] = simd::hsum(acc[c]) - accm[c];
}

#define DS4_VNNI_Q4 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define DS4_VNNI_Q4_INLINE DS4_VNNI_Q4 __attribute__((always_inline)) inline
// GCC 12 warns about the undefined pass-through operand inside its AVX-512 intrinsics.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// The same integers and float steps as dot_cols, 64 elements a step: a 32-byte slice of qs
// holds sub-block 2k (low nibbles) and 2k + 1 (high), so it is broadcast to both halves of
// a register and shifted by 0 / 4 per half; vpmaddubsw gives the pair sums and one
// vpdpwssd multiplies them by the sub-block's scale and adds them up, where the AVX2 kernel
// takes a vpmaddwd and an add per 32 elements. Dword l of the low half then holds the even
// sub-blocks' part of dot_cols' lane l, dword l of the high half the odd ones' part (its
// sum0 and sum1): their integer sum is that lane exactly.
// Decode (vec_dot_rows) takes one row after another: one weight stream. Unlike Q8_0 and
// Q2_K, rows far apart side by side measured slower here with the weights in the model
// file's page cache (Zen 5 VM, flash-shape ds4-q4 experts on one thread: one stream 28-30
// GB/s, two 25-27, four 19-20; on two threads one stream was fastest too), although on
// ds4-bench-quant's huge-paged rows three streams ran fastest.
struct VnniQ4 {
    __m512i shift, perm[4], lane0;   // lane0: dword 0 of each 128-bit lane to dwords 0-3
    DS4_VNNI_Q4 VnniQ4() {
        lane0 = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
        alignas(64) uint16_t sh[32], pm[4][32];
        for (int i = 0; i < 32; ++i) {
            sh[i] = uint16_t(i < 16 ? 0 : 4);
            for (int k = 0; k < 4; ++k) pm[k][i] = uint16_t(2 * k + (i < 16 ? 0 : 1));
        }
        shift = _mm512_load_si512(sh);
        for (int k = 0; k < 4; ++k) perm[k] = _mm512_load_si512(pm[k]);
    }
};

// A weight block made ready for its columns: its 4-bit weights per step, the scale words,
// the mins (16-bit lanes 0-7) and d, dmin.
struct WeightsVnni {
    __m512i q[4], sc[4];
    __m128i mins;
    float dw, dminw;
};

DS4_VNNI_Q4_INLINE void decode_vnni(const VnniQ4 &K, const BlockQ4_K &wb, WeightsVnni &o) {
    o.dw = f16_to_f32_fast(wb.d);
    o.dminw = f16_to_f32_fast(wb.dmin);
    alignas(16) uint8_t sm[16];
    unpack_scales(wb.scales, sm);
    const __m256i sm16 = _mm256_cvtepu8_epi16(_mm_load_si128(reinterpret_cast<const __m128i *>(sm)));
    o.mins = _mm256_extracti128_si256(sm16, 1);
    const __m512i s16 = _mm512_castsi256_si512(sm16);
    const __m512i m4 = _mm512_set1_epi8(0xF);
    for (int k = 0; k < 4; ++k) {
        const __m512i v = _mm512_broadcast_i64x4(simd::loadu(wb.qs + 32 * k));
        o.q[k] = _mm512_and_si512(_mm512_srlv_epi16(v, K.shift), m4);
        o.sc[k] = _mm512_permutexvar_epi16(K.perm[k], s16);
    }
}

// dot_cols' scale step for one block and one column: acc += (x_d * d) * the eight lane sums.
DS4_VNNI_Q4_INLINE __m256 add_block(const WeightsVnni &wv, const BlockQ8_K &x, __m256 acc) {
    __m512i s = _mm512_setzero_si512();
    for (int k = 0; k < 4; ++k)
        s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(wv.q[k], _mm512_loadu_si512(x.qs + 64 * k)), wv.sc[k]);
    const __m256i t = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
    return _mm256_fmadd_ps(_mm256_set1_ps(x.d * wv.dw), _mm256_cvtepi32_ps(t), acc);
}

// One weight block against C activation blocks, both of dot_cols' steps. bs: the columns'
// sub_block_sums where the caller has them already (rows_vnni), else null.
template <int C>
DS4_VNNI_Q4_INLINE void block_vnni(const VnniQ4 &K, const BlockQ4_K &wb, const BlockQ8_K *const *xb, __m256 *acc,
                                   float *accm, const __m128i *bs = nullptr) {
    WeightsVnni wv;
    decode_vnni(K, wb, wv);
    for (int c = 0; c < C; ++c) {
        const BlockQ8_K &x = *xb[c];
        const __m128i sums = bs ? bs[c] : sub_block_sums(x);
        accm[c] += x.d * wv.dminw * float(simd::hsum_i32(_mm_madd_epi16(wv.mins, sums)));
        acc[c] = add_block(wv, x, acc[c]);
    }
}

template <int C>
DS4_VNNI_Q4 void dot_cols_vnni(const uint8_t *wv, const void *const *xv, int64_t n, float *out) {
    static const VnniQ4 K;   // constants made once
    const BlockQ4_K *w = reinterpret_cast<const BlockQ4_K *>(wv);
    const BlockQ8_K *x[C];
    __m256 acc[C];
    float accm[C];
    for (int c = 0; c < C; ++c) {
        x[c] = static_cast<const BlockQ8_K *>(xv[c]);
        acc[c] = _mm256_setzero_ps();
        accm[c] = 0;
    }
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        simd::prefetch_ahead<4096, 3>(w + b);
        const BlockQ8_K *xb[C];
        for (int c = 0; c < C; ++c) xb[c] = x[c] + b;
        block_vnni<C>(K, w[b], xb, acc + 0, accm);
    }
    for (int c = 0; c < C; ++c) out[c] = simd::hsum(acc[c]) - accm[c];
}

// Many weight rows against one activation row (decode), one row after another: dot_cols_vnni
// with the activation row's sub-block sums worked out once per call.
DS4_VNNI_Q4 void rows_vnni(const uint8_t *w, size_t stride, int64_t n_rows, const BlockQ8_K *x, int64_t n, float *out) {
    static const VnniQ4 K;
    const int64_t nb = n / kQK_K;
    thread_local CacheAlignedVector<int16_t> sums;
    if (sums.size() < size_t(nb) * 8) sums.resize(size_t(nb) * 8);
    for (int64_t b = 0; b < nb; ++b) _mm_store_si128(reinterpret_cast<__m128i *>(sums.data() + 8 * b), sub_block_sums(x[b]));
    const __m128i *bs = reinterpret_cast<const __m128i *>(sums.data());
    for (int64_t r = 0; r < n_rows; ++r) {
        const BlockQ4_K *wr = reinterpret_cast<const BlockQ4_K *>(w + size_t(r) * stride);
        __m256 acc = _mm256_setzero_ps();
        float accm = 0;
        for (int64_t b = 0; b < nb; ++b) {
            simd::prefetch_ahead<4096, 3>(wr + b);
            const BlockQ8_K *xb = x + b;
            block_vnni<1>(K, wr[b], &xb, &acc, &accm, bs + b);
        }
        out[r] = simd::hsum(acc) - accm;
    }
}

// C activation rows against many weight rows (vec_dot_tile: prefill): dot_cols_vnni's steps
// for each row, with the work that depends on the activations only done once per call: each
// block's sub-block sums of the C columns (a 128-bit lane each) and their scales. The four
// columns' min terms then take one vpmaddwd and one reduction, lane for lane the scalar
// steps of dot_cols (their order per column is the same).
template <int C>
DS4_VNNI_Q4 void tile_cols_vnni(const uint8_t *w, size_t stride, int64_t n_rows, const BlockQ8_K *const *x,
                                const int16_t *bsum, const float *xd, int64_t nb, float *const *out) {
    static const VnniQ4 K;
    for (int64_t r = 0; r < n_rows; ++r) {
        const BlockQ4_K *wr = reinterpret_cast<const BlockQ4_K *>(w + size_t(r) * stride);
        __m256 acc[C];
        for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
        __m128 accm = _mm_setzero_ps();
        for (int64_t b = 0; b < nb; ++b) {
            simd::prefetch_ahead<4096, 3>(wr + b);
            WeightsVnni wv;
            decode_vnni(K, wr[b], wv);
            for (int c = 0; c < C; ++c) acc[c] = add_block(wv, x[c][b], acc[c]);
            // lane c: column c's sum of min * sub-block sum, in every dword after the folds
            __m512i p = _mm512_madd_epi16(_mm512_broadcast_i32x4(wv.mins), _mm512_load_si512(bsum + 32 * b));
            p = _mm512_add_epi32(p, _mm512_shuffle_epi32(p, _MM_PERM_BADC));
            p = _mm512_add_epi32(p, _mm512_shuffle_epi32(p, _MM_PERM_CDAB));
            const __m128i im = _mm512_castsi512_si128(_mm512_permutexvar_epi32(K.lane0, p));
            accm = _mm_add_ps(accm, _mm_mul_ps(_mm_mul_ps(_mm_load_ps(xd + 4 * b), _mm_set1_ps(wv.dminw)), _mm_cvtepi32_ps(im)));
        }
        alignas(16) float m[4];
        _mm_store_ps(m, accm);
        for (int c = 0; c < C; ++c) out[c][r] = simd::hsum(acc[c]) - m[c];
    }
}

#pragma GCC diagnostic pop

}  // namespace

void dot_q4_k(const uint8_t *w, const void *const *x, int ncols, int64_t n, float *out) {
    if (vnni_enabled()) {
        DS4_QUANT_COLS_DISPATCH(dot_cols_vnni, w, x, n, out)
    } else {
        DS4_QUANT_COLS_DISPATCH(dot_cols, w, x, n, out)
    }
}

void q4_k_tile_cols(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const void *const *x, int ncols, int64_t n,
                    float *const *out) {
    if (!vnni_enabled()) {
        for (int64_t r = 0; r < n_rows; ++r) {
            float res[kMaxCols];
            DS4_QUANT_COLS_DISPATCH(dot_cols, w + size_t(r) * w_row_stride, x, n, res)
            for (int c = 0; c < ncols; ++c) out[c][r] = res[c];
        }
        return;
    }
    const int64_t nb = n / kQK_K;
    // per block: the columns' 8 sub-block sums (a 128-bit lane each), then their 4 scales
    thread_local CacheAlignedVector<int16_t> bsum;
    thread_local CacheAlignedVector<float> xd;
    if (bsum.size() < size_t(nb) * 32) {
        bsum.resize(size_t(nb) * 32);
        xd.resize(size_t(nb) * 4);
    }
    const BlockQ8_K *xc[kMaxCols];
    for (int c = 0; c < ncols; ++c) xc[c] = static_cast<const BlockQ8_K *>(x[c]);
    for (int64_t b = 0; b < nb; ++b) {
        alignas(64) int16_t s[32] = {};
        alignas(16) float d[4] = {0, 0, 0, 0};
        for (int c = 0; c < ncols; ++c) {
            const BlockQ8_K &xb = xc[c][b];
            for (int j = 0; j < 8; ++j) s[8 * c + j] = int16_t(xb.bsums[2 * j] + xb.bsums[2 * j + 1]);
            d[c] = xb.d;
        }
        std::memcpy(bsum.data() + 32 * b, s, 64);
        std::memcpy(xd.data() + 4 * b, d, 16);
    }
    switch (ncols) {
        case 1: tile_cols_vnni<1>(w, w_row_stride, n_rows, xc, bsum.data(), xd.data(), nb, out); break;
        case 2: tile_cols_vnni<2>(w, w_row_stride, n_rows, xc, bsum.data(), xd.data(), nb, out); break;
        case 3: tile_cols_vnni<3>(w, w_row_stride, n_rows, xc, bsum.data(), xd.data(), nb, out); break;
        default: tile_cols_vnni<4>(w, w_row_stride, n_rows, xc, bsum.data(), xd.data(), nb, out); break;
    }
}

void rows_q4_k(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const void *x, int64_t n, float *out) {
    if (vnni_enabled()) {
        rows_vnni(w, w_row_stride, n_rows, static_cast<const BlockQ8_K *>(x), n, out);
        return;
    }
    for (int64_t r = 0; r < n_rows; ++r) dot_cols<1>(w + size_t(r) * w_row_stride, &x, n, out + r);
}

}  // namespace ds4::quant::detail
