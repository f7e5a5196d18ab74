// Dot kernels against dequantise-then-dot, fast decoders against the scalar references,
// and the multi-row helper against single-row dots.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "engine/common/error.h"
#include "engine/quant/kernels.h"
#include "quant_test_util.h"
#include "tests/common/switch_guard.h"

using namespace qtest;
using ds4::quant::Type;
namespace q = ds4::quant;

namespace {

const char *name(Type t) {
    switch (t) {
        case Type::F32: return "F32"; case Type::F16: return "F16"; case Type::BF16: return "BF16";
        case Type::Q8_0: return "Q8_0"; case Type::Q2_K: return "Q2_K"; case Type::Q4_K: return "Q4_K";
        case Type::IQ2_XXS: return "IQ2_XXS"; default: return "?";
    }
}
const char *name(Scale s) {
    switch (s) {
        case Scale::Normal: return "normal"; case Scale::Tiny: return "tiny"; case Scale::Huge: return "huge";
        case Scale::Zero: return "zero"; case Scale::Negative: return "negative"; case Scale::Mixed: return "mixed";
    }
    return "?";
}

// For K formats, the per-element offset term (-dmin * m) decoded on its own by zeroing
// the quants; the dot's rounding error scales with |scale term| + |offset term|.
std::vector<float> offset_terms(Type t, const uint8_t *row, int64_t n) {
    std::vector<float> out(static_cast<size_t>(n), 0.f);
    if (t != Type::Q2_K && t != Type::Q4_K) return out;
    std::vector<uint8_t> copy(row, row + row_size(t, n));
    for (int64_t b = 0; b < n / 256; ++b) {
        uint8_t *p = copy.data() + b * block_bytes(t);
        std::memset(p + 16, 0, t == Type::Q2_K ? 64 : 128);
    }
    q::dequantize_row_ref(t, copy.data(), out.data(), n);
    return out;
}

struct DotCase {
    Type t;
    Scale s;
    float xmag;
};

void check_dot(const DotCase &c, int64_t n, std::mt19937 &rng) {
    SCOPED_TRACE(testing::Message() << name(c.t) << " weights " << name(c.s) << " |x|~" << c.xmag << " n=" << n);
    const auto w = random_weights(c.t, 1, n, c.s, rng);
    const auto xf = gaussian(n, c.xmag, rng);
    std::vector<uint8_t> xa(q::vec_dot_row_bytes(c.t, n));
    q::quantize_activation(c.t, xf.data(), xa.data(), n);

    std::vector<float> wd(static_cast<size_t>(n)), xd(static_cast<size_t>(n));
    q::dequantize_row_ref(c.t, w.data(), wd.data(), n);
    q::dequantize_row_ref(q::vec_dot_type(c.t), xa.data(), xd.data(), n);
    const auto off = offset_terms(c.t, w.data(), n);
    double expect = 0, bound = 0;
    for (int64_t i = 0; i < n; ++i) {
        expect += double(wd[i]) * double(xd[i]);
        bound += (std::fabs(double(wd[i]) - off[i]) + std::fabs(double(off[i]))) * std::fabs(double(xd[i]));
    }
    const float got = q::vec_dot(c.t, w.data(), xa.data(), n);
    const float ref = q::vec_dot_ref(c.t, w.data(), xa.data(), n);
    ASSERT_TRUE(std::isfinite(got));
    EXPECT_NEAR(ref, expect, 1e-6 * bound + 1e-37);
    EXPECT_NEAR(got, expect, 1e-5 * bound + 1e-37) << "bound " << bound;
    if (c.s == Scale::Zero && (c.t == Type::Q8_0 || c.t == Type::IQ2_XXS)) {
        EXPECT_EQ(got, 0.f);
    }
}

class FormatTest : public testing::TestWithParam<Type> {};

}  // namespace

TEST_P(FormatTest, DotMatchesDequantizedDot) {
    const Type t = GetParam();
    std::mt19937 rng(1234 + unsigned(t));
    const int64_t qk = block_elems(t) == 1 ? 32 : block_elems(t);
    for (Scale s : {Scale::Normal, Scale::Tiny, Scale::Huge, Scale::Zero, Scale::Negative, Scale::Mixed})
        for (float xmag : {1e-3f, 1.f, 1e3f})
            for (int64_t nblk : {1, 3, 16})
                for (int rep = 0; rep < 3; ++rep) check_dot({t, s, xmag}, qk * nblk, rng);
    if (block_elems(t) == 1)   // plain rows of any length (vector tails)
        for (int64_t n : {1, 7, 9, 17, 31, 33, 4095}) check_dot({t, Scale::Normal, 1.f}, n, rng);
}

TEST_P(FormatTest, FastDecodeEqualsReference) {
    const Type t = GetParam();
    std::mt19937 rng(99 + unsigned(t));
    const int64_t n = block_elems(t) == 1 ? 1001 : block_elems(t) * 12;
    for (Scale s : {Scale::Normal, Scale::Tiny, Scale::Huge, Scale::Negative, Scale::Mixed}) {
        const auto w = random_weights(t, 1, n, s, rng);
        std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
        q::dequantize_row(t, w.data(), a.data(), n);
        q::dequantize_row_ref(t, w.data(), b.data(), n);
        ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << name(t) << " " << name(s);
    }
}

