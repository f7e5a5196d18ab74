// matmul against the one-pair dot: whatever path a product takes (one token, the 4-column
// tile, the packed Q8_0 tile with its activations repacked once and split over threads,
// the narrow layout for batched decode, IQ2_XXS with transposed activations), every output
// is vec_dot of its row and token, bit for bit. So a session's tokens do not depend on the batch or chunk they ran in.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <initializer_list>
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

// Products of an in x out weight of type t for many token counts, each output equal to its
// one-pair vec_dot bit for bit. The default: 4096 wide (large enough for the pool and the row
// blocks), 203 rows (a row block and a 4-row step with remainders).
void expect_products_equal_one_pair_dots(gguf::Type t, std::mt19937 &rng, int64_t in = 4096, int64_t out = 203,
                                         std::initializer_list<int64_t> n_toks = {1, 2, 4, 5, 7, 8, 9, 16, 17, 32,
                                                                                  33, 40, 48, 50},
                                         int threads = 2) {
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
    ThreadPool pool(threads);
    MatmulCtx ctx(pool);
    // by default one to three 16-column groups at a time, the last part-filled or full
    for (int64_t n_tok : n_toks) {
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
                ASSERT_EQ(std::memcmp(&got, &d, 4), 0) << "in " << in << ", " << n_tok << " tokens, token " << k
                                                       << " row " << r << ": " << got << " vs " << d;
            }
        }
    }
}

// Plain types take the chunked tile (quant::vec_dot_tile) a row block at a time.
TEST(Matmul, PlainProductsEqualOnePairDotsForEveryTokenCount) {
    std::mt19937 rng(43);
    for (gguf::Type t : {gguf::Type::F32, gguf::Type::F16, gguf::Type::BF16}) expect_products_equal_one_pair_dots(t, rng);
}

TEST(Matmul, Q8_0ProductsEqualOnePairDotsForEveryTokenCount) {
    std::mt19937 rng(41);
    expect_products_equal_one_pair_dots(gguf::Type::Q8_0, rng);
}

// On a one-thread pool (a routed expert on its lane of a prefill step) the rows tile's
// column counts (9 to 28 on AVX-512 VNNI) take the whole matrix in one run, written in place.
TEST(Matmul, Q8_0ProductsOnOneThreadEqualOnePairDots) {
    std::mt19937 rng(47);
    expect_products_equal_one_pair_dots(gguf::Type::Q8_0, rng, 4096, 203, {1, 8, 9, 17, 24, 28, 29}, 1);
    expect_products_equal_one_pair_dots(gguf::Type::Q8_0, rng, 2048, 301, {12, 28}, 1);
}

// A few long rows of a plain type (the hyper-connection mix) split the tokens over the pool
// and cut the rows into chunks (quant::vec_dot_tile's plain path): the same bits.
TEST(Matmul, FewLongPlainRowsEqualOnePairDots) {
    std::mt19937 rng(59);
    for (gguf::Type t : {gguf::Type::F32, gguf::Type::BF16})
        for (int64_t in : {int64_t(4096 + 32 + 8 + 1), int64_t(1024)})   // 1024: the default model's mixes
            expect_products_equal_one_pair_dots(t, rng, in, 24, {1, 7, 8, 9, 40, 256});
}

// IQ2_XXS takes the packed (transposed) path on AVX-512 VBMI for every token count.
TEST(Matmul, Iq2XxsProductsEqualOnePairDotsForEveryTokenCount) {
    std::mt19937 rng(43);
    expect_products_equal_one_pair_dots(gguf::Type::IQ2_XXS, rng);
}

}  // namespace
}  // namespace ds4
