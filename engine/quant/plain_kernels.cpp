// F32 / F16 / BF16: conversions and dots against f32 activations.
#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/quant/cache_aligned.h"
#include "engine/quant/half.h"
#include "engine/quant/kernels.h"
#include "engine/quant/simd.h"

namespace ds4::quant::detail {
namespace {

template <class V>
void grow_to(V &v, size_t n) {
    if (v.size() < n) v.resize(n);
}

struct LoadF32 {
    static __m256 load8(const uint8_t *p) { return _mm256_loadu_ps(reinterpret_cast<const float *>(p)); }
    static float one(const uint8_t *p) { float f; std::memcpy(&f, p, 4); return f; }
    static constexpr int kBytes = 4;
};
struct LoadF16 {
    static __m256 load8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))); }
    static float one(const uint8_t *p) { uint16_t h; std::memcpy(&h, p, 2); return f16_to_f32_fast(h); }
    static constexpr int kBytes = 2;
};
struct LoadBF16 {
    static __m256 load8(const uint8_t *p) {
        const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
    static float one(const uint8_t *p) { uint16_t h; std::memcpy(&h, p, 2); return bf16_to_f32_inline(h); }
    static constexpr int kBytes = 2;
};

// Four accumulators per column hide the FMA latency; each group of 8 weights is
// converted once for all columns.
template <class L, int C>
void dot_plain(const uint8_t *w, const void *const *xv, int64_t n, float *out) {
    const float *x[C];
    __m256 a[C][4];
    for (int c = 0; c < C; ++c) {
        x[c] = static_cast<const float *>(xv[c]);
        for (int k = 0; k < 4; ++k) a[c][k] = _mm256_setzero_ps();
    }
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const uint8_t *p = w + i * L::kBytes;
        // 4 KB ahead: from memory these dots waited on their loads (one core of an Emerald
        // Rapids VM: f16 9.5 -> 12.8-13.1 GB/s, bf16 9.0 -> 12.4-12.9, f32 12.0-12.6 -> 14.1-14.7)
        simd::prefetch_ahead<4096, L::kBytes / 2>(p);
        const __m256 w0 = L::load8(p), w1 = L::load8(p + 8 * L::kBytes);
        const __m256 w2 = L::load8(p + 16 * L::kBytes), w3 = L::load8(p + 24 * L::kBytes);
        for (int c = 0; c < C; ++c) {
            a[c][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[c] + i), a[c][0]);
            a[c][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[c] + i + 8), a[c][1]);
            a[c][2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x[c] + i + 16), a[c][2]);
            a[c][3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x[c] + i + 24), a[c][3]);
        }
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 w0 = L::load8(w + i * L::kBytes);
        for (int c = 0; c < C; ++c) a[c][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[c] + i), a[c][0]);
    }
    for (int c = 0; c < C; ++c) {
        float s = simd::hsum(_mm256_add_ps(_mm256_add_ps(a[c][0], a[c][1]), _mm256_add_ps(a[c][2], a[c][3])));
        for (int64_t j = i; j < n; ++j) s += L::one(w + j * L::kBytes) * x[c][j];
        out[c] = s;
    }
}

// dot_plain's 32-element steps over len elements (a multiple of 32) from w and x[c] on,
// its chains kept in a (a[4 c + k], zero to start), so a long dot can be cut into chunks and
// resumed.
template <class L, int C>
void plain_steps(const uint8_t *w, const float *const *x, int64_t len, __m256 *a) {
    __m256 acc[C][4];
    for (int c = 0; c < C; ++c)
        for (int k = 0; k < 4; ++k) acc[c][k] = a[4 * c + k];
    for (int64_t i = 0; i < len; i += 32) {
        const uint8_t *p = w + i * L::kBytes;
        const __m256 w0 = L::load8(p), w1 = L::load8(p + 8 * L::kBytes);
        const __m256 w2 = L::load8(p + 16 * L::kBytes), w3 = L::load8(p + 24 * L::kBytes);
        for (int c = 0; c < C; ++c) {
            acc[c][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[c] + i), acc[c][0]);
            acc[c][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[c] + i + 8), acc[c][1]);
            acc[c][2] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x[c] + i + 16), acc[c][2]);
            acc[c][3] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x[c] + i + 24), acc[c][3]);
        }
    }
    for (int c = 0; c < C; ++c)
        for (int k = 0; k < 4; ++k) a[4 * c + k] = acc[c][k];
}

