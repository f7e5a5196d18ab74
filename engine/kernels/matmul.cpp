#include "engine/kernels/matmul.h"

#include <algorithm>

#include "engine/common/error.h"
#include "engine/quant/quants.h"

namespace ds4 {

WeightView WeightView::rows(int64_t r0, int64_t n) const {
    WeightView v = *this;
    v.data = data + (uint64_t)r0 * row_bytes;
    v.out = n;
    return v;
}

WeightView ExpertsView::expert(int64_t e) const {
    WeightView v = first;
    v.data = first.data + (uint64_t)e * expert_bytes;
    return v;
}

uint64_t quantize_rows(ThreadPool &pool, gguf::Type t, const float *x, int64_t n_tok, int64_t x_stride, int64_t n,
                       quant::ScratchVector<uint8_t> &buf) {
    const uint64_t row = quant::vec_dot_row_bytes(t, n);
    if (buf.size() < row * n_tok) buf.resize(row * n_tok);
    uint8_t *dst = buf.data();
    if (n_tok == 1) {
        quant::quantize_activation(t, x, dst, n);
        return row;
    }
    pool.parallel_for(n_tok, 1, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) quant::quantize_activation(t, x + i * x_stride, dst + i * row, n);
    });
    return row;
}

void matmul_q(MatmulCtx &ctx, const WeightView &w, const uint8_t *xq, int64_t n_tok, uint64_t xq_row, float *y,
              int64_t y_stride) {
    ThreadPool &pool = ctx.pool;
    ctx.weight_bytes += w.bytes();
    // Small products are not worth waking the pool for.
    if (w.bytes() * (uint64_t)n_tok < (64u << 10)) {
        for (int64_t t = 0; t < n_tok; ++t)
            quant::vec_dot_rows(w.type, w.data, w.row_bytes, w.out, xq + t * xq_row, w.in, y + t * y_stride);
        return;
    }
    // Where the weight type has a packed kernel on this CPU (Q8_0 tiles on AVX-512 VNNI, or
    // on AVX2 from 8 rows; IQ2_XXS on VBMI), the activations are repacked once here, not once
    // per row block.
    const uint64_t pack_bytes = quant::tile_pack_bytes(w.type, w.in, n_tok);
    if (pack_bytes) {
        if (ctx.xpack.size() < pack_bytes) ctx.xpack.resize(pack_bytes);
        const int64_t groups = quant::tile_pack_groups(w.type, n_tok);
        if (groups == 1)
            quant::tile_pack(w.type, xq, xq_row, n_tok, w.in, 0, 1, ctx.xpack.data());
        else
            pool.parallel_for(groups, 1, [&](int64_t b, int64_t e, int) {
                quant::tile_pack(w.type, xq, xq_row, n_tok, w.in, b, e, ctx.xpack.data());
            });
    }
    if (n_tok == 1) {
        // Rows in blocks of 16 so each thread streams long contiguous runs of weights.
        pool.parallel_for(w.out, 16, [&](int64_t b, int64_t e, int) {
            if (pack_bytes)
                quant::vec_dot_tile_packed(w.type, w.row(b), w.row_bytes, e - b, ctx.xpack.data(), 1, w.in, y + b, 1);
            else
                quant::vec_dot_rows(w.type, w.row(b), w.row_bytes, e - b, xq, w.in, y + b);
        });
        return;
    }
    // A few long rows of a plain type (the hyper-connection mixes, 24 x 16384 f32; 24 x 1024 in
    // the default model, which by row blocks ran on one thread: 0.17 -> 0.09 ms): the tokens
    // split over the pool and the rows cut into chunks, so each token's activations are read
    // once (by row blocks of 4 rows every token was read 6 times: 2.5 ms a mix of a 256-row
    // flash-shape step on 2 Zen 5 cores).
    if (!pack_bytes && w.out <= 64 && w.in >= 1024 && n_tok >= 8 && quant::vec_dot_type(w.type) == gguf::Type::F32) {
        pool.parallel_for(n_tok, std::max<int64_t>(4, n_tok / (2 * pool.size())), [&](int64_t b, int64_t e, int) {
            quant::vec_dot_tile(w.type, w.data, w.row_bytes, w.out, xq + b * xq_row, xq_row, e - b, w.in,
                                y + b * y_stride, (size_t)y_stride);
        });
        return;
    }
    // Row blocks sized to stay in L2 (~256 KB of weights) while all tokens pass over them
    // (vec_dot_tile takes plain types by the chunked tile: a 4096 x 4096 f32 matrix against
    // 256 rows ran in 57 ms on two Zen 5 cores, by dot_plain four columns at a time in 111).
    int64_t block;
    if (pack_bytes && quant::tile_streams_rows(w.type, n_tok)) {
        // A tile that streams its rows (the Q8_0 rows tile, a prefill step's routed experts)
        // takes them in a few long runs: the whole matrix on a one-thread pool (an expert on
        // its lane), four runs a thread otherwise, so a descheduled worker's share is picked
        // up by the others. In 60-row blocks its prefetch of the next rows stopped at each.
        const int64_t runs = pool.size() == 1 ? 1 : 4 * (int64_t)pool.size();
        block = std::max<int64_t>(32, ((w.out + runs - 1) / runs + 31) / 32 * 32);
    } else {
        block = std::max<int64_t>(4, (int64_t)((256 * 1024) / std::max<uint64_t>(1, w.row_bytes)));
        block = std::min<int64_t>(block, 256) / 4 * 4;
    }
    const int64_t n_blocks = (w.out + block - 1) / block;
    pool.parallel_for(n_blocks, 1, [&](int64_t b, int64_t e, int) {
        for (int64_t bi = b; bi < e; ++bi) {
            const int64_t r0 = bi * block, nr = std::min(block, w.out - r0);
            if (pack_bytes)
                quant::vec_dot_tile_packed(w.type, w.row(r0), w.row_bytes, nr, ctx.xpack.data(), n_tok, w.in, y + r0,
                                           (size_t)y_stride);
            else
                quant::vec_dot_tile(w.type, w.row(r0), w.row_bytes, nr, xq, xq_row, n_tok, w.in, y + r0,
                                    (size_t)y_stride);
        }
    });
}

void matmul(MatmulCtx &ctx, const WeightView &w, const float *x, int64_t n_tok, int64_t x_stride, float *y,
            int64_t y_stride) {
    if (w.empty()) fail("matmul: weight not bound");
    // F32 / F16 / BF16 weights take f32 activations as they are: quantising would copy them
    // (the hyper-connection mix: 16 MB for a 256-row step, twice a layer).
    if (quant::vec_dot_type(w.type) == gguf::Type::F32) {
        matmul_q(ctx, w, reinterpret_cast<const uint8_t *>(x), n_tok, (uint64_t)x_stride * sizeof(float), y, y_stride);
        return;
    }
    const uint64_t row = quantize_rows(ctx.pool, w.type, x, n_tok, x_stride, w.in, ctx.xq);
    matmul_q(ctx, w, ctx.xq.data(), n_tok, row, y, y_stride);
}

}  // namespace ds4
