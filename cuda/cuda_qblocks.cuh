// Device-side decoding of block-quantised weight rows for the integer products
// (cuda_qmatmul.cu, cuda_moe.cu): a row is walked in chunks of 8 elements, each decoded into
// two int8x4 words with its sub-block's integer scale, and dotted with the matching chunk of
// an activation row quantised as the CPU does. Both kernels accumulate through chunk_dot and
// warp_dot_total, so a row's result does not depend on which kernel computed it.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/cuda_async_copy.cuh"
#include "engine/quant/blocks.h"

namespace ds4::cuda {
namespace {

__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t ld16(const uint8_t *p) { return *reinterpret_cast<const uint16_t *>(p); }
__device__ __forceinline__ uint32_t ld32(const uint8_t *p) { return *reinterpret_cast<const uint32_t *>(p); }
// A 32-bit word at a 2-byte aligned address.
__device__ __forceinline__ uint32_t ld32_2(const uint8_t *p) { return (uint32_t)ld16(p) | ((uint32_t)ld16(p + 2) << 16); }

// ---------------------------------------------------------------------------------------
// Weight chunks: elements [8c, 8c + 8) of a row as two int8x4 words, the integer
// sub-block scale (multiplies the int dot), the min (Q2_K / Q4_K: multiplies the activation
// sum of the 16 elements [16 (c/2), 16 (c/2) + 16), taken by even chunks) and the float
// factors of the block.
struct Chunk {
    int w0, w1;
    int sc, mn;
    float d, dmin;
    uint32_t m0, m1;   // IQ2_XXS through load_dot: sign masks (0xFF bytes negate), w0 / w1 unsigned
};

template <int T> struct Fmt;

template <> struct Fmt<8> {   // Q8_0 weights, Q8_0 activations
    static constexpr int kQK = 32;
    static constexpr int kAlign = 2;
    template <class I>
    __device__ static __forceinline__ Chunk load(const uint8_t *row, I c, const uint64_t *) {
        const uint8_t *b = row + (c >> 2) * (I)sizeof(quant::BlockQ8_0);
        const uint8_t *qs = b + 2 + 8 * (c & 3);
        return {(int)ld32_2(qs), (int)ld32_2(qs + 4), 1, 0, h2f(ld16(b)), 0.f};
    }
};

template <> struct Fmt<12> {   // Q4_K
    static constexpr int kQK = 256;
    static constexpr int kAlign = 8;
    template <class I>
    __device__ static __forceinline__ Chunk load(const uint8_t *row, I c, const uint64_t *) {
        const uint8_t *b = row + (c >> 5) * (I)sizeof(quant::BlockQ4_K);
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
    template <class I>
    __device__ static __forceinline__ Chunk load(const uint8_t *row, I c, const uint64_t *) {
        const uint8_t *b = row + (c >> 5) * (I)sizeof(quant::BlockQ2_K);
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
    // Chunk c's 8 grid bytes (unsigned, below 128), its 8 sign bits, the block's 4-bit
    // sub-block scale word and its f16 scale.
    struct Raw {
        uint64_t gv;
        uint32_t s8, a1;
        float d;
    };
    template <class I>
    __device__ static __forceinline__ Raw raw(const uint8_t *row, I c, const uint64_t *grid) {
        const uint8_t *b = row + (c >> 5) * (I)sizeof(quant::BlockIQ2_XXS);
        const int e0 = (int)(c & 31) * 8, g = e0 >> 5, l = (e0 & 31) >> 3;
        const uint8_t *qs = b + 2 + 8 * g;
        const uint32_t a1 = ld32_2(qs + 4);
        const uint32_t s7 = (a1 >> (7 * l)) & 127;
        return {grid[qs[l]], s7 | ((__popc(s7) & 1u) << 7), a1, h2f(ld16(b))};
    }
    template <class I>
    __device__ static __forceinline__ Chunk load(const uint8_t *row, I c, const uint64_t *grid) {
        const Raw r = raw(row, c, grid);
        const uint32_t m0 = sign_mask4(r.s8 & 15), m1 = sign_mask4(r.s8 >> 4);
        // per byte: (g ^ m) - m negates where m = 0xFF
        const uint32_t w0 = __vsub4((uint32_t)r.gv ^ m0, m0), w1 = __vsub4((uint32_t)(r.gv >> 32) ^ m1, m1);
        return {(int)w0, (int)w1, (int)(2 * (r.a1 >> 28) + 1), 0, r.d, 0.f};
    }
    // The same chunk with the grid bytes unsigned and the signs as byte masks: a dot takes
    // g . x - 2 (g & m) . x, the same integer as ((g ^ m) - m) . x without the per-byte
    // subtraction (emulated on this hardware) -- grid bytes are below 128.
    template <class I>
    __device__ static __forceinline__ Chunk load_split(const uint8_t *row, I c, const uint64_t *grid) {
        const Raw r = raw(row, c, grid);
        return {(int)(uint32_t)r.gv, (int)(uint32_t)(r.gv >> 32), (int)(2 * (r.a1 >> 28) + 1), 0, r.d, 0.f,
                sign_mask4(r.s8 & 15), sign_mask4(r.s8 >> 4)};
    }
};

// The chunk as the dot kernels take it (chunk_dot / chunk_dot_p).
template <int T, class I>
__device__ __forceinline__ Chunk load_dot(const uint8_t *row, I c, const uint64_t *grid) {
    if constexpr (T == 16) return Fmt<16>::load_split(row, c, grid);
    else return Fmt<T>::load(row, c, grid);
}

// The chunk's integer dot with activation words x0, x1 (before the sub-block scale).
template <int T>
__device__ __forceinline__ int chunk_idot(const Chunk &k, int x0, int x1) {
    const int s = __dp4a(k.w0, x0, __dp4a(k.w1, x1, 0));
    if constexpr (T == 16) return s - 2 * __dp4a((int)((uint32_t)k.w0 & k.m0), x0, __dp4a((int)((uint32_t)k.w1 & k.m1), x1, 0));
    else return s;
}

// Grouped products: output row o reads the activation slice starting at chunk
// (o / opg) * gchunks of a quantised row of xn elements (plain products: xn = in, gchunks 0).
// IQ2_XXS's grid table into the block's shared memory, for all threads (other formats read none).
template <int T>
__device__ __forceinline__ void stage_grid(uint64_t *grid_s, const uint64_t *grid_g) {
    if constexpr (T == 16) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) grid_s[i] = grid_g[i];
        __syncthreads();
    }
}

struct XGroups {
    int64_t xn, opg, gchunks;
};

constexpr bool has_min(int T) { return T == 10 || T == 12; }

// acc/accm += chunk c of weight chunk k times activation row xr (quantised, `in` elements,
// nblk activation blocks); blk = c's activation block.
template <int T>
__device__ __forceinline__ void chunk_dot(const Chunk &k, const uint8_t *xr, int64_t in, int64_t nblk, int64_t c, int64_t blk,
                                          float &acc, float &accm) {
    const int2 xv = reinterpret_cast<const int2 *>(xr)[c];
    const float xd = reinterpret_cast<const float *>(xr + in)[blk];
    const int s = chunk_idot<T>(k, xv.x, xv.y) * k.sc;
    // the CPU's factor order: activation scale times weight scale
    if (T == 8) acc += (k.d * xd) * (float)s;
    else if (T == 16) acc += (0.125f * xd * k.d) * (float)s;
    else acc += (xd * k.d) * (float)s;
    if (has_min(T) && !(c & 1)) {
        const int bs = reinterpret_cast<const int16_t *>(xr + in + 4 * nblk)[c >> 1];
        accm += (xd * k.dmin) * (float)(k.mn * bs);
    }
}

// chunk_dot with the activation row's pieces already offset to chunk c's piece (c local,
// the piece starting an activation block): the same arithmetic, so the same bits.
template <int T>
__device__ __forceinline__ void chunk_dot_p(const Chunk &k, const int2 *xv, const float *xd, const int16_t *bs, int c, float &acc,
                                            float &accm) {
    const int2 x = xv[c];
    const float d = xd[c / (Fmt<T>::kQK / 8)];
    const int s = chunk_idot<T>(k, x.x, x.y) * k.sc;
    if (T == 8) acc += (k.d * d) * (float)s;
    else if (T == 16) acc += (0.125f * d * k.d) * (float)s;
    else acc += (d * k.d) * (float)s;
    if (has_min(T) && !(c & 1)) accm += (d * k.dmin) * (float)(k.mn * (int)bs[c >> 1]);
}

// The row's value from each lane's partial sums (same on every lane).
template <int T>
__device__ __forceinline__ float warp_dot_total(float v, float m) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, off);
        if (has_min(T)) m += __shfl_xor_sync(0xffffffffu, m, off);
    }
    return v - m;
}

