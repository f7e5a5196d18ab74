// Integer tensor-core products for steps of many rows (prefill chunks, big batches): the same
// quantised operands as cuda_qmatmul.cu's dp4a kernels -- weights in their GGUF blocks,
// activations quantised as the CPU does -- multiplied with int8 mma.sync (m16n8k32, s32
// accumulators). The dp4a kernels re-read every weight chunk once per 8 tokens and run on
// the ALUs; here a 64 x 64 output tile shares one decoded weight tile through shared memory,
// and the products run on the tensor cores.
//
// The integer sums are exact, as in the dp4a path; only the float scaling is grouped
// differently, so results agree with the CPU up to float summation order:
//  - Q8_0: one int32 dot per 32-element block, scaled by weight x activation scale;
//  - IQ2_XXS: the 8 sub-block dots of a 256 block times their odd integer scales summed in
//    int32, then one float scale (d x activation scale / 8);
//  - Q2_K: the 4-bit sub-block scale folded into the 2-bit weights (q x sc <= 45 fits int8), so
//    one int32 dot per 256 block, minus the integer mins times the activation's 16-element sums.
// Q4_K (and misaligned shapes) keep the dp4a kernel.
#include <cstdint>

#include "cuda/cuda_async_copy.cuh"
#include "cuda/cuda_check.h"
#include "cuda/cuda_launch.cuh"
#include "cuda/cuda_kernels.h"
#include "cuda/cuda_qblocks.cuh"
#include "engine/common/error.h"

