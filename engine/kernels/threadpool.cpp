#include "engine/kernels/threadpool.h"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#define DS4_PAUSE() _mm_pause()
#else
#define DS4_PAUSE() ((void)0)
#endif

namespace ds4 {

ThreadPool::ThreadPool(int n_threads) {
    if (n_threads <= 0) n_threads = (int)std::max(1u, std::thread::hardware_concurrency());
    n_threads_ = n_threads;
    for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
        epoch_.fetch_add(1);
    }
    cv_.notify_all();
    for (auto &t : threads_) t.join();
}

// Ranges are handed out in chunks from an atomic counter so uneven work balances itself.
void ThreadPool::run_share(int index) {
    const int64_t chunk = std::max<int64_t>(grain_, ((n_ / (n_threads_ * 4)) / grain_) * grain_);
    for (;;) {
        int64_t b = next_.fetch_add(chunk);
        if (b >= n_) break;
        int64_t e = std::min(n_, b + chunk);
        try {
            (*fn_)(b, e, index);
        } catch (...) {
            std::lock_guard<std::mutex> lk(err_mu_);
            if (!error_) error_ = std::current_exception();
        }
    }
}

void ThreadPool::worker(int index) {
    uint64_t seen = 0;
    for (;;) {
        int spins = 0;
        while (epoch_.load(std::memory_order_acquire) == seen && spins < 20000) {
            if (spins < 10000) DS4_PAUSE();
            else std::this_thread::yield();
            ++spins;
        }
        if (epoch_.load(std::memory_order_acquire) == seen) {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait(lk, [&] { return epoch_.load() != seen; });
        }
        seen = epoch_.load(std::memory_order_acquire);
        if (stop_) return;
        run_share(index);
        pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, RangeFn fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(1, grain);
    if (n_threads_ == 1 || n <= grain) {
        fn(0, n, 0);
        return;
    }
    fn_ = &fn;
    n_ = n;
    grain_ = grain;
    next_.store(0);
    error_ = nullptr;
    pending_.store(n_threads_ - 1);
    {
        std::lock_guard<std::mutex> lk(mu_);
        epoch_.fetch_add(1, std::memory_order_acq_rel);
    }
    cv_.notify_all();
    run_share(0);
    // Spin briefly, then yield: on an oversubscribed machine a worker may be descheduled
    // and pure spinning would burn the time slice it needs.
    for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
        if (spins < 4000) DS4_PAUSE();
        else std::this_thread::yield();
    }
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
}

}  // namespace ds4