// ---------------------------------------------------------------------------------------
// Staged rows (one-token products): the chunk loads above are 1- to 4-byte reads at 2-byte
// alignment, four or five per chunk, and a one-token product is bound by issuing them. A warp
// instead copies a piece of its row (whole blocks, kElems elements) into shared memory with
// 16-byte asynchronous copies -- about nine a lane for a 4096-wide Q8_0 row, all in flight
// together -- and decodes its chunks from there. Each lane still takes chunks lane, lane + 32, ... in
// ascending order through chunk_dot, so the sums are the unstaged loop's, bit for bit.
template <int T> struct Stage {
    static constexpr int kBlockBytes = T == 8    ? (int)sizeof(quant::BlockQ8_0)
                                       : T == 10 ? (int)sizeof(quant::BlockQ2_K)
                                       : T == 12 ? (int)sizeof(quant::BlockQ4_K)
                                                 : (int)sizeof(quant::BlockIQ2_XXS);
    static constexpr int kElems = 4096;
    static constexpr int kBytes = kElems / Fmt<T>::kQK * kBlockBytes;   // a multiple of 16 for every format
    static constexpr int kLoads = (kBytes / 16 + 31) / 32;              // 16-byte loads a lane, at most
};

// Whether rows at w, row_bytes apart, can be staged (16-byte loads from every row start).
__host__ __device__ inline bool stageable(const void *w, uint64_t row_bytes) {
    return (uintptr_t)w % 16 == 0 && row_bytes % 16 == 0;
}