TEST_P(FormatTest, RowsHelperEqualsSingleRowDots) {
    const Type t = GetParam();
    std::mt19937 rng(7 + unsigned(t));
    // 3 blocks: a row shorter than the kernels' steps; 9: whole steps and a tail
    for (int64_t nblk : {3, 9}) {
        const int64_t n = block_elems(t) == 1 ? 24 * nblk : block_elems(t) * nblk;
        const size_t rb = row_size(t, n), stride = rb + 48;   // padded rows
        for (int64_t nrows : {1, 2, 3, 4, 5, 8, 9, 11}) {
            const auto packed = random_weights(t, nrows, n, Scale::Mixed, rng);
            std::vector<uint8_t> w(stride * size_t(nrows), 0xAB);
            for (int64_t r = 0; r < nrows; ++r) std::memcpy(&w[r * stride], &packed[r * rb], rb);
            const auto xf = gaussian(n, 1.f, rng);
            std::vector<uint8_t> xa(q::vec_dot_row_bytes(t, n));
            q::quantize_activation(t, xf.data(), xa.data(), n);
            std::vector<float> out(size_t(nrows) + 1, -7.f);
            q::vec_dot_rows(t, w.data(), stride, nrows, xa.data(), n, out.data());
            for (int64_t r = 0; r < nrows; ++r) {
                const float one = q::vec_dot(t, &w[r * stride], xa.data(), n);
                ASSERT_EQ(out[r], one) << name(t) << " blocks " << nblk << " rows " << nrows << " r " << r;
            }
            EXPECT_EQ(out[nrows], -7.f) << "wrote past n_rows";
        }
    }
}

TEST_P(FormatTest, TileEqualsPairwiseDots) {
    const Type t = GetParam();
    std::mt19937 rng(11 + unsigned(t));
    const int64_t nrows = 5;
    // 2 blocks: a row shorter than the kernels' steps; 9: whole steps and a tail
    for (int64_t nblk : {2, 9}) {
        const int64_t n = block_elems(t) == 1 ? 77 * nblk / 2 : block_elems(t) * nblk;
        const size_t rb = row_size(t, n), wstride = rb + 16;
        const auto packed = random_weights(t, nrows, n, Scale::Mixed, rng);
        std::vector<uint8_t> w(wstride * nrows);
        for (int64_t r = 0; r < nrows; ++r) std::memcpy(&w[r * wstride], &packed[r * rb], rb);
        for (int64_t ncols : {1, 2, 3, 4, 5, 6, 7, 8, 9, 17}) {
            const size_t xb = q::vec_dot_row_bytes(t, n), xstride = xb + 8;
            std::vector<uint8_t> x(xstride * ncols);
            for (int64_t c = 0; c < ncols; ++c) {
                const auto xf = gaussian(n, c % 3 == 0 ? 10.f : 0.1f, rng);
                q::quantize_activation(t, xf.data(), &x[c * xstride], n);
            }
            const size_t ostride = nrows + 3;
            std::vector<float> out(ostride * ncols, -1.f);
            q::vec_dot_tile(t, w.data(), wstride, nrows, x.data(), xstride, ncols, n, out.data(), ostride);
            for (int64_t c = 0; c < ncols; ++c)
                for (int64_t r = 0; r < int64_t(ostride); ++r) {
                    if (r >= nrows) {
                        ASSERT_EQ(out[c * ostride + r], -1.f) << "wrote outside the tile";
                        continue;
                    }
                    ASSERT_EQ(out[c * ostride + r], q::vec_dot(t, &w[r * wstride], &x[c * xstride], n))
                        << name(t) << " blocks " << nblk << " cols " << ncols << " r " << r << " c " << c;
                }
        }
    }
    const int64_t n = block_elems(t) == 1 ? 77 : block_elems(t) * 2;
    const size_t rb = row_size(t, n);
    float o[4];
    std::vector<uint8_t> buf(8192);
    EXPECT_THROW(q::vec_dot_tile(t, buf.data(), rb, 2, buf.data(), 1, 2, n, o, 2), ds4::Error);   // x stride
    EXPECT_THROW(q::vec_dot_tile(t, buf.data(), rb, 2, buf.data(), q::vec_dot_row_bytes(t, n), 2, n, o, 1), ds4::Error);
    EXPECT_THROW(q::vec_dot_tile(t, buf.data(), rb, -1, buf.data(), 0, 1, n, o, 1), ds4::Error);
}

TEST_P(FormatTest, RejectsBadLengths) {
    const Type t = GetParam();
    if (block_elems(t) == 1) return;
    std::vector<uint8_t> buf(4096);
    std::vector<float> f(4096);
    EXPECT_THROW(q::dequantize_row(t, buf.data(), f.data(), block_elems(t) + 1), ds4::Error);
    EXPECT_THROW(q::quantize_row(t, f.data(), buf.data(), block_elems(t) / 2), ds4::Error);
    EXPECT_THROW(q::vec_dot(t, buf.data(), buf.data(), 3), ds4::Error);
    EXPECT_THROW(q::vec_dot_row_bytes(t, -block_elems(t)), ds4::Error);
    float out[2];
    EXPECT_THROW(q::vec_dot_rows(t, buf.data(), 1, 2, buf.data(), block_elems(t), out), ds4::Error);
}

INSTANTIATE_TEST_SUITE_P(Quant, FormatTest, testing::ValuesIn(kAllWeightTypes),
                         [](const testing::TestParamInfo<Type> &i) { return std::string(name(i.param)); });

TEST(Quant, ActivationFormats) {
    EXPECT_EQ(q::vec_dot_type(Type::F32), Type::F32);
    EXPECT_EQ(q::vec_dot_type(Type::F16), Type::F32);
    EXPECT_EQ(q::vec_dot_type(Type::BF16), Type::F32);
    EXPECT_EQ(q::vec_dot_type(Type::Q8_0), Type::Q8_0);
    EXPECT_EQ(q::vec_dot_type(Type::Q2_K), Type::Q8_K);
    EXPECT_EQ(q::vec_dot_type(Type::Q4_K), Type::Q8_K);
    EXPECT_EQ(q::vec_dot_type(Type::IQ2_XXS), Type::Q8_K);
    EXPECT_EQ(q::vec_dot_row_bytes(Type::F16, 4096), 4096u * 4);
    EXPECT_EQ(q::vec_dot_row_bytes(Type::Q8_0, 4096), 128u * 34);
}

