// Activation quantisation, one lane's part: the CPU quantiser's exact arithmetic (see
// cuda_qmatmul.cu), shared by the quantise kernel and the kernels that quantise what they have
// just computed (a norm, SwiGLU, the attention output's rope), so their int8 values and scales
// are the quantise kernel's bit for bit.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace ds4::cuda {
namespace {

// The lane holds elements [8c, 8c + 8) of a row of n (a multiple of QK) in v; the QK / 8 lanes
// of a block are consecutive lanes of one warp, and every lane of the warp calls this (lanes
// past the row with in = false and v zero). Writes the lane's int8 values, and the block's
// scale (and Q8_K sums) into the quantised row `row` (layout: cuda_qmatmul.cu).
template <int QK>
__device__ __forceinline__ void quantize_chunk(const float (&v)[8], bool in, int lane, int64_t c, int64_t n, uint8_t *row) {
    constexpr int G = QK / 8;   // lanes per block
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i)
        if (isfinite(v[i])) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
    for (int off = 1; off < G; off <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
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

}  // namespace
}  // namespace ds4::cuda
