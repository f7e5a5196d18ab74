// ops::sinkhorn against the one-matrix loop it replaced (columns, then rows and columns
// iters - 1 more times; each sum from 0 in index order; each entry divided by sum + eps),
// written out here: every matrix of a batch, in every lane count, bit for bit, and a
// batch's idle lanes leave nothing behind.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/kernels/ops.h"

namespace ds4::ops {
namespace {

void one_matrix(float *cb, int hc, int iters, float eps) {
    auto norm_cols = [&] {
        for (int k = 0; k < hc; ++k) {
            float s = 0;
            for (int j = 0; j < hc; ++j) s += cb[j * hc + k];
            for (int j = 0; j < hc; ++j) cb[j * hc + k] /= s + eps;
        }
    };
    auto norm_rows = [&] {
        for (int j = 0; j < hc; ++j) {
            float s = 0;
            for (int k = 0; k < hc; ++k) s += cb[j * hc + k];
            for (int k = 0; k < hc; ++k) cb[j * hc + k] /= s + eps;
        }
    };
    norm_cols();
    for (int it = 1; it < iters; ++it) {
        norm_rows();
        norm_cols();
    }
}

// Row-softmaxed matrices plus eps, as the hyper-connection mix hands them over, with a wide
// spread of logits so that the sums are far from 1.
std::vector<float> random_matrices(int count, int hc, float eps, std::mt19937 &rng) {
    std::normal_distribution<float> g(0.f, 3.f);
    std::vector<float> m((size_t)count * hc * hc);
    for (int c = 0; c < count; ++c)
        for (int j = 0; j < hc; ++j) {
            float *row = m.data() + ((size_t)c * hc + j) * hc;
            for (int k = 0; k < hc; ++k) row[k] = g(rng);
            softmax(row, hc);
            for (int k = 0; k < hc; ++k) row[k] += eps;
        }
    return m;
}

TEST(Sinkhorn, EveryLaneCountEqualsTheOneMatrixLoop) {
    std::mt19937 rng(11);
    for (int hc : {1, 2, 3, 4, 5, 16})
        for (int iters : {1, 2, 20})
            for (float eps : {1e-6f, 0.01f})
                for (int n = 1; n <= kSinkhornLanes; ++n) {
                    std::vector<float> got = random_matrices(n, hc, eps, rng), want = got;
                    float *mats[kSinkhornLanes];
                    for (int i = 0; i < n; ++i) mats[i] = got.data() + (size_t)i * hc * hc;
                    sinkhorn(mats, n, hc, iters, eps);
                    for (int i = 0; i < n; ++i) one_matrix(want.data() + (size_t)i * hc * hc, hc, iters, eps);
                    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
                        << "hc " << hc << " iters " << iters << " eps " << eps << " lanes " << n;
                }
}

TEST(Sinkhorn, NormalisesAndWritesOnlyTheGivenMatrices) {
    // 20 iterations leave every column summing to ~1 (columns are normalised last), and a
    // batch of 3 writes its 3 matrices and nothing next to them.
    std::mt19937 rng(5);
    const int hc = 4, n = 3;
    std::vector<float> m = random_matrices(n + 1, hc, 1e-6f, rng);
    const std::vector<float> before = m;
    float *mats[kSinkhornLanes] = {m.data(), m.data() + 16, m.data() + 32};
    sinkhorn(mats, n, hc, 20, 1e-6f);
    for (int i = 0; i < n; ++i)
        for (int k = 0; k < hc; ++k) {
            float s = 0;
            for (int j = 0; j < hc; ++j) s += mats[i][j * hc + k];
            EXPECT_NEAR(s, 1.f, 1e-4f) << "matrix " << i << " column " << k;
        }
    EXPECT_NE(0, std::memcmp(m.data(), before.data(), 16 * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(m.data() + 48, before.data() + 48, 16 * sizeof(float)));
}

}  // namespace
}  // namespace ds4::ops
