// Integer products for block-quantised weights, matching the CPU engine (engine/quant): the
// activation rows are quantised once per input -- Q8_0 blocks of 32 for Q8_0 weights, Q8_K
// blocks of 256 with per-16 sums for Q2_K / Q4_K / IQ2_XXS -- with the CPU quantiser's exact
// arithmetic (same scale, same reciprocal, same rounding rule, same non-finite handling), so
// the int8 values and scales are bit-identical; the dots are then int8 x int8 dp4a with int32
// sums per sub-block, scaled like the CPU kernels. Only the order of the float sums differs.
//
// Layout of one quantised activation row (act_row_bytes): int8 q[n], float d[n / qk]
// (Q8_0: the f16 scale widened), int16 bsums[n / 16] (Q8_K only), padded to 16 bytes.
//
// The dot kernel: a warp per output row, each lane 8 consecutive elements per step (always
// inside one sub-block of any format, so one sub-scale), the warp covering 256 contiguous
// elements per step (coalesced weight reads); the weight chunk is decoded once into two
// int8x4 words for a tile of up to 8 tokens (grid.y walks the tiles; a one-token product
// is compiled apart, with a tile of 1).
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/cuda_check.h"
#include "cuda/cuda_kernels.h"
#include "engine/common/error.h"
#include "engine/quant/blocks.h"
#include "engine/quant/iq2xxs_tables.h"

namespace ds4::cuda {

namespace {

using gguf::Type;

__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t ld16(const uint8_t *p) { return *reinterpret_cast<const uint16_t *>(p); }
__device__ __forceinline__ uint32_t ld32(const uint8_t *p) { return *reinterpret_cast<const uint32_t *>(p); }
// A 32-bit word at a 2-byte aligned address.
__device__ __forceinline__ uint32_t ld32_2(const uint8_t *p) { return (uint32_t)ld16(p) | ((uint32_t)ld16(p + 2) << 16); }

// ---------------------------------------------------------------------------------------
// Activation quantisation. Lane l of a warp holds elements [8l, 8l + 8) of a 256-element
// span; a block is QK / 8 lanes, whose amax is a shuffle max (exact in any order).

template <int QK>
__global__ void __launch_bounds__(128) quantize_kernel(const float *__restrict__ x, int64_t xs, int64_t n,
                                                       uint8_t *__restrict__ q, uint64_t qrow) {
    constexpr int G = QK / 8;   // lanes per block
    const int lane = threadIdx.x & 31;
    const int64_t c = ((int64_t)blockIdx.x * 4 + (threadIdx.x >> 5)) * 32 + lane;   // chunk of 8
    const bool in = 8 * c < n;   // n is a multiple of QK, so a block's lanes agree
    const int64_t t = blockIdx.y;
    const float *xr = x + t * xs + 8 * c;
    float v[8];
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        v[i] = in ? xr[i] : 0.f;
        if (isfinite(v[i])) amax = fmaxf(amax, fabsf(v[i]));
    }
#pragma unroll
    for (int off = 1; off < G; off <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    uint8_t *row = q + t * qrow;
    int8_t r[8];
    if (QK == 32) {
        // As quant_q8_0: d = amax / 127 (stored as f16), q = round(x * (1 / d)) half away from
        // zero, non-finite x -> 0.
        const float d = amax / 127.f;
        const float id = d != 0.f ? 1.f / d : 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            float s = __fmul_rn(v[i], id);
            if (!isfinite(v[i]) || !(s == s)) {
                r[i] = 0;
                continue;
            }
            s = roundf(s);
            r[i] = (int8_t)(s > 127.f ? 127.f : (s < -127.f ? -127.f : s));
        }
        if (in && (lane % G) == 0)
            reinterpret_cast<float *>(row + n)[c / G] = __half2float(__float2half_rn(d));
    } else {
        // As quant_q8_k: id = 127 / amax, d = amax / 127 (f32), q = nearbyint(x * id) (ties to
        // even), a non-finite product -> 0; bsums over 16.
        const float id = amax > 0.f ? 127.f / amax : 0.f;
        const float d = amax / 127.f;
        int s16 = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            float s = __fmul_rn(v[i], id);
            s = isfinite(s) ? rintf(s) : 0.f;
            r[i] = (int8_t)(s > 127.f ? 127.f : (s < -127.f ? -127.f : s));
            s16 += r[i];
        }
        s16 += __shfl_xor_sync(0xffffffffu, s16, 1);
        if (in) {
            if (lane == 0) reinterpret_cast<float *>(row + n)[c / G] = d;
            if ((lane & 1) == 0) reinterpret_cast<int16_t *>(row + n + 4 * (n / QK))[c >> 1] = (int16_t)s16;
        }
    }
    if (in) {
        uint2 pk;
        pk.x = (uint32_t)(uint8_t)r[0] | ((uint32_t)(uint8_t)r[1] << 8) | ((uint32_t)(uint8_t)r[2] << 16) |
               ((uint32_t)(uint8_t)r[3] << 24);
        pk.y = (uint32_t)(uint8_t)r[4] | ((uint32_t)(uint8_t)r[5] << 8) | ((uint32_t)(uint8_t)r[6] << 16) |
               ((uint32_t)(uint8_t)r[7] << 24);
        reinterpret_cast<uint2 *>(row)[c] = pk;
    }
}

