// Products of f32 activations with weights of any type -- the path of F32 / F16 / BF16
// weights; block-quantised weights take cuda_qmatmul.cu's integer path, as the CPU does,
// unless DS4_CUDA_F32_ACTIVATIONS asks for this one (comparisons) -- and row decoding of any
// weight type (embedding lookups). Each
// warp owns one output row and walks it in chunks of 8 consecutive elements (always inside one
// block of any supported format), decoding them in registers and applying them to a tile
// of up to 8 tokens; grid.y walks the token tiles. Decode (one token) is therefore one
// pass over the weights at full width. Prefill re-reads each row once per 8 tokens (from
// L2 when it fits); the tensor-core path for long chunks is separate work.
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/cuda_check.h"
#include "cuda/cuda_launch.cuh"
#include "cuda/cuda_kernels.h"
#include "engine/quant/blocks.h"
#include "engine/quant/iq2xxs_tables.h"

namespace ds4::cuda {

namespace {

__constant__ uint64_t c_iq2xxs_grid[256];

__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ uint16_t ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

// Elements [8c, 8c + 8) of a row.
template <int T> __device__ __forceinline__ void deq8(const uint8_t *row, int64_t c, float *w);

template <> __device__ __forceinline__ void deq8<0>(const uint8_t *row, int64_t c, float *w) {   // F32
    const float4 *p = reinterpret_cast<const float4 *>(row) + 2 * c;
    const float4 a = p[0], b = p[1];
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
}

template <> __device__ __forceinline__ void deq8<1>(const uint8_t *row, int64_t c, float *w) {   // F16
    const uint4 v = reinterpret_cast<const uint4 *>(row)[c];
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) w[2 * i] = h2f(u[i] & 0xFFFF), w[2 * i + 1] = h2f(u[i] >> 16);
}

template <> __device__ __forceinline__ void deq8<30>(const uint8_t *row, int64_t c, float *w) {  // BF16
    const uint4 v = reinterpret_cast<const uint4 *>(row)[c];
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) w[2 * i] = bf2f(u[i] & 0xFFFF), w[2 * i + 1] = bf2f(u[i] >> 16);
}

template <> __device__ __forceinline__ void deq8<8>(const uint8_t *row, int64_t c, float *w) {   // Q8_0
    const uint8_t *b = row + (c >> 2) * sizeof(quant::BlockQ8_0);
    const float d = h2f(ld16(b));
    const int8_t *q = reinterpret_cast<const int8_t *>(b + 2) + (c & 3) * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = d * (float)q[i];
}

template <> __device__ __forceinline__ void deq8<10>(const uint8_t *row, int64_t c, float *w) {  // Q2_K
    const quant::BlockQ2_K *b = reinterpret_cast<const quant::BlockQ2_K *>(row) + (c >> 5);
    const int e0 = (int)(c & 31) * 8, half = e0 >> 7, r = e0 & 127, shift = 2 * (r >> 5), l0 = r & 31;
    const uint8_t sc = b->scales[e0 >> 4];
    const float dl = h2f(b->d) * (float)(sc & 15), ml = h2f(b->dmin) * (float)(sc >> 4);
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = dl * (float)((b->qs[32 * half + l0 + i] >> shift) & 3) - ml;
}

template <> __device__ __forceinline__ void deq8<12>(const uint8_t *row, int64_t c, float *w) {  // Q4_K
    const quant::BlockQ4_K *b = reinterpret_cast<const quant::BlockQ4_K *>(row) + (c >> 5);
    const int e0 = (int)(c & 31) * 8, chunk = e0 >> 6, r = e0 & 63, hi = r >> 5, l0 = r & 31, j = e0 >> 5;
    const uint8_t *s = b->scales;
    uint8_t sc, m;
    if (j < 4) {
        sc = s[j] & 63, m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    const float dl = h2f(b->d) * (float)sc, ml = h2f(b->dmin) * (float)m;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const uint8_t byte = b->qs[32 * chunk + l0 + i];
        w[i] = dl * (float)(hi ? byte >> 4 : byte & 15) - ml;
    }
}

template <> __device__ __forceinline__ void deq8<16>(const uint8_t *row, int64_t c, float *w) {  // IQ2_XXS
    const quant::BlockIQ2_XXS *b = reinterpret_cast<const quant::BlockIQ2_XXS *>(row) + (c >> 5);
    const int e0 = (int)(c & 31) * 8, g = e0 >> 5, l = (e0 & 31) >> 3;
    const uint32_t a0 = b->qs[4 * g] | ((uint32_t)b->qs[4 * g + 1] << 16);
    const uint32_t a1 = b->qs[4 * g + 2] | ((uint32_t)b->qs[4 * g + 3] << 16);
    const uint64_t grid = c_iq2xxs_grid[(a0 >> (8 * l)) & 255];
    uint32_t s7 = (a1 >> (7 * l)) & 127;
    const uint32_t signs = s7 | ((__popc(s7) & 1u) << 7);
    const float db = h2f(b->d) * (0.5f + (float)(a1 >> 28)) * 0.25f;
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = db * (float)((grid >> (8 * i)) & 255) * ((signs >> i) & 1 ? -1.f : 1.f);
}

