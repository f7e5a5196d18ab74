// Per-operation GPU time of the CUDA executor, for finding where a step's time goes
// (DS4_CUDA_PROFILE=1; off by default: it synchronises after every operation). Each scope
// records the host wall time of the operation (launches, host tables, uploads) and the
// device time between events around it; the table goes to stderr when the executor ends,
// decode steps (one row) apart from multi-row steps.
// With a synchronisation per scope, an operation of several kernels also counts the GPU's
// idle time while the host launches each one. DS4_CUDA_PROFILE=async records the events in
// the stream without waiting and reads them when the step has drained: while the host
// enqueues ahead of the device (decode is device-bound), that is each operation's own device
// time; the step totals (as =step) come with it, to check that the host was ahead.
#pragma once
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace ds4::cuda {

class OpProfile {
public:
    OpProfile() {
        const char *e = std::getenv("DS4_CUDA_PROFILE");
        const std::string m = e ? e : "";
        async_ = m == "async";
        step_ = m == "step" || async_;
        on_ = !m.empty() && m != "0" && m != "step";
    }
    ~OpProfile() {
        print();
        for (int m = 0; m < 2; ++m)
            if (step_ && st_[m].steps)
                std::fprintf(stderr,
                             "DS4_CUDA_PROFILE: %llu %s steps (%.1f rows): host enqueue %.1f us, device %.1f us, wall %.1f us per step\n",
                             (unsigned long long)st_[m].steps, m ? "multi-row" : "one-row", (double)st_[m].rows / st_[m].steps,
                             st_[m].enq_us / st_[m].steps, st_[m].dev_us / st_[m].steps, st_[m].wall_us / st_[m].steps);
        if (ev0_) cudaEventDestroy(ev0_), cudaEventDestroy(ev1_);
        for (cudaEvent_t ev : pool_) cudaEventDestroy(ev);
    }
    bool on() const { return on_; }

    // DS4_CUDA_PROFILE=step: whole steps without per-operation synchronisation --
    // the host's time to enqueue a step against the device's time to run it (is decode bound
    // by launches or by kernels?).
    void step_begin(cudaStream_t s, int rows) {
        if (async_) drain();   // the executor drained the stream before a step
        if (!step_) return;
        rows_now_ = rows;
        if (!ev0_) cudaEventCreate(&ev0_), cudaEventCreate(&ev1_);
        t0_ = std::chrono::steady_clock::now();
        cudaEventRecord(ev0_, s);
        in_step_ = true;
    }
    void step_enqueued(cudaStream_t s) {
        if (!in_step_) return;
        t1_ = std::chrono::steady_clock::now();
        cudaEventRecord(ev1_, s);
    }
    void step_end() {
        if (!in_step_) return;
        in_step_ = false;
        cudaEventSynchronize(ev1_);
        drain();
        float ms = 0.f;
        cudaEventElapsedTime(&ms, ev0_, ev1_);
        const auto t2 = std::chrono::steady_clock::now();
        StepTimes &st = st_[rows_now_ > 1];
        st.enq_us += std::chrono::duration<double, std::micro>(t1_ - t0_).count();
        st.wall_us += std::chrono::duration<double, std::micro>(t2 - t0_).count();
        st.dev_us += 1000.0 * ms;
        st.rows += rows_now_;
        ++st.steps;
    }

    struct Scope {
        OpProfile *p;
        const char *name;
        cudaEvent_t a = nullptr, b = nullptr;
        std::chrono::steady_clock::time_point t0;
        cudaStream_t s;
        // bytes: weight bytes the operation reads (0: none reported), for the GB/s column.
        Scope(OpProfile *p_, const char *n, cudaStream_t s_, bool multi, uint64_t bytes = 0)
            : p(p_->on_ ? p_ : nullptr), name(n), s(s_), bytes(bytes) {
            if (!p) return;
            key = std::string(multi ? "multi-row " : "one-row   ") + n;
            if (p->async_) {
                a = p->event(), b = p->event();
            } else {
                cudaStreamSynchronize(s);
                cudaEventCreate(&a), cudaEventCreate(&b);
            }
            cudaEventRecord(a, s);
            t0 = std::chrono::steady_clock::now();
        }
        ~Scope() {
            if (!p) return;
            const double host = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
            cudaEventRecord(b, s);
            if (p->async_) {
                p->pending_.push_back({key, a, b, host, bytes});
                return;
            }
            cudaEventSynchronize(b);
            float ms = 0.f;
            cudaEventElapsedTime(&ms, a, b);
            cudaEventDestroy(a), cudaEventDestroy(b);
            Row &r = p->rows_[key];
            r.calls++, r.dev_us += 1000.0 * ms, r.host_us += host, r.bytes += bytes;
        }
        std::string key;
        uint64_t bytes = 0;
    };

private:
    struct Pending {
        std::string key;
        cudaEvent_t a, b;
        double host_us;
        uint64_t bytes;
    };
    cudaEvent_t event() {
        if (free_ < pool_.size()) return pool_[free_++];
        cudaEvent_t ev;
        cudaEventCreate(&ev);
        pool_.push_back(ev);
        ++free_;
        return ev;
    }
    // The step has completed: read its scopes' events, then reuse them.
    void drain() {
        for (const Pending &q : pending_) {
            float ms = 0.f;
            cudaEventElapsedTime(&ms, q.a, q.b);
            Row &r = rows_[q.key];
            r.calls++, r.dev_us += 1000.0 * ms, r.host_us += q.host_us, r.bytes += q.bytes;
        }
        pending_.clear();
        free_ = 0;
    }
    struct Row {
        uint64_t calls = 0;
        double dev_us = 0, host_us = 0;
        uint64_t bytes = 0;
    };
    void print() const {
        if (!on_ || rows_.empty()) return;
        double tot = 0;
        for (auto &[k, r] : rows_) tot += r.dev_us;
        std::fprintf(stderr, "DS4_CUDA_PROFILE: %-40s %9s %12s %10s %12s %6s %8s\n", "operation", "calls", "device ms",
                     "us/call", "host ms", "%dev", "GB/s");
        for (auto &[k, r] : rows_)
            std::fprintf(stderr, "DS4_CUDA_PROFILE: %-40s %9llu %12.2f %10.1f %12.2f %6.1f %8.0f\n", k.c_str(),
                         (unsigned long long)r.calls, r.dev_us / 1000, r.dev_us / r.calls, r.host_us / 1000,
                         100 * r.dev_us / tot, r.dev_us > 0 ? r.bytes / (r.dev_us * 1e3) : 0.0);
    }
    bool on_ = false, step_ = false, in_step_ = false, async_ = false;
    std::vector<cudaEvent_t> pool_;
    size_t free_ = 0;
    std::vector<Pending> pending_;
    std::map<std::string, Row> rows_;
    cudaEvent_t ev0_ = nullptr, ev1_ = nullptr;
    std::chrono::steady_clock::time_point t0_, t1_;
    struct StepTimes {
        double enq_us = 0, dev_us = 0, wall_us = 0;
        uint64_t steps = 0, rows = 0;
    } st_[2];   // one-row, multi-row
    int rows_now_ = 0;
};

}  // namespace ds4::cuda
