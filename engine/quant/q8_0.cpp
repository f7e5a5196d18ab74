// Q8_0: 32 elements, f16 scale + int8. Used for weights and as the activation format
// for Q8_0 weights.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/quant/blocks.h"
#include "engine/quant/half.h"
#include "engine/quant/int8_dot.h"
#include "engine/quant/kernels.h"
#include "engine/quant/simd.h"

namespace ds4::quant::detail {

// int8 code of v (already scaled), ties away from zero as GGML's reference; NaN -> 0.
static inline int8_t clamp_round_i8(float v) {
    if (!(v == v)) return 0;
    v = std::round(v);
    return int8_t(v > 127.f ? 127.f : (v < -127.f ? -127.f : v));
}

// As GGML: d = amax / 127, q = round(x * (1 / d)); d stored as f16. Non-finite inputs
// are coded as 0 and do not affect the scale. The scalar definition; quant_q8_0 below is
// its AVX2 form (tests compare the bytes).
void quant_q8_0_ref(const float *src, void *dst, int64_t n) {
    BlockQ8_0 *y = static_cast<BlockQ8_0 *>(dst);
    for (int64_t b = 0; b < n / kQK8_0; ++b) {
        const float *x = src + b * kQK8_0;
        float amax = 0;
        for (int i = 0; i < kQK8_0; ++i)
            if (std::isfinite(x[i])) amax = std::fmax(amax, std::fabs(x[i]));
        const float d = amax / 127.f;
        const float id = d != 0 ? 1.f / d : 0.f;
        y[b].d = f32_to_f16_fast(d);
        for (int i = 0; i < kQK8_0; ++i) y[b].qs[i] = std::isfinite(x[i]) ? clamp_round_i8(x[i] * id) : 0;
    }
}

// Every activation row of a Q8_0 product passes through here (decode: once per matrix
// input), so it is vectorised: the same amax (a max is exact), the same product x * id,
// and round-half-away-from-zero written exactly: t = trunc(v), v - t is exact, and |v - t|
// >= 0.5 steps t away from zero.
namespace {

void quant_q8_0_avx2(const float *src, void *dst, int64_t n) {
    BlockQ8_0 *y = static_cast<BlockQ8_0 *>(dst);
    const __m256 sign = _mm256_set1_ps(-0.f), inf = _mm256_set1_ps(INFINITY), half = _mm256_set1_ps(0.5f),
                 one = _mm256_set1_ps(1.f), lim = _mm256_set1_ps(127.f), nlim = _mm256_set1_ps(-127.f);
    for (int64_t b = 0; b < n / kQK8_0; ++b) {
        const float *x = src + b * kQK8_0;
        __m256 v[4], fin[4];
        __m256 mx = _mm256_setzero_ps();
        for (int k = 0; k < 4; ++k) {
            v[k] = _mm256_loadu_ps(x + 8 * k);
            const __m256 a = _mm256_andnot_ps(sign, v[k]);
            fin[k] = _mm256_cmp_ps(a, inf, _CMP_LT_OQ);   // finite (false for NaN and inf)
            mx = _mm256_max_ps(mx, _mm256_and_ps(a, fin[k]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.f;
        const float id = d != 0 ? 1.f / d : 0.f;
        y[b].d = f32_to_f16_fast(d);
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int k = 0; k < 4; ++k) {
            const __m256 p = _mm256_mul_ps(v[k], vid);
            const __m256 t = _mm256_round_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            const __m256 up = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(p, t)), half, _CMP_GE_OQ);
            __m256 r = _mm256_add_ps(t, _mm256_and_ps(up, _mm256_or_ps(_mm256_and_ps(p, sign), one)));
            r = _mm256_max_ps(_mm256_min_ps(r, lim), nlim);
            // zero for non-finite inputs and for a NaN product (0 * inf when d is tiny)
            r = _mm256_and_ps(r, _mm256_and_ps(fin[k], _mm256_cmp_ps(p, p, _CMP_ORD_Q)));
            q[k] = _mm256_cvttps_epi32(r);
        }
        // 32 int32 -> 32 int8 in order: packs work within 128-bit lanes, a permute restores it
        const __m256i w01 = _mm256_packs_epi32(q[0], q[1]), w23 = _mm256_packs_epi32(q[2], q[3]);
        const __m256i bytes = _mm256_packs_epi16(w01, w23);
        const __m256i ordered = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(y[b].qs), ordered);
    }
}

// The same steps in 512-bit registers, sixteen blocks at a time: their amax first, then d and
// 1/d by one vector division each and the sixteen f16 scales by one conversion (IEEE
// division and rounding, so the values of the scalar steps). A block at a time the two
// scalar divisions and the horizontal max made a chain the core waited on: 256 rows of 4096
// took 497 us on one Zen 5 core, 161 this way.
#define DS4_AVX512_Q8 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
// GCC 12 warns about the undefined pass-through operand inside its AVX-512 intrinsics.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
DS4_AVX512_Q8 void quant_q8_0_avx512(const float *src, void *dst, int64_t n) {
    BlockQ8_0 *y = static_cast<BlockQ8_0 *>(dst);
    const int64_t nb = n / kQK8_0;
    const __m512 inf = _mm512_set1_ps(INFINITY), half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.f),
                 lim = _mm512_set1_ps(127.f), nlim = _mm512_set1_ps(-127.f);
    const __m512i sign = _mm512_set1_epi32(int(0x80000000u));
    // A last group of fewer than sixteen blocks (and a whole row of fewer: the default
    // model's rows are 8 and 6 blocks) takes the same steps, its missing blocks' amax 0.
    for (int64_t b0 = 0; b0 < nb; b0 += 16) {
        const int nblk = int(nb - b0 < 16 ? nb - b0 : 16);
        alignas(64) float amax[16] = {}, idv[16];
        for (int i = 0; i < nblk; ++i) {
            const float *x = src + (b0 + i) * kQK8_0;
            const __m512 a0 = _mm512_abs_ps(_mm512_loadu_ps(x)), a1 = _mm512_abs_ps(_mm512_loadu_ps(x + 16));
            // non-finite values count as 0
            const __m512 m = _mm512_max_ps(_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a0, inf, _CMP_LT_OQ), a0),
                                           _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a1, inf, _CMP_LT_OQ), a1));
            amax[i] = _mm512_reduce_max_ps(m);
        }
        const __m512 d = _mm512_div_ps(_mm512_load_ps(amax), lim);
        _mm512_store_ps(idv, _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_OQ), one, d));
        alignas(32) uint16_t dh[16];
        _mm256_store_si256(reinterpret_cast<__m256i *>(dh), _mm512_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        for (int i = 0; i < nblk; ++i) {
            const float *x = src + (b0 + i) * kQK8_0;
            BlockQ8_0 &o = y[b0 + i];
            o.d = dh[i];
            const __m512 vid = _mm512_set1_ps(idv[i]);
            for (int k = 0; k < 2; ++k) {
                const __m512 v = _mm512_loadu_ps(x + 16 * k);
                const __m512 p = _mm512_mul_ps(v, vid);
                const __m512 t = _mm512_roundscale_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
                const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(p, t)), half, _CMP_GE_OQ);
                const __m512 away = _mm512_castsi512_ps(
                    _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(p), sign), _mm512_castps_si512(one)));
                const __m512 r = _mm512_max_ps(_mm512_min_ps(_mm512_mask_add_ps(t, up, t, away), lim), nlim);
                // zero for non-finite inputs and for a NaN product (0 * inf when d is tiny)
                const __mmask16 keep = _mm512_cmp_ps_mask(_mm512_abs_ps(v), inf, _CMP_LT_OQ) & _mm512_cmp_ps_mask(p, p, _CMP_ORD_Q);
                _mm_storeu_si128(reinterpret_cast<__m128i *>(o.qs + 16 * k),
                                 _mm512_cvtepi32_epi8(_mm512_maskz_cvttps_epi32(keep, r)));
            }
        }
    }
}
#pragma GCC diagnostic pop

}  // namespace