constexpr int kTileTok = 8, kWarps = 4;

// NT: the tile (1 for a one-token product: its chunk loop is unrolled so the loads of four
// chunks go out together; the sums keep chunk order either way).
template <int T, int NT = kTileTok>
__global__ void __launch_bounds__(32 * kWarps) matmul_kernel(const uint8_t *__restrict__ w, int64_t in, int64_t out,
                                                             uint64_t row_bytes, const float *__restrict__ x, int64_t n_tok,
                                                             int64_t x_stride, float *__restrict__ y, int64_t y_stride) {
    const int lane = threadIdx.x & 31;
    const int64_t o = (int64_t)blockIdx.x * kWarps + (threadIdx.x >> 5);
    const uint8_t *row = w + (uint64_t)o * row_bytes;
    if (NT == 1 && o < out) prefetch_l2(row, row_bytes, lane, 32);   // before waiting: weights never change
    pdl_enter();
    if (o >= out) return;
    const int64_t t0 = (int64_t)blockIdx.y * NT;
    const int nt = (int)(n_tok - t0 < NT ? n_tok - t0 : NT);
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = 0.f;
    const int64_t chunks = in >> 3;
#pragma unroll(NT == 1 ? 4 : 1)
    for (int64_t c = lane; c < chunks; c += 32) {
        float wv[8];
        deq8<T>(row, c, wv);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            if (t < nt) {
                const float *xr = x + (t0 + t) * x_stride + 8 * c;
                float s = 0.f;
#pragma unroll
                for (int i = 0; i < 8; ++i) s = fmaf(wv[i], xr[i], s);
                acc[t] += s;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        float v = acc[t];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0 && t < nt) y[(t0 + t) * y_stride + o] = v;
    }
}

// Few output rows and long input rows (hyper-connection mixes, routers, compressor gates at
// decode): a warp per row would leave most of the GPU idle while each warp walks the whole
// input, so a block of kSplitWarps warps splits each row's input and sums in shared memory.
// One or two products over the same activations in one launch: blocks [0, b0) take the first
// matrix, the rest the second (a decode step's compressor kv and gate).
constexpr int kSplitWarps = 8;
inline bool split_rows(int64_t in, int64_t out, int64_t tiles) { return out * tiles < 2048 && in >= 2048; }
struct SplitPair {
    const uint8_t *w[2];
    uint64_t rb[2];
    float *y[2];
    unsigned b0;
};
template <int T, int NT = kTileTok>
__global__ void __launch_bounds__(32 * kSplitWarps) matmul_split_kernel(SplitPair p, int64_t in, const float *__restrict__ x,
                                                                       int64_t n_tok, int64_t x_stride, int64_t y_stride) {
    const int m = blockIdx.x >= p.b0;
    // selects, not p.w[m]: a kernel parameter indexed at run time goes through local memory
    const int64_t o = blockIdx.x - (m ? p.b0 : 0);
    const uint64_t row_bytes = m ? p.rb[1] : p.rb[0];
    const uint8_t *row = (m ? p.w[1] : p.w[0]) + (uint64_t)o * row_bytes;
    float *y = m ? p.y[1] : p.y[0];
    if (NT == 1) prefetch_l2(row, row_bytes, threadIdx.x, 32 * kSplitWarps);   // before waiting: weights never change
    pdl_enter();
    __shared__ float part[kSplitWarps][NT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t t0 = (int64_t)blockIdx.y * NT;
    const int nt = (int)(n_tok - t0 < NT ? n_tok - t0 : NT);
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = 0.f;
    const int64_t chunks = in >> 3;
#pragma unroll(NT == 1 ? 4 : 1)
    for (int64_t c = threadIdx.x; c < chunks; c += 32 * kSplitWarps) {
        float wv[8];
        deq8<T>(row, c, wv);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            if (t < nt) {
                const float *xr = x + (t0 + t) * x_stride + 8 * c;
                float s = 0.f;
#pragma unroll
                for (int i = 0; i < 8; ++i) s = fmaf(wv[i], xr[i], s);
                acc[t] += s;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        float v = acc[t];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0) part[warp][t] = v;
    }
    __syncthreads();
    if (threadIdx.x < nt) {
        float v = 0.f;
        for (int k = 0; k < kSplitWarps; ++k) v += part[k][threadIdx.x];
        y[(t0 + threadIdx.x) * y_stride + o] = v;
    }
}

// y[t][o] = W[o] . rmsnorm(x[t]) (unit weight) for one-token rows: the hyper-connection mix
// of a decode step, where the norm of the 16384-wide stream row was a kernel of its own on
// one SM. Block (o, t) takes the row's sum of squares in the pass that takes the dot
// (x is read from L2 by every block; it is 64 KB), and scales the dot once:
// (W . x) * inv for W . (x * inv) -- equal up to rounding, as in any reordered sum.
template <int T>
__global__ void __launch_bounds__(32 * kSplitWarps) matmul_rms_kernel(const uint8_t *__restrict__ w, int64_t in, uint64_t row_bytes,
                                                                      const float *__restrict__ x, int64_t x_stride, float eps,
                                                                      float *__restrict__ y, int64_t y_stride) {
    const int64_t o = blockIdx.x, t = blockIdx.y;
    const uint8_t *row = w + (uint64_t)o * row_bytes;
    if (t == 0) prefetch_l2(row, row_bytes, threadIdx.x, 32 * kSplitWarps);
    pdl_enter();
    __shared__ float part[kSplitWarps];
    __shared__ double part_ss[kSplitWarps];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float *xr = x + t * x_stride;
    float acc = 0.f;
    double ss = 0;
    const int64_t chunks = in >> 3;
#pragma unroll 4
    for (int64_t c = threadIdx.x; c < chunks; c += 32 * kSplitWarps) {
        float wv[8];
        deq8<T>(row, c, wv);
        const float4 a = reinterpret_cast<const float4 *>(xr)[2 * c], b = reinterpret_cast<const float4 *>(xr)[2 * c + 1];
        const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) s = fmaf(wv[i], xv[i], s), ss += (double)xv[i] * xv[i];
        acc += s;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off), ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if (lane == 0) part[warp] = acc, part_ss[warp] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        float v = 0.f;
        double q = 0;
        for (int k = 0; k < kSplitWarps; ++k) v += part[k], q += part_ss[k];
        y[t * y_stride + o] = v * (float)(1.0 / sqrt(q / (double)in + (double)eps));
    }
}

