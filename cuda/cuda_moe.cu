// Routed experts without the host: the router's choices stay on the device, one small kernel
// groups the step's (row, choice) pairs by expert, and the expert products read each chosen
// expert's weights straight out of the layer's stacked tensor. No copy back, no
// synchronisation, five launches per layer whatever K is -- and nothing in a step that a
// graph could not replay. Used for steps of few rows (decode, small batches); a big prefill
// step groups on the host, where per-expert launches amortise.
//
// Results equal the host-grouped path's bit for bit: pairs are ordered by expert, then by
// row and choice, as the host orders them; each output row is accumulated through the same
// chunk_dot / warp_dot_total as qmatmul_kernel; the clamped SwiGLU is the same expression;
// the weighted sum adds the experts' outputs into zero in ascending expert order, as the
// host path's memset + scatter-adds do.
#include <cstdint>

#include "cuda/cuda_check.h"
#include "cuda/cuda_launch.cuh"
#include "cuda/cuda_kernels.h"
#include "cuda/cuda_moe_sum.cuh"
#include "cuda/cuda_qblocks.cuh"
#include "engine/common/error.h"

namespace ds4::cuda {

extern uint64_t *g_grid_addr;   // IQ2_XXS grid in device memory (cuda_qmatmul.cu)

namespace {

using gguf::Type;
constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 4;   // staged one-row kernels

// Output rows a warp of the staged one-row kernels copies at once (R weight rows each): as
// many as fit 10 KB a warp, so a block stays near 40 KB of shared memory.
template <int T, int R>
constexpr int stage_group() {
    const int g = 10240 / (R * Stage<T>::kBytes);
    return g < 1 ? 1 : g > kRowsPerWarp ? kRowsPerWarp : g;
}

__global__ void moe_group_kernel(const int *__restrict__ ids, const float *__restrict__ w, int P, int K, int E,
                                 MoeGroups g) {
    pdl_enter();
    extern __shared__ int sm[];   // cnt[E], start[E], ids[P]
    int *cnt = sm, *start = sm + E, *sid = sm + 2 * E;
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
        const int e = ids[p];
        sid[p] = e;
        if (e < 0 || e >= E) atomicExch(g.err, 1 + p);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int n = 0;
        for (int p = 0; p < P; ++p) n += sid[p] == e;
        cnt[e] = n;
    }
    __syncthreads();
    // Starts and the used list in ascending expert order: warp 0 scans 32 experts at a time
    // (the same values as a serial walk over E, without E dependent steps on one thread).
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        int n = 0, pos = 0;
        for (int e0 = 0; e0 < E; e0 += 32) {
            const int e = e0 + lane;
            const int c = e < E ? cnt[e] : 0, f = c > 0;
            int ic = c, in = f;   // inclusive scans
            for (int off = 1; off < 32; off <<= 1) {
                const int uc = __shfl_up_sync(0xffffffffu, ic, off), uf = __shfl_up_sync(0xffffffffu, in, off);
                if (lane >= off) ic += uc, in += uf;
            }
            if (e < E) {
                start[e] = pos + ic - c;
                if (f) g.used[n + in - 1] = e, g.off[n + in - 1] = pos + ic - c;
            }
            pos += __shfl_sync(0xffffffffu, ic, 31);
            n += __shfl_sync(0xffffffffu, in, 31);
        }
        if (lane == 0) g.off[n] = pos, *g.n_used = n;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        if (!cnt[e]) continue;
        int q = start[e];
        for (int p = 0; p < P; ++p)
            if (sid[p] == e) g.prow[q] = p / K, g.pw[q] = w[p], ++q;
    }
}