void quant_q8_0(const float *src, void *dst, int64_t n) {
    if (avx512_enabled())
        quant_q8_0_avx512(src, dst, n);
    else
        quant_q8_0_avx2(src, dst, n);
}

void dequant_q8_0(const void *src, float *dst, int64_t n) {
    const BlockQ8_0 *x = static_cast<const BlockQ8_0 *>(src);
    for (int64_t b = 0; b < n / kQK8_0; ++b) {
        const __m256 d = _mm256_set1_ps(f16_to_f32_fast(x[b].d));
        for (int k = 0; k < 4; ++k) {
            const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(x[b].qs + 8 * k));
            _mm256_storeu_ps(dst + b * kQK8_0 + 8 * k, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))));
        }
    }
}

namespace {

// Every Q8_0 dot here, and the packed column tile in q8_0_tile.cpp, computes the same
// floats in the same order, so a result never depends on the kernel, the batch or the
// columns next to it:
//   S_b  = the exact integer dot of block b (int32),
//   s_b  = f16(w_b.d) * f16(x_b.d) in f32,
//   a[k] = fma(s_b, float(S_b), a[k]) over b = k, k + 4, k + 8, ... in turn (a[k] from +0),
//   dot  = (a[0] + a[2]) + (a[1] + a[3]).
// Four chains keep the float work at one fma per block: a one-row kernel finds S_b with a
// horizontal sum (cheap next to the load of the row), the packed tile with columns in the
// lanes has it for free.

// The scales of blocks b[0..nt) as f32 lanes; missing blocks scale by 0.
inline __m128 scales4(const BlockQ8_0 *b, int nt) {
    // Gathered in a general register: pinsrw would take four shuffle-port slots.
    uint64_t h = b[0].d;
    if (nt > 1) h |= uint64_t(b[1].d) << 16;
    if (nt > 2) h |= uint64_t(b[2].d) << 32;
    if (nt > 3) h |= uint64_t(b[3].d) << 48;
    return _mm_cvtph_ps(_mm_cvtsi64_si128(int64_t(h)));
}

// Four-byte sums of |w| x sign(x, w) = w x (int8_dot.h).
template <Isa kIsa>
inline __m256i dot4(__m256i aw, __m256i sx) {
    if constexpr (kIsa == Isa::Avx2) return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1));
    else return dot4_add<kIsa>(_mm256_setzero_si256(), aw, sx);
}

