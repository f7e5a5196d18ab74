// Matrix products against GGUF weights, in whatever format the weights are stored
// (dequantised on the fly, never copied to f32 as a whole).
//
// A weight W has ne = [in, out]: `out` rows of `in` elements; y = W x for each token.
// Decode (one token) splits the rows over the thread pool; prefill (many tokens) walks the
// rows in blocks small enough to stay in cache while every token of the batch is applied
// to them, which turns the batch into matrix-matrix work.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/gguf/gguf.h"
#include "engine/kernels/threadpool.h"
#include "engine/quant/cache_aligned.h"

namespace ds4 {

struct WeightView {
    gguf::Type type = gguf::Type::F32;
    int64_t in = 0, out = 0;
    const uint8_t *data = nullptr;
    uint64_t row_bytes = 0;

    bool empty() const { return data == nullptr; }
    const uint8_t *row(int64_t r) const { return data + (uint64_t)r * row_bytes; }
    uint64_t bytes() const { return row_bytes * (uint64_t)out; }
    // Rows [r0, r0 + n) as their own matrix.
    WeightView rows(int64_t r0, int64_t n) const;
};

// Stacked experts: ne = [in, out, n_expert].
struct ExpertsView {
    WeightView first;   // expert 0
    int64_t n_expert = 0;
    uint64_t expert_bytes = 0;
    WeightView expert(int64_t e) const;
    bool empty() const { return first.empty(); }
};

// What products need besides their operands: the pool to split over, scratch for the
// quantised activations, and a count of weight bytes read (benchmarks: bytes per token).
// One per executor, so no kernel keeps process-wide mutable state.
struct MatmulCtx {
    explicit MatmulCtx(ThreadPool &p) : pool(p) {}
    ThreadPool &pool;
    quant::ScratchVector<uint8_t> xq;
    quant::ScratchVector<uint8_t> xpack;   // activations repacked for a packed tile (quant::tile_pack)
    uint64_t weight_bytes = 0;
};

// y[t * y_stride + o] = sum_i W[o, i] * x[t * x_stride + i] for t < n_tok.
void matmul(MatmulCtx &ctx, const WeightView &w, const float *x, int64_t n_tok, int64_t x_stride, float *y,
            int64_t y_stride);

// Same, but for activations already quantised to quant::vec_dot_type(w.type) with row
// size xq_row (lets several weights of one type share one quantisation of x).
void matmul_q(MatmulCtx &ctx, const WeightView &w, const uint8_t *xq, int64_t n_tok, uint64_t xq_row, float *y,
              int64_t y_stride);

// Quantises n_tok rows of x for weights of type t into buf (resized); returns its row size.
uint64_t quantize_rows(ThreadPool &pool, gguf::Type t, const float *x, int64_t n_tok, int64_t x_stride, int64_t n,
                       quant::ScratchVector<uint8_t> &buf);

}  // namespace ds4
