// Q8_0 products against many activation rows on AVX-512 VNNI: the columns sit in the
// 16 lanes of a register, so one vpdpbusd multiplies a 4-byte slice of a weight row
// (broadcast) by the same slice of 16 activation rows, and a block's 8 slices sum to the
// exact integer block dots of 16 columns with no horizontal work. The float steps are the
// ones of dot_q8_0 (q8_0.cpp) lane for lane, so every result is bit-identical to vec_dot.
//
// vpdpbusd multiplies unsigned by signed bytes. The activations are packed as x + 128
// (x ^ 0x80), which adds 128 * sum(w) to each block dot; the accumulator starts at minus
// that, so the integer that comes out is exact. The correction depends on the weight row
// only and is worked out once per row per call.
#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/quant/blocks.h"
#include "engine/quant/half.h"
#include "engine/quant/kernels.h"
#include "engine/quant/simd.h"

namespace ds4::quant::detail {

namespace {

// Per column group and block: 8 slices x 16 lanes x 4 bytes, then 16 f32 scales.
constexpr int64_t kSliceBytes = kPackCols * 4;
constexpr int64_t kGroupBlockBytes = 8 * kSliceBytes + kPackCols * 4;

struct RowPrep {
    int32_t neg_corr;   // -128 * sum of the block's weights
    float dw;           // the block's scale
};

#define DS4_VNNI512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
// GCC 12 warns about the undefined pass-through operand inside its AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

DS4_VNNI512 void prep_rows(const uint8_t *w, size_t w_stride, int64_t n_rows, int64_t nb, RowPrep *prep) {
    const __m256i ones = _mm256_set1_epi8(1), zero = _mm256_setzero_si256();
    for (int64_t r = 0; r < n_rows; ++r) {
        const BlockQ8_0 *wb = reinterpret_cast<const BlockQ8_0 *>(w + size_t(r) * w_stride);
        RowPrep *p = prep + r * nb;
        int64_t b = 0;
        for (; b + 4 <= nb; b += 4) {
            __m256i s[4];
            for (int k = 0; k < 4; ++k) s[k] = _mm256_dpbusd_epi32(zero, ones, simd::loadu(wb[b + k].qs));
            alignas(16) int32_t sums[4];
            _mm_store_si128(reinterpret_cast<__m128i *>(sums), simd::sum4_i32(s[0], s[1], s[2], s[3]));
            for (int k = 0; k < 4; ++k) p[b + k] = {-128 * sums[k], f16_to_f32_fast(wb[b + k].d)};
        }
        for (; b < nb; ++b) {
            int32_t sum = 0;
            for (int i = 0; i < kQK8_0; ++i) sum += wb[b].qs[i];
            p[b] = {-128 * sum, f16_to_f32_fast(wb[b].d)};
        }
    }
}

inline uint32_t load_u32(const int8_t *p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// R weight rows against one packed group of 16 columns; out[r] holds row r's 16 results.
// pf..pf_end: weights to pull into L2 meanwhile (the next rows, on the first pass over a
// row block, when they still come from memory); three lines a block covers 4 rows.
template <int R>
DS4_VNNI512 inline void rows_x16(const BlockQ8_0 *const *w, const RowPrep *const *prep, const uint8_t *panel,
                                 int64_t nb, const uint8_t *pf, const uint8_t *pf_end, __m512 *out) {
    __m512 acc[R][4];
    for (int r = 0; r < R; ++r)
        for (int k = 0; k < 4; ++k) acc[r][k] = _mm512_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += 4) {
        const int nt = int(std::min<int64_t>(4, nb - b0));
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
            if (k >= nt) break;
            const int64_t b = b0 + k;
            const uint8_t *pb = panel + b * kGroupBlockBytes;
            for (int i = 0; i < 3 && pf < pf_end; ++i, pf += 64) _mm_prefetch(reinterpret_cast<const char *>(pf), _MM_HINT_T1);
            // Two integer chains a row (even and odd slices): eight dependent vpdpbusd a
            // block would leave the units waiting on their latency.
            __m512i dot[R][2];
            for (int r = 0; r < R; ++r) {
                dot[r][0] = _mm512_set1_epi32(prep[r][b].neg_corr);
                dot[r][1] = _mm512_setzero_si512();
            }
#pragma GCC unroll 8
            for (int j = 0; j < 8; ++j) {
                const __m512i x = _mm512_loadu_si512(pb + j * kSliceBytes);
                for (int r = 0; r < R; ++r)
                    dot[r][j & 1] =
                        _mm512_dpbusd_epi32(dot[r][j & 1], x, _mm512_set1_epi32(int(load_u32(w[r][b].qs + 4 * j))));
            }
            const __m512 dx = _mm512_loadu_ps(pb + 8 * kSliceBytes);
            for (int r = 0; r < R; ++r)
                acc[r][k] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(prep[r][b].dw), dx),
                                            _mm512_cvtepi32_ps(_mm512_add_epi32(dot[r][0], dot[r][1])), acc[r][k]);
        }
    }
    for (int r = 0; r < R; ++r)
        out[r] = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][2]), _mm512_add_ps(acc[r][1], acc[r][3]));
}

