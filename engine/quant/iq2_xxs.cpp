// IQ2_XXS: 256 elements, f16 d; per 32: four 8-element grid points (magnitudes from a
// 256-entry codebook), 4 x 7 sign bits (8th implied by even parity) and a 4-bit scale.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/quant/blocks.h"
#include "engine/quant/half.h"
#include "engine/quant/iq2xxs_tables.h"
#include "engine/quant/kernels.h"
#include "engine/quant/kquant_fit.h"
#include "engine/quant/simd.h"

namespace ds4::quant::detail {
namespace {

// Sign patterns as byte multipliers (+1 = 0x01, -1 = 0xff) for _mm256_sign_epi8.
struct SignMasks {
    uint64_t v[128];
    constexpr SignMasks() : v() {
        for (uint32_t i = 0; i < 128; ++i) {
            const uint8_t s = iq2_signs_from7(i);
            uint64_t m = 0;
            for (int j = 0; j < 8; ++j) m |= uint64_t((s >> j) & 1 ? 0xff : 0x01) << (8 * j);
            v[i] = m;
        }
    }
};
alignas(64) constexpr SignMasks kSignMasks;

// Codebook transposed to floats for the quantizer's search: g[j][k] = magnitude of
// element j in entry k; gg[k] = |entry k|^2.
struct GridF {
    float g[8][256];
    float gg[256];
    GridF() {
        for (int k = 0; k < 256; ++k) {
            gg[k] = 0;
            for (int j = 0; j < 8; ++j) {
                g[j][k] = float(uint8_t(kIq2xxsGrid[k] >> (8 * j)));
                gg[k] += g[j][k] * g[j][k];
            }
        }
    }
};
const GridF &grid_f() {
    static const GridF g;
    return g;
}

// One group of 8: sign-folded targets and their correlation with every grid entry.
struct Group8 {
    float ag[256];
    uint8_t s7;
};

void prepare_group(const float *x, Group8 *g) {
    const GridF &G = grid_f();
    float a[8];
    uint32_t neg = 0;
    int jmin = 0;
    for (int j = 0; j < 8; ++j) {
        a[j] = std::fabs(x[j]);
        if (x[j] < 0) neg |= 1u << j;
        if (a[j] < a[jmin]) jmin = j;
    }
    if (__builtin_popcount(neg) & 1) {
        // odd count of negatives is not encodable: flip the smallest value's sign
        neg ^= 1u << jmin;
        a[jmin] = -a[jmin];
    }
    g->s7 = uint8_t(neg & 127);
    for (int k = 0; k < 256; ++k) g->ag[k] = 0;
    for (int j = 0; j < 8; ++j)
        for (int k = 0; k < 256; ++k) g->ag[k] += a[j] * G.g[j][k];
}

// Best entry for a group at scale s (> 0): minimises s^2*gg - 2*s*ag. Returns the error
// term (without the constant sum of squares) and the index.
inline float best_entry(const Group8 &g, float s, int *idx) {
    const GridF &G = grid_f();
    float best = G.gg[0] * s - 2 * g.ag[0];
    int bi = 0;
    for (int k = 1; k < 256; ++k) {
        const float e = G.gg[k] * s - 2 * g.ag[k];
        if (e < best) {
            best = e;
            bi = k;
        }
    }
    *idx = bi;
    return best * s;
}

float group32_error(const Group8 *g, float s, int *idx) {
    float e = 0;
    for (int l = 0; l < 4; ++l) e += best_entry(g[l], s, &idx[l]);
    return e;
}

// Continuous scale for a 32-group: coarse search, then alternate least-squares refits.
float fit_group32(const Group8 *g, float amax) {
    const GridF &G = grid_f();
    float best_s = 0, best_e = 0;
    int idx[4];
    for (int c = 0; c < 20; ++c) {
        // amax lands on grid value 7..48 (the grid's levels are 8, 25, 43)
        const float s = amax / (7.f * std::pow(48.f / 7.f, c / 19.f));
        const float e = group32_error(g, s, idx);
        if (c == 0 || e < best_e) {
            best_e = e;
            best_s = s;
        }
    }
    for (int it = 0; it < 3; ++it) {
        group32_error(g, best_s, idx);
        double num = 0, den = 0;
        for (int l = 0; l < 4; ++l) {
            num += g[l].ag[idx[l]];
            den += G.gg[idx[l]];
        }
        if (!(num > 0)) break;
        const float s = float(num / den);
        const float e = group32_error(g, s, idx);
        if (!(e < best_e)) break;
        best_e = e;
        best_s = s;
    }
    return best_s;
}

}  // namespace

// No importance matrix: plain squared error. Sign parity is fixed by flipping the
// smallest magnitude in each group of 8; the grid search is exhaustive per group.
void quant_iq2_xxs(const float *src, void *dst, int64_t n) {
    BlockIQ2_XXS *y = static_cast<BlockIQ2_XXS *>(dst);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        float x[kQK_K], s32[8];
        Group8 groups[32];
        sanitize(src + b * kQK_K, x, kQK_K);
        std::memset(&y[b], 0, sizeof(BlockIQ2_XXS));
        float smax = 0;
        for (int ib = 0; ib < 8; ++ib) {
            float amax = 0;
            for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[32 * ib + i]));
            for (int l = 0; l < 4; ++l) prepare_group(x + 32 * ib + 8 * l, &groups[4 * ib + l]);
            s32[ib] = amax > 0 ? fit_group32(groups + 4 * ib, amax) : 0.f;
            smax = std::max(smax, s32[ib]);
        }
        if (!(smax > 0)) continue;
        // the largest group scale gets the top 4-bit level: s = d * (2*15 + 1) / 8
        y[b].d = f32_to_f16_fast(std::min(smax * 8.f / 31.f, 65504.f));
        const float d = f16_to_f32_fast(y[b].d);
        if (!(d > 0)) {
            y[b].d = 0;
            continue;
        }
        for (int ib = 0; ib < 8; ++ib) {
            const int ls0 = std::clamp(nearest_int((8.f * s32[ib] / d - 1.f) / 2.f), 0, 15);
            int best_ls = ls0, best_idx[4] = {0, 0, 0, 0};
            float best_e = 0;
            bool first = true;
            for (int ls = std::max(0, ls0 - 1); ls <= std::min(15, ls0 + 1); ++ls) {
                int idx[4];
                const float e = group32_error(groups + 4 * ib, d * float(2 * ls + 1) / 8.f, idx);
                if (first || e < best_e) {
                    first = false;
                    best_e = e;
                    best_ls = ls;
                    std::copy(idx, idx + 4, best_idx);
                }
            }
            uint32_t aux[2] = {0, uint32_t(best_ls) << 28};
            for (int l = 0; l < 4; ++l) {
                aux[0] |= uint32_t(best_idx[l]) << (8 * l);
                aux[1] |= uint32_t(groups[4 * ib + l].s7) << (7 * l);
            }
            std::memcpy(y[b].qs + 4 * ib, aux, 8);
        }
    }
}

