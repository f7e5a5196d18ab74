// Per-operation timing of the CPU executor (DS4_CPU_PROFILE=1: a table on stderr when the
// executor ends; DS4_CPU_PROFILE=N > 1: also every N steps). Each operation's wall time,
// rows and weight bytes read, summed by step size (1, 2-3, 4-7, 8-15, 16+ rows), so a
// multi-row step can be compared with a one-row step op by op. Off: one branch per op.
#pragma once
#include <chrono>
#include <cstdint>

namespace ds4 {

enum class CpuOp : int {
    Embed, HcPre, Norm, QKv, Compress, Indexer, Attend, OutProj, HcPost, Route, Experts, Shared, Head, Count
};

class CpuProfile {
public:
    CpuProfile();
    ~CpuProfile();
    bool on() const { return every_ != 0; }
    void step(int rows);   // a step of `rows` rows begins
    void add(CpuOp op, uint64_t ns, uint64_t bytes);
    void add_experts(int distinct) { experts_[bucket_] += (uint64_t)distinct; }
    void print() const;

private:
    static constexpr int kBuckets = 5;
    int64_t every_ = 0;
    int bucket_ = 0;
    uint64_t steps_[kBuckets] = {}, rows_[kBuckets] = {}, experts_[kBuckets] = {};
    uint64_t ns_[kBuckets][(int)CpuOp::Count] = {}, bytes_[kBuckets][(int)CpuOp::Count] = {};
};

// Times one operation (and the weight bytes it read) when profiling is on.
class CpuOpTimer {
public:
    CpuOpTimer(CpuProfile &p, CpuOp op, const uint64_t &bytes)
        : p_(p), op_(op), bytes_(bytes), b0_(bytes), on_(p.on()) {
        if (on_) t0_ = std::chrono::steady_clock::now();
    }
    ~CpuOpTimer() {
        if (on_)
            p_.add(op_, (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_).count(),
                   bytes_ - b0_);
    }

private:
    CpuProfile &p_;
    CpuOp op_;
    const uint64_t &bytes_;
    uint64_t b0_;
    bool on_;
    std::chrono::steady_clock::time_point t0_;
};

}  // namespace ds4
