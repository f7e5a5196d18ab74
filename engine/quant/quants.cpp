// Type dispatch for the public quant API: validates arguments, then calls the per-format
// kernels in kernels.h.
#include "engine/quant/quants.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/common/error.h"
#include "engine/quant/blocks.h"
#include "engine/quant/half.h"
#include "engine/quant/kernels.h"

namespace ds4::quant {
namespace {

using DequantFn = void (*)(const void *, float *, int64_t);
using QuantFn = void (*)(const float *, void *, int64_t);

struct Format {
    const char *name;
    int64_t qk;      // elements per block
    int64_t bytes;   // bytes per block
    Type dot_type;   // activation format for vec_dot
    DequantFn dequant;
    QuantFn quant;
    detail::DotFn dot;   // one weight row x up to max_cols() (else kMaxCols) activation rows
    detail::TileColsFn tile_cols = nullptr;   // many weight rows x the same: vec_dot_tile, where it has one
    detail::RowsFn rows = nullptr;            // many weight rows x one: vec_dot_rows, where it has one
    int (*max_cols)() = nullptr;              // the dot's column limit on this CPU, where not kMaxCols
};

void dequant_f32(const void *src, float *dst, int64_t n) { std::memcpy(dst, src, size_t(n) * 4); }
void quant_f32(const float *src, void *dst, int64_t n) { std::memcpy(dst, src, size_t(n) * 4); }

const Format *format_of(Type t) {
    static const Format kF32{"f32", 1, 4, Type::F32, dequant_f32, quant_f32, detail::dot_f32, nullptr, detail::rows_f32};
    static const Format kF16{"f16", 1, 2, Type::F32, detail::dequant_f16, detail::quant_f16, detail::dot_f16};
    static const Format kBF16{"bf16", 1, 2, Type::F32, detail::dequant_bf16, detail::quant_bf16, detail::dot_bf16};
    static const Format kQ8_0{"q8_0", kQK8_0, sizeof(BlockQ8_0), Type::Q8_0, detail::dequant_q8_0, detail::quant_q8_0,
                              detail::dot_q8_0, detail::q8_0_tile_cols, detail::rows_q8_0};
    static const Format kQ8_K{"q8_K", kQK_K, sizeof(BlockQ8_K), Type::Q8_K, detail::dequant_q8_k, detail::quant_q8_k,
                              nullptr};
    static const Format kQ2_K{"q2_K", kQK_K, sizeof(BlockQ2_K), Type::Q8_K, detail::dequant_q2_k, detail::quant_q2_k,
                              detail::dot_q2_k, nullptr, detail::rows_q2_k};
    static const Format kQ4_K{"q4_K", kQK_K, sizeof(BlockQ4_K), Type::Q8_K, detail::dequant_q4_k, detail::quant_q4_k,
                              detail::dot_q4_k, detail::q4_k_tile_cols, detail::rows_q4_k};
    static const Format kIQ2_XXS{"iq2_xxs", kQK_K, sizeof(BlockIQ2_XXS), Type::Q8_K, detail::dequant_iq2_xxs,
                                 detail::quant_iq2_xxs, detail::dot_iq2_xxs, nullptr, nullptr, detail::iq2_xxs_max_cols};
    switch (t) {
        case Type::F32: return &kF32;
        case Type::F16: return &kF16;
        case Type::BF16: return &kBF16;
        case Type::Q8_0: return &kQ8_0;
        case Type::Q8_K: return &kQ8_K;
        case Type::Q2_K: return &kQ2_K;
        case Type::Q4_K: return &kQ4_K;
        case Type::IQ2_XXS: return &kIQ2_XXS;
        default: return nullptr;
    }
}

const Format &need(Type t, int64_t n, const char *what) {
    const Format *f = format_of(t);
    if (!f) failf("quant: %s: tensor type %u is not supported", what, unsigned(t));
    if (n < 0 || n % f->qk != 0)
        failf("quant: %s: row length %lld is not a multiple of the %s block size %lld", what, (long long)n, f->name,
              (long long)f->qk);
    return *f;
}

}  // namespace

namespace detail {
bool &avx512_enabled() {
    static bool on = [] {
        if (const char *e = std::getenv("DS4_NO_AVX512"); e && *e && *e != '0') return false;
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    }();
    return on;
}
bool vnni_available() { return avx512_enabled() && __builtin_cpu_supports("avx512vnni"); }
bool &vnni_enabled() {
    static bool on = [] {
        if (const char *e = std::getenv("DS4_NO_VNNI"); e && *e && *e != '0') return false;
        return vnni_available();
    }();
    return on;
}
int64_t &q8_0_rows_tile_max() {
    static int64_t cols = [] {
        if (const char *e = std::getenv("DS4_Q8_ROWS_TILE_MAX"); e && *e) return int64_t(std::atoll(e));
        return kQ8RowsTileMaxCols;
    }();
    return cols;
}
bool avxvnni_available() { return __builtin_cpu_supports("avxvnni"); }
bool &avxvnni_enabled() {
    static bool on = [] {
        if (const char *e = std::getenv("DS4_NO_AVXVNNI"); e && *e && *e != '0') return false;
        return avxvnni_available();
    }();
    return on;
}
}  // namespace detail

void dequantize_row(Type t, const void *src, float *dst, int64_t n) {
    const Format &f = need(t, n, "dequantize_row");
    f.dequant(src, dst, n);
}

void quantize_row(Type t, const float *src, void *dst, int64_t n) {
    const Format &f = need(t, n, "quantize_row");
    if (!f.quant) failf("quant: quantize_row: no quantizer for %s", f.name);
    f.quant(src, dst, n);
}

Type vec_dot_type(Type weight_type) {
    const Format *f = format_of(weight_type);
    if (!f || !f->dot) failf("quant: vec_dot_type: no dot product for tensor type %u", unsigned(weight_type));
    return f->dot_type;
}

uint64_t vec_dot_row_bytes(Type weight_type, int64_t n) {
    const Format &a = need(vec_dot_type(weight_type), n, "vec_dot_row_bytes");
    need(weight_type, n, "vec_dot_row_bytes");
    return uint64_t(n / a.qk) * uint64_t(a.bytes);
}

void quantize_activation(Type weight_type, const float *x, void *dst, int64_t n) {
    need(weight_type, n, "quantize_activation");
    const Format &a = need(vec_dot_type(weight_type), n, "quantize_activation");
    a.quant(x, dst, n);
}

float vec_dot(Type t, const void *w, const void *x, int64_t n) {
    const Format &f = need(t, n, "vec_dot");
    if (!f.dot) failf("quant: vec_dot: no dot product for %s", f.name);
    float out;
    f.dot(static_cast<const uint8_t *>(w), &x, 1, n, &out);
    return out;
}

void vec_dot_rows(Type t, const void *w, size_t w_row_stride, int64_t n_rows, const void *x, int64_t n, float *out) {
    const Format &f = need(t, n, "vec_dot_rows");
    if (!f.dot) failf("quant: vec_dot_rows: no dot product for %s", f.name);
    if (n_rows < 0) failf("quant: vec_dot_rows: negative row count %lld", (long long)n_rows);
    if (n_rows > 1 && w_row_stride < uint64_t(n / f.qk) * uint64_t(f.bytes))
        failf("quant: vec_dot_rows: row stride %zu is smaller than a %s row of %lld elements", w_row_stride, f.name,
              (long long)n);
    const uint8_t *wp = static_cast<const uint8_t *>(w);
    if (f.rows) {
        f.rows(wp, w_row_stride, n_rows, x, n, out);
        return;
    }
    for (int64_t r = 0; r < n_rows; ++r) f.dot(wp + size_t(r) * w_row_stride, &x, 1, n, out + r);
}

void vec_dot_tile(Type t, const void *w, size_t w_row_stride, int64_t n_rows, const void *x, size_t x_row_stride,
                  int64_t n_cols, int64_t n, float *out, size_t out_col_stride) {
    const Format &f = need(t, n, "vec_dot_tile");
    if (!f.dot) failf("quant: vec_dot_tile: no dot product for %s", f.name);
    if (n_rows < 0 || n_cols < 0) failf("quant: vec_dot_tile: negative size %lld x %lld", (long long)n_rows, (long long)n_cols);
    const uint64_t wrow = uint64_t(n / f.qk) * uint64_t(f.bytes);
    if (n_rows > 1 && w_row_stride < wrow)
        failf("quant: vec_dot_tile: weight row stride %zu is smaller than a %s row of %lld elements", w_row_stride,
              f.name, (long long)n);
    if (n_cols > 1 && x_row_stride < vec_dot_row_bytes(t, n))
        failf("quant: vec_dot_tile: activation row stride %zu is smaller than an activation row (%llu bytes)",
              x_row_stride, (unsigned long long)vec_dot_row_bytes(t, n));
    if (n_cols > 1 && out_col_stride < uint64_t(n_rows))
        failf("quant: vec_dot_tile: output column stride %zu is smaller than the row count %lld", out_col_stride,
              (long long)n_rows);
    const uint8_t *wp = static_cast<const uint8_t *>(w);
    const uint8_t *xp = static_cast<const uint8_t *>(x);
    // Plain types: the chunked tile (the same bits; dot_plain over four columns keeps 16
    // chains in AVX2's 16 registers and spills).
    if (f.dot_type == Type::F32) {
        detail::plain_tile(uint32_t(t), wp, w_row_stride, n_rows, xp, x_row_stride, n_cols, n, out, out_col_stride);
        return;
    }
    // Column groups outer: a group's activations stay in L1 while the weight rows stream
    // past (from L2 when the caller's row block fits there).
    const int group = f.max_cols ? f.max_cols() : detail::kMaxCols;
    for (int64_t c0 = 0; c0 < n_cols; c0 += group) {
        const int nc = int(std::min<int64_t>(group, n_cols - c0));
        const void *xs[detail::kWideCols];
        for (int c = 0; c < nc; ++c) xs[c] = xp + size_t(c0 + c) * x_row_stride;
        if (f.tile_cols) {
            float *o[detail::kMaxCols];
            for (int c = 0; c < nc; ++c) o[c] = out + size_t(c0 + c) * out_col_stride;
            f.tile_cols(wp, w_row_stride, n_rows, xs, nc, n, o);
            continue;
        }
        for (int64_t r = 0; r < n_rows; ++r) {
            float res[detail::kWideCols];
            f.dot(wp + size_t(r) * w_row_stride, xs, nc, n, res);
            for (int c = 0; c < nc; ++c) out[size_t(c0 + c) * out_col_stride + size_t(r)] = res[c];
        }
    }
}

const char *q8_0_tile_isa() {
    return detail::vnni_enabled() ? "avx512-vnni" : detail::avxvnni_enabled() ? "avx-vnni" : "avx2";
}

uint64_t tile_pack_bytes(Type t, int64_t n, int64_t n_cols) {
    if (t == Type::Q8_0 && n_cols >= (detail::vnni_enabled()      ? kTilePackMinCols
                                      : detail::avxvnni_enabled() ? kTilePackMinColsAvxVnni
                                                                  : kTilePackMinColsAvx2)) {
        need(t, n, "tile_pack_bytes");
        return detail::q8_0_pack_bytes(n, n_cols);
    }
    if (t == Type::IQ2_XXS && n_cols >= 1 && detail::avx512_enabled() && detail::vbmi_enabled()) {
        need(t, n, "tile_pack_bytes");
        return detail::iq2_xxs_pack_bytes(n, n_cols);
    }
    return 0;
}

bool tile_streams_rows(Type t, int64_t n_cols) { return t == Type::Q8_0 && detail::q8_0_rows_layout(n_cols); }

int64_t tile_pack_groups(Type t, int64_t n_cols) {
    return t == Type::IQ2_XXS ? n_cols : detail::q8_0_pack_groups(n_cols);
}

void tile_pack(Type t, const void *x, size_t x_row_stride, int64_t n_cols, int64_t n, int64_t g0, int64_t g1,
               void *packed) {
    if (tile_pack_bytes(t, n, n_cols) == 0)
        failf("quant: tile_pack: no packed tile for %u with %lld columns on this CPU", unsigned(t), (long long)n_cols);
    if (g0 < 0 || g1 > tile_pack_groups(t, n_cols) || g0 > g1)
        failf("quant: tile_pack: groups [%lld, %lld) out of range", (long long)g0, (long long)g1);
    if (n_cols > 1 && x_row_stride < vec_dot_row_bytes(t, n))
        failf("quant: tile_pack: activation row stride %zu is smaller than an activation row (%llu bytes)",
              x_row_stride, (unsigned long long)vec_dot_row_bytes(t, n));
    if (t == Type::IQ2_XXS)
        detail::iq2_xxs_pack(x, x_row_stride, n, g0, g1, static_cast<uint8_t *>(packed));
    else
        detail::q8_0_pack(x, x_row_stride, n_cols, n, g0, g1, static_cast<uint8_t *>(packed));
}

void vec_dot_tile_packed(Type t, const void *w, size_t w_row_stride, int64_t n_rows, const void *packed,
                         int64_t n_cols, int64_t n, float *out, size_t out_col_stride) {
    if (tile_pack_bytes(t, n, n_cols) == 0)
        failf("quant: vec_dot_tile_packed: no packed tile for %u with %lld columns on this CPU", unsigned(t),
              (long long)n_cols);
    if (n_rows < 0) failf("quant: vec_dot_tile_packed: negative row count %lld", (long long)n_rows);
    const Format &f = need(t, n, "vec_dot_tile_packed");
    if (n_rows > 1 && w_row_stride < uint64_t(n / f.qk) * uint64_t(f.bytes))
        failf("quant: vec_dot_tile_packed: weight row stride %zu is smaller than a %s row of %lld elements",
              w_row_stride, f.name, (long long)n);
    if (n_cols > 1 && out_col_stride < uint64_t(n_rows))
        failf("quant: vec_dot_tile_packed: output column stride %zu is smaller than the row count %lld",
              out_col_stride, (long long)n_rows);
    const uint8_t *wp = static_cast<const uint8_t *>(w), *pp = static_cast<const uint8_t *>(packed);
    if (t == Type::IQ2_XXS)
        detail::iq2_xxs_tile_packed(wp, w_row_stride, n_rows, pp, n_cols, n, out, out_col_stride);
    else
        detail::q8_0_tile_packed(wp, w_row_stride, n_rows, pp, n_cols, n, out, out_col_stride);
}

void dequantize_row_ref(Type t, const void *src, float *dst, int64_t n) {
    need(t, n, "dequantize_row_ref");
    detail::dequant_ref(uint32_t(t), src, dst, n);
}

float vec_dot_ref(Type t, const void *w, const void *x, int64_t n) {
    const Format &f = need(t, n, "vec_dot_ref");
    if (!f.dot) failf("quant: vec_dot_ref: no dot product for %s", f.name);
    std::vector<float> wf(static_cast<size_t>(n)), xf(static_cast<size_t>(n));
    detail::dequant_ref(uint32_t(t), w, wf.data(), n);
    detail::dequant_ref(uint32_t(f.dot_type), x, xf.data(), n);
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += double(wf[size_t(i)]) * double(xf[size_t(i)]);
    return float(s);
}

float f16_to_f32(uint16_t h) { return f16_to_f32_fast(h); }
uint16_t f32_to_f16(float f) { return f32_to_f16_fast(f); }
float bf16_to_f32(uint16_t h) { return bf16_to_f32_inline(h); }
uint16_t f32_to_bf16(float f) { return f32_to_bf16_inline(f); }

}  // namespace ds4::quant