// ---------------------------------------------------------------------------------------
// Weight chunks: elements [8c, 8c + 8) of a row as two int8x4 words, the integer
// sub-block scale (multiplies the int dot), the min (Q2_K / Q4_K: multiplies the activation
// sum of the 16 elements [16 (c/2), 16 (c/2) + 16), taken by even chunks) and the float
// factors of the block.
struct Chunk {
    int w0, w1;
    int sc, mn;
    float d, dmin;
};

template <int T> struct Fmt;

template <> struct Fmt<8> {   // Q8_0 weights, Q8_0 activations
    static constexpr int kQK = 32;
    static constexpr int kAlign = 2;
    __device__ static __forceinline__ Chunk load(const uint8_t *row, int64_t c, const uint64_t *) {
        const uint8_t *b = row + (c >> 2) * sizeof(quant::BlockQ8_0);
        const uint8_t *qs = b + 2 + 8 * (c & 3);
        return {(int)ld32_2(qs), (int)ld32_2(qs + 4), 1, 0, h2f(ld16(b)), 0.f};
    }
};

template <> struct Fmt<12> {   // Q4_K
    static constexpr int kQK = 256;
    static constexpr int kAlign = 8;
    __device__ static __forceinline__ Chunk load(const uint8_t *row, int64_t c, const uint64_t *) {
        const uint8_t *b = row + (c >> 5) * sizeof(quant::BlockQ4_K);
        const int cc = (int)(c & 31), j = cc >> 2, hi = (cc >> 2) & 1;
        const uint2 q = *reinterpret_cast<const uint2 *>(b + 16 + 32 * (cc >> 3) + 8 * (cc & 3));
        const int sh = 4 * hi;
        const uint32_t dd = ld32(b);
        // the packed 6-bit scale and min of sub-block j (quant::q4k_scale_min)
        const uint8_t *s = b + 4;
        int sc, m;
        if (j < 4) {
            sc = s[j] & 63, m = s[j + 4] & 63;
        } else {
            sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
            m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        }
        return {(int)((q.x >> sh) & 0x0F0F0F0Fu), (int)((q.y >> sh) & 0x0F0F0F0Fu), sc, m, h2f(dd & 0xFFFF), h2f(dd >> 16)};
    }
};

template <> struct Fmt<10> {   // Q2_K
    static constexpr int kQK = 256;
    static constexpr int kAlign = 4;
    __device__ static __forceinline__ Chunk load(const uint8_t *row, int64_t c, const uint64_t *) {
        const uint8_t *b = row + (c >> 5) * sizeof(quant::BlockQ2_K);
        const int e0 = (int)(c & 31) * 8, half = e0 >> 7, r = e0 & 127, sh = 2 * (r >> 5), l0 = r & 31;
        const uint8_t *qs = b + 16 + 32 * half + l0;
        const uint8_t sc = b[e0 >> 4];
        const uint32_t dd = ld32(b + 80);
        return {(int)((ld32(qs) >> sh) & 0x03030303u), (int)((ld32(qs + 4) >> sh) & 0x03030303u), sc & 15, sc >> 4,
                h2f(dd & 0xFFFF), h2f(dd >> 16)};
    }
};

// 4 sign bits -> bytes of 0xFF (negative) or 0x00.
__device__ __forceinline__ uint32_t sign_mask4(uint32_t b) { return ((b * 0x00204081u) & 0x01010101u) * 0xFFu; }

template <> struct Fmt<16> {   // IQ2_XXS
    static constexpr int kQK = 256;
    static constexpr int kAlign = 2;
    __device__ static __forceinline__ Chunk load(const uint8_t *row, int64_t c, const uint64_t *grid) {
        const uint8_t *b = row + (c >> 5) * sizeof(quant::BlockIQ2_XXS);
        const int e0 = (int)(c & 31) * 8, g = e0 >> 5, l = (e0 & 31) >> 3;
        const uint8_t *qs = b + 2 + 8 * g;
        const uint32_t a1 = ld32_2(qs + 4);
        const uint64_t gv = grid[qs[l]];
        const uint32_t s7 = (a1 >> (7 * l)) & 127;
        const uint32_t s8 = s7 | ((__popc(s7) & 1u) << 7);
        const uint32_t m0 = sign_mask4(s8 & 15), m1 = sign_mask4(s8 >> 4);
        // per byte: (g ^ m) - m negates where m = 0xFF
        const uint32_t w0 = __vsub4((uint32_t)gv ^ m0, m0), w1 = __vsub4((uint32_t)(gv >> 32) ^ m1, m1);
        return {(int)w0, (int)w1, (int)(2 * (a1 >> 28) + 1), 0, h2f(ld16(b)), 0.f};
    }
};