// h[j][o] = SwiGLU(gate_e[o] . x[prow[j]], up_e[o] . x[prow[j]]) for the pairs j of expert
// used[blockIdx.y]; output rows o split kWarps per block, a warp each.
template <int T, int NT, bool SG = false>
__global__ void __launch_bounds__(32 * kWarps, SG ? 8 : NT == 1 ? 6 : 4)
    moe_gate_up_kernel(const uint8_t *__restrict__ gate, const uint8_t *__restrict__ up, uint64_t eb_g, uint64_t eb_u,
                       uint64_t rb_g, uint64_t rb_u, int64_t in, int64_t F, const uint8_t *__restrict__ xq, uint64_t qrow,
                       MoeGroups g, float *__restrict__ h, float lim, const uint64_t *__restrict__ grid_g,
                       const int *__restrict__ slot, int u0) {
    pdl_enter();
    using Fm = Fmt<T>;
    const int u = u0 + blockIdx.y;
    if (u >= *g.n_used) return;   // uniform per block
    __shared__ uint64_t grid_s[T == 16 ? 256 : 1];
    stage_grid<T>(grid_s, grid_g);
    const int lane = threadIdx.x & 31;
    const int e = slot ? slot[g.used[u]] : g.used[u], p0 = g.off[u], p1 = g.off[u + 1];
    const int64_t nblk = in / Fm::kQK, chunks = in >> 3;
    if constexpr (SG) {
        // one row (NT == 1): kRowsPerWarp output rows a warp, so the block's prologue (the
        // expert, its pairs, the grid table) is paid once for all of them; gate and up of a
        // row are staged together, G output rows' copies in flight at once
        constexpr int G = stage_group<T, 2>();
        __shared__ __align__(16) uint8_t stage_s[kWarps][G * 2 * Stage<T>::kBytes];
        uint8_t *sw = stage_s[threadIdx.x >> 5];
        const int64_t o0 = (int64_t)blockIdx.x * kRowsPerWarp * kWarps + (threadIdx.x >> 5);
        for (int r0 = 0; r0 < kRowsPerWarp; r0 += G) {
            const bool whole = in <= Stage<T>::kElems;   // one piece a row: copy G rows, then decode
            if (whole)
                for (int r = 0; r < G && r0 + r < kRowsPerWarp; ++r) {
                    const int64_t o = o0 + (int64_t)(r0 + r) * kWarps;
                    const uint8_t *rows[2] = {gate + (uint64_t)e * eb_g + (uint64_t)o * rb_g, up + (uint64_t)e * eb_u + (uint64_t)o * rb_u};
                    if (o < F) stage_piece<T, 2>(rows, sw + r * 2 * Stage<T>::kBytes, in, 0, lane);
                }
            cp_wait<0>();
            __syncwarp();
            for (int r = 0; r < G && r0 + r < kRowsPerWarp; ++r) {
                const int64_t o = o0 + (int64_t)(r0 + r) * kWarps;
                if (o >= F) break;
                const uint8_t *rows[2] = {gate + (uint64_t)e * eb_g + (uint64_t)o * rb_g, up + (uint64_t)e * eb_u + (uint64_t)o * rb_u};
                for (int j = p0; j < p1; ++j) {
                    float a[2] = {0.f, 0.f}, am[2] = {0.f, 0.f};
                    const uint8_t *xr = xq + (uint64_t)g.prow[j] * qrow;
                    if (whole) piece_dot<T, 2>(sw + r * 2 * Stage<T>::kBytes, in, 0, xr, in, 0, grid_s, lane, a, am);
                    else staged_rows_dot<T, 2>(rows, sw, in, xr, in, 0, grid_s, lane, a, am);
                    const float vg = warp_dot_total<T>(a[0], am[0]), vu = warp_dot_total<T>(a[1], am[1]);
                    if (lane == 0) {
                        const float x = fminf(vg, lim), b = fminf(fmaxf(vu, -lim), lim);
                        h[(int64_t)j * F + o] = x / (1.f + expf(-x)) * b;
                    }
                }
            }
            __syncwarp();   // decoded before the next group's copies land
        }
    } else {
        const int64_t o = (int64_t)blockIdx.x * kWarps + (threadIdx.x >> 5);
        if (o >= F) return;
        const uint8_t *grow = gate + (uint64_t)e * eb_g + (uint64_t)o * rb_g;
        const uint8_t *urow = up + (uint64_t)e * eb_u + (uint64_t)o * rb_u;
        for (int j0 = p0; j0 < p1; j0 += NT) {
            const int nt = p1 - j0 < NT ? p1 - j0 : NT;
            const uint8_t *xr[NT];
            float ag[NT], agm[NT], au[NT], aum[NT];
    #pragma unroll
            for (int t = 0; t < NT; ++t) {
                xr[t] = xq + (uint64_t)g.prow[j0 + (t < nt ? t : 0)] * qrow;
                ag[t] = agm[t] = au[t] = aum[t] = 0.f;
            }
    #pragma unroll(NT == 1 ? 4 : 2)
            for (int64_t c = lane; c < chunks; c += 32) {
                const Chunk kg = load_dot<T>(grow, c, grid_s), ku = load_dot<T>(urow, c, grid_s);
                const int64_t blk = c / (Fm::kQK / 8);
    #pragma unroll
                for (int t = 0; t < NT; ++t)
                    if (t < nt) {
                        chunk_dot<T>(kg, xr[t], in, nblk, c, blk, ag[t], agm[t]);
                        chunk_dot<T>(ku, xr[t], in, nblk, c, blk, au[t], aum[t]);
                    }
            }
    #pragma unroll
            for (int t = 0; t < NT; ++t) {
                const float vg = warp_dot_total<T>(ag[t], agm[t]), vu = warp_dot_total<T>(au[t], aum[t]);
                if (lane == 0 && t < nt) {
                    // as swiglu_kernel
                    const float a = fminf(vg, lim), b = fminf(fmaxf(vu, -lim), lim);
                    h[(int64_t)(j0 + t) * F + o] = a / (1.f + expf(-a)) * b;
                }
            }
        }
    }
}