TEST(Quant, UnsupportedTypesThrow) {
    std::vector<uint8_t> buf(1024);
    std::vector<float> f(256);
    EXPECT_THROW(q::dequantize_row(Type::Q5_0, buf.data(), f.data(), 32), ds4::Error);
    EXPECT_THROW(q::quantize_row(Type::Q6_K, f.data(), buf.data(), 256), ds4::Error);
    EXPECT_THROW(q::vec_dot_type(Type::IQ3_S), ds4::Error);
    EXPECT_THROW(q::vec_dot(Type::Q8_K, buf.data(), buf.data(), 256), ds4::Error);   // activation-only format
}

TEST(Quant, Q8_0QuantizerMatchesDefinition) {
    // d = amax/127 stored as f16; q = round(x / d) with the unrounded d.
    std::mt19937 rng(5);
    const auto x = gaussian(32 * 64, 0.7f, rng);
    std::vector<q::BlockQ8_0> y(64);
    q::quantize_row(Type::Q8_0, x.data(), y.data(), int64_t(x.size()));
    for (int b = 0; b < 64; ++b) {
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
        const float d = amax / 127.f;
        EXPECT_EQ(y[b].d, q::f32_to_f16(d));
        for (int i = 0; i < 32; ++i) {
            const float v = x[b * 32 + i] / d;
            EXPECT_LE(std::fabs(float(y[b].qs[i]) - v), 0.5f + 1e-4f);
        }
    }
    // all-zero and non-finite input never produce garbage
    std::vector<float> z(32, 0.f);
    q::quantize_row(Type::Q8_0, z.data(), y.data(), 32);
    EXPECT_EQ(y[0].d, 0);
    for (int i = 0; i < 32; ++i) EXPECT_EQ(y[0].qs[i], 0);
}

// The AVX-512 dots (and, for Q2_K, the VBMI one) against the AVX2 ones, bit for bit.
TEST(Quant, Avx512PathsMatchAvx2) {
    bool &on = ds4::quant::detail::avx512_enabled();
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
          __builtin_cpu_supports("avx512dq")))
        GTEST_SKIP() << "no AVX-512 on this CPU";
    bool &vbmi = ds4::quant::detail::vbmi_enabled();
    const bool saved = on, saved_vbmi = vbmi;
    for (Type t : {Type::IQ2_XXS, Type::Q2_K}) {
        std::mt19937 rng(21);
        for (int64_t nblk : {1, 6}) {
            const int64_t n = 256 * nblk, nrows = 7, ncols = 6;
            for (Scale s : {Scale::Normal, Scale::Mixed, Scale::Huge, Scale::Negative}) {
                const auto w = random_weights(t, nrows, n, s, rng);
                const size_t rb = row_size(t, n), xb = q::vec_dot_row_bytes(t, n);
                std::vector<uint8_t> x(xb * ncols);
                for (int64_t c = 0; c < ncols; ++c) {
                    const auto xf = gaussian(n, c % 2 ? 1.f : 40.f, rng);
                    q::quantize_activation(t, xf.data(), &x[c * xb], n);
                }
                std::vector<float> a(nrows * ncols), b(nrows * ncols), v(nrows * ncols);
                on = false;
                q::vec_dot_tile(t, w.data(), rb, nrows, x.data(), xb, ncols, n, a.data(), nrows);
                on = true;
                vbmi = false;
                q::vec_dot_tile(t, w.data(), rb, nrows, x.data(), xb, ncols, n, b.data(), nrows);
                for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << name(t) << " " << i;
                if (!ds4::quant::detail::vbmi_available()) continue;
                vbmi = true;
                q::vec_dot_tile(t, w.data(), rb, nrows, x.data(), xb, ncols, n, v.data(), nrows);
                for (size_t i = 0; i < a.size(); ++i)
                    ASSERT_EQ(std::memcmp(&a[i], &v[i], 4), 0) << name(t) << " VBMI " << i << ": " << a[i] << " vs " << v[i];
            }
        }
    }
    on = saved;
    vbmi = saved_vbmi;
}

// A Q8_0 product's operands: nrows weight rows with a code of -128 in the first block
// (bytes 0-1 are the scale) and ncols quantised activation rows of alternating spread,
// x_pad bytes of padding after each activation row.
struct Q8Operands {
    std::vector<uint8_t> w, x;
    size_t rb, xb;
    Q8Operands(int64_t n, int64_t nrows, int64_t ncols, Scale s, std::mt19937 &rng, size_t x_pad = 0)
        : w(random_weights(Type::Q8_0, nrows, n, s, rng)), rb(row_size(Type::Q8_0, n)),
          xb(q::vec_dot_row_bytes(Type::Q8_0, n) + x_pad) {
        w[2] = 0x80;
        x.resize(xb * size_t(ncols));
        for (int64_t c = 0; c < ncols; ++c) {
            const auto xf = gaussian(n, c % 2 ? 3.f : 0.2f, rng);
            q::quantize_activation(Type::Q8_0, xf.data(), &x[size_t(c) * xb], n);
        }
    }
};

using ds4::test::SwitchGuard;

