// Single-thread throughput of vec_dot_rows per weight format over a weight block larger
// than the caches, next to a plain streaming-read loop over the same bytes.
// Usage: ds4-bench-quant [--mb N] [--n ROWLEN] [--reps R] [--types q8_0,q2_K,...] [--wall]
// Reports the best of R passes. --tile COLS also times vec_dot_tile (prefill-style, COLS
// activation rows per weight row) over --tile-mb MB of rows (default 4: from the caches;
// more than the last-level cache to read them from memory), the packed tile where the CPU has one
// (Q8_0 on AVX-512 VNNI, packing included), and the core's int8 multiply-add peak (a
// dependency-free run of vpdpbusd, or of vpmaddubsw on AVX2) to put the tiles against.
#include <immintrin.h>

#include <ctime>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/quant/cache_aligned.h"
#include "engine/quant/quants.h"
#include "tools/bench/int8_work.h"
#include "ds4_version.h"

using ds4::quant::Type;

namespace {

struct Fmt {
    const char *name;
    Type t;
    int qk, bytes;
    std::vector<int> f16_offsets;   // scale fields to keep finite and sane
};

const Fmt kFormats[] = {
    {"f32", Type::F32, 1, 4, {}},          {"f16", Type::F16, 1, 2, {}},
    {"bf16", Type::BF16, 1, 2, {}},        {"q8_0", Type::Q8_0, 32, 34, {0}},
    {"q4_K", Type::Q4_K, 256, 144, {0, 2}}, {"q2_K", Type::Q2_K, 256, 84, {80, 82}},
    {"iq2_xxs", Type::IQ2_XXS, 256, 66, {0}},
};

// Thread CPU time by default: the dev machine is shared, and time slices spent in other
// processes would otherwise count as slow kernels (--wall to use wall-clock time).
bool g_wall = false;
double now() {
    timespec ts;
    clock_gettime(g_wall ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

void *alloc(size_t n) {
    void *p = std::aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p) { std::fprintf(stderr, "out of memory\n"); std::exit(1); }
    return p;
}

double read_bandwidth(const uint8_t *p, size_t n, int reps) {
    double best = 1e30;
    volatile float sink = 0;
    for (int r = 0; r < reps; ++r) {
        const double t0 = now();
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (size_t i = 0; i + 128 <= n; i += 128) {
            a0 = _mm256_add_ps(a0, _mm256_load_ps(reinterpret_cast<const float *>(p + i)));
            a1 = _mm256_add_ps(a1, _mm256_load_ps(reinterpret_cast<const float *>(p + i + 32)));
            a2 = _mm256_add_ps(a2, _mm256_load_ps(reinterpret_cast<const float *>(p + i + 64)));
            a3 = _mm256_add_ps(a3, _mm256_load_ps(reinterpret_cast<const float *>(p + i + 96)));
        }
        float tmp[8];
        _mm256_storeu_ps(tmp, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        sink = sink + tmp[0];
        best = std::min(best, now() - t0);
    }
    return double(n) / best / 1e9;
}

}  // namespace

constexpr const char *kUsage = "usage: %s [--mb N] [--n ROWLEN] [--reps R] [--types a,b] [--wall] [--tile COLS [--tile-mb MB]]\n";

int main(int argc, char **argv) {
    if (ds4_wants_version(argc, argv)) {
        ds4_print_version("ds4-bench-quant");
        return 0;
    }
    double mb = 64;
    int64_t n = 4096;
    int reps = 5, tile_cols = 0;
    double tile_mb = 4;
    std::string types = "f32,f16,bf16,q8_0,q4_K,q2_K,iq2_xxs";
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> const char * {
            if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", a.c_str()); std::exit(2); }
            return argv[++i];
        };
        if (a == "--mb") mb = std::atof(next());
        else if (a == "--n") n = std::atoll(next());
        else if (a == "--reps") reps = std::atoi(next());
        else if (a == "--types") types = next();
        else if (a == "--wall") g_wall = true;
        else if (a == "--tile") tile_cols = std::atoi(next());
        else if (a == "--tile-mb") tile_mb = std::atof(next());
        else if (a == "-h" || a == "--help") { std::printf(kUsage, argv[0]); return 0; }
        else { std::fprintf(stderr, "unknown argument %s\n", a.c_str()); std::fprintf(stderr, kUsage, argv[0]); return 2; }
    }
    const size_t total = size_t(mb * 1024 * 1024);
    std::mt19937 rng(1);
    {
        uint8_t *buf = static_cast<uint8_t *>(alloc(total));
        for (size_t i = 0; i < total; ++i) buf[i] = uint8_t(rng());
        std::printf("streaming read (1 thread)  %8.2f GB/s\n", read_bandwidth(buf, total, reps));
        std::free(buf);
    }
    double peak = 0;
    if (tile_cols > 0) {
        // the instruction the tile runs (DS4_NO_AVX512 / DS4_NO_VNNI / DS4_NO_AVXVNNI move it)
        peak = ds4::bench::int8_peak(3, g_wall ? ds4::bench::PeakClock::Wall : ds4::bench::PeakClock::ThreadCpu);
        std::printf("int8 multiply-add peak     %8.2f G/s (1 thread, %s)\n", peak / 1e9, ds4::bench::int8_peak_instruction());
    }
    std::vector<float> x(static_cast<size_t>(n));
    std::normal_distribution<float> g(0, 1);
    for (auto &v : x) v = g(rng);
    for (const Fmt &f : kFormats) {
        const std::string list = "," + types + ",", key = std::string(",") + f.name + ",";
        if (list.find(key) == std::string::npos) continue;
        if (n % f.qk) { std::printf("%-8s skipped: n %% %d != 0\n", f.name, f.qk); continue; }
        const size_t row = size_t(n / f.qk) * size_t(f.bytes);
        const int64_t rows = int64_t(total / row);
        const size_t bytes = row * size_t(rows);
        uint8_t *w = static_cast<uint8_t *>(alloc(bytes));
        if (f.qk == 1) {   // plain types: encode real values so no NaN/Inf slow paths
            std::vector<float> tmp(static_cast<size_t>(n));
            for (int64_t r = 0; r < rows; ++r) {
                for (auto &v : tmp) v = g(rng);
                ds4::quant::quantize_row(f.t, tmp.data(), w + size_t(r) * row, n);
            }
        } else {
            for (size_t i = 0; i < bytes; ++i) w[i] = uint8_t(rng());
            for (size_t b = 0; b < bytes / size_t(f.bytes); ++b)
                for (int off : f.f16_offsets) {
                    const uint16_t h = ds4::quant::f32_to_f16(0.001f + 0.01f * float(rng() % 100) / 100.f);
                    std::memcpy(w + b * size_t(f.bytes) + size_t(off), &h, 2);
                }
        }
        std::vector<uint8_t> xa(ds4::quant::vec_dot_row_bytes(f.t, n));
        ds4::quant::quantize_activation(f.t, x.data(), xa.data(), n);
        std::vector<float> out(static_cast<size_t>(rows));
        double best = 1e30;
        for (int r = 0; r <= reps; ++r) {   // first pass warms pages and caches
            const double t0 = now();
            ds4::quant::vec_dot_rows(f.t, w, row, rows, xa.data(), n, out.data());
            if (r) best = std::min(best, now() - t0);
        }
        std::printf("%-8s vec_dot_rows (1 thread) %8.2f GB/s  %7.2f Gweights/s  (%lld rows x %lld)\n", f.name,
                    double(bytes) / best / 1e9, double(rows) * double(n) / best / 1e9, (long long)rows, (long long)n);
        if (const uint64_t pb = ds4::quant::tile_pack_bytes(f.t, n, 1)) {   // decode's packed kernel (IQ2_XXS on VBMI)
            ds4::quant::CacheAlignedVector<uint8_t> packed(pb);
            std::vector<float> pout(static_cast<size_t>(rows));
            double pbest = 1e30;
            for (int r = 0; r <= reps; ++r) {
                const double t0 = now();
                ds4::quant::tile_pack(f.t, xa.data(), xa.size(), 1, n, 0, 1, packed.data());
                ds4::quant::vec_dot_tile_packed(f.t, w, row, rows, packed.data(), 1, n, pout.data(), 1);
                if (r) pbest = std::min(pbest, now() - t0);
            }
            if (std::memcmp(pout.data(), out.data(), out.size() * sizeof(float)) != 0)
                std::printf("%-8s packed rows differ from vec_dot_rows\n", f.name);
            std::printf("%-8s packed rows   (1 thread) %8.2f GB/s  %7.2f Gweights/s\n", f.name, double(bytes) / pbest / 1e9,
                        double(rows) * double(n) / pbest / 1e9);
        }
        if (tile_cols > 0) {   // prefill-style: the same weights against several activation rows
            std::vector<uint8_t> xs(xa.size() * size_t(tile_cols));
            for (int c = 0; c < tile_cols; ++c) std::memcpy(&xs[xa.size() * size_t(c)], xa.data(), xa.size());
            const int64_t trows = std::min<int64_t>(rows, std::max<int64_t>(1, int64_t(tile_mb * (1 << 20)) / int64_t(row)));
            std::vector<float> tout(size_t(trows) * size_t(tile_cols));
            double tbest = 1e30;
            for (int r = 0; r <= reps; ++r) {
                const double t0 = now();
                ds4::quant::vec_dot_tile(f.t, w, row, trows, xs.data(), xa.size(), tile_cols, n, tout.data(), size_t(trows));
                if (r) tbest = std::min(tbest, now() - t0);
            }
            std::printf("%-8s vec_dot_tile x%-3d        %7.2f Gweight-dots/s (%g MB of rows)\n", f.name, tile_cols,
                        double(trows) * double(n) * tile_cols / tbest / 1e9, tile_mb);
            if (const uint64_t pb = ds4::quant::tile_pack_bytes(f.t, n, tile_cols)) {
                ds4::quant::CacheAlignedVector<uint8_t> packed(pb);
                double pbest = 1e30;
                for (int r = 0; r <= reps; ++r) {
                    const double t0 = now();
                    ds4::quant::tile_pack(f.t, xs.data(), xa.size(), tile_cols, n, 0,
                                          ds4::quant::tile_pack_groups(f.t, tile_cols), packed.data());
                    // in row blocks of ~256 KB, as the prefill's products run it
                    const int64_t blk = std::max<int64_t>(4, int64_t(256 << 10) / int64_t(row));
                    for (int64_t r0 = 0; r0 < trows; r0 += blk)
                        ds4::quant::vec_dot_tile_packed(f.t, static_cast<const uint8_t *>(w) + size_t(r0) * row, row,
                                                        std::min(blk, trows - r0), packed.data(), tile_cols, n,
                                                        tout.data() + r0, size_t(trows));
                    if (r) pbest = std::min(pbest, now() - t0);
                }
                const double rate = double(trows) * double(n) * tile_cols / pbest;
                std::printf("%-8s packed tile x%-3d         %7.2f Gweight-dots/s = %.1f%% of the int8 peak\n", f.name,
                            tile_cols, rate / 1e9, 100 * rate / peak);
            }
        }
        std::free(w);
    }
    return 0;
}