constexpr int kWarps = 4;

// NT: tokens per tile (1 for decode, so the registers of a bigger tile do not cut occupancy).
template <int T, int NT>
__global__ void __launch_bounds__(32 * kWarps, NT == 1 ? 6 : 4) qmatmul_kernel(const uint8_t *__restrict__ w, int64_t in, int64_t out,
                                                              uint64_t row_bytes, const uint8_t *__restrict__ xq,
                                                              uint64_t qrow, int64_t n_tok, float *__restrict__ y,
                                                              int64_t y_stride, const uint64_t *__restrict__ grid_g) {
    using F = Fmt<T>;
    constexpr bool kMin = T == 10 || T == 12;
    __shared__ uint64_t grid_s[T == 16 ? 256 : 1];
    if (T == 16) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) grid_s[i] = grid_g[i];
        __syncthreads();
    }
    const int lane = threadIdx.x & 31;
    const int64_t o = (int64_t)blockIdx.x * kWarps + (threadIdx.x >> 5);
    if (o >= out) return;
    const int64_t t0 = (int64_t)blockIdx.y * NT;
    const int nt = (int)(n_tok - t0 < NT ? n_tok - t0 : NT);
    const uint8_t *row = w + (uint64_t)o * row_bytes;
    const uint8_t *xt = xq + (uint64_t)t0 * qrow;
    const int64_t nblk = in / F::kQK;
    float acc[NT], accm[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = accm[t] = 0.f;
    const int64_t chunks = in >> 3;
#pragma unroll(NT == 1 ? 4 : 2)
    for (int64_t c = lane; c < chunks; c += 32) {
        const Chunk k = F::load(row, c, grid_s);
        const int64_t blk = c / (F::kQK / 8);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            if (t < nt) {
                const uint8_t *xr = xt + (uint64_t)t * qrow;
                const int2 xv = reinterpret_cast<const int2 *>(xr)[c];
                const float xd = reinterpret_cast<const float *>(xr + in)[blk];
                const int s = __dp4a(k.w0, xv.x, __dp4a(k.w1, xv.y, 0)) * k.sc;
                // the CPU's factor order: activation scale times weight scale
                if (T == 8) acc[t] += (k.d * xd) * (float)s;
                else if (T == 16) acc[t] += (0.125f * xd * k.d) * (float)s;
                else acc[t] += (xd * k.d) * (float)s;
                if (kMin && !(c & 1)) {
                    const int bs = reinterpret_cast<const int16_t *>(xr + in + 4 * nblk)[c >> 1];
                    accm[t] += (xd * k.dmin) * (float)(k.mn * bs);
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        float v = acc[t], m = accm[t];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            v += __shfl_xor_sync(0xffffffffu, v, off);
            if (kMin) m += __shfl_xor_sync(0xffffffffu, m, off);
        }
        if (lane == 0 && t < nt) y[(t0 + t) * y_stride + o] = v - m;
    }
}

__device__ uint64_t g_iq2xxs_grid[256];
uint64_t *g_grid_addr = nullptr;   // its device address, set once by init_qmatmul_tables

template <int T>
void launch(cudaStream_t s, const uint8_t *w, int64_t in, int64_t out, uint64_t rb, const uint8_t *xq, uint64_t qrow,
            int64_t n_tok, float *y, int64_t ys) {
    if ((uintptr_t)w % Fmt<T>::kAlign || rb % Fmt<T>::kAlign)
        failf("CUDA backend: %s weights at a misaligned address or row size", gguf::type_name(Type(T)));
    if (T == 16 && !g_grid_addr) fail("CUDA backend: init_qmatmul_tables was not called");
    const unsigned rows = (unsigned)((out + kWarps - 1) / kWarps);
    if (n_tok == 1) qmatmul_kernel<T, 1><<<dim3(rows, 1), 32 * kWarps, 0, s>>>(w, in, out, rb, xq, qrow, n_tok, y, ys, g_grid_addr);
    else qmatmul_kernel<T, 8><<<dim3(rows, (unsigned)((n_tok + 7) / 8)), 32 * kWarps, 0, s>>>(w, in, out, rb, xq, qrow, n_tok, y, ys, g_grid_addr);
    DS4_CUDA_LAUNCHED();
}

__global__ void gather_bytes_kernel(const uint4 *__restrict__ src, uint64_t row16, const int *__restrict__ idx,
                                    uint4 *__restrict__ dst) {
    const int r = blockIdx.x;
    const uint4 *s = src + (uint64_t)idx[r] * row16;
    uint4 *d = dst + (uint64_t)r * row16;
    for (uint64_t i = threadIdx.x; i < row16; i += blockDim.x) d[i] = s[i];
}

}  // namespace