// y[j][o] = down_e[o] . hq[j] for the pairs j of expert used[blockIdx.y].
template <int T, int NT, bool SG = false>
__global__ void __launch_bounds__(32 * kWarps, SG ? 8 : NT == 1 ? 6 : 4)
    moe_down_kernel(const uint8_t *__restrict__ down, uint64_t eb, uint64_t rb, int64_t in, int64_t D,
                    const uint8_t *__restrict__ hq, uint64_t qrow, MoeGroups g, float *__restrict__ y,
                    const uint64_t *__restrict__ grid_g, const int *__restrict__ slot, int u0) {
    pdl_enter();
    using Fm = Fmt<T>;
    const int u = u0 + blockIdx.y;
    if (u >= *g.n_used) return;
    __shared__ uint64_t grid_s[T == 16 ? 256 : 1];
    stage_grid<T>(grid_s, grid_g);
    const int lane = threadIdx.x & 31;
    const int e = slot ? slot[g.used[u]] : g.used[u], p0 = g.off[u], p1 = g.off[u + 1];
    const int64_t nblk = in / Fm::kQK, chunks = in >> 3;
    if constexpr (SG) {   // as moe_gate_up_kernel's
        constexpr int G = stage_group<T, 1>();
        __shared__ __align__(16) uint8_t stage_s[kWarps][G * Stage<T>::kBytes];
        uint8_t *sw = stage_s[threadIdx.x >> 5];
        const int64_t o0 = (int64_t)blockIdx.x * kRowsPerWarp * kWarps + (threadIdx.x >> 5);
        for (int r0 = 0; r0 < kRowsPerWarp; r0 += G) {
            const bool whole = in <= Stage<T>::kElems;
            if (whole)
                for (int r = 0; r < G && r0 + r < kRowsPerWarp; ++r) {
                    const int64_t o = o0 + (int64_t)(r0 + r) * kWarps;
                    const uint8_t *rows[1] = {down + (uint64_t)e * eb + (uint64_t)o * rb};
                    if (o < D) stage_piece<T, 1>(rows, sw + r * Stage<T>::kBytes, in, 0, lane);
                }
            cp_wait<0>();
            __syncwarp();
            for (int r = 0; r < G && r0 + r < kRowsPerWarp; ++r) {
                const int64_t o = o0 + (int64_t)(r0 + r) * kWarps;
                if (o >= D) break;
                const uint8_t *rows[1] = {down + (uint64_t)e * eb + (uint64_t)o * rb};
                for (int j = p0; j < p1; ++j) {
                    float a[1] = {0.f}, am[1] = {0.f};
                    const uint8_t *xr = hq + (uint64_t)j * qrow;
                    if (whole) piece_dot<T, 1>(sw + r * Stage<T>::kBytes, in, 0, xr, in, 0, grid_s, lane, a, am);
                    else staged_rows_dot<T, 1>(rows, sw, in, xr, in, 0, grid_s, lane, a, am);
                    const float v = warp_dot_total<T>(a[0], am[0]);
                    if (lane == 0) y[(int64_t)j * D + o] = v;
                }
            }
            __syncwarp();
        }
    } else {
        const int64_t o = (int64_t)blockIdx.x * kWarps + (threadIdx.x >> 5);
        if (o >= D) return;
        const uint8_t *row = down + (uint64_t)e * eb + (uint64_t)o * rb;
        for (int j0 = p0; j0 < p1; j0 += NT) {
            const int nt = p1 - j0 < NT ? p1 - j0 : NT;
            float acc[NT], accm[NT];
    #pragma unroll
            for (int t = 0; t < NT; ++t) acc[t] = accm[t] = 0.f;
    #pragma unroll(NT == 1 ? 4 : 2)
            for (int64_t c = lane; c < chunks; c += 32) {
                const Chunk k = load_dot<T>(row, c, grid_s);
                const int64_t blk = c / (Fm::kQK / 8);
    #pragma unroll
                for (int t = 0; t < NT; ++t)
                    if (t < nt) chunk_dot<T>(k, hq + (uint64_t)(j0 + t) * qrow, in, nblk, c, blk, acc[t], accm[t]);
            }
    #pragma unroll
            for (int t = 0; t < NT; ++t) {
                const float v = warp_dot_total<T>(acc[t], accm[t]);
                if (lane == 0 && t < nt) y[(int64_t)(j0 + t) * D + o] = v;
            }
        }
    }
}