// Copies piece [e0, e0 + kElems) of each of R rows into sw (R buffers of Stage<T>::kBytes)
// with cp.async: 16 bytes a copy, every copy of the piece in flight at once and none holding
// a register; one commit group. Weights never change, so a kernel may issue its first piece
// before pdl_enter and have the copy overlap the tail of the kernel before it.
template <int T, int R>
__device__ __forceinline__ void stage_piece(const uint8_t *const (&rows)[R], uint8_t *sw, int64_t in, int64_t e0, int lane) {
    using F = Fmt<T>;
    using S = Stage<T>;
    const int64_t ne = in - e0 < S::kElems ? in - e0 : S::kElems;
    const int n16 = (int)(ne / F::kQK * S::kBlockBytes / 16);
    const uint64_t off = (uint64_t)(e0 / F::kQK) * S::kBlockBytes;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int i = 0; i < S::kLoads; ++i) {
            const int j = lane + 32 * i;
            if (j < n16) cp16(sw + r * S::kBytes + 16 * j, rows[r] + off + 16 * (uint64_t)j, 16);
        }
    cp_commit();
}

// acc[r]/accm[r] += the staged piece at e0 of row r (buffer r of sw) . xr. The activation
// chunk of weight chunk c is c + cg of a row of xn elements (grouped products; else cg = 0,
// xn = in). Each lane takes the piece's chunks lane, lane + 32, ... in ascending order.
template <int T, int R>
__device__ __forceinline__ void piece_dot(const uint8_t *sw, int64_t in, int64_t e0, const uint8_t *xr, int64_t xn, int64_t cg,
                                          const uint64_t *grid, int lane, float (&acc)[R], float (&accm)[R]) {
    using F = Fmt<T>;
    using S = Stage<T>;
    const int64_t nblk = xn / F::kQK;
    const int64_t ne = in - e0 < S::kElems ? in - e0 : S::kElems;
    // 32-bit indices inside the piece and activation pointers advanced once per piece: the
    // loop is bound by instruction issue, and 64-bit index math was most of it. The piece's
    // first activation chunk starts an activation block (pieces and groups are whole blocks),
    // so block and bsum indices split as below.
    const int64_t xb = (e0 >> 3) + cg;
    const int2 *xv = reinterpret_cast<const int2 *>(xr) + xb;
    const float *xd = reinterpret_cast<const float *>(xr + xn) + xb / (F::kQK / 8);
    const int16_t *bs = reinterpret_cast<const int16_t *>(xr + xn + 4 * nblk) + xb / 2;
    const int cn = (int)(ne >> 3);
#pragma unroll 4
    for (int c = lane; c < cn; c += 32) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const Chunk k = load_dot<T>(sw + r * S::kBytes, c, grid);
            chunk_dot_p<T>(k, xv, xd, bs, c, acc[r], accm[r]);
        }
    }
}

// acc[i]/accm[i] += row i . xr over `in` elements for R rows of one token, piece by piece
// through sw: NB sets of R staging buffers of Stage<T>::kBytes (16-byte aligned, this warp's
// own). With NB = 2 the next piece's copy is in flight while the current one is decoded.
// issued: the caller already issued piece 0 into the first set (stage_piece). The sums are
// chunk_dot's in the unstaged loop's order, bit for bit.
template <int T, int R, int NB = 1>
__device__ __forceinline__ void staged_rows_dot(const uint8_t *const (&rows)[R], uint8_t *sw, int64_t in, const uint8_t *xr,
                                                int64_t xn, int64_t cg, const uint64_t *grid, int lane, float (&acc)[R],
                                                float (&accm)[R], bool issued = false) {
    using S = Stage<T>;
    const int np = (int)((in + S::kElems - 1) / S::kElems);
    if (!issued) stage_piece<T, R>(rows, sw, in, 0, lane);
    for (int p = 0; p < np; ++p) {
        uint8_t *cur = sw + (NB == 2 ? (p & 1) : 0) * R * S::kBytes;
        if (NB == 2 && p + 1 < np) {
            stage_piece<T, R>(rows, sw + ((p + 1) & 1) * R * S::kBytes, in, (int64_t)(p + 1) * S::kElems, lane);
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncwarp();   // every lane's copies have landed
        piece_dot<T, R>(cur, in, (int64_t)p * S::kElems, xr, xn, cg, grid, lane, acc, accm);
        __syncwarp();   // the piece is decoded before its buffer is refilled
        if (NB == 1 && p + 1 < np) stage_piece<T, R>(rows, sw, in, (int64_t)(p + 1) * S::kElems, lane);
    }
}

}  // namespace
}  // namespace ds4::cuda
