// A persistent pool of worker threads for data-parallel loops. The calling thread takes
// part, so a pool of N threads runs N-1 workers. Workers spin briefly before sleeping:
// decode issues thousands of short parallel loops per token and a futex wake each time
// would cost more than the work.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

namespace ds4 {

// A borrowed reference to a loop body fn(begin, end, thread_index). parallel_for runs the
// body before it returns, so the reference never outlives the callable; unlike
// std::function it never allocates, and decode issues thousands of loops per token.
class RangeFn {
public:
    template <class F>
        requires(!std::is_same_v<std::remove_cvref_t<F>, RangeFn>)
    RangeFn(F &&f)  // NOLINT: implicit, so lambdas pass straight in
        : obj_(const_cast<void *>(static_cast<const void *>(std::addressof(f)))),
          call_([](void *o, int64_t b, int64_t e, int i) { (*static_cast<std::remove_reference_t<F> *>(o))(b, e, i); }) {}
    void operator()(int64_t b, int64_t e, int i) const { call_(obj_, b, e, i); }

private:
    void *obj_;
    void (*call_)(void *, int64_t, int64_t, int);
};

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
    void parallel_for(int64_t n, int64_t grain, RangeFn fn);

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
    const RangeFn *fn_ = nullptr;
    int64_t n_ = 0, grain_ = 1;
    std::atomic<int64_t> next_{0};
    std::exception_ptr error_;
    std::mutex err_mu_;
};

}  // namespace ds4