// A[r] = sum over the pairs of row r, in pair order, of pw * y[pair]. Blocks split D (one
// block per row left a decode step's sum on one SM).
__global__ void moe_combine_kernel(const float *__restrict__ y, int D, int P, MoeGroups g, float *__restrict__ A) {
    pdl_enter();
    const int r = blockIdx.y;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < D; i += gridDim.x * blockDim.x)
        A[(int64_t)r * D + i] = moe_row_sum(y, D, P, g, r, i);
}

__global__ void moe_combine_pos_kernel(const float *__restrict__ y, int D, const int *__restrict__ pos,
                                       const float *__restrict__ pw, int K, float *__restrict__ A) {
    pdl_enter();
    const int r = blockIdx.y;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < D; i += gridDim.x * blockDim.x) {
        float acc = 0.f;
        for (int k = 0; k < K; ++k) {
            const int p = pos[r * K + k];
            acc += pw[p] * y[(int64_t)p * D + i];
        }
        A[(int64_t)r * D + i] = acc;
    }
}

template <int T>
void launch_gate_up(cudaStream_t s, const ExpertMats &m, int64_t in, int64_t F, const uint8_t *xq, uint64_t qrow,
                    const MoeGroups &g, int max_used, bool one_row, float *h, float lim, int u0) {
    const dim3 grid((unsigned)((F + kWarps - 1) / kWarps), (unsigned)max_used);
    const dim3 sgrid((unsigned)((F + kWarps * kRowsPerWarp - 1) / (kWarps * kRowsPerWarp)), (unsigned)max_used);
    if (one_row && stage_rows(in) && stageable(m.gate, m.rb_gate) && stageable(m.up, m.rb_up) && m.eb_gate % 16 == 0 && m.eb_up % 16 == 0)
        launch_pdl(moe_gate_up_kernel<T, 1, true>, sgrid, 32 * kWarps, 0, s, m.gate, m.up, m.eb_gate, m.eb_up, m.rb_gate, m.rb_up, in, F,
                                                                    xq, qrow, g, h, lim, g_grid_addr, m.slot, u0);
    else if (one_row)
        launch_pdl(moe_gate_up_kernel<T, 1>, grid, 32 * kWarps, 0, s, m.gate, m.up, m.eb_gate, m.eb_up, m.rb_gate, m.rb_up, in, F, xq,
                                                              qrow, g, h, lim, g_grid_addr, m.slot, u0);
    else
        launch_pdl(moe_gate_up_kernel<T, 8>, grid, 32 * kWarps, 0, s, m.gate, m.up, m.eb_gate, m.eb_up, m.rb_gate, m.rb_up, in, F, xq,
                                                              qrow, g, h, lim, g_grid_addr, m.slot, u0);
    DS4_CUDA_LAUNCHED();
}