template <int R>
DS4_VNNI512 void rows_group(const uint8_t *w, size_t w_stride, int64_t r0, const RowPrep *prep, const uint8_t *panel,
                            int64_t nb, int nc, float *out, size_t out_col_stride, const uint8_t *pf = nullptr,
                            const uint8_t *pf_end = nullptr) {
    const BlockQ8_0 *wr[R];
    const RowPrep *pr[R];
    for (int r = 0; r < R; ++r) {
        wr[r] = reinterpret_cast<const BlockQ8_0 *>(w + size_t(r0 + r) * w_stride);
        pr[r] = prep + (r0 + r) * nb;
    }
    __m512 res[R];
    rows_x16<R>(wr, pr, panel, nb, pf, pf_end, res);
    for (int r = 0; r < R; ++r) {
        alignas(64) float v[kPackCols];
        _mm512_store_ps(v, res[r]);
        for (int c = 0; c < nc; ++c) out[size_t(c) * out_col_stride + size_t(r0 + r)] = v[c];
    }
}

}  // namespace

uint64_t q8_0_pack_group_bytes(int64_t n) { return uint64_t(n / kQK8_0) * uint64_t(kGroupBlockBytes); }

void q8_0_pack_group(const void *x, size_t x_row_stride, int nc, int64_t n, uint8_t *dst) {
    const int64_t nb = n / kQK8_0;
    for (int64_t b = 0; b < nb; ++b) {
        uint8_t *pb = dst + b * kGroupBlockBytes;
        uint32_t slices[8 * kPackCols];
        float dx[kPackCols];
        for (int c = 0; c < kPackCols; ++c) {
            if (c < nc) {
                const BlockQ8_0 &blk = reinterpret_cast<const BlockQ8_0 *>(static_cast<const uint8_t *>(x) +
                                                                           size_t(c) * x_row_stride)[b];
                for (int j = 0; j < 8; ++j) slices[j * kPackCols + c] = load_u32(blk.qs + 4 * j) ^ 0x80808080u;
                dx[c] = f16_to_f32_fast(blk.d);
            } else {   // a missing column: x = 0 and scale 0, so its (unused) results are 0
                for (int j = 0; j < 8; ++j) slices[j * kPackCols + c] = 0x80808080u;
                dx[c] = 0;
            }
        }
        std::memcpy(pb, slices, sizeof slices);
        std::memcpy(pb + 8 * kSliceBytes, dx, sizeof dx);
    }
}

void q8_0_tile_packed(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *packed, int64_t n_cols,
                      int64_t n, float *out, size_t out_col_stride) {
    const int64_t nb = n / kQK8_0;
    thread_local std::vector<RowPrep> prep;
    if (prep.size() < size_t(n_rows * nb)) prep.resize(size_t(n_rows * nb));
    const uint64_t group_bytes = q8_0_pack_group_bytes(n);
    for (int64_t c0 = 0; c0 < n_cols; c0 += kPackCols) {
        const uint8_t *panel = packed + uint64_t(c0 / kPackCols) * group_bytes;
        const int nc = int(std::min<int64_t>(kPackCols, n_cols - c0));
        float *o = out + size_t(c0) * out_col_stride;
        // The first group works out each row's corrections just before using it, so the
        // first pass over the weights (from memory) overlaps the products.
        const bool first = c0 == 0;
        int64_t r = 0;
        for (; r + 4 <= n_rows; r += 4) {
            const uint8_t *pf = nullptr, *pf_end = nullptr;
            if (first) {
                prep_rows(w + size_t(r) * w_row_stride, w_row_stride, 4, nb, prep.data() + r * nb);
                pf = w + size_t(r + 4) * w_row_stride;
                pf_end = w + size_t(std::min<int64_t>(r + 8, n_rows)) * w_row_stride;
            }
            rows_group<4>(w, w_row_stride, r, prep.data(), panel, nb, nc, o, out_col_stride, pf, pf_end);
        }
        if (first && r < n_rows) prep_rows(w + size_t(r) * w_row_stride, w_row_stride, n_rows - r, nb, prep.data() + r * nb);
        switch (n_rows - r) {
            case 3: rows_group<3>(w, w_row_stride, r, prep.data(), panel, nb, nc, o, out_col_stride); break;
            case 2: rows_group<2>(w, w_row_stride, r, prep.data(), panel, nb, nc, o, out_col_stride); break;
            case 1: rows_group<1>(w, w_row_stride, r, prep.data(), panel, nb, nc, o, out_col_stride); break;
            default: break;
        }
    }
}

}  // namespace ds4::quant::detail
