#include "engine/kernels/threadpool.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <climits>

#if defined(__x86_64__)
#include <immintrin.h>
#define DS4_PAUSE() _mm_pause()
#else
#define DS4_PAUSE() ((void)0)
#endif

namespace ds4 {
namespace {

void futex_wait(std::atomic<uint32_t> &a, uint32_t expected) {
    syscall(SYS_futex, reinterpret_cast<uint32_t *>(&a), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}
void futex_wake(std::atomic<uint32_t> &a, int n) {
    syscall(SYS_futex, reinterpret_cast<uint32_t *>(&a), FUTEX_WAKE_PRIVATE, n, nullptr, nullptr, 0);
}

using Clock = std::chrono::steady_clock;

constexpr uint32_t epoch_of(uint64_t w) { return (uint32_t)(w >> 32); }
constexpr uint32_t count_of(uint64_t w) { return (uint32_t)(w >> 16) & 0xffff; }
constexpr uint32_t next_of(uint64_t w) { return (uint32_t)w & 0xffff; }

// How long a worker spins (then yields) for the next loop before it sleeps, and how long
// the caller spins for claimed chunks before it sleeps. A decode step's loops come every
// few microseconds; a late chunk means its thread lost its core, so waiting longer than a
// chunk takes only keeps the core from it.
constexpr auto kWorkerSpin = std::chrono::microseconds(50);
constexpr auto kWorkerYield = std::chrono::microseconds(2000);
constexpr auto kCallerSpin = std::chrono::microseconds(30);
constexpr int64_t kSampleNs = 50'000'000;   // how often the caller looks at the load

int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }

// Runnable tasks on the machine now (procs_running of /proc/stat), or -1.
int procs_running() {
    const int fd = open("/proc/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    char buf[8192];
    const ssize_t got = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (got <= 0) return -1;
    buf[got] = 0;
    const char *p = strstr(buf, "procs_running ");
    return p ? atoi(p + 14) : -1;
}

int cpus_allowed() {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return (int)std::max(1u, std::thread::hardware_concurrency());
    return std::max(1, CPU_COUNT(&set));
}

}  // namespace

ThreadPool::ThreadPool(int n_threads, bool share_cores) : share_cores_(share_cores), n_cpus_(cpus_allowed()) {
    if (n_threads <= 0) n_threads = (int)std::max(1u, std::thread::hardware_concurrency());
    n_threads_ = std::min(n_threads, 1024);
    active_.store((uint32_t)n_threads_);
    for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
    stop_.store(true);
    epoch_.fetch_add(1);
    futex_wake(epoch_, INT_MAX);
    active_.fetch_add(1u << 16);   // past any index: inactive workers wake and see stop_
    futex_wake(active_, INT_MAX);
    for (auto &t : threads_) t.join();
}

// After the last chunk's count the caller may publish the next job at once, so nothing of
// this job's description is read after the increment.
void ThreadPool::finish_chunk() {
    const uint32_t total = n_chunks_;
    if (done_.fetch_add(1) + 1 == total && caller_asleep_.load()) futex_wake(done_, 1);
}

// Claims chunks of job `epoch` until it has none left (or a newer job replaced it).
void ThreadPool::run_chunks(uint32_t epoch, int index) {
    uint64_t w = job_.load(std::memory_order_acquire);
    for (;;) {
        if (epoch_of(w) != epoch || next_of(w) >= count_of(w)) return;
        if (!job_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
        // The claim holds the job open: its description stays as published until this
        // chunk is counted done.
        const int64_t b = (int64_t)next_of(w) * chunk_, e = std::min(n_, b + chunk_);
        try {
            (*fn_)(b, e, index);
        } catch (...) {
            std::lock_guard<std::mutex> lk(err_mu_);
            if (!error_) error_ = std::current_exception();
        }
        finish_chunk();
        w = job_.load(std::memory_order_acquire);
    }
}

void ThreadPool::sample_load() {
    const int running = procs_running();
    if (running < 0) return;
    // Ours among them: the caller and the workers taking part and not asleep.
    const int ours = 1 + std::max(0, (int)(active_.load() & 0xffff) - 1 - sleepers_.load());
    const int others = std::max(0, running - ours);
    const int fit = std::clamp(n_cpus_ - others, 1, n_threads_);
    const bool crowded = fit < n_threads_;
    crowded_samples_ = crowded ? crowded_samples_ + 1 : 0;
    const uint32_t want = crowded && crowded_samples_ < 2 ? active_.load() : (uint32_t)fit;
    if (want != active_.load()) {
        active_.store(want);
        futex_wake(active_, INT_MAX);
    }
}

void ThreadPool::worker(int index) {
    uint32_t seen = 0;
    for (;;) {
        // Not taking part: sleep until the count of threads taking part changes.
        for (uint32_t a; (int)((a = active_.load()) & 0xffff) <= index && !stop_.load();) futex_wait(active_, a);
        uint32_t ep = epoch_.load(std::memory_order_acquire);
        if (ep == seen) {
            const auto t0 = Clock::now();
            for (int spins = 0; (ep = epoch_.load(std::memory_order_acquire)) == seen; ++spins) {
                if ((spins & 63) != 63) {
                    DS4_PAUSE();
                    continue;
                }
                const auto waited = Clock::now() - t0;
                if (waited < kWorkerSpin) continue;
                if (waited < kWorkerYield) {
                    sched_yield();
                    continue;
                }
                sleepers_.fetch_add(1);
                while ((ep = epoch_.load()) == seen) futex_wait(epoch_, seen);
                sleepers_.fetch_sub(1);
                break;
            }
        }
        seen = ep;
        if (stop_.load()) return;
        if ((int)(active_.load() & 0xffff) <= index) continue;
        run_chunks(ep, index);
    }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, RangeFn fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(1, grain);
    const int64_t units = (n + grain - 1) / grain;
    if (share_cores_ && n_threads_ > 1 && (++loops_ & 63) == 0) {
        const int64_t t = now_ns();
        if (t >= next_sample_ns_) {
            next_sample_ns_ = t + kSampleNs;
            sample_load();
        }
    }
    const int64_t threads = active_.load() & 0xffff;
    if (threads <= 1 || units <= 1) {
        fn(0, n, 0);
        return;
    }
    const int64_t want = std::min<int64_t>({units, threads * kChunksPerThread, 0xffff});
    const int64_t per = (units + want - 1) / want;   // grains per chunk
    chunk_ = per * grain;
    n_chunks_ = (uint32_t)((n + chunk_ - 1) / chunk_);
    fn_ = &fn;
    n_ = n;
    error_ = nullptr;
    done_.store(0, std::memory_order_relaxed);
    const uint32_t epoch = epoch_of(job_.load(std::memory_order_relaxed)) + 1;
    job_.store(((uint64_t)epoch << 32) | ((uint64_t)n_chunks_ << 16), std::memory_order_release);
    epoch_.store(epoch);
    if (sleepers_.load() > 0) futex_wake(epoch_, INT_MAX);
    run_chunks(epoch, 0);
    // Every chunk is claimed; wait for the ones other threads still run.
    if (done_.load(std::memory_order_acquire) != n_chunks_) {
        const auto t0 = Clock::now();
        for (int spins = 0; done_.load(std::memory_order_acquire) != n_chunks_; ++spins) {
            if ((spins & 63) != 63 || Clock::now() - t0 < kCallerSpin) {
                DS4_PAUSE();
                continue;
            }
            caller_asleep_.store(1);
            for (uint32_t d; (d = done_.load()) != n_chunks_;) futex_wait(done_, d);
            caller_asleep_.store(0);
        }
    }
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
}

}  // namespace ds4
