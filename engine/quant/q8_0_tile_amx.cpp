// Q8_0 products against many activation rows on AMX (Intel Xeon from Sapphire Rapids on).
// One TDPBSSD multiplies a tile of 16 weight rows x one block's 32 bytes, loaded straight
// from the weight matrix at its row stride, by one block of the wide panel (its 8 slices x
// 16 columns are the B tile's layout as they stand), and leaves the 16 x 16 exact integer
// block dots: 8192 multiply-adds where vpdpbusd does 64. Signed by signed, so the panel is
// stored as it is (q8_0_panel_offset() is false here) and no correction is needed.
//
// The float steps stay those of dot_q8_0, lane for lane (lanes are columns, a register a
// row), so every result is bit-identical to vec_dot. Their four chains (block b feeds chain
// b % 4) are walked one at a time, blocks k, k + 4, ... in order, so one chain of 16 rows
// lives in registers; two blocks of a chain are in the tile unit at once.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "engine/quant/blocks.h"
#include "engine/quant/cache_aligned.h"
#include "engine/quant/half.h"
#include "engine/quant/kernels.h"
#include "engine/quant/q8_0_panel.h"

namespace ds4::quant::detail {

#define DS4_AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq")))
// GCC 12 warns about the undefined pass-through operand inside its AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace {

constexpr int kTileRows = 16;

// The tile registers: C (16 x 16 int32) in tmm0 / tmm3, A (16 rows x 32 bytes) in tmm1 /
// tmm4, B (8 slices x 64 bytes) in tmm2 / tmm5: two blocks in flight.
struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

DS4_AMX void configure() {
    TileConfig cfg;
    for (int t : {0, 3}) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    for (int t : {1, 4}) cfg.rows[t] = 16, cfg.colsb[t] = 32;
    for (int t : {2, 5}) cfg.rows[t] = 8, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
}

// 16 weight rows (w, stride; rows past the matrix are a zero-padded copy) against one group
// of 16 columns (group, nb blocks); dwf: the rows' scales as f32, [block][row]. res[r], lane
// c: row r, column c.
DS4_AMX void rows16(const uint8_t *w, size_t stride, const float *dwf, const uint8_t *group, int64_t nb, __m512 *res) {
    alignas(64) int32_t c0[16][16], c1[16][16];
    alignas(64) __m512 ch[4][16];
    for (int k = 0; k < 4; ++k) {
        __m512 acc[16];
        for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
        auto fold = [&](const int32_t (*c)[16], int64_t b) DS4_AMX {
            const __m512 dx = _mm512_loadu_ps(group + b * kGroupBlockBytes + kScaleOff);
            for (int r = 0; r < 16; ++r)
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(dwf[b * 16 + r]), dx),
                                         _mm512_cvtepi32_ps(_mm512_load_si512(c[r])), acc[r]);
        };
        int64_t b = k;
        for (; b + 4 < nb; b += 8) {
            _tile_zero(0);
            _tile_zero(3);
            _tile_loadd(1, w + b * sizeof(BlockQ8_0) + 2, stride);
            _tile_loadd(2, group + b * kGroupBlockBytes, kSliceBytes);
            _tile_loadd(4, w + (b + 4) * sizeof(BlockQ8_0) + 2, stride);
            _tile_loadd(5, group + (b + 4) * kGroupBlockBytes, kSliceBytes);
            _tile_dpbssd(0, 1, 2);
            _tile_dpbssd(3, 4, 5);
            _tile_stored(0, c0, 64);
            _tile_stored(3, c1, 64);
            fold(c0, b);
            fold(c1, b + 4);
        }
        if (b < nb) {
            _tile_zero(0);
            _tile_loadd(1, w + b * sizeof(BlockQ8_0) + 2, stride);
            _tile_loadd(2, group + b * kGroupBlockBytes, kSliceBytes);
            _tile_dpbssd(0, 1, 2);
            _tile_stored(0, c0, 64);
            fold(c0, b);
        }
        for (int r = 0; r < 16; ++r) ch[k][r] = acc[r];
    }
    for (int r = 0; r < 16; ++r)   // dot_q8_0's (a0 + a2) + (a1 + a3)
        res[r] = _mm512_add_ps(_mm512_add_ps(ch[0][r], ch[2][r]), _mm512_add_ps(ch[1][r], ch[3][r]));
}

}  // namespace

// XTILEDATA must be granted to the process (Linux 5.16+) before any tile instruction.
bool amx_available() {
    static const bool ok = [] {
        if (!__builtin_cpu_supports("avx512f")) return false;
        unsigned a, b, c, d;
        __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
        if (!((d >> 24) & 1) || !((d >> 25) & 1)) return false;   // AMX-TILE, AMX-INT8
        constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
        return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
    }();
    return ok;
}

DS4_AMX void q8_0_tile_wide_amx(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *panel,
                                int64_t n_cols, int64_t nb, float *out, size_t out_col_stride) {
    configure();
    const uint64_t group_bytes = uint64_t(nb) * kGroupBlockBytes;
    const size_t row_bytes = size_t(nb) * sizeof(BlockQ8_0);
    thread_local CacheAlignedVector<float> dwf;
    thread_local CacheAlignedVector<uint8_t> pad;   // a last tile of fewer than 16 rows, zero-filled
    if (dwf.size() < size_t(nb) * 16) dwf.resize(size_t(nb) * 16);
    for (int64_t r0 = 0; r0 < n_rows; r0 += kTileRows) {
        const int m = int(std::min<int64_t>(kTileRows, n_rows - r0));
        const uint8_t *wt = w + size_t(r0) * w_row_stride;
        size_t stride = w_row_stride;
        if (m < kTileRows) {
            if (pad.size() < 16 * row_bytes) pad.resize(16 * row_bytes);
            std::memset(pad.data(), 0, 16 * row_bytes);
            for (int r = 0; r < m; ++r) std::memcpy(pad.data() + size_t(r) * row_bytes, wt + size_t(r) * w_row_stride, row_bytes);
            wt = pad.data();
            stride = row_bytes;
        }
        for (int r = 0; r < kTileRows; ++r) {
            const BlockQ8_0 *row = reinterpret_cast<const BlockQ8_0 *>(wt + size_t(r) * stride);
            for (int64_t b = 0; b < nb; ++b) dwf[size_t(b) * 16 + size_t(r)] = f16_to_f32_fast(row[b].d);
        }
        for (int64_t c0 = 0; c0 < n_cols; c0 += kPackCols) {
            alignas(64) __m512 res[16];
            rows16(wt, stride, dwf.data(), panel + uint64_t(c0 / kPackCols) * group_bytes, nb, res);
            alignas(64) float t[16][16];
            for (int r = 0; r < 16; ++r) _mm512_store_ps(t[r], res[r]);
            const int nc = int(std::min<int64_t>(kPackCols, n_cols - c0));
            for (int c = 0; c < nc; ++c)
                for (int r = 0; r < m; ++r) out[size_t(c0 + c) * out_col_stride + size_t(r0 + r)] = t[r][c];
        }
    }
    _tile_release();
}

}  // namespace ds4::quant::detail
