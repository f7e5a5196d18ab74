// matmul against the one-pair dot: whatever path a product takes (one token, the 4-column
// tile, the packed Q8_0 tile with its activations repacked once and split over threads,
// the narrow layout for batched decode, IQ2_XXS with transposed activations), every output
// is vec_dot of its row and token, bit for bit. So a session's tokens do not depend on the batch or chunk they ran in.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/kernels/matmul.h"
#include "engine/quant/quants.h"

namespace ds4 {
namespace {

std::vector<float> gaussian(size_t n, float sd, std::mt19937 &rng) {
    std::normal_distribution<float> g(0, sd);
    std::vector<float> v(n);
    for (auto &x : v) x = g(rng);
    return v;
}

// Products of a 4096-wide weight of type t (large enough for the pool and the row blocks;
// 203 rows leave a row block and a 4-row step with remainders) for many token counts.
// keep_prep and dense: as a batched step runs a dense matrix (the row prep kept in the context).
void expect_products_equal_one_pair_dots(gguf::Type t, std::mt19937 &rng, bool keep_prep = false, bool dense = false,
                                         MatmulCtx *kept = nullptr) {
    const int64_t in = 4096, out = 203;
    const auto wf = gaussian(size_t(in * out), 0.05f, rng);
    const size_t row = size_t(gguf::row_bytes(t, in));
    const size_t xrow = size_t(quant::vec_dot_row_bytes(t, in));
    std::vector<uint8_t> wq(row * size_t(out));
    for (int64_t r = 0; r < out; ++r) quant::quantize_row(t, &wf[size_t(r * in)], &wq[size_t(r) * row], in);
    WeightView w;
    w.type = t;
    w.in = in;
    w.out = out;
    w.data = wq.data();
    w.row_bytes = row;
    w.dense = dense;
    ThreadPool pool(2);
    MatmulCtx own(pool);
    MatmulCtx &ctx = kept ? *kept : own;
    ctx.keep_prep = keep_prep;
    for (int64_t n_tok : {1, 2, 4, 5, 7, 8, 9, 16, 17, 40}) {
        const auto x = gaussian(size_t(in * n_tok), 1.f, rng);
        const int64_t y_stride = out + 3;
        std::vector<float> y(size_t(y_stride * n_tok), NAN);
        matmul(ctx, w, x.data(), n_tok, in, y.data(), y_stride);
        std::vector<uint8_t> xq(xrow);
        for (int64_t k = 0; k < n_tok; ++k) {
            quant::quantize_activation(t, &x[size_t(k * in)], xq.data(), in);
            for (int64_t r = 0; r < out; ++r) {
                const float d = quant::vec_dot(t, &wq[size_t(r) * row], xq.data(), in);
                const float got = y[size_t(k * y_stride + r)];
                ASSERT_EQ(std::memcmp(&got, &d, 4), 0) << n_tok << " tokens, token " << k << " row " << r << ": "
                                                       << got << " vs " << d;
            }
        }
    }
}

TEST(Matmul, Q8_0ProductsEqualOnePairDotsForEveryTokenCount) {
    std::mt19937 rng(41);
    expect_products_equal_one_pair_dots(gguf::Type::Q8_0, rng);
}

// A batched step keeps a dense Q8_0 matrix's row prep in its context (worked out at the
// first packed product, then reused): the same bits, and only where the packed tile runs.
TEST(Matmul, Q8_0ProductsWithAKeptRowPrepEqualOnePairDots) {
    std::mt19937 rng(47);
    ThreadPool pool(2);
    MatmulCtx ctx(pool);
    expect_products_equal_one_pair_dots(gguf::Type::Q8_0, rng, true, true, &ctx);
    const uint64_t per_row = quant::tile_prep_row_bytes(gguf::Type::Q8_0, 4096);
    EXPECT_EQ(ctx.prep_bytes, per_row * 204);   // one matrix (rows in pairs), kept once (0 without AVX-512 VNNI)
    EXPECT_EQ(ctx.preps.size(), per_row ? 1u : 0u);
    // A view of the first rows of another matrix keeps a shorter prep under the same
    // address; the whole matrix after it must not read past it (the same bits again).
    {
        const int64_t in = 4096, out = 203;
        const auto wf = gaussian(size_t(in * out), 0.05f, rng);
        const size_t row = size_t(gguf::row_bytes(gguf::Type::Q8_0, in));
        std::vector<uint8_t> wq(row * size_t(out));
        for (int64_t r = 0; r < out; ++r) quant::quantize_row(gguf::Type::Q8_0, &wf[size_t(r * in)], &wq[size_t(r) * row], in);
        WeightView w;
        w.type = gguf::Type::Q8_0;
        w.in = in;
        w.out = out;
        w.data = wq.data();
        w.row_bytes = row;
        w.dense = true;
        MatmulCtx ctx3(pool);
        ctx3.keep_prep = true;
        const auto x = gaussian(size_t(in * 8), 1.f, rng);
        std::vector<float> part(size_t(out) * 8), whole(size_t(out) * 8), plain(size_t(out) * 8);
        matmul(ctx3, w.rows(0, 37), x.data(), 8, in, part.data(), out);
        matmul(ctx3, w, x.data(), 8, in, whole.data(), out);
        EXPECT_EQ(ctx3.prep_bytes, quant::tile_prep_bytes(gguf::Type::Q8_0, in, out));
        MatmulCtx ctx4(pool);
        matmul(ctx4, w, x.data(), 8, in, plain.data(), out);
        ASSERT_EQ(std::memcmp(whole.data(), plain.data(), whole.size() * sizeof(float)), 0);
        for (int64_t t = 0; t < 8; ++t)
            ASSERT_EQ(std::memcmp(&part[size_t(t * out)], &plain[size_t(t * out)], 37 * sizeof(float)), 0);
    }
    // A routed expert's matrix (not dense) is not kept.
    MatmulCtx ctx2(pool);
    expect_products_equal_one_pair_dots(gguf::Type::Q8_0, rng, true, false, &ctx2);
    EXPECT_EQ(ctx2.prep_bytes, 0u);
}

// IQ2_XXS takes the packed (transposed) path on AVX-512 VBMI for every token count.
TEST(Matmul, Iq2XxsProductsEqualOnePairDotsForEveryTokenCount) {
    std::mt19937 rng(43);
    expect_products_equal_one_pair_dots(gguf::Type::IQ2_XXS, rng);
}

}  // namespace
}  // namespace ds4
