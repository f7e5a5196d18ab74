// The AVX-512 VNNI and AVX-VNNI Q8_0 tiles run emulated (SIMDe, see tile_emulation.h) and
// checked bit for bit against vec_dot, on any x86-64-v3 CPU: the packed layouts, the offset
// panel and the per-row corrections are exercised in CI, which has neither instruction set.
// On a CPU that has them, test_quant's Q8_0PackedTileEqualsDotBitForBit* run the real code.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "engine/quant/kernels.h"
#include "engine/quant/quants.h"
#include "tests/common/switch_guard.h"
#include "tests/quant/quant_test_util.h"

namespace ds4::quant::detail::emu {
bool &emu_vnni() {
    static bool on = false;
    return on;
}
bool &emu_avxvnni() {
    static bool on = false;
    return on;
}
int64_t q8_0_pack_groups(int64_t n_cols);
uint64_t q8_0_pack_bytes(int64_t n, int64_t n_cols);
void q8_0_pack(const void *x, size_t x_row_stride, int64_t n_cols, int64_t n, int64_t g0, int64_t g1, uint8_t *dst);
void q8_0_tile_packed(const uint8_t *w, size_t w_row_stride, int64_t n_rows, const uint8_t *packed, int64_t n_cols,
                      int64_t n, float *out, size_t out_col_stride);
}  // namespace ds4::quant::detail::emu

namespace {

namespace emu = ds4::quant::detail::emu;
namespace q = ds4::quant;
using namespace qtest;

// Every row count to 11 (each remainder of the four-row steps, and two row blocks), 16, 17
// and 33 (the rows tile's blocks of 16, two a step) and 301 (past the 256 rows staged at once); columns through the narrow layout (VNNI, up to 8), one
// group, two, three, four (two and two) and part-filled groups; 1 to 129 blocks; padded rows.
// rows_tile_max: up to how many columns the VNNI tile puts the weight rows in the lanes.
void tile_equals_dot(bool vnni512, int64_t min_cols, int64_t rows_tile_max) {
    int64_t &rows_max = ds4::quant::detail::q8_0_rows_tile_max();
    const ds4::test::SwitchGuard restore(rows_max);
    rows_max = rows_tile_max;
    emu::emu_vnni() = vnni512;
    emu::emu_avxvnni() = !vnni512;
    std::mt19937 rng(vnni512 ? 71 : 73);
    long checked = 0;
    for (int64_t nb : {1, 2, 3, 5, 33, 129}) {
        const int64_t n = 32 * nb;
        for (Scale s : {Scale::Normal, Scale::Mixed}) {
            for (int64_t cols : {1, 4, 5, 7, 8, 9, 12, 16, 17, 24, 28, 33, 48, 53, 64}) {
                if (cols < min_cols) continue;
                for (int64_t rows : {1, 2, 3, 4, 5, 7, 8, 11, 16, 17, 33, 301}) {
                    if (rows == 301 && (nb > 5 || cols > 17)) continue;
                    if ((rows == 16 || rows == 33) && cols != 12 && cols != 24) continue;
                    const size_t rb = row_size(Type::Q8_0, n), ws = rb + 6, xs = rb + 10;
                    const auto wp = random_weights(Type::Q8_0, rows, n, s, rng);
                    std::vector<uint8_t> w(ws * size_t(rows), 0xCD), x(xs * size_t(cols));
                    for (int64_t r = 0; r < rows; ++r) std::memcpy(&w[size_t(r) * ws], &wp[size_t(r) * rb], rb);
                    w[2] = 0x80;   // a -128 weight
                    std::normal_distribution<float> g(0.f, 1.f);
                    std::vector<float> xf(static_cast<size_t>(n));
                    for (int64_t c = 0; c < cols; ++c) {
                        for (auto &v : xf) v = g(rng) * (c % 2 ? 3.f : 0.2f);
                        q::quantize_activation(Type::Q8_0, xf.data(), &x[size_t(c) * xs], n);
                    }
                    std::vector<uint8_t> packed(emu::q8_0_pack_bytes(n, cols));
                    const int64_t groups = emu::q8_0_pack_groups(cols);
                    emu::q8_0_pack(x.data(), xs, cols, n, 0, groups / 2, packed.data());   // in two parts,
                    emu::q8_0_pack(x.data(), xs, cols, n, groups / 2, groups, packed.data());   // as threads do
                    const size_t os = size_t(rows) + 3;
                    std::vector<float> out(os * size_t(cols), -1.f);
                    emu::q8_0_tile_packed(w.data(), ws, rows, packed.data(), cols, n, out.data(), os);
                    for (int64_t c = 0; c < cols; ++c) {
                        for (int64_t r = 0; r < rows; ++r) {
                            const float d = q::vec_dot(Type::Q8_0, &w[size_t(r) * ws], &x[size_t(c) * xs], n);
                            ASSERT_EQ(std::memcmp(&out[size_t(c) * os + size_t(r)], &d, 4), 0)
                                << "nb " << nb << " cols " << cols << " rows " << rows << " r " << r << " c " << c
                                << ": " << out[size_t(c) * os + size_t(r)] << " vs " << d;
                            ++checked;
                        }
                        for (size_t r = size_t(rows); r < os; ++r) ASSERT_EQ(out[size_t(c) * os + r], -1.f);
                    }
                }
            }
        }
    }
    EXPECT_GT(checked, 100000);
}

TEST(QuantEmulated, Vnni512TileEqualsDotBitForBit) { tile_equals_dot(true, q::kTilePackMinCols, 0); }

// The weight rows in the lanes (q8_0_tile_rows.cpp) for every tested column count from 9.
TEST(QuantEmulated, Vnni512RowsTileEqualsDotBitForBit) { tile_equals_dot(true, 9, 1 << 20); }

TEST(QuantEmulated, AvxVnniTileEqualsDotBitForBit) { tile_equals_dot(false, q::kTilePackMinColsAvxVnni, 0); }

// The offset panel is what the VNNI tiles read and not the AVX2 one's: x + 128 where they run.
TEST(QuantEmulated, PanelIsOffsetForVpdpbusdOnly) {
    const int64_t n = 64, cols = 16;
    std::vector<uint8_t> x(size_t(cols) * 68, 0);   // scale 0, bytes 0
    std::vector<uint8_t> a(emu::q8_0_pack_bytes(n, cols)), b(a.size());
    emu::emu_vnni() = false;
    emu::emu_avxvnni() = false;
    emu::q8_0_pack(x.data(), 68, cols, n, 0, 1, a.data());
    emu::emu_avxvnni() = true;
    emu::q8_0_pack(x.data(), 68, cols, n, 0, 1, b.data());
    EXPECT_EQ(a[0], 0);
    EXPECT_EQ(b[0], 0x80);
}

}  // namespace
