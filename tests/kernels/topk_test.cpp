// ops::top_k_scores against std::partial_sort under its order (score descending, ties to the
// lower index) on rows with many ties, for every k from 0 past n; and with NaN scores, which
// rank below every number (checked against a full sort under that order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "engine/kernels/ops.h"

namespace ds4::ops {
namespace {

std::vector<IndexScore> row(size_t n, std::mt19937 &rng, bool nans) {
    std::uniform_int_distribution<int> small(-6, 6);   // few distinct scores: many ties
    std::vector<IndexScore> r(n);
    for (size_t i = 0; i < n; ++i) {
        r[i] = {0.25f * float(small(rng)), int(i)};
        if (nans && rng() % 7 == 0) r[i].score = std::numeric_limits<float>::quiet_NaN();
    }
    return r;
}

void expect_same(const std::vector<IndexScore> &got, const std::vector<IndexScore> &want, size_t k, const char *what) {
    for (size_t i = 0; i < k; ++i) {
        ASSERT_EQ(got[i].idx, want[i].idx) << what << " k " << k << " n " << want.size() << " at " << i;
        ASSERT_EQ(std::isnan(got[i].score), std::isnan(want[i].score));
        if (std::isnan(want[i].score)) continue;
        ASSERT_EQ(got[i].score, want[i].score);
    }
}

TEST(TopKScores, IsPartialSortWithTiesForEveryK) {
    std::mt19937 rng(23);
    auto before = [](const IndexScore &a, const IndexScore &b) {
        return a.score > b.score || (a.score == b.score && a.idx < b.idx);
    };
    for (size_t n : {0, 1, 2, 5, 16, 17, 40, 333, 1024})
        for (size_t k : {size_t(0), size_t(1), size_t(3), size_t(16), n / 2, n, n + 5}) {
            const std::vector<IndexScore> src = row(n, rng, false);
            std::vector<IndexScore> got = src, want = src;
            top_k_scores(got.data(), got.data() + n, k);
            const size_t kk = std::min(k, n);
            std::partial_sort(want.begin(), want.begin() + kk, want.end(), before);
            expect_same(got, want, kk, "ties");
        }
}

TEST(TopKScores, NaNRanksBelowEveryNumber) {
    std::mt19937 rng(29);
    auto total = [](const IndexScore &a, const IndexScore &b) {
        const bool an = std::isnan(a.score), bn = std::isnan(b.score);
        if (an != bn) return bn;
        if (!an && a.score != b.score) return a.score > b.score;
        return a.idx < b.idx;
    };
    for (size_t n : {1, 3, 16, 17, 100, 700})
        for (size_t k : {size_t(1), size_t(4), size_t(16), n}) {
            std::vector<IndexScore> src = row(n, rng, true);
            src[0].score = std::numeric_limits<float>::quiet_NaN();   // a NaN among the first k too
            std::vector<IndexScore> got = src, want = src;
            top_k_scores(got.data(), got.data() + n, k);
            std::sort(want.begin(), want.end(), total);
            expect_same(got, want, std::min(k, n), "nan");
        }
}

}  // namespace
}  // namespace ds4::ops