template <int T>
void launch_down(cudaStream_t s, const ExpertMats &m, int64_t in, int64_t D, const uint8_t *hq, uint64_t qrow,
                 const MoeGroups &g, int max_used, bool one_row, float *y, int u0) {
    const dim3 grid((unsigned)((D + kWarps - 1) / kWarps), (unsigned)max_used);
    const dim3 sgrid((unsigned)((D + kWarps * kRowsPerWarp - 1) / (kWarps * kRowsPerWarp)), (unsigned)max_used);
    if (one_row && stage_rows(in) && stageable(m.down, m.rb_down) && m.eb_down % 16 == 0)
        launch_pdl(moe_down_kernel<T, 1, true>, sgrid, 32 * kWarps, 0, s, m.down, m.eb_down, m.rb_down, in, D, hq, qrow, g, y, g_grid_addr,
                                                                 m.slot, u0);
    else if (one_row)
        launch_pdl(moe_down_kernel<T, 1>, grid, 32 * kWarps, 0, s, m.down, m.eb_down, m.rb_down, in, D, hq, qrow, g, y, g_grid_addr, m.slot, u0);
    else
        launch_pdl(moe_down_kernel<T, 8>, grid, 32 * kWarps, 0, s, m.down, m.eb_down, m.rb_down, in, D, hq, qrow, g, y, g_grid_addr, m.slot, u0);
    DS4_CUDA_LAUNCHED();
}

template <class F>
void by_type(Type t, const char *what, F &&f) {
    switch (t) {
    case Type::Q8_0: f(std::integral_constant<int, 8>{}); return;
    case Type::Q2_K: f(std::integral_constant<int, 10>{}); return;
    case Type::Q4_K: f(std::integral_constant<int, 12>{}); return;
    case Type::IQ2_XXS: f(std::integral_constant<int, 16>{}); return;
    default: failf("CUDA backend: no device-grouped expert product for %s %s weights", gguf::type_name(t), what);
    }
}

}  // namespace

bool moe_type_supported(Type t) { return t == Type::Q8_0 || t == Type::Q2_K || t == Type::Q4_K || t == Type::IQ2_XXS; }

void moe_group(cudaStream_t s, const int *ids, const float *wts, int P, int K, int E, const MoeGroups &g) {
    if (P <= 0) return;
    const size_t shm = sizeof(int) * (2 * (size_t)E + (size_t)P);
    if (shm > 48 * 1024) failf("CUDA backend: %d routed pairs over %d experts are too many to group on the device", P, E);
    launch_pdl(moe_group_kernel, 1, 256, shm, s, ids, wts, P, K, E, g);
    DS4_CUDA_LAUNCHED();
}

void moe_gate_up(cudaStream_t s, const ExpertMats &m, int64_t in, int64_t F, const uint8_t *xq, uint64_t qrow,
                 const MoeGroups &g, int max_used, bool one_row, float *h, float lim, int u0) {
    if (m.type_gate != m.type_up) fail("CUDA backend: device-grouped experts need gate and up of one type");
    by_type(m.type_gate, "gate/up", [&](auto T) { launch_gate_up<T()>(s, m, in, F, xq, qrow, g, max_used, one_row, h, lim, u0); });
}

void moe_down(cudaStream_t s, const ExpertMats &m, int64_t in, int64_t D, const uint8_t *hq, uint64_t qrow,
              const MoeGroups &g, int max_used, bool one_row, float *y, int u0) {
    by_type(m.type_down, "down", [&](auto T) { launch_down<T()>(s, m, in, D, hq, qrow, g, max_used, one_row, y, u0); });
}

void moe_combine(cudaStream_t s, const float *y, int D, int P, const MoeGroups &g, float *A, int rows) {
    if (rows <= 0) return;
    launch_pdl(moe_combine_kernel, dim3((unsigned)((D + 255) / 256), (unsigned)rows), 256, 0, s, y, D, P, g, A);
    DS4_CUDA_LAUNCHED();
}

void moe_combine_pos(cudaStream_t s, const float *y, int D, const int *pos, const float *pw, int K, float *A, int rows) {
    if (rows <= 0) return;
    launch_pdl(moe_combine_pos_kernel, dim3((unsigned)((D + 255) / 256), (unsigned)rows), 256, 0, s, y, D, pos, pw, K, A);
    DS4_CUDA_LAUNCHED();
}

}  // namespace ds4::cuda