// The chunked tile of plain weights (few long rows against many columns: the mixes) against
// the one-pair dot, bit for bit, on AVX-512 and AVX2: rows spanning one to three chunks with
// 8-element and scalar tails, odd row counts and column counts past the steps of 2 and 4,
// padded strides; the padding is not written.
TEST(Quant, ChunkedPlainTileEqualsDotBitForBit) {
    std::mt19937 rng(53);
    bool &wide = ds4::quant::detail::avx512_enabled();
    const SwitchGuard restore(wide);
    const bool have = wide;
    for (Type t : {Type::F32, Type::F16, Type::BF16}) {
        for (int64_t n : {int64_t(40), int64_t(1024 + 32 + 8 + 3), int64_t(2048 + 64)}) {
            const int64_t rows = 5, cols = 9;
            std::normal_distribution<float> g(0.f, 1.f);
            const size_t wrow = size_t(n) * (t == Type::F32 ? 4 : 2) + 64, xrow = size_t(n) * 4 + 32;
            std::vector<uint8_t> w(wrow * rows), x(xrow * cols);
            std::vector<float> f((size_t)n);
            for (int64_t r = 0; r < rows; ++r) {
                for (auto &v : f) v = g(rng);
                q::quantize_row(t, f.data(), &w[size_t(r) * wrow], n);
            }
            for (int64_t c = 0; c < cols; ++c)
                for (int64_t i = 0; i < n; ++i) {
                    const float v = g(rng);
                    std::memcpy(&x[size_t(c) * xrow + size_t(i) * 4], &v, 4);
                }
            for (bool on : {false, true}) {
                if (on && !have) continue;
                wide = on;
                for (int64_t nr : {int64_t(1), int64_t(3), rows})
                    for (int64_t nc : {int64_t(1), int64_t(2), int64_t(3), int64_t(5), cols}) {
                        const size_t ostride = size_t(nr) + 2;
                        std::vector<float> out(ostride * size_t(nc), -1.f);
                        q::vec_dot_tile(t, w.data(), wrow, nr, x.data(), xrow, nc, n, out.data(), ostride);
                        for (int64_t c = 0; c < nc; ++c) {
                            for (int64_t r = 0; r < nr; ++r) {
                                const float d = q::vec_dot(t, &w[size_t(r) * wrow], &x[size_t(c) * xrow], n);
                                ASSERT_EQ(std::memcmp(&out[size_t(c) * ostride + size_t(r)], &d, 4), 0)
                                    << name(t) << " n " << n << (on ? " avx512" : " avx2") << " rows " << nr
                                    << " cols " << nc << " r " << r << " c " << c;
                            }
                            for (size_t r = size_t(nr); r < ostride; ++r) ASSERT_EQ(out[size_t(c) * ostride + r], -1.f);
                        }
                    }
            }
        }
    }
    std::vector<uint8_t> dummy(256);
    float out[4];
    EXPECT_THROW(q::vec_dot_tile(Type::F32, dummy.data(), 4, 2, dummy.data(), 128, 1, 32, out, 2),
                 std::exception);   // weight rows overlap
}

// Q8_0 tiles (prefill, batched decode) against the one-pair dot, bit for bit: odd block
// counts (the tail block), long rows, every column count up to two column groups, weights
// of -128.
TEST(Quant, Q8_0TileEqualsDotBitForBit) {
    std::mt19937 rng(29);
    for (int64_t n : {32, 32 * 7, 4096 + 32, 32 * 1025}) {
        const int64_t nrows = 6, ncols = 9;
        const Q8Operands op(n, nrows, ncols, Scale::Mixed, rng);
        const auto &w = op.w, &x = op.x;
        const size_t rb = op.rb, xb = op.xb;
        for (int64_t cols = 1; cols <= ncols; ++cols) {
            std::vector<float> a(nrows * cols);
            q::vec_dot_tile(Type::Q8_0, w.data(), rb, nrows, x.data(), xb, cols, n, a.data(), nrows);
            for (int64_t c = 0; c < cols; ++c)
                for (int64_t r = 0; r < nrows; ++r) {
                    const float d = q::vec_dot(Type::Q8_0, &w[r * rb], &x[c * xb], n);
                    ASSERT_EQ(std::memcmp(&a[c * nrows + r], &d, 4), 0) << "n " << n << " cols " << cols << " r " << r;
                }
        }
    }
}

// A Q8_0 path (flag on) against plain AVX2 (flag off, every other int8 path off too), bit for
// bit: the one-pair dot and the 2-4-column tile (vec_dot_tile: decode and small batches),
// the four-stream rows kernel (vec_dot_rows), an odd block count (the tail block), weights
// of -128.
static void q8_0_path_matches_avx2(bool &flag, unsigned seed) {
    bool &vnni = ds4::quant::detail::vnni_enabled(), &avxvnni = ds4::quant::detail::avxvnni_enabled();
    const SwitchGuard restore_vnni(vnni), restore_avxvnni(avxvnni);
    vnni = avxvnni = false;
    std::mt19937 rng(seed);
    for (int64_t n : {32, 64, 32 * 7, 4096 + 32}) {
        const int64_t nrows = 9, ncols = 9;
        for (Scale s : {Scale::Normal, Scale::Mixed, Scale::Huge}) {
            const Q8Operands op(n, nrows, ncols, s, rng);
            const auto &w = op.w, &x = op.x;
            const size_t rb = op.rb, xb = op.xb;
            for (int64_t cols : {int64_t(1), int64_t(2), int64_t(3), int64_t(4), ncols}) {
                std::vector<float> a(nrows * cols), b(nrows * cols);
                flag = false;
                q::vec_dot_tile(Type::Q8_0, w.data(), rb, nrows, x.data(), xb, cols, n, a.data(), nrows);
                flag = true;
                q::vec_dot_tile(Type::Q8_0, w.data(), rb, nrows, x.data(), xb, cols, n, b.data(), nrows);
                for (size_t i = 0; i < a.size(); ++i)
                    ASSERT_EQ(std::memcmp(&a[i], &b[i], 4), 0) << "n " << n << " cols " << cols << " i " << i << ": " << a[i] << " vs " << b[i];
            }
            for (int64_t rows : {int64_t(1), int64_t(4), int64_t(5), nrows}) {
                std::vector<float> a(rows), b(rows);
                flag = false;
                q::vec_dot_rows(Type::Q8_0, w.data(), rb, rows, x.data(), n, a.data());
                flag = true;
                q::vec_dot_rows(Type::Q8_0, w.data(), rb, rows, x.data(), n, b.data());
                for (int64_t i = 0; i < rows; ++i)
                    ASSERT_EQ(std::memcmp(&a[i], &b[i], 4), 0) << "n " << n << " rows " << rows << " r " << i << ": " << a[i] << " vs " << b[i];
            }
        }
    }
}