void dequant_iq2_xxs(const void *src, float *dst, int64_t n) {
    const BlockIQ2_XXS *x = static_cast<const BlockIQ2_XXS *>(src);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float d = f16_to_f32_fast(x[b].d);
        float *y = dst + b * kQK_K;
        for (int ib = 0; ib < 8; ++ib) {
            uint32_t aux[2];
            std::memcpy(aux, x[b].qs + 4 * ib, 8);
            const float db = d * (0.5f + float(aux[1] >> 28)) * 0.25f;
            for (int l = 0; l < 4; ++l) {
                const uint64_t g = kIq2xxsGrid[(aux[0] >> (8 * l)) & 255];
                const uint8_t s = iq2_signs_from7((aux[1] >> (7 * l)) & 127);
                for (int j = 0; j < 8; ++j)
                    y[j] = db * float(uint8_t(g >> (8 * j))) * ((s >> j) & 1 ? -1.f : 1.f);
                y += 8;
            }
        }
    }
}

namespace {

template <int R>
void rows_iq2_xxs_r(const uint8_t *w, size_t stride, const BlockQ8_K *x, int64_t nb, float *out) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    const uint64_t *grid = kIq2xxsGrid;
    const uint64_t *sm = kSignMasks.v;
    for (int64_t b = 0; b < nb; ++b) {
        const BlockQ8_K &xb = x[b];
        for (int r = 0; r < R; ++r) {
            const BlockIQ2_XXS *wb = reinterpret_cast<const BlockIQ2_XXS *>(w + r * stride) + b;
            __m256i sumi = _mm256_setzero_si256();
            for (int ib = 0; ib < 8; ++ib) {
                uint32_t a[2];
                std::memcpy(a, wb->qs + 4 * ib, 8);
                const __m256i g = _mm256_set_epi64x(int64_t(grid[a[0] >> 24]), int64_t(grid[(a[0] >> 16) & 255]),
                                                    int64_t(grid[(a[0] >> 8) & 255]), int64_t(grid[a[0] & 255]));
                const __m256i s = _mm256_set_epi64x(int64_t(sm[(a[1] >> 21) & 127]), int64_t(sm[(a[1] >> 14) & 127]),
                                                    int64_t(sm[(a[1] >> 7) & 127]), int64_t(sm[a[1] & 127]));
                const __m256i xs = _mm256_sign_epi8(simd::loadu(xb.qs + 32 * ib), s);
                const __m256i p = _mm256_maddubs_epi16(g, xs);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_set1_epi16(int16_t(2 * (a[1] >> 28) + 1))));
            }
            const float d = 0.125f * xb.d * f16_to_f32_fast(wb->d);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc[r]);
        }
    }
    for (int r = 0; r < R; ++r) out[r] = simd::hsum(acc[r]);
}

}  // namespace

void rows_iq2_xxs(const uint8_t *w, size_t stride, int64_t nrows, const void *xv, int64_t n, float *out) {
    const BlockQ8_K *x = static_cast<const BlockQ8_K *>(xv);
    const int64_t nb = n / kQK_K;
    int64_t r = 0;
    for (; r + 4 <= nrows; r += 4) rows_iq2_xxs_r<4>(w + r * stride, stride, x, nb, out + r);
    for (; r < nrows; ++r) rows_iq2_xxs_r<1>(w + r * stride, stride, x, nb, out + r);
}

}  // namespace ds4::quant::detail
