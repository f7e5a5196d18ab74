#include "engine/cpu/cpu_profile.h"

#include <cstdio>
#include <cstdlib>

namespace ds4 {

namespace {
const char *const kNames[] = {"embed",     "hc_pre", "norm",  "q_kv",   "compress", "indexer", "attend",
                              "out_proj",  "hc_post", "route", "experts", "shared",   "head"};
const char *const kBucketNames[] = {"1 row", "2-3 rows", "4-7 rows", "8-15 rows", "16+ rows"};
}  // namespace

CpuProfile::CpuProfile() {
    if (const char *e = std::getenv("DS4_CPU_PROFILE")) every_ = std::strtoll(e, nullptr, 10);
    if (every_ < 0) every_ = 0;
}

CpuProfile::~CpuProfile() {
    if (on()) print();
}

void CpuProfile::step(int rows) {
    if (!on()) return;
    bucket_ = rows <= 1 ? 0 : rows < 4 ? 1 : rows < 8 ? 2 : rows < 16 ? 3 : 4;
    ++steps_[bucket_];
    rows_[bucket_] += (uint64_t)rows;
    uint64_t all = 0;
    for (uint64_t s : steps_) all += s;
    if (every_ > 1 && all % (uint64_t)every_ == 0) print();
}

void CpuProfile::add(CpuOp op, uint64_t ns, uint64_t bytes) {
    ns_[bucket_][(int)op] += ns;
    bytes_[bucket_][(int)op] += bytes;
}

void CpuProfile::print() const {
    for (int b = 0; b < kBuckets; ++b) {
        if (!steps_[b]) continue;
        uint64_t total = 0;
        for (int o = 0; o < (int)CpuOp::Count; ++o) total += ns_[b][o];
        std::fprintf(stderr, "ds4 cpu profile, steps of %s: %llu steps, %.2f rows/step, %.3f ms/step, %.1f distinct experts/step\n",
                     kBucketNames[b], (unsigned long long)steps_[b], (double)rows_[b] / steps_[b], total / 1e6 / steps_[b],
                     (double)experts_[b] / steps_[b]);
        for (int o = 0; o < (int)CpuOp::Count; ++o) {
            if (!ns_[b][o]) continue;
            const double ms = ns_[b][o] / 1e6 / steps_[b], mb = bytes_[b][o] / 1e6 / steps_[b];
            std::fprintf(stderr, "  %-9s %9.3f ms/step %5.1f%%  %8.1f MB/step  %6.2f GB/s\n", kNames[o], ms,
                         100.0 * ns_[b][o] / (total ? total : 1), mb, ms > 0 ? mb / ms : 0.0);
        }
    }
}

}  // namespace ds4
