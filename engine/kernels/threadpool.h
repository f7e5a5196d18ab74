// A persistent pool of worker threads for data-parallel loops. The calling thread takes
// part, so a pool of N threads runs N-1 workers. Workers spin briefly before sleeping:
// decode issues thousands of short parallel loops per token and a futex wake each time
// would cost more than the work.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ds4 {

class ThreadPool {
public:
    explicit ThreadPool(int n_threads);   // 0 = all cores
    ~ThreadPool();
    ThreadPool(const ThreadPool &) = delete;
    ThreadPool &operator=(const ThreadPool &) = delete;

    int size() const { return n_threads_; }
    // Runs fn(begin, end, thread_index) over [0, n) split into contiguous ranges whose
    // sizes are multiples of `grain` (except the last). Returns when all ranges are done.
    // Exceptions thrown by fn are rethrown here (the first one).
    void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t, int)> &fn);

private:
    void worker(int index);
    void run_share(int index);

    int n_threads_;
    std::vector<std::thread> threads_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::atomic<uint64_t> epoch_{0};
    std::atomic<int> pending_{0};
    std::atomic<bool> stop_{false};
    // current job
    const std::function<void(int64_t, int64_t, int)> *fn_ = nullptr;
    int64_t n_ = 0, grain_ = 1;
    std::atomic<int64_t> next_{0};
    std::exception_ptr error_;
    std::mutex err_mu_;
};

}  // namespace ds4