// The same steps on AVX-512 for R rows and C columns at once: a 512-bit register holds two
// chains of dot_plain side by side (lanes 0-7 chain 0 or 2, lanes 8-15 chain 1 or 3: the
// elements those chains take), so every lane does the float steps of dot_plain; a[(r, c)] is
// the same 4 x 8 floats. 2 rows x 4 columns take 16 registers of chains, which AVX2's 16
// registers cannot hold with the weights.
#define DS4_AVX512_PLAIN __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
// GCC 12 warns about the undefined pass-through operand inside its AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
struct Load16F32 {
    DS4_AVX512_PLAIN static __m512 load16(const uint8_t *p) { return _mm512_loadu_ps(reinterpret_cast<const float *>(p)); }
};
struct Load16F16 {
    DS4_AVX512_PLAIN static __m512 load16(const uint8_t *p) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
    }
};
struct Load16BF16 {
    DS4_AVX512_PLAIN static __m512 load16(const uint8_t *p) {
        const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    }
};

template <class L, class L16, int R, int C>
DS4_AVX512_PLAIN void plain_steps512(const uint8_t *const *w, const float *const *x, int64_t len, __m256 *const *a) {
    __m512 acc[R][C][2];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c)
            for (int h = 0; h < 2; ++h) acc[r][c][h] = _mm512_loadu_ps(reinterpret_cast<const float *>(a[r * C + c] + 2 * h));
    for (int64_t i = 0; i < len; i += 32) {
        __m512 wv[R][2];
        for (int r = 0; r < R; ++r) {
            wv[r][0] = L16::load16(w[r] + i * L::kBytes);
            wv[r][1] = L16::load16(w[r] + (i + 16) * L::kBytes);
        }
        for (int c = 0; c < C; ++c) {
            __m512 x0 = _mm512_loadu_ps(x[c] + i), x1 = _mm512_loadu_ps(x[c] + i + 16);
            // in registers: folded into each row's FMA, every column's load was made R times
            if constexpr (R > 1) __asm__("" : "+v"(x0), "+v"(x1));
            for (int r = 0; r < R; ++r) {
                acc[r][c][0] = _mm512_fmadd_ps(wv[r][0], x0, acc[r][c][0]);
                acc[r][c][1] = _mm512_fmadd_ps(wv[r][1], x1, acc[r][c][1]);
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c)
            for (int h = 0; h < 2; ++h) _mm512_storeu_ps(reinterpret_cast<float *>(a[r * C + c] + 2 * h), acc[r][c][h]);
}

template <class L, class L16, int R>
void plain_steps512_cols(int nc, const uint8_t *const *w, const float *const *x, int64_t len, __m256 *const *a) {
    switch (nc) {
        case 1: plain_steps512<L, L16, R, 1>(w, x, len, a); break;
        case 2: plain_steps512<L, L16, R, 2>(w, x, len, a); break;
        case 3: plain_steps512<L, L16, R, 3>(w, x, len, a); break;
        default: plain_steps512<L, L16, R, 4>(w, x, len, a); break;
    }
}

// The rest of dot_plain from element i (past its 32-element steps): the 8-element steps,
// the sum of the chains, the scalar tail.
template <class L, int C>
void plain_finish(const uint8_t *w, const float *const *x, int64_t i, int64_t n, __m256 *a, float *const *out,
                  int64_t r) {
    for (; i + 8 <= n; i += 8) {
        const __m256 w0 = L::load8(w + i * L::kBytes);
        for (int c = 0; c < C; ++c) a[4 * c] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[c] + i), a[4 * c]);
    }
    for (int c = 0; c < C; ++c) {
        const __m256 *ac = a + 4 * c;
        float s = simd::hsum(_mm256_add_ps(_mm256_add_ps(ac[0], ac[1]), _mm256_add_ps(ac[2], ac[3])));
        for (int64_t j = i; j < n; ++j) s += L::one(w + j * L::kBytes) * x[c][j];
        out[c][r] = s;
    }
}