// R weight rows (wv[r]) against C activation rows, four blocks a step (nt < 4 at the tail),
// the rows' steps in turn; out[r * C + c]. xd: null, or the activation rows' block scales as
// f32 (xd[c][b], zero past the last block), worked out once for many weight rows (see
// q8_0_tile_cols).
template <int R, int C, Isa kIsa>
void dot_rows_cols(const uint8_t *const *wv, const void *const *xv, int64_t n, float *out,
                   const float *const *xd = nullptr) {
    const BlockQ8_0 *x[C];
    for (int c = 0; c < C; ++c) x[c] = static_cast<const BlockQ8_0 *>(xv[c]);
    __m128 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) acc[r][c] = _mm_setzero_ps();
    auto step = [&](const BlockQ8_0 *w, __m128 *a, int64_t b, int nt) {
        // Hardware prefetch loses track across the 34-byte blocks of many short rows;
        // ask for the weights ~2 KB ahead explicitly.
        // One prefetch per two blocks, as the two-block kernel before this one did: a step
        // covers 136 bytes. (Prefetching the step's start and start + 64 measured 10-15%
        // slower decode in ds4d, though not in ds4-bench.)
        _mm_prefetch(reinterpret_cast<const char *>(w + b) + 2048, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char *>(w + b + 2) + 2048, _MM_HINT_T0);
        __m256i q[4], aq[4];
        for (int k = 0; k < 4; ++k) {
            q[k] = k < nt ? simd::loadu(w[b + k].qs) : _mm256_setzero_si256();
            aq[k] = _mm256_sign_epi8(q[k], q[k]);
        }
        const __m128 dw = scales4(w + b, nt);
        for (int c = 0; c < C; ++c) {
            __m256i p[4];
            for (int k = 0; k < 4; ++k)
                p[k] = k < nt ? dot4<kIsa>(aq[k], _mm256_sign_epi8(simd::loadu(x[c][b + k].qs), q[k]))
                              : _mm256_setzero_si256();
            const __m128 s = _mm_mul_ps(dw, xd ? _mm_loadu_ps(xd[c] + b) : scales4(x[c] + b, nt));
            a[c] = _mm_fmadd_ps(s, _mm_cvtepi32_ps(simd::sum4_i32(p[0], p[1], p[2], p[3])), a[c]);
        }
    };
    const BlockQ8_0 *w[R];
    for (int r = 0; r < R; ++r) w[r] = reinterpret_cast<const BlockQ8_0 *>(wv[r]);
    const int64_t nb = n / kQK8_0;
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4)
        for (int r = 0; r < R; ++r) step(w[r], acc[r], b, 4);
    if (b < nb)
        for (int r = 0; r < R; ++r) step(w[r], acc[r], b, int(nb - b));
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) {
            const __m128 h = _mm_add_ps(acc[r][c], _mm_movehl_ps(acc[r][c], acc[r][c]));   // a0 + a2, a1 + a3
            out[r * C + c] = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
        }
}

template <int C, Isa kIsa>
void dot_cols(const uint8_t *wv, const void *const *xv, int64_t n, float *out, const float *const *xd = nullptr) {
    dot_rows_cols<1, C, kIsa>(&wv, xv, n, out, xd);
}

template <int C>
void dot_cols_vnni(const uint8_t *w, const void *const *x, int64_t n, float *out) {
    dot_cols<C, Isa::Vnni512>(w, x, n, out);
}
template <int C>
void dot_cols_avxvnni(const uint8_t *w, const void *const *x, int64_t n, float *out) {
    dot_cols<C, Isa::AvxVnni>(w, x, n, out);
}
template <int C>
void dot_cols_avx2(const uint8_t *w, const void *const *x, int64_t n, float *out) {
    dot_cols<C, Isa::Avx2>(w, x, n, out);
}

