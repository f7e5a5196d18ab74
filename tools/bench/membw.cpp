#include "tools/bench/membw.h"

#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "engine/common/error.h"

namespace ds4 {

double measure_read_bandwidth(ThreadPool &pool, uint64_t bytes, int reps) {
    void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) fail("membw: cannot map the test buffer");
    madvise(p, bytes, MADV_HUGEPAGE);   // best case for the machine: few TLB misses
    auto *buf = static_cast<uint8_t *>(p);
    // Fill in parallel so pages are first-touched by the threads that will read them.
    pool.parallel_for((int64_t)(bytes / 4096), 64, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) std::memset(buf + i * 4096, (int)(i & 0x7f), 4096);
    });
    double best = 0;
    std::vector<double> sums(pool.size() * 8, 0.0);
    for (int r = 0; r < reps; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        pool.parallel_for((int64_t)(bytes / 4096), 16, [&](int64_t b, int64_t e, int th) {
            __m256i acc0 = _mm256_setzero_si256(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
            for (int64_t i = b; i < e; ++i) {
                const __m256i *q = reinterpret_cast<const __m256i *>(buf + i * 4096);
                for (int k = 0; k < 4096 / 32; k += 4) {
                    acc0 = _mm256_add_epi64(acc0, _mm256_load_si256(q + k));
                    acc1 = _mm256_add_epi64(acc1, _mm256_load_si256(q + k + 1));
                    acc2 = _mm256_add_epi64(acc2, _mm256_load_si256(q + k + 2));
                    acc3 = _mm256_add_epi64(acc3, _mm256_load_si256(q + k + 3));
                }
            }
            __m256i s = _mm256_add_epi64(_mm256_add_epi64(acc0, acc1), _mm256_add_epi64(acc2, acc3));
            sums[th * 8] += (double)_mm256_extract_epi64(s, 0);
        });
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::max(best, (double)bytes / sec);
    }
    munmap(p, bytes);
    return best;
}

}  // namespace ds4