// Few weight rows against many long activation rows: the rows cut into chunks of kChunk
// elements, and per chunk every weight row passes over every column, the chains kept in
// memory between chunks. Each chunk of the weight rows is copied together first: the rows of
// the mixes are 64 KB apart, so their chunks all fell in the same L2 sets and were read from
// L3 again for every column. A row block at a time (vec_dot_tile) instead, every row block
// read all the columns again.
template <class L, class L16>
void plain_tile_chunked(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *x, size_t x_row_stride,
                        int64_t n_cols, int64_t n, float *out, size_t out_col_stride) {
    constexpr int64_t kChunk = 1024;
    const int64_t n32 = n / 32 * 32;
    thread_local CacheAlignedVector<float> chain_floats;   // 4 chains of 8 floats a (row, column)
    thread_local CacheAlignedVector<uint8_t> wc;   // on a cache line, as the rows' 512-bit loads want
    chain_floats.assign(size_t(n_rows * n_cols * 32), 0.f);
    __m256 *const chains_at = reinterpret_cast<__m256 *>(chain_floats.data());
    grow_to(wc, size_t(n_rows * kChunk * L::kBytes));
    auto cols = [&](int64_t c0, int nc, int64_t i, const float **xs, float **o) {
        for (int c = 0; c < nc; ++c) {
            xs[c] = reinterpret_cast<const float *>(x + size_t(c0 + c) * x_row_stride) + i;
            o[c] = out + size_t(c0 + c) * out_col_stride;
        }
    };
    for (int64_t i0 = 0; i0 < n32; i0 += kChunk) {
        const int64_t len = std::min(kChunk, n32 - i0);
        const size_t row = size_t(len * L::kBytes);
        for (int64_t r = 0; r < n_rows; ++r)
            std::memcpy(wc.data() + size_t(r) * row, w + size_t(r) * w_row_stride + size_t(i0 * L::kBytes), row);
        if (avx512_enabled()) {   // two rows and four columns a step
            for (int64_t c0 = 0; c0 < n_cols; c0 += 4) {
                const int nc = int(std::min<int64_t>(4, n_cols - c0));
                const float *xs[4];
                float *o[4];
                cols(c0, nc, i0, xs, o);
                for (int64_t r = 0; r < n_rows; r += 2) {
                    const int nr = int(std::min<int64_t>(2, n_rows - r));
                    const uint8_t *wr[2];
                    __m256 *a[8];
                    for (int q = 0; q < nr; ++q) {
                        wr[q] = wc.data() + size_t(r + q) * row;
                        for (int c = 0; c < nc; ++c) a[q * nc + c] = chains_at + size_t((r + q) * n_cols + c0 + c) * 4;
                    }
                    if (nr == 2) plain_steps512_cols<L, L16, 2>(nc, wr, xs, len, a);
                    else plain_steps512_cols<L, L16, 1>(nc, wr, xs, len, a);
                }
            }
            continue;
        }
        // Two columns a step: their 8 chains and the 4 weight vectors fit the 16 AVX2
        // registers (four columns' 16 chains do not, and spill).
        for (int64_t c0 = 0; c0 < n_cols; c0 += 2) {
            const int nc = int(std::min<int64_t>(2, n_cols - c0));
            const float *xs[2];
            float *o[2];
            cols(c0, nc, i0, xs, o);
            for (int64_t r = 0; r < n_rows; ++r) {
                __m256 *a = chains_at + size_t(r * n_cols + c0) * 4;
                if (nc == 2) plain_steps<L, 2>(wc.data() + size_t(r) * row, xs, len, a);
                else plain_steps<L, 1>(wc.data() + size_t(r) * row, xs, len, a);
            }
        }
    }
    for (int64_t c0 = 0; c0 < n_cols; c0 += kMaxCols) {
        const int nc = int(std::min<int64_t>(kMaxCols, n_cols - c0));
        const float *xs[kMaxCols];
        float *o[kMaxCols];
        cols(c0, nc, 0, xs, o);
        for (int64_t r = 0; r < n_rows; ++r) {
            __m256 *a = chains_at + size_t(r * n_cols + c0) * 4;
            const uint8_t *wr = w + size_t(r) * w_row_stride;
            switch (nc) {
                case 1: plain_finish<L, 1>(wr, xs, n32, n, a, o, r); break;
                case 2: plain_finish<L, 2>(wr, xs, n32, n, a, o, r); break;
                case 3: plain_finish<L, 3>(wr, xs, n32, n, a, o, r); break;
                default: plain_finish<L, 4>(wr, xs, n32, n, a, o, r); break;
            }
        }
    }
}