// One row of a weight (embedding lookup), decoded to f32.
template <int T>
__global__ void dequant_rows_kernel(const uint8_t *__restrict__ w, uint64_t row_bytes, int64_t n, const int32_t *__restrict__ ids,
                                    float *__restrict__ out, int64_t out_stride) {
    pdl_enter();
    const int64_t r = blockIdx.x;
    const uint8_t *row = w + (uint64_t)ids[r] * row_bytes;
    for (int64_t c = threadIdx.x; c < (n >> 3); c += blockDim.x) {
        float v[8];
        deq8<T>(row, c, v);
#pragma unroll
        for (int i = 0; i < 8; ++i) out[r * out_stride + 8 * c + i] = v[i];
    }
}

template <template <int> class F, class... A>
void by_type(gguf::Type t, A &&...a) {
    switch (t) {
    case gguf::Type::F32: F<0>::run(a...); return;
    case gguf::Type::F16: F<1>::run(a...); return;
    case gguf::Type::BF16: F<30>::run(a...); return;
    case gguf::Type::Q8_0: F<8>::run(a...); return;
    case gguf::Type::Q2_K: F<10>::run(a...); return;
    case gguf::Type::Q4_K: F<12>::run(a...); return;
    case gguf::Type::IQ2_XXS: F<16>::run(a...); return;
    default: failf("CUDA backend: tensor type %s is not supported", gguf::type_name(t));
    }
}

template <int T> struct MatmulLaunch {
    static void run(cudaStream_t s, const uint8_t *w, int64_t in, int64_t out, uint64_t rb, const float *x, int64_t n_tok,
                    int64_t xs, float *y, int64_t ys) {
        const unsigned tiles = (unsigned)((n_tok + kTileTok - 1) / kTileTok);
        const bool one = n_tok == 1;
        if (split_rows(in, out, tiles)) {
            const SplitPair p{{w, w}, {rb, rb}, {y, y}, (unsigned)out};
            const dim3 grid((unsigned)out, tiles);
            if (one) launch_pdl(matmul_split_kernel<T, 1>, grid, 32 * kSplitWarps, 0, s, p, in, x, n_tok, xs, ys);
            else launch_pdl(matmul_split_kernel<T>, grid, 32 * kSplitWarps, 0, s, p, in, x, n_tok, xs, ys);
        } else {
            const dim3 grid((unsigned)((out + kWarps - 1) / kWarps), tiles);
            if (one) launch_pdl(matmul_kernel<T, 1>, grid, 32 * kWarps, 0, s, w, in, out, rb, x, n_tok, xs, y, ys);
            else launch_pdl(matmul_kernel<T>, grid, 32 * kWarps, 0, s, w, in, out, rb, x, n_tok, xs, y, ys);
        }
        DS4_CUDA_LAUNCHED();
    }
};

