// matmul against the one-pair dot: whatever path a product takes (one token, the 4-column
// tile, the packed Q8_0 tile with its activations repacked once and split over threads,
// the narrow layout for batched decode), every output is vec_dot of its row and token, bit
// for bit. So a session's tokens do not depend on the batch or chunk they ran in.
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

TEST(Matmul, Q8_0ProductsEqualOnePairDotsForEveryTokenCount) {
    std::mt19937 rng(41);
    // 4096 wide so products are large enough for the pool and the row blocks; 203 rows
    // leave a row block and a 4-row step with remainders.
    const int64_t in = 4096, out = 203;
    const auto wf = gaussian(size_t(in * out), 0.05f, rng);
    const size_t row = size_t(quant::vec_dot_row_bytes(gguf::Type::Q8_0, in));
    std::vector<uint8_t> wq(row * size_t(out));
    for (int64_t r = 0; r < out; ++r)
        quant::quantize_row(gguf::Type::Q8_0, &wf[size_t(r * in)], &wq[size_t(r) * row], in);
    WeightView w;
    w.type = gguf::Type::Q8_0;
    w.in = in;
    w.out = out;
    w.data = wq.data();
    w.row_bytes = row;
    ThreadPool pool(2);
    MatmulCtx ctx(pool);
    for (int64_t n_tok : {1, 2, 4, 5, 7, 8, 9, 16, 17, 40}) {
        const auto x = gaussian(size_t(in * n_tok), 1.f, rng);
        const int64_t y_stride = out + 3;
        std::vector<float> y(size_t(y_stride * n_tok), NAN);
        matmul(ctx, w, x.data(), n_tok, in, y.data(), y_stride);
        std::vector<uint8_t> xq(row);
        for (int64_t t = 0; t < n_tok; ++t) {
            quant::quantize_activation(gguf::Type::Q8_0, &x[size_t(t * in)], xq.data(), in);
            for (int64_t r = 0; r < out; ++r) {
                const float d = quant::vec_dot(gguf::Type::Q8_0, &wq[size_t(r) * row], xq.data(), in);
                const float got = y[size_t(t * y_stride + r)];
                ASSERT_EQ(std::memcmp(&got, &d, 4), 0) << n_tok << " tokens, token " << t << " row " << r << ": "
                                                       << got << " vs " << d;
            }
        }
    }
}

}  // namespace
}  // namespace ds4
