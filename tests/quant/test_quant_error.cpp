// Quantise -> dequantise error on Gaussian data, per format. The measured relative RMS
// error is printed. Upper bounds: what each format's bit budget should reach (GGML's own
// quantizers measure q4_K 0.071, q2_K 0.296, iq2_xxs 0.344 on this data). Lower bounds:
// the Gaussian rate-distortion limit 2^-R at R bits per weight, which no quantizer beats.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "quant_test_util.h"

using namespace qtest;
namespace q = ds4::quant;

namespace {

double rel_rmse(Type t, const std::vector<float> &x) {
    const int64_t n = int64_t(x.size());
    std::vector<uint8_t> buf(row_size(t, n));
    std::vector<float> y(x.size());
    q::quantize_row(t, x.data(), buf.data(), n);
    q::dequantize_row(t, buf.data(), y.data(), n);
    double e = 0, s = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        e += double(x[i] - y[i]) * double(x[i] - y[i]);
        s += double(x[i]) * double(x[i]);
    }
    return std::sqrt(e / s);
}

void expect_error(Type t, const char *label, double lo, double hi) {
    std::mt19937 rng(2024);
    const auto x = gaussian(256 * 256, 1.f, rng);
    const double r = rel_rmse(t, x);
    std::printf("[quant] %-8s Gaussian rel-RMSE %.5f\n", label, r);
    EXPECT_GT(r, lo) << label << ": suspiciously exact for its bit budget";
    EXPECT_LT(r, hi) << label;
    // scale invariance: the same data at 1e-3 and 1e3 (f16 block scales stay normal)
    for (float k : {1e-3f, 1e3f}) {
        std::vector<float> xs(x);
        for (auto &v : xs) v *= k;
        EXPECT_NEAR(rel_rmse(t, xs), r, 0.1 * r + 1e-3) << label << " scaled by " << k;
    }
}

}  // namespace

TEST(QuantError, F16) { expect_error(Type::F16, "f16", 1e-5, 4e-4); }
TEST(QuantError, BF16) { expect_error(Type::BF16, "bf16", 1e-4, 3e-3); }
TEST(QuantError, Q8_0) { expect_error(Type::Q8_0, "q8_0", 1e-3, 0.01); }
TEST(QuantError, Q4_K) { expect_error(Type::Q4_K, "q4_K", 0.044, 0.085); }
TEST(QuantError, Q2_K) { expect_error(Type::Q2_K, "q2_K", 0.16, 0.31); }
TEST(QuantError, IQ2_XXS) { expect_error(Type::IQ2_XXS, "iq2_xxs", 0.24, 0.37); }