void init_qmatmul_tables() {
    DS4_CUDA_CHECK(cudaMemcpyToSymbol(g_iq2xxs_grid, quant::kIq2xxsGrid, sizeof(quant::kIq2xxsGrid)));
    DS4_CUDA_CHECK(cudaGetSymbolAddress((void **)&g_grid_addr, g_iq2xxs_grid));
}

Type act_type(Type weight) {
    switch (weight) {
    case Type::Q8_0: return Type::Q8_0;
    case Type::Q2_K:
    case Type::Q4_K:
    case Type::IQ2_XXS: return Type::Q8_K;
    case Type::F32:
    case Type::F16:
    case Type::BF16: return Type::F32;
    default: failf("CUDA backend: tensor type %s is not supported", gguf::type_name(weight));
    }
}

uint64_t act_row_bytes(Type weight, int64_t n) {
    const Type a = act_type(weight);
    if (a == Type::F32) return (uint64_t)n * 4;
    const int64_t qk = a == Type::Q8_0 ? quant::kQK8_0 : quant::kQK_K;
    if (n % qk) failf("CUDA backend: rows of %lld elements are not a multiple of the %s block (%lld)", (long long)n,
                      gguf::type_name(weight), (long long)qk);
    uint64_t b = (uint64_t)n + 4 * (uint64_t)(n / qk) + (a == Type::Q8_K ? 2 * (uint64_t)(n / 16) : 0);
    return (b + 15) & ~uint64_t(15);
}

void quantize_act(cudaStream_t s, Type weight, const float *x, int64_t n_tok, int64_t xs, int64_t n, uint8_t *q,
                  uint64_t qrow) {
    if (n_tok <= 0) return;
    const Type a = act_type(weight);
    if (a == Type::F32) failf("CUDA backend: %s weights take f32 activations", gguf::type_name(weight));
    if (qrow < act_row_bytes(weight, n) || qrow % 16) failf("CUDA backend: quantised activation row of %llu bytes is too small or misaligned", (unsigned long long)qrow);
    const dim3 g((unsigned)((n + 1023) / 1024), (unsigned)n_tok);
    if (a == Type::Q8_0) quantize_kernel<32><<<g, 128, 0, s>>>(x, xs, n, q, qrow);
    else quantize_kernel<256><<<g, 128, 0, s>>>(x, xs, n, q, qrow);
    DS4_CUDA_LAUNCHED();
}

void matmul_q(cudaStream_t s, Type type, const void *w, int64_t in, int64_t out, uint64_t row_bytes, const uint8_t *xq,
              uint64_t qrow, int64_t n_tok, float *y, int64_t y_stride) {
    if (n_tok <= 0 || out <= 0) return;
    if (qrow < act_row_bytes(type, in)) failf("CUDA backend: quantised activation rows too small for %lld elements", (long long)in);
    const uint8_t *wp = static_cast<const uint8_t *>(w);
    switch (type) {
    case Type::Q8_0: launch<8>(s, wp, in, out, row_bytes, xq, qrow, n_tok, y, y_stride); return;
    case Type::Q2_K: launch<10>(s, wp, in, out, row_bytes, xq, qrow, n_tok, y, y_stride); return;
    case Type::Q4_K: launch<12>(s, wp, in, out, row_bytes, xq, qrow, n_tok, y, y_stride); return;
    case Type::IQ2_XXS: launch<16>(s, wp, in, out, row_bytes, xq, qrow, n_tok, y, y_stride); return;
    default: failf("CUDA backend: no integer product for %s weights", gguf::type_name(type));
    }
}

void gather_bytes(cudaStream_t s, const uint8_t *src, uint64_t row_bytes, const int *idx, uint8_t *dst, int rows) {
    if (rows <= 0) return;
    if (row_bytes % 16 || (uintptr_t)src % 16 || (uintptr_t)dst % 16) fail("CUDA backend: gather_bytes needs 16-byte rows");
    gather_bytes_kernel<<<(unsigned)rows, 128, 0, s>>>(reinterpret_cast<const uint4 *>(src), row_bytes / 16, idx,
                                                       reinterpret_cast<uint4 *>(dst));
    DS4_CUDA_LAUNCHED();
}

}  // namespace ds4::cuda