// Rows r, r + q, ..., r + (S - 1)q (q = n_rows / S) a step of each in turn, out[c][row]:
// S weight streams far apart, which the hardware prefetchers follow side by side; the rows
// left over one at a time. One activation row (decode) takes four streams: from memory on
// Zen 5, one core, one stream read 70-75% of a plain read, two 80-85%, four 97-100%, six
// 80-96%, eight 71-80% (from cache 41 / 48 / 54 / 44-49 / 44 GB/s). 2-4 columns take two:
// four measured slower there (55-59 against 57-63 G weight-dots/s from memory).
template <int S, int C, Isa kIsa>
void tile_cols(const uint8_t *w, size_t w_stride, int64_t n_rows, const void *const *x, const float *const *xd,
               int64_t n, float *const *out) {
    const int64_t part = n_rows / S;
    float res[S * C];
    for (int64_t r = 0; r < part; ++r) {
        const uint8_t *wr[S];
        for (int s = 0; s < S; ++s) wr[s] = w + size_t(r + s * part) * w_stride;
        dot_rows_cols<S, C, kIsa>(wr, x, n, res, xd);
        for (int s = 0; s < S; ++s)
            for (int c = 0; c < C; ++c) out[c][r + s * part] = res[s * C + c];
    }
    for (int64_t r = S * part; r < n_rows; ++r) {
        dot_cols<C, kIsa>(w + size_t(r) * w_stride, x, n, res, xd);
        for (int c = 0; c < C; ++c) out[c][r] = res[c];
    }
}

template <int C>
void tile_cols_vnni(const uint8_t *w, size_t w_stride, int64_t n_rows, const void *const *x, const float *const *xd,
                    int64_t n, float *const *out) {
    tile_cols<2, C, Isa::Vnni512>(w, w_stride, n_rows, x, xd, n, out);
}
template <int C>
void tile_cols_avxvnni(const uint8_t *w, size_t w_stride, int64_t n_rows, const void *const *x,
                       const float *const *xd, int64_t n, float *const *out) {
    tile_cols<2, C, Isa::AvxVnni>(w, w_stride, n_rows, x, xd, n, out);
}
template <int C>
void tile_cols_avx2(const uint8_t *w, size_t w_stride, int64_t n_rows, const void *const *x, const float *const *xd,
                    int64_t n, float *const *out) {
    tile_cols<2, C, Isa::Avx2>(w, w_stride, n_rows, x, xd, n, out);
}

}  // namespace

void q8_0_tile_cols(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const void *const *x, int ncols, int64_t n,
                    float *const *out) {
    // The scales of the activation blocks, converted once here rather than per weight row.
    const int64_t nb = n / kQK8_0;
    thread_local std::vector<float> scales;
    const size_t per = size_t(nb + 4);
    if (scales.size() < per * size_t(ncols)) scales.resize(per * size_t(ncols));
    const float *xd[kMaxCols];
    for (int c = 0; c < ncols; ++c) {
        const BlockQ8_0 *xb = static_cast<const BlockQ8_0 *>(x[c]);
        float *d = scales.data() + per * size_t(c);
        for (int64_t b = 0; b < nb; ++b) d[b] = f16_to_f32_fast(xb[b].d);
        std::fill(d + nb, d + per, 0.f);
        xd[c] = d;
    }
    if (vnni_enabled()) {
        DS4_QUANT_COLS_DISPATCH(tile_cols_vnni, w, w_row_stride, n_rows, x, xd, n, out)
    } else if (avxvnni_enabled()) {
        DS4_QUANT_COLS_DISPATCH(tile_cols_avxvnni, w, w_row_stride, n_rows, x, xd, n, out)
    } else {
        DS4_QUANT_COLS_DISPATCH(tile_cols_avx2, w, w_row_stride, n_rows, x, xd, n, out)
    }
}

void rows_q8_0(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const void *x, int64_t n, float *out) {
    float *const o[1] = {out};
    if (vnni_enabled())
        tile_cols<4, 1, Isa::Vnni512>(w, w_row_stride, n_rows, &x, nullptr, n, o);
    else if (avxvnni_enabled())
        tile_cols<4, 1, Isa::AvxVnni>(w, w_row_stride, n_rows, &x, nullptr, n, o);
    else
        tile_cols<4, 1, Isa::Avx2>(w, w_row_stride, n_rows, &x, nullptr, n, o);
}

void dot_q8_0(const uint8_t *w, const void *const *x, int ncols, int64_t n, float *out) {
    if (vnni_enabled()) {
        DS4_QUANT_COLS_DISPATCH(dot_cols_vnni, w, x, n, out)
    } else if (avxvnni_enabled()) {
        DS4_QUANT_COLS_DISPATCH(dot_cols_avxvnni, w, x, n, out)
    } else {
        DS4_QUANT_COLS_DISPATCH(dot_cols_avx2, w, x, n, out)
    }
}

}  // namespace ds4::quant::detail