TEST(Quant, Q8_0VnniMatchesAvx2) {
    if (!ds4::quant::detail::vnni_available()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU (or DS4_NO_AVX512 set)";
    q8_0_path_matches_avx2(ds4::quant::detail::vnni_enabled(), 23);
}

// AVX-VNNI: the VEX vpdpbusd (Intel clients from Alder Lake on).
TEST(Quant, Q8_0AvxVnniMatchesAvx2) {
    if (!ds4::quant::detail::avxvnni_available()) GTEST_SKIP() << "no AVX-VNNI on this CPU";
    q8_0_path_matches_avx2(ds4::quant::detail::avxvnni_enabled(), 29);
}

// The Q4_K AVX-512 VNNI dot and rows kernel against the AVX2 one, bit for bit: 1-4 columns,
// every remainder of the rows kernel's four streams, and blocks of random bytes (every
// 6-bit scale and min, every nibble) beside quantized ones.
TEST(Quant, Q4_KVnniMatchesAvx2) {
    if (!ds4::quant::detail::vnni_available()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU (or DS4_NO_AVX512 set)";
    bool &on = ds4::quant::detail::vnni_enabled();
    const SwitchGuard restore(on);
    std::mt19937 rng(41);
    const Type t = Type::Q4_K;
    for (int64_t n : {256, 256 * 3, 256 * 9}) {
        const int64_t nrows = 11, ncols = 4;
        const size_t rb = row_size(t, n), xb = q::vec_dot_row_bytes(t, n);
        for (bool raw : {false, true}) {
            std::vector<uint8_t> w = random_weights(t, nrows, n, Scale::Mixed, rng);
            if (raw) {
                std::uniform_int_distribution<int> byte(0, 255);
                for (auto &v : w) v = uint8_t(byte(rng));
                for (size_t b = 0; b < w.size() / 144; ++b) {   // finite d and dmin
                    const uint16_t d = uint16_t(0x2000 + byte(rng)), dm = uint16_t(0x1c00 + byte(rng));
                    std::memcpy(&w[144 * b], &d, 2);
                    std::memcpy(&w[144 * b + 2], &dm, 2);
                }
            }
            std::vector<uint8_t> x(xb * ncols);
            for (int64_t c = 0; c < ncols; ++c) {
                const auto xf = gaussian(n, c % 2 ? 10.f : 0.1f, rng);
                q::quantize_activation(t, xf.data(), x.data() + xb * c, n);
            }
            for (int64_t cols = 1; cols <= ncols; ++cols) {
                std::vector<float> a(nrows * cols), b(nrows * cols);
                on = false;
                q::vec_dot_tile(t, w.data(), rb, nrows, x.data(), xb, cols, n, a.data(), nrows);
                on = true;
                q::vec_dot_tile(t, w.data(), rb, nrows, x.data(), xb, cols, n, b.data(), nrows);
                for (size_t i = 0; i < a.size(); ++i)
                    ASSERT_EQ(std::memcmp(&a[i], &b[i], 4), 0) << "n " << n << " raw " << raw << " cols " << cols << " i " << i << ": " << a[i] << " vs " << b[i];
            }
            for (int64_t rows : {1, 3, 4, 5, 8, 11}) {
                std::vector<float> a(rows), b(rows);
                on = false;
                q::vec_dot_rows(t, w.data(), rb, rows, x.data(), n, a.data());
                on = true;
                q::vec_dot_rows(t, w.data(), rb, rows, x.data(), n, b.data());
                for (int64_t i = 0; i < rows; ++i)
                    ASSERT_EQ(std::memcmp(&a[i], &b[i], 4), 0) << "n " << n << " raw " << raw << " rows " << rows << " r " << i << ": " << a[i] << " vs " << b[i];
            }
        }
    }
}

// The packed Q8_0 tile (columns in the lanes) against the one-pair dot, bit for bit, on
// AVX-512 VNNI (where the CPU has it) and on AVX2 (VNNI turned off): block counts with a
// tail of 1-3 blocks, every remainder of the 4-row steps, column counts around the
// 8-column narrow panel, the AVX2 tile's 8-column units and the 16-column groups, padded
// activation rows, weights of -128, and scales from tiny to huge.
// avxvnni: the AVX2 tile's VEX vpdpbusd (only where vnni is off).
// rows_tile_max: up to how many columns the AVX-512 VNNI tile puts the weight rows in the
// lanes (q8_0_tile_rows.cpp); -1 leaves it as it is.
static void packed_q8_0_tile_equals_dot(bool vnni, bool avxvnni = false, int64_t rows_tile_max = -1) {
    bool &on = ds4::quant::detail::vnni_enabled();
    bool &avx_on = ds4::quant::detail::avxvnni_enabled();
    int64_t &rows_max = ds4::quant::detail::q8_0_rows_tile_max();
    const SwitchGuard restore(on), restore_avx(avx_on);
    const SwitchGuard restore_rows(rows_max);
    on = vnni;
    avx_on = avxvnni;
    if (rows_tile_max >= 0) rows_max = rows_tile_max;
    const int64_t min_cols = vnni ? q::kTilePackMinCols : avxvnni ? q::kTilePackMinColsAvxVnni : q::kTilePackMinColsAvx2;
    std::mt19937 rng(31);
    for (int64_t n : {32, 32 * 5, 32 * 7, 4096 + 32}) {
        // 53 columns: three full groups (rows_xg) and a part-filled one; 40 rows: two and a
        // half blocks of 16 for the rows-in-lanes tile
        const int64_t nrows = 40, ncols = 53;
        for (Scale s : {Scale::Normal, Scale::Mixed, Scale::Huge}) {
            const Q8Operands op(n, nrows, ncols, s, rng, 6);   // padded activation rows
            const auto &w = op.w, &x = op.x;
            const size_t rb = op.rb, xb = op.xb;
            for (int64_t cols : {int64_t(q::kTilePackMinCols), int64_t(5), int64_t(7), int64_t(8), int64_t(9), int64_t(15), int64_t(16), int64_t(17), int64_t(24), int64_t(32), int64_t(33), int64_t(48), ncols}) {
                if (cols < min_cols) continue;
                std::vector<uint8_t> packed(q::tile_pack_bytes(Type::Q8_0, n, cols));
                ASSERT_FALSE(packed.empty());
                const int64_t groups = q::tile_pack_groups(Type::Q8_0, cols);
                q::tile_pack(Type::Q8_0, x.data(), xb, cols, n, 0, groups / 2, packed.data());   // in two parts,
                q::tile_pack(Type::Q8_0, x.data(), xb, cols, n, groups / 2, groups, packed.data());   // as threads do
                for (int64_t rows : {1, 2, 3, 4, 5, 6, 7, 8, 11, 16, 17, 32, 33, 40}) {
                    const size_t ostride = size_t(rows) + 3;
                    std::vector<float> a(ostride * size_t(cols), -1.f);
                    q::vec_dot_tile_packed(Type::Q8_0, w.data(), rb, rows, packed.data(), cols, n, a.data(), ostride);
                    for (int64_t c = 0; c < cols; ++c)
                        for (int64_t r = 0; r < rows; ++r) {
                            const float d = q::vec_dot(Type::Q8_0, &w[r * rb], &x[c * xb], n);
                            ASSERT_EQ(std::memcmp(&a[c * ostride + r], &d, 4), 0)
                                << "n " << n << " cols " << cols << " rows " << rows << " r " << r << " c " << c << ": "
                                << a[c * ostride + r] << " vs " << d;
                        }
                    for (int64_t c = 0; c < cols; ++c)   // the padding between columns is not written
                        for (size_t r = size_t(rows); r < ostride; ++r) ASSERT_EQ(a[c * ostride + r], -1.f);
                }
            }
        }
    }
    {   // more rows than the kernel stages at once (256), an odd count
        const int64_t n = 64, rows = 301, cols = 50;
        const Q8Operands op(n, rows, cols, Scale::Mixed, rng, 6);
        std::vector<uint8_t> packed(q::tile_pack_bytes(Type::Q8_0, n, cols));
        q::tile_pack(Type::Q8_0, op.x.data(), op.xb, cols, n, 0, q::tile_pack_groups(Type::Q8_0, cols), packed.data());
        const size_t ostride = size_t(rows) + 5;
        {
            std::vector<float> a(ostride * size_t(cols), -1.f);
            q::vec_dot_tile_packed(Type::Q8_0, op.w.data(), op.rb, rows, packed.data(), cols, n, a.data(), ostride);
            for (int64_t c = 0; c < cols; ++c) {
                for (int64_t r = 0; r < rows; ++r) {
                    const float d = q::vec_dot(Type::Q8_0, &op.w[r * op.rb], &op.x[c * op.xb], n);
                    ASSERT_EQ(std::memcmp(&a[c * ostride + r], &d, 4), 0) << "r " << r << " c " << c;
                }
                for (size_t r = size_t(rows); r < ostride; ++r) ASSERT_EQ(a[c * ostride + r], -1.f);
            }
        }
    }
    EXPECT_EQ(q::tile_pack_bytes(Type::Q8_0, 4096, min_cols - 1), 0u);
    EXPECT_EQ(q::tile_pack_bytes(Type::Q2_K, 4096, 64), 0u);
    std::vector<float> out(64);
    std::vector<uint8_t> dummy(64);
    EXPECT_THROW(q::vec_dot_tile_packed(Type::Q8_0, dummy.data(), 34, 1, dummy.data(), min_cols - 1, 32,
                                       out.data(), 1),
                 std::exception);
}

TEST(Quant, Q8_0PackedTileEqualsDotBitForBitVnni) {
    if (!ds4::quant::detail::vnni_available()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU (or DS4_NO_AVX512 set)";
    packed_q8_0_tile_equals_dot(true, false, 0);    // columns in the lanes from 9 columns
    packed_q8_0_tile_equals_dot(true, false, 64);   // weight rows in the lanes to 64
}

TEST(Quant, Q8_0PackedTileEqualsDotBitForBitAvxVnni) {
    if (!ds4::quant::detail::avxvnni_available()) GTEST_SKIP() << "no AVX-VNNI on this CPU";
    packed_q8_0_tile_equals_dot(false, true);
}

TEST(Quant, Q8_0PackedTileEqualsDotBitForBitAvx2) { packed_q8_0_tile_equals_dot(false); }

// With VNNI on and off the packing's size follows the layout the tile reads: the narrow
// panel (one group) up to 8 columns on VNNI only, 16-column groups otherwise; the fewest
// columns packed follow the ISA (sizes only: nothing runs, so any CPU can check them).
TEST(Quant, Q8_0PackLayoutFollowsThePath) {
    bool &on = ds4::quant::detail::vnni_enabled();
    bool &avx_on = ds4::quant::detail::avxvnni_enabled();
    const SwitchGuard restore(on), restore_avx(avx_on);
    on = false;
    avx_on = true;
    EXPECT_EQ(q::tile_pack_bytes(Type::Q8_0, 4096, q::kTilePackMinColsAvxVnni - 1), 0u);
    EXPECT_GT(q::tile_pack_bytes(Type::Q8_0, 4096, q::kTilePackMinColsAvxVnni), 0u);
    avx_on = false;
    EXPECT_EQ(q::tile_pack_bytes(Type::Q8_0, 4096, q::kTilePackMinColsAvx2 - 1), 0u);
    EXPECT_GT(q::tile_pack_bytes(Type::Q8_0, 4096, q::kTilePackMinColsAvx2), 0u);
    EXPECT_EQ(q::tile_pack_groups(Type::Q8_0, 8), 1);
    EXPECT_EQ(q::tile_pack_groups(Type::Q8_0, 17), 2);
    const uint64_t wide8 = q::tile_pack_bytes(Type::Q8_0, 4096, 8);
    EXPECT_EQ(wide8, q::tile_pack_bytes(Type::Q8_0, 4096, 16));
    if (!ds4::quant::detail::vnni_available()) return;
    on = true;
    EXPECT_LT(q::tile_pack_bytes(Type::Q8_0, 4096, 8), wide8);
    EXPECT_EQ(q::tile_pack_bytes(Type::Q8_0, 4096, 16), wide8);
}

// IQ2_XXS with transposed activations (AVX-512 VBMI) against the one-pair dot with the
// packed path off, on the AVX-512 and on the AVX2 kernel, bit for bit: 1-7 and 16 blocks
// (an odd last pair, every remainder of the 4-block steps), 1-9 columns (column groups of
// up to 4), padded weight and activation rows, scales from tiny to huge, the packing split
// as threads split it, the code lookups both ways (iq2_xxs_two_source_permutes).
TEST(Quant, Iq2XxsPackedEqualsDotBitForBit) {
    if (!ds4::quant::detail::vbmi_available()) GTEST_SKIP() << "no AVX-512 VBMI + VNNI on this CPU (or DS4_NO_AVX512 set)";
    bool &vbmi = ds4::quant::detail::vbmi_enabled();
    bool &avx512 = ds4::quant::detail::avx512_enabled();
    bool &two_source = ds4::quant::detail::iq2_xxs_two_source_permutes();
    const SwitchGuard restore_vbmi(vbmi), restore_avx512(avx512), restore_two(two_source);
    std::mt19937 rng(37);
    const Type t = Type::IQ2_XXS;
    for (int64_t nblk : {1, 2, 3, 4, 5, 6, 7, 16}) {
        const int64_t n = 256 * nblk, nrows = 7, ncols = 9;
        for (Scale s : {Scale::Normal, Scale::Mixed, Scale::Huge, Scale::Tiny}) {
            const size_t rb = row_size(t, n), wstride = rb + 10, xb = q::vec_dot_row_bytes(t, n) + 6;
            const auto packed_w = random_weights(t, nrows, n, s, rng);
            std::vector<uint8_t> w(wstride * nrows, 0xCD);
            for (int64_t r = 0; r < nrows; ++r) std::memcpy(&w[r * wstride], &packed_w[r * rb], rb);
            std::vector<uint8_t> x(xb * ncols);
            for (int64_t c = 0; c < ncols; ++c) {
                const auto xf = gaussian(n, c % 2 ? 5.f : 0.3f, rng);
                q::quantize_activation(t, xf.data(), &x[c * xb], n);
            }
            for (int64_t cols = 1; cols <= ncols; ++cols)
              for (bool two : {false, true}) {   // code lookups by four vpermb / two vpermi2b
                two_source = two;
                vbmi = true;
                avx512 = true;
                std::vector<uint8_t> packed(q::tile_pack_bytes(t, n, cols));
                ASSERT_FALSE(packed.empty());
                const int64_t groups = q::tile_pack_groups(t, cols);
                q::tile_pack(t, x.data(), xb, cols, n, 0, groups / 2, packed.data());
                q::tile_pack(t, x.data(), xb, cols, n, groups / 2, groups, packed.data());
                const size_t ostride = nrows + 2;
                std::vector<float> got(ostride * size_t(cols), -1.f);
                q::vec_dot_tile_packed(t, w.data(), wstride, nrows, packed.data(), cols, n, got.data(), ostride);
                vbmi = false;
                for (bool wide : {true, false}) {
                    avx512 = wide;
                    for (int64_t c = 0; c < cols; ++c)
                        for (int64_t r = 0; r < nrows; ++r) {
                            const float d = q::vec_dot(t, &w[r * wstride], &x[c * xb], n);
                            ASSERT_EQ(std::memcmp(&got[c * ostride + r], &d, 4), 0)
                                << "blocks " << nblk << " cols " << cols << " r " << r << " c " << c
                                << (wide ? " (AVX-512)" : " (AVX2)") << (two ? " vpermi2b" : " vpermb") << ": "
                                << got[c * ostride + r] << " vs " << d;
                        }
                }
                for (int64_t c = 0; c < cols; ++c)   // the padding between columns is not written
                    for (size_t r = nrows; r < ostride; ++r) ASSERT_EQ(got[c * ostride + r], -1.f);
            }
        }
    }
    vbmi = false;
    EXPECT_EQ(q::tile_pack_bytes(t, 4096, 1), 0u);
}

// Weights usually come from a mapped file, so a kernel must not read past a row's last
// block (the next page may not be mapped): every path, for every block count that leaves a
// tail, on a row that ends where an inaccessible page begins.
TEST(Quant, KernelsReadNothingPastTheRow) {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    const size_t span = 8 * page;
    void *map = mmap(nullptr, span + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(map, MAP_FAILED);
    ASSERT_EQ(mprotect(static_cast<uint8_t *>(map) + span, page, PROT_NONE), 0);
    uint8_t *end = static_cast<uint8_t *>(map) + span;
    bool &vbmi = ds4::quant::detail::vbmi_enabled();
    bool &avx512 = ds4::quant::detail::avx512_enabled();
    const SwitchGuard restore_vbmi(vbmi), restore_avx512(avx512);
    std::mt19937 rng(47);
    for (Type t : {Type::IQ2_XXS, Type::Q2_K, Type::Q4_K, Type::Q8_0}) {
        for (int64_t nblk : {1, 2, 3, 5, 7}) {
            const int64_t n = block_elems(t) * nblk * (t == Type::Q8_0 ? 8 : 1);
            const size_t rb = row_size(t, n);
            const auto w = random_weights(t, 1, n, Scale::Mixed, rng);
            uint8_t *row = end - rb;   // the row's last byte is the last accessible one
            std::memcpy(row, w.data(), rb);
            const size_t xb = q::vec_dot_row_bytes(t, n);
            std::vector<uint8_t> x(xb * 9);
            for (int c = 0; c < 9; ++c) {
                const auto xf = gaussian(n, 1.f, rng);
                q::quantize_activation(t, xf.data(), &x[c * xb], n);
            }
            for (bool wide : {false, true}) {
                avx512 = wide && __builtin_cpu_supports("avx512bw");
                for (bool v : {false, true}) {
                    vbmi = v && ds4::quant::detail::vbmi_available();
                    for (int64_t cols = 1; cols <= 9; ++cols) {
                        std::vector<float> got(static_cast<size_t>(cols));
                        q::vec_dot_tile(t, row, rb, 1, x.data(), xb, cols, n, got.data(), 1);
                        if (const uint64_t pb = q::tile_pack_bytes(t, n, cols)) {
                            std::vector<uint8_t> packed(pb);
                            q::tile_pack(t, x.data(), xb, cols, n, 0, q::tile_pack_groups(t, cols), packed.data());
                            q::vec_dot_tile_packed(t, row, rb, 1, packed.data(), cols, n, got.data(), 1);
                        }
                        for (int64_t c = 0; c < cols; ++c)
                            ASSERT_EQ(got[size_t(c)], q::vec_dot(t, w.data(), &x[size_t(c) * xb], n)) << name(t) << " blocks " << nblk;
                    }
                }
            }
        }
    }
    munmap(map, span + page);
}

// The AVX2 Q8_0 quantiser (every activation row of a Q8_0 product) against its scalar
// definition, byte for byte: ordinary rows, exact .5 ties (amax 127 makes the scale 1),
// non-finite inputs, denormals, all-zero blocks and a scale so small its inverse is inf.
TEST(Quant, Q8_0QuantizerEqualsScalarDefinition) {
    std::mt19937 rng(9);
    std::vector<float> x;
    for (float mag : {1e-3f, 0.7f, 30.f, 1e30f}) {
        const auto g = gaussian(32 * 16, mag, rng);
        x.insert(x.end(), g.begin(), g.end());
    }
    for (int b = 0; b < 8; ++b) {   // ties: amax = 127, so v = x exactly
        x.push_back(b % 2 ? 127.f : -127.f);
        for (int i = 1; i < 32; ++i) x.push_back(float(int(rng() % 254) - 127) + (rng() % 2 ? 0.5f : -0.5f));
    }
    const float specials[] = {NAN, INFINITY, -INFINITY, 0.f, -0.f, 1e-40f, -1e-42f, 2.5f, -2.5f, 126.5f};
    for (int b = 0; b < 8; ++b)
        for (int i = 0; i < 32; ++i) x.push_back(rng() % 3 ? specials[rng() % 10] : float(rng() % 100) * 0.01f);
    for (int i = 0; i < 32; ++i) x.push_back(i % 2 ? 1e-44f : -3e-45f);   // d denormal or 0, 1/d inf
    for (int i = 0; i < 32; ++i) x.push_back(0.f);
    const int64_t n = int64_t(x.size());
    ASSERT_EQ(n % 32, 0);
    std::vector<uint8_t> fast(size_t(n / 32) * sizeof(q::BlockQ8_0)), ref(fast.size());
    ds4::quant::detail::quant_q8_0_ref(x.data(), ref.data(), n);
    // AVX-512 (sixteen blocks at a time, the rest as a part-filled group) where the CPU has
    // it, and AVX2; the whole row, its last 16 + 3 blocks (a group and a remainder) and its
    // last 6 (a row shorter than a group, as the default model's expert rows)
    bool &on = ds4::quant::detail::avx512_enabled();
    const SwitchGuard restore(on);
    const bool have = on;
    for (bool wide : {false, true}) {
        if (wide && !have) continue;
        on = wide;
        for (int64_t skip : {int64_t(0), n / 32 - 19, n / 32 - 6}) {
            std::fill(fast.begin(), fast.end(), uint8_t(0xAA));
            const size_t off = size_t(skip) * sizeof(q::BlockQ8_0);
            ds4::quant::detail::quant_q8_0(x.data() + skip * 32, fast.data() + off, n - skip * 32);
            for (size_t i = off; i < fast.size(); ++i)
                ASSERT_EQ(fast[i], ref[i]) << (wide ? "avx512" : "avx2") << " from block " << skip << ": byte " << i
                                           << " (block " << i / sizeof(q::BlockQ8_0) << ")";
        }
    }
}