// One activation row against many weight rows (vec_dot_rows): on AVX-512 four rows a step, a
// quarter of the rows apart (four streams the prefetchers follow, as rows_q8_0), each with
// dot_plain's chains, so the bits are dot_plain's. One row at a time, a short row's dot waits
// on its four FMA chains: the hyper-connection mix (24 rows of 1024 f32) was ~4% of a
// default-model decode step. F32 only: from memory on Zen 5 F32 rows went 35-37 -> 40-41 GB/s
// (the read), F16 and BF16 (which convert) 35-36 -> 33.
template <class L, class L16>
void plain_rows(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const void *xv, int64_t n, float *out) {
    const float *x[1] = {static_cast<const float *>(xv)};
    const int64_t q = avx512_enabled() ? n_rows / 4 : 0, n32 = n / 32 * 32;
    for (int64_t r = 0; r < q; ++r) {
        alignas(32) __m256 chains[4][4];
        const uint8_t *wr[4];
        __m256 *a[4];
        for (int k = 0; k < 4; ++k) {
            wr[k] = w + size_t(r + k * q) * w_row_stride;
            a[k] = chains[k];
            for (int j = 0; j < 4; ++j) chains[k][j] = _mm256_setzero_ps();
        }
        plain_steps512<L, L16, 4, 1>(wr, x, n32, a);
        float *o[1] = {out};
        for (int k = 0; k < 4; ++k) plain_finish<L, 1>(wr[k], x, n32, n, chains[k], o, r + k * q);
    }
    for (int64_t r = 4 * q; r < n_rows; ++r) dot_plain<L, 1>(w + size_t(r) * w_row_stride, &xv, n, out + r);
}

template <int C> void dot_f32_c(const uint8_t *w, const void *const *x, int64_t n, float *out) { dot_plain<LoadF32, C>(w, x, n, out); }
template <int C> void dot_f16_c(const uint8_t *w, const void *const *x, int64_t n, float *out) { dot_plain<LoadF16, C>(w, x, n, out); }
template <int C> void dot_bf16_c(const uint8_t *w, const void *const *x, int64_t n, float *out) { dot_plain<LoadBF16, C>(w, x, n, out); }

}  // namespace

void rows_f32(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const void *x, int64_t n, float *out) {
    plain_rows<LoadF32, Load16F32>(w, w_row_stride, n_rows, x, n, out);
}

void dot_f32(const uint8_t *w, const void *const *x, int ncols, int64_t n, float *out) {
    DS4_QUANT_COLS_DISPATCH(dot_f32_c, w, x, n, out)
}
void dot_f16(const uint8_t *w, const void *const *x, int ncols, int64_t n, float *out) {
    DS4_QUANT_COLS_DISPATCH(dot_f16_c, w, x, n, out)
}
void dot_bf16(const uint8_t *w, const void *const *x, int ncols, int64_t n, float *out) {
    DS4_QUANT_COLS_DISPATCH(dot_bf16_c, w, x, n, out)
}

void plain_tile(uint32_t type, const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *x,
                size_t x_row_stride, int64_t n_cols, int64_t n, float *out, size_t out_col_stride) {
    switch (type) {
        case 0: plain_tile_chunked<LoadF32, Load16F32>(w, w_row_stride, n_rows, x, x_row_stride, n_cols, n, out, out_col_stride); break;
        case 1: plain_tile_chunked<LoadF16, Load16F16>(w, w_row_stride, n_rows, x, x_row_stride, n_cols, n, out, out_col_stride); break;
        default: plain_tile_chunked<LoadBF16, Load16BF16>(w, w_row_stride, n_rows, x, x_row_stride, n_cols, n, out, out_col_stride); break;
    }
}

void dequant_f16(const void *src, float *dst, int64_t n) {
    const uint8_t *p = static_cast<const uint8_t *>(src);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, LoadF16::load8(p + 2 * i));
    for (; i < n; ++i) dst[i] = LoadF16::one(p + 2 * i);
}

void dequant_bf16(const void *src, float *dst, int64_t n) {
    const uint8_t *p = static_cast<const uint8_t *>(src);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, LoadBF16::load8(p + 2 * i));
    for (; i < n; ++i) dst[i] = LoadBF16::one(p + 2 * i);
}

void quant_f16(const float *src, void *dst, int64_t n) {
    uint8_t *p = static_cast<uint8_t *>(dst);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i *>(p + 2 * i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; ++i) {
        const uint16_t h = f32_to_f16_fast(src[i]);
        std::memcpy(p + 2 * i, &h, 2);
    }
}

void quant_bf16(const float *src, void *dst, int64_t n) {
    uint8_t *p = static_cast<uint8_t *>(dst);
    for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_bf16_inline(src[i]);
        std::memcpy(p + 2 * i, &h, 2);
    }
}

}  // namespace ds4::quant::detail
