// F16 weights times f32 activations on the tensor cores, for steps of many rows (the
// compressors', indexer's and router's products in a prefill). The CPU multiplies these in
// f32; a tensor-core f16 product would round each activation to 11 bits, so each activation
// is split into two f16 parts, hi = f16(x) and lo = f16(x - hi), and both are multiplied
// (f32 accumulation): hi + lo carries ~22 bits of x, so the product is within a few f32 ulps
// of the exact one -- the CPU parity bars for f16 models hold. Activations are normed rows
// (|x| far below the f16 range); a value past 65504 would make hi infinite and the output
// non-finite, visibly.
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/cuda_check.h"
#include "cuda/cuda_launch.cuh"
#include "cuda/cuda_kernels.h"

namespace ds4::cuda {

namespace {

constexpr int kBM = 64, kBN = 64, kBK = 64, kStride = kBK + 8;   // halves; padded: no bank conflicts

__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t ld_u32(const __half *p) { return *reinterpret_cast<const uint32_t *>(p); }

// Block: 8 warps, tile rows [m0, m0 + 64) x tokens [n0, n0 + 64); warp w owns rows
// 16 (w % 4).. of the tile for tokens 32 (w / 4).. (4 n-tiles). A step's global loads are
// issued together before any is stored. m16n8k16 fragments (PTX ISA), g = lane / 4,
// q = lane % 4: A = rows g, g+8 at k 2q.. and 8+2q..; B = token g at k 2q.. and 8+2q..;
// C = (row g | g+8, token 2q | 2q+1).
constexpr int kThreads = 256, kWarpsM = 4, kNT = 4;
__global__ void __launch_bounds__(kThreads) hmma_kernel(const __half *__restrict__ w, int64_t in, int64_t out, int64_t w_stride,
                                                        const float *__restrict__ x, int64_t n_tok, int64_t xs,
                                                        float *__restrict__ y, int64_t ys, int64_t kper, int64_t zstride) {
    pdl_enter();
    __shared__ __align__(16) __half ws[kBM][kStride];
    __shared__ __align__(16) __half xh[kBN][kStride];
    __shared__ __align__(16) __half xl[kBN][kStride];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;
    const int64_t n0 = (int64_t)blockIdx.x * kBN, m0 = (int64_t)blockIdx.y * kBM;
    float acc[kNT][4];
#pragma unroll
    for (int u = 0; u < kNT; ++u)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[u][i] = 0.f;

    // split-K: this block's input range (kper a multiple of kBK); its partial sums at y + z * zstride
    const int64_t kbeg = (int64_t)blockIdx.z * kper, kend = kbeg + kper < in ? kbeg + kper : in;
    y += (int64_t)blockIdx.z * zstride;
    for (int64_t k0 = kbeg; k0 < kend; k0 += kBK) {
        const int kl = (int)(kend - k0 < kBK ? kend - k0 : kBK);
        __syncthreads();
        constexpr int kWPieces = kBM * 8 / kThreads, kXPieces = kBN * 16 / kThreads;
        uint4 wv[kWPieces];
        float4 xv[kXPieces];
#pragma unroll
        for (int j = 0; j < kWPieces; ++j) {   // 64 rows x 64 halves, 8 halves a piece
            const int i = tid + kThreads * j, r = i >> 3, part = i & 7;
            const int64_t row = m0 + r;
            wv[j] = row < out && 8 * part < kl ? *reinterpret_cast<const uint4 *>(w + row * w_stride + k0 + 8 * part)
                                               : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int j = 0; j < kXPieces; ++j) {   // 64 tokens x 64 floats, 4 a piece
            const int i = tid + kThreads * j, n = i >> 4, part = i & 15;
            const int64_t t = n0 + n;
            xv[j] = t < n_tok && 4 * part < kl ? *reinterpret_cast<const float4 *>(x + t * xs + k0 + 4 * part)
                                               : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int j = 0; j < kWPieces; ++j) {
            const int i = tid + kThreads * j;
            *reinterpret_cast<uint4 *>(&ws[i >> 3][8 * (i & 7)]) = wv[j];
        }
#pragma unroll
        for (int j = 0; j < kXPieces; ++j) {
            const int i = tid + kThreads * j, n = i >> 4, part = i & 15;
            const float f[4] = {xv[j].x, xv[j].y, xv[j].z, xv[j].w};
            __half h[4], l[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                h[e] = __float2half_rn(f[e]);
                l[e] = __float2half_rn(f[e] - __half2float(h[e]));
            }
            *reinterpret_cast<uint2 *>(&xh[n][4 * part]) =
                make_uint2(*reinterpret_cast<uint32_t *>(&h[0]), *reinterpret_cast<uint32_t *>(&h[2]));
            *reinterpret_cast<uint2 *>(&xl[n][4 * part]) =
                make_uint2(*reinterpret_cast<uint32_t *>(&l[0]), *reinterpret_cast<uint32_t *>(&l[2]));
        }
        __syncthreads();
        const int r0 = 16 * (warp % kWarpsM) + g, r1 = r0 + 8, nb = 8 * kNT * (warp / kWarpsM);
#pragma unroll
        for (int j = 0; j < kBK / 16; ++j) {
            const int kk = 16 * j + 2 * q;
            const uint32_t a0 = ld_u32(&ws[r0][kk]), a1 = ld_u32(&ws[r1][kk]), a2 = ld_u32(&ws[r0][kk + 8]),
                           a3 = ld_u32(&ws[r1][kk + 8]);
#pragma unroll
            for (int u = 0; u < kNT; ++u) {
                const int n = nb + 8 * u + g;
                mma_f16(acc[u], a0, a1, a2, a3, ld_u32(&xh[n][kk]), ld_u32(&xh[n][kk + 8]));
                mma_f16(acc[u], a0, a1, a2, a3, ld_u32(&xl[n][kk]), ld_u32(&xl[n][kk + 8]));
            }
        }
    }
    const int64_t ra = m0 + 16 * (warp % kWarpsM) + g, rb = ra + 8;
#pragma unroll
    for (int u = 0; u < kNT; ++u) {
        const int64_t t0 = n0 + 8 * kNT * (warp / kWarpsM) + 8 * u + 2 * q, t1 = t0 + 1;
        if (ra < out) {
            if (t0 < n_tok) y[t0 * ys + ra] = acc[u][0];
            if (t1 < n_tok) y[t1 * ys + ra] = acc[u][1];
        }
        if (rb < out) {
            if (t0 < n_tok) y[t0 * ys + rb] = acc[u][2];
            if (t1 < n_tok) y[t1 * ys + rb] = acc[u][3];
        }
    }
}

}  // namespace

bool matmul_f16_mma(cudaStream_t s, const void *w, int64_t in, int64_t out, uint64_t row_bytes, const float *x, int64_t n_tok,
                    int64_t x_stride, float *y, int64_t y_stride) {
    // 16-byte pieces of weight rows and activation rows. A tile's rows past `out` are zeros:
    // with few outputs (the 24 of the hyper-connection mix over a 16384-wide input) most of
    // the tile idles, and split-K spreads the long input, yet it measured far faster than the
    // CUDA-core kernel that keeps each row's input in one block. Below 16 outputs, that kernel.
    if (n_tok < kMmaMinTokens || out < 16 || in % 8 || row_bytes % 16 || (uintptr_t)w % 16 || x_stride % 4 ||
        (uintptr_t)x % 16 || (out + kBM - 1) / kBM > 65535)
        return false;
    const int64_t tn = (n_tok + kBN - 1) / kBN, tm = (out + kBM - 1) / kBM, ksteps = (in + kBK - 1) / kBK;
    const int splits = splitk_count(tn * tm, ksteps);
    const __half *wh = static_cast<const __half *>(w);
    if (splits == 1) {
        launch_pdl(hmma_kernel, dim3((unsigned)tn, (unsigned)tm), kThreads, 0, s, wh, in, out, (int64_t)(row_bytes / 2), x, n_tok, x_stride, y,
                                                                        y_stride, ksteps * kBK, 0);
        DS4_CUDA_LAUNCHED();
        return true;
    }
    const int64_t per = (ksteps + splits - 1) / splits, z = (ksteps + per - 1) / per;
    float *part = splitk_alloc(s, (int)z, n_tok, out);
    launch_pdl(hmma_kernel, dim3((unsigned)tn, (unsigned)tm, (unsigned)z), kThreads, 0, s, wh, in, out, (int64_t)(row_bytes / 2), x, n_tok,
                                                                                 x_stride, part, out, per * kBK, n_tok * out);
    DS4_CUDA_LAUNCHED();
    splitk_finish(s, part, (int)z, n_tok, out, y, y_stride);
    return true;
}

}  // namespace ds4::cuda