template <int T> struct MatmulPairLaunch {
    static void run(cudaStream_t s, const SplitPair &p, int64_t in, int64_t out_total, const float *x) {
        launch_pdl(matmul_split_kernel<T, 1>, dim3((unsigned)out_total, 1), 32 * kSplitWarps, 0, s, p, in, x, (int64_t)1, in, (int64_t)0);
        DS4_CUDA_LAUNCHED();
    }
};

template <int T> struct MatmulRmsLaunch {
    static void run(cudaStream_t s, const uint8_t *w, int64_t in, int64_t out, uint64_t rb, const float *x, int64_t n_tok,
                    int64_t xs, float eps, float *y, int64_t ys) {
        launch_pdl(matmul_rms_kernel<T>, dim3((unsigned)out, (unsigned)n_tok), 32 * kSplitWarps, 0, s, w, in, rb, x, xs, eps, y, ys);
        DS4_CUDA_LAUNCHED();
    }
};

template <int T> struct DequantLaunch {
    static void run(cudaStream_t s, const uint8_t *w, uint64_t rb, int64_t n, const int32_t *ids, int64_t rows, float *out,
                    int64_t os) {
        launch_pdl(dequant_rows_kernel<T>, (unsigned)rows, 128, 0, s, w, rb, n, ids, out, os);
        DS4_CUDA_LAUNCHED();
    }
};

}  // namespace

void init_quant_tables() {
    DS4_CUDA_CHECK(cudaMemcpyToSymbol(c_iq2xxs_grid, quant::kIq2xxsGrid, sizeof(c_iq2xxs_grid)));
}

void matmul(cudaStream_t s, gguf::Type type, const void *w, int64_t in, int64_t out, uint64_t row_bytes, const float *x,
            int64_t n_tok, int64_t x_stride, float *y, int64_t y_stride) {
    if (n_tok <= 0 || out <= 0) return;
    if (in % 8) failf("CUDA backend: rows of %lld elements are not a multiple of 8", (long long)in);
    if (type == gguf::Type::F16 && matmul_f16_mma(s, w, in, out, row_bytes, x, n_tok, x_stride, y, y_stride)) return;
    by_type<MatmulLaunch>(type, s, static_cast<const uint8_t *>(w), in, out, row_bytes, x, n_tok, x_stride, y, y_stride);
}

bool matmul_pair(cudaStream_t s, gguf::Type type, int64_t in, const void *w0, int64_t out0, uint64_t rb0, float *y0, const void *w1,
                 int64_t out1, uint64_t rb1, float *y1, const float *x) {
    if (out0 <= 0 || out1 <= 0 || in % 8 || !split_rows(in, out0, 1) || !split_rows(in, out1, 1)) return false;
    const SplitPair p{{static_cast<const uint8_t *>(w0), static_cast<const uint8_t *>(w1)}, {rb0, rb1}, {y0, y1}, (unsigned)out0};
    by_type<MatmulPairLaunch>(type, s, p, in, out0 + out1, x);
    return true;
}

bool matmul_rms(cudaStream_t s, gguf::Type type, const void *w, int64_t in, int64_t out, uint64_t row_bytes, const float *x,
                int64_t n_tok, int64_t x_stride, float eps, float *y, int64_t y_stride) {
    using gguf::Type;
    if (n_tok <= 0 || out <= 0) return true;
    if (n_tok >= kMmaMinTokens || in % 8 || x_stride % 4 || (uintptr_t)x % 16) return false;   // the products' own boundary
    const auto *wp = static_cast<const uint8_t *>(w);
    switch (type) {
    case Type::F32: MatmulRmsLaunch<0>::run(s, wp, in, out, row_bytes, x, n_tok, x_stride, eps, y, y_stride); return true;
    case Type::F16: MatmulRmsLaunch<1>::run(s, wp, in, out, row_bytes, x, n_tok, x_stride, eps, y, y_stride); return true;
    case Type::BF16: MatmulRmsLaunch<30>::run(s, wp, in, out, row_bytes, x, n_tok, x_stride, eps, y, y_stride); return true;
    default: return false;
    }
}

void dequant_rows(cudaStream_t s, gguf::Type type, const void *w, uint64_t row_bytes, int64_t n, const int32_t *ids,
                  int64_t rows, float *out, int64_t out_stride) {
    if (rows <= 0) return;
    if (n % 8) failf("CUDA backend: rows of %lld elements are not a multiple of 8", (long long)n);
    by_type<DequantLaunch>(type, s, static_cast<const uint8_t *>(w), row_bytes, n, ids, rows, out, out_stride);
}

}  // namespace ds4::cuda
