#include "tools/bench/int8_work.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <string>

#include "engine/quant/int8_dot.h"
#include "engine/quant/quants.h"

namespace ds4::bench {

double q8_0_macs_per_token(const std::vector<gguf::TensorInfo> &tensors, const ModelConfig &c) {
    double macs = 0;
    for (const gguf::TensorInfo &t : tensors) {
        if (t.type != gguf::Type::Q8_0 || t.ne.size() < 2 || t.name.rfind("blk.", 0) != 0) continue;
        if (t.name.find(".ffn_gate_inp.") != std::string::npos && c.is_hash(std::atoi(t.name.c_str() + 4))) continue;
        double m = double(t.ne[0]) * double(t.ne[1]);
        if (t.name.find("_exps.") != std::string::npos) m *= c.n_expert_used;       // one expert's, per use
        else if (t.ne.size() > 2) m *= double(t.ne[2]);
        macs += m;
    }
    return macs;
}

namespace {

// GCC 12 warns about the undefined pass-through operand inside its AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

constexpr long kIters = 4000000;

// Multiply-adds done by one run; 12 independent accumulators each.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) double run_vnni512() {
    __m512i a[12];
    __m512i x = _mm512_set1_epi8(3), y = _mm512_set1_epi8(5);
    for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_epi32(i);
    for (long k = 0; k < kIters; ++k) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; ++i) a[i] = _mm512_dpbusd_epi32(a[i], x, y);
        __asm__ volatile("" : "+v"(x), "+v"(y));
    }
    for (int i = 1; i < 12; ++i) a[0] = _mm512_add_epi32(a[0], a[i]);
    volatile int sink = _mm512_reduce_add_epi32(a[0]);
    (void)sink;
    return double(kIters) * 12 * 64;
}

// Each chain feeds its own result back as the unsigned operand: with a shared product
// (a[i] += maddubs(x, y)) the compiler computes the product once and the loop times adds.
__attribute__((target("avx2"))) double run_avx2() {
    __m256i a[10];
    const __m256i y = _mm256_set1_epi8(5);
    for (int i = 0; i < 10; ++i) a[i] = _mm256_set1_epi8(char(i + 1));
    for (long k = 0; k < kIters; ++k) {
#pragma GCC unroll 10
        for (int i = 0; i < 10; ++i) a[i] = _mm256_maddubs_epi16(a[i], y);
    }
    for (int i = 1; i < 10; ++i) a[0] = _mm256_add_epi16(a[0], a[i]);
    volatile int sink = _mm256_extract_epi16(a[0], 0);
    (void)sink;
    return double(kIters) * 10 * 32;
}

// The VEX vpdpbusd (AVX-VNNI), the kernels' own (int8_dot.h): tools are built for x86-64-v3.
double run_avxvnni() {
    __m256i a[12];
    __m256i x = _mm256_set1_epi8(3), y = _mm256_set1_epi8(5);
    for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_epi32(i);
    for (long k = 0; k < kIters; ++k) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; ++i) a[i] = ds4::quant::detail::dot4_add<ds4::quant::detail::Isa::AvxVnni>(a[i], x, y);
        __asm__ volatile("" : "+x"(x), "+x"(y));
    }
    for (int i = 1; i < 12; ++i) a[0] = _mm256_add_epi32(a[0], a[i]);
    volatile int sink = _mm256_extract_epi32(a[0], 0);
    (void)sink;
    return double(kIters) * 12 * 32;
}

// The instruction the Q8_0 tile runs (DS4_NO_AVX512 / DS4_NO_VNNI / DS4_NO_AVXVNNI move it).
double run_once() {
    const std::string isa = ds4::quant::q8_0_tile_isa();
    return isa == "avx512-vnni" ? run_vnni512() : isa == "avx-vnni" ? run_avxvnni() : run_avx2();
}

}  // namespace

const char *int8_peak_instruction() {
    const std::string isa = ds4::quant::q8_0_tile_isa();
    return isa == "avx512-vnni" ? "512-bit vpdpbusd" : isa == "avx-vnni" ? "256-bit VEX vpdpbusd" : "256-bit vpmaddubsw";
}

double int8_peak(int reps, PeakClock clock) {
    const auto seconds = [clock] {
        if (clock == PeakClock::Wall)
            return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
        timespec ts;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
    };
    double best = 0;
    for (int r = 0; r < reps; ++r) {
        const double t0 = seconds();
        const double macs = run_once();
        best = std::max(best, macs / (seconds() - t0));
    }
    return best;
}

}  // namespace ds4::bench