namespace ds4::cuda {

extern uint64_t *g_grid_addr;   // IQ2_XXS grid in device memory (cuda_qmatmul.cu)

bool mma_type_supported(gguf::Type t);

namespace {

constexpr int kBM = 64, kBN = 64, kBK = 256, kStride = kBK + 16;   // padded rows: no bank conflicts
// A weight row's bytes of one k-step (Q8_0: 8 blocks, 272 bytes; IQ2_XXS 66; Q2_K 84) copied
// from the 16-byte boundary at or below their start, so at most 14 bytes of lead.
constexpr int kRawRow = 288, kRawPieces = kRawRow / 16;

__device__ __forceinline__ void mma_s8(int (&c)[4], int a0, int a1, int a2, int a3, int b0, int b1) {
    asm(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ int ld_s32(const int8_t *p) { return *reinterpret_cast<const int *>(p); }

// An int32 dot of one 32-element block (|c| <= 32 * 128 * 128 < 2^22) as a float, exactly:
// the magic-number conversion takes an integer add and a float add, where the conversion
// instruction issues at a fraction of their rate.
__device__ __forceinline__ float i2f_small(int c) { return __int_as_float(c + 0x4B400000) - 12582912.f; }

// One k-step's operands as copied from global memory: raw weight bytes (decoded into ws by
// the block), activations with their scales (and Q8_K sums of 16), used in place.
struct MmqStage {
    int8_t w[kBM][kRawRow];
    int8_t x[kBN][kStride];
    float xd[kBN][8];
    int16_t xb[kBN][16];
};
struct MmqShared {
    MmqStage st[2];
    int8_t ws[kBM][kStride];
    float wd[kBM][8];     // Q8_0: block scales; IQ2_XXS: [0] = d; Q2_K: [0] = d, [1] = dmin
    int8_t wsc[kBM][16];  // IQ2_XXS: odd sub-block scales (8); Q2_K: sub-block mins (16)
    uint64_t xrow[kBN];   // byte offset of each token's activation row; ~0: none
    uint64_t grid_s[256];
};

// Block: 8 warps, tile rows [m0, m0 + 64) x tokens [n0, n0 + 64); warp w owns rows
// 16 (w % 4).. of the tile for tokens 32 (w / 4).. (4 n-tiles of 8). Two stages: the next
// k-step's weights and activations are copied (cp.async) while this one is decoded and
// multiplied, so a block waits for memory once, not once per k-step. Fragment layout of
// m16n8k32 (PTX ISA), g = lane / 4, q = lane % 4: A regs = rows g, g+8 at k 4q.. and
// 16+4q..; B regs = token g at k 4q.. and 16+4q..; C = (row g | g+8, token 2q | 2q+1).
constexpr int kThreads = 256, kWarpsM = 4, kNT = 4;   // n-tiles per warp
template <int T>
__global__ void __launch_bounds__(kThreads, 2) mmq_kernel(const uint8_t *__restrict__ w, int64_t in, int64_t out, uint64_t rb,
                                                       const uint8_t *__restrict__ xq, uint64_t qrow, int64_t n_tok,
                                                       float *__restrict__ y, int64_t ys, const uint64_t *__restrict__ grid_g,
                                                       XGroups xg, const MmaTile *__restrict__ tiles, uint64_t eb,
                                                       const int *__restrict__ rowidx, int64_t kper, int64_t zstride) {
    pdl_enter();
    constexpr int QKA = T == 8 ? 32 : 256;   // activation block
    constexpr int QKW = T == 8 ? 32 : 256;   // weight block
    constexpr int BB = T == 8 ? 34 : T == 10 ? 84 : 66;   // its bytes
    extern __shared__ __align__(16) uint8_t smem_raw[];
    MmqShared &sh = *reinterpret_cast<MmqShared *>(smem_raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, q = lane & 3;
    if (T == 16) {
        for (int i = tid; i < 256; i += kThreads) sh.grid_s[i] = grid_g[i];
    }
    const int64_t m0 = (int64_t)blockIdx.y * kBM;
    int64_t n0 = (int64_t)blockIdx.x * kBN;
    if (tiles) {   // expert tiles: this block's expert and pairs
        const MmaTile tl = tiles[blockIdx.x];
        w += (uint64_t)tl.e * eb;
        n0 = tl.p0, n_tok = tl.p0 + tl.np;
    }
    const int64_t xoff = (m0 / xg.opg) * xg.gchunks * 8;   // the group's activation slice
    const int64_t xnblk = xg.xn / QKA;
    if (tid < kBN) {
        const int64_t t = n0 + tid;
        sh.xrow[tid] = t < n_tok ? (uint64_t)(rowidx ? rowidx[t] : t) * qrow : ~uint64_t(0);
    }
    __syncthreads();   // grid_s, xrow are written

    float acc[kNT][4];
    int isum[kNT][4];
#pragma unroll
    for (int u = 0; u < kNT; ++u)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[u][i] = 0.f;

    // split-K: this block's input range (kper a multiple of kBK); its partial sums at y + z * zstride
    const int64_t kbeg = (int64_t)blockIdx.z * kper, kend = kbeg + kper < in ? kbeg + kper : in;
    y += (int64_t)blockIdx.z * zstride;
    const int nsteps = (int)((kend - kbeg + kBK - 1) / kBK);

    // Copies of step i into stage i % 2: rows' raw bytes in 16-byte pieces, 16-byte
    // activation pieces, 4-byte scales and sums. Invalid tokens and rows are not copied: their
    // outputs are never stored and an integer product does not mix columns.
    auto issue = [&](int i) {
        MmqStage &st = sh.st[i & 1];
        const int64_t k0 = kbeg + (int64_t)i * kBK;
        const int kl = (int)(kend - k0 < kBK ? kend - k0 : kBK);
        const uint64_t boff = (uint64_t)(k0 / QKW) * BB, len = (uint64_t)(kl / QKW) * BB;
        for (int j = tid; j < kBM * kRawPieces; j += kThreads) {
            const int r = j / kRawPieces, p = j - r * kRawPieces;
            const int64_t row = m0 + r;
            if (row >= out) continue;
            const uint8_t *gs = w + (uint64_t)row * rb + boff;
            const uint8_t *a = reinterpret_cast<const uint8_t *>((uintptr_t)gs & ~uintptr_t(15)) + 16 * p;
            const int64_t left = (int64_t)(gs + len - a);
            if (left > 0) cp16(&st.w[r][16 * p], a, left < 16 ? (int)left : 16);
        }
#pragma unroll
        for (int j = 0; j < kBN * 16 / kThreads; ++j) {
            const int e = tid + kThreads * j, n = e >> 4, part = e & 15;
            const uint64_t off = sh.xrow[n];
            if (off == ~uint64_t(0) || 16 * part >= kl) continue;
            cp16(&st.x[n][16 * part], xq + off + xoff + k0 + 16 * part, 16);
        }
#pragma unroll
        for (int j = 0; j < kBN * 8 / kThreads; ++j) {
            const int e = tid + kThreads * j, n = e >> 3, part = e & 7;
            const uint64_t off = sh.xrow[n];
            if (off == ~uint64_t(0)) continue;
            const uint8_t *xr = xq + off;
            if (T == 8 ? 32 * part < kl : part == 0)
                cp4(&st.xd[n][part], reinterpret_cast<const float *>(xr + xg.xn) + (xoff + k0) / QKA + (T == 8 ? part : 0));
            if (T == 10) {
                const int16_t *sums = reinterpret_cast<const int16_t *>(xr + xg.xn + 4 * xnblk) + (xoff + k0) / 16;
                cp4(&st.xb[n][2 * part], sums + 2 * part);
            }
        }
    };

    issue(0);
    cp_commit();
    for (int i = 0; i < nsteps; ++i) {
        const int64_t k0 = kbeg + (int64_t)i * kBK;
        const int kl = (int)(kend - k0 < kBK ? kend - k0 : kBK);
        __syncthreads();   // step i - 1's tiles are consumed: ws and stage (i + 1) % 2 are free
        if (i + 1 < nsteps) issue(i + 1);
        cp_commit();
        cp_wait<1>();      // this thread's copies of step i have landed
        __syncthreads();   // everyone's have
        const MmqStage &st = sh.st[i & 1];
        // decode: warp w takes rows w, w + 8, ..., lane = chunk of 8
        const uint64_t boff = (uint64_t)(k0 / QKW) * BB;
#pragma unroll 2
        for (int r8 = 0; r8 < kBM / 8; ++r8) {
            const int rr = warp + 8 * r8;
            const int64_t row = m0 + rr;
            Chunk k{0, 0, 0, 0, 0.f, 0.f};
            if (row < out && 8 * lane < kl) {
                const int lead = (int)((uintptr_t)(w + (uint64_t)row * rb + boff) & 15);
                k = Fmt<T>::load(reinterpret_cast<const uint8_t *>(st.w[rr]) + lead, lane, sh.grid_s);
            }
            const uint2 v = T == 10 ? make_uint2((uint32_t)k.w0 * (uint32_t)k.sc, (uint32_t)k.w1 * (uint32_t)k.sc)
                                    : make_uint2((uint32_t)k.w0, (uint32_t)k.w1);
            *reinterpret_cast<uint2 *>(&sh.ws[rr][8 * lane]) = v;
            if (T == 8 && (lane & 3) == 0) sh.wd[rr][lane >> 2] = k.d;
            if (T == 16 && (lane & 3) == 0) sh.wsc[rr][lane >> 2] = (int8_t)k.sc;
            if (T == 10 && (lane & 1) == 0) sh.wsc[rr][lane >> 1] = (int8_t)k.mn;
            if (T != 8 && lane == 0) sh.wd[rr][0] = k.d, sh.wd[rr][1] = k.dmin;
        }
        __syncthreads();

        const int r0 = 16 * (warp % kWarpsM) + g, r1 = r0 + 8, nb = 8 * kNT * (warp / kWarpsM);
        if (T != 8) {
#pragma unroll
            for (int u = 0; u < kNT; ++u)
#pragma unroll
                for (int i2 = 0; i2 < 4; ++i2) isum[u][i2] = 0;
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (T == 8 && 32 * j >= kl) break;
            const int a0 = ld_s32(&sh.ws[r0][32 * j + 4 * q]), a1 = ld_s32(&sh.ws[r1][32 * j + 4 * q]);
            const int a2 = ld_s32(&sh.ws[r0][32 * j + 16 + 4 * q]), a3 = ld_s32(&sh.ws[r1][32 * j + 16 + 4 * q]);
            int s0 = 1, s1 = 1;
            float f0 = 0.f, f1 = 0.f;
            if (T == 16) s0 = sh.wsc[r0][j], s1 = sh.wsc[r1][j];
            if (T == 8) f0 = sh.wd[r0][j], f1 = sh.wd[r1][j];
            int c[kNT][4];
#pragma unroll
            for (int u = 0; u < kNT; ++u) {
                const int n = nb + 8 * u + g;
                c[u][0] = c[u][1] = c[u][2] = c[u][3] = 0;
                mma_s8(c[u], a0, a1, a2, a3, ld_s32(&st.x[n][32 * j + 4 * q]), ld_s32(&st.x[n][32 * j + 16 + 4 * q]));
            }
#pragma unroll
            for (int u = 0; u < kNT; ++u) {
                if (T == 8) {
                    const int t0 = nb + 8 * u + 2 * q;
                    const float x0 = st.xd[t0][j], x1 = st.xd[t0 + 1][j];
                    // the CPU's factor order: weight scale times activation scale
                    acc[u][0] += (f0 * x0) * i2f_small(c[u][0]);
                    acc[u][1] += (f0 * x1) * i2f_small(c[u][1]);
                    acc[u][2] += (f1 * x0) * i2f_small(c[u][2]);
                    acc[u][3] += (f1 * x1) * i2f_small(c[u][3]);
                } else {
                    isum[u][0] += c[u][0] * s0, isum[u][1] += c[u][1] * s0;
                    isum[u][2] += c[u][2] * s1, isum[u][3] += c[u][3] * s1;
                }
            }
        }
        if (T != 8) {
            const float d0 = sh.wd[r0][0], d1 = sh.wd[r1][0], m0f = sh.wd[r0][1], m1f = sh.wd[r1][1];
#pragma unroll
            for (int u = 0; u < kNT; ++u) {
                const int t0 = nb + 8 * u + 2 * q;
                const float x0 = st.xd[t0][0], x1 = st.xd[t0 + 1][0];
                if (T == 16) {
                    acc[u][0] += (0.125f * x0 * d0) * (float)isum[u][0];
                    acc[u][1] += (0.125f * x1 * d0) * (float)isum[u][1];
                    acc[u][2] += (0.125f * x0 * d1) * (float)isum[u][2];
                    acc[u][3] += (0.125f * x1 * d1) * (float)isum[u][3];
                } else {   // Q2_K: minus the mins times the activation sums of 16
                    int ms[4] = {0, 0, 0, 0};
#pragma unroll
                    for (int j = 0; j < 16; ++j) {
                        const int b0 = st.xb[t0][j], b1 = st.xb[t0 + 1][j], w0 = sh.wsc[r0][j], w1 = sh.wsc[r1][j];
                        ms[0] += w0 * b0, ms[1] += w0 * b1, ms[2] += w1 * b0, ms[3] += w1 * b1;
                    }
                    acc[u][0] += (x0 * d0) * (float)isum[u][0] - (x0 * m0f) * (float)ms[0];
                    acc[u][1] += (x1 * d0) * (float)isum[u][1] - (x1 * m0f) * (float)ms[1];
                    acc[u][2] += (x0 * d1) * (float)isum[u][2] - (x0 * m1f) * (float)ms[2];
                    acc[u][3] += (x1 * d1) * (float)isum[u][3] - (x1 * m1f) * (float)ms[3];
                }
            }
        }
    }
    const int64_t ra = m0 + 16 * (warp % kWarpsM) + g, rb8 = ra + 8;
#pragma unroll
    for (int u = 0; u < kNT; ++u) {
        const int64_t t0 = n0 + 8 * kNT * (warp / kWarpsM) + 8 * u + 2 * q, t1 = t0 + 1;
        if (ra < out) {
            if (t0 < n_tok) y[t0 * ys + ra] = acc[u][0];
            if (t1 < n_tok) y[t1 * ys + ra] = acc[u][1];
        }
        if (rb8 < out) {
            if (t0 < n_tok) y[t0 * ys + rb8] = acc[u][2];
            if (t1 < n_tok) y[t1 * ys + rb8] = acc[u][3];
        }
    }
}

// The kernel's dynamic shared memory (over the 48 KB default), opted in once per format.
template <int T>
void mmq_opt_in() {
    static const cudaError_t e =
        cudaFuncSetAttribute(mmq_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sizeof(MmqShared));
    DS4_CUDA_CHECK(e);
}

template <int T>
void launch(cudaStream_t s, const uint8_t *w, int64_t in, int64_t out, uint64_t rb, const uint8_t *xq, uint64_t qrow,
            int64_t n_tok, float *y, int64_t ys, XGroups xg, const MmaTile *tiles = nullptr, int n_tiles = 0, uint64_t eb = 0,
            const int *rowidx = nullptr) {
    const int64_t tn = tiles ? n_tiles : (n_tok + kBN - 1) / kBN, tm = (out + kBM - 1) / kBM, ksteps = (in + kBK - 1) / kBK;
    const int splits = tiles ? 1 : splitk_count(tn * tm, ksteps);
    mmq_opt_in<T>();
    const size_t shm = sizeof(MmqShared);
    if (splits == 1) {
        launch_pdl(mmq_kernel<T>, dim3((unsigned)tn, (unsigned)tm), kThreads, shm, s, w, in, out, rb, xq, qrow, n_tok, y, ys, g_grid_addr, xg,
                                                                          tiles, eb, rowidx, ksteps * kBK, 0);
        DS4_CUDA_LAUNCHED();
        return;
    }
    const int64_t per = (ksteps + splits - 1) / splits, z = (ksteps + per - 1) / per;
    float *part = splitk_alloc(s, (int)z, n_tok, out);
    launch_pdl(mmq_kernel<T>, dim3((unsigned)tn, (unsigned)tm, (unsigned)z), kThreads, shm, s, w, in, out, rb, xq, qrow, n_tok, part, out,
                                                                                   g_grid_addr, xg, tiles, eb, rowidx, per * kBK,
                                                                                   n_tok * out);
    DS4_CUDA_LAUNCHED();
    splitk_finish(s, part, (int)z, n_tok, out, y, ys);
}

}  // namespace

bool matmul_q_mma(cudaStream_t s, gguf::Type type, const void *w, int64_t in, int64_t out, uint64_t row_bytes,
                  const uint8_t *xq, uint64_t qrow, int64_t n_tok, float *y, int64_t y_stride, int64_t xn, int64_t out_per_group,
                  int64_t group_chunks) {
    using gguf::Type;
    const XGroups xg{xn, out_per_group, group_chunks};
    if (!mma_type_supported(type)) return false;
    // tiles never straddle an activation group; activation pieces are 16-byte loads
    if (xg.gchunks && xg.opg % kBM) return false;
    if (qrow % 16 || (uintptr_t)xq % 16 || in % 32 || (xg.gchunks * 8) % 16) return false;
    if ((n_tok + kBN - 1) / kBN > 0x7fffffff || (out + kBM - 1) / kBM > 65535) return false;
    const uint8_t *wp = static_cast<const uint8_t *>(w);
    switch (type) {
    case Type::Q8_0: launch<8>(s, wp, in, out, row_bytes, xq, qrow, n_tok, y, y_stride, xg); return true;
    case Type::Q2_K: launch<10>(s, wp, in, out, row_bytes, xq, qrow, n_tok, y, y_stride, xg); return true;
    case Type::IQ2_XXS: launch<16>(s, wp, in, out, row_bytes, xq, qrow, n_tok, y, y_stride, xg); return true;
    default: return false;
    }
}

bool mma_type_supported(gguf::Type t) { return t == gguf::Type::Q8_0 || t == gguf::Type::Q2_K || t == gguf::Type::IQ2_XXS; }

void matmul_q_mma_tiles(cudaStream_t s, gguf::Type type, const void *w, uint64_t expert_bytes, int64_t in, int64_t out,
                        uint64_t row_bytes, const uint8_t *xq, uint64_t qrow, const int *rowidx, const MmaTile *tiles, int n_tiles,
                        float *y, int64_t y_stride) {
    using gguf::Type;
    if (n_tiles <= 0 || out <= 0) return;
    if (!mma_type_supported(type)) failf("CUDA backend: no tensor-core expert product for %s weights", gguf::type_name(type));
    if (qrow % 16 || (uintptr_t)xq % 16 || in % (act_type(type) == Type::Q8_0 ? 32 : 256) || (out + kBM - 1) / kBM > 65535)
        failf("CUDA backend: tensor-core expert product of %lld x %lld %s weights on %llu-byte rows", (long long)out,
              (long long)in, gguf::type_name(type), (unsigned long long)qrow);
    const uint8_t *wp = static_cast<const uint8_t *>(w);
    const XGroups xg{in, out, 0};
    switch (type) {
    case Type::Q8_0: launch<8>(s, wp, in, out, row_bytes, xq, qrow, 0, y, y_stride, xg, tiles, n_tiles, expert_bytes, rowidx); return;
    case Type::Q2_K: launch<10>(s, wp, in, out, row_bytes, xq, qrow, 0, y, y_stride, xg, tiles, n_tiles, expert_bytes, rowidx); return;
    case Type::IQ2_XXS: launch<16>(s, wp, in, out, row_bytes, xq, qrow, 0, y, y_stride, xg, tiles, n_tiles, expert_bytes, rowidx); return;
    default: return;
    }
}

}  // namespace ds4::cuda
