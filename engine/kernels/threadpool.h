// A persistent pool of worker threads for data-parallel loops. The calling thread takes
// part, so a pool of N threads runs N-1 workers. Workers spin briefly before sleeping:
// decode issues thousands of short parallel loops per token and a futex wake each time
// would cost more than the work.
//
// Scheduling is dynamic and never waits for a thread that has not started: a loop is cut
// into more chunks than threads, every thread (the caller too) claims chunks from one
// atomic word until none are left, and the caller returns when every chunk is finished.
// A worker that is descheduled (another process holds its core) or asleep simply claims
// nothing; only a chunk already claimed is waited for, and then the caller sleeps instead
// of spinning so the kernel can run the late worker on the caller's core. A spinning worker
// is runnable, though, and where other processes keep cores busy it takes time from the
// caller: so every 50 ms (at most) the caller reads how many tasks are runnable
// (/proc/stat procs_running) and, while other processes would leave fewer cores than the
// pool has threads (two samples in a row), only that many threads take part; the others
// sleep until it changes. Which thread runs
// a chunk varies from call to call; each index of [0, n) is still handled by exactly one
// call of the body, so bodies that write disjoint outputs give the same bits as one thread.
#pragma once
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
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
    // 0 = all cores. share_cores false: all threads always take part (tests of the split).
    explicit ThreadPool(int n_threads, bool share_cores = true);
    ~ThreadPool();
    ThreadPool(const ThreadPool &) = delete;
    ThreadPool &operator=(const ThreadPool &) = delete;

    int size() const { return n_threads_; }
    // Runs fn(begin, end, thread_index) over [0, n) split into contiguous ranges whose
    // sizes are multiples of `grain` (except the last); thread_index < size() is unique to
    // the thread running the range (per-thread scratch). Returns when all ranges are done.
    // Exceptions thrown by fn are rethrown here (the first one). Not re-entrant: a body
    // must not call parallel_for on the same pool.
    void parallel_for(int64_t n, int64_t grain, RangeFn fn);

    // At most this many chunks per thread in one loop (tests check uneven splits).
    static constexpr int kChunksPerThread = 8;
    // Threads taking part now (size() unless other processes crowd the cores).
    int active() const { return active_.load(); }
    // Takes a sample now (as parallel_for does every 50 ms): runnable tasks of other processes.
    void sample_load();

private:
    void worker(int index);
    void run_chunks(uint32_t epoch, int index);
    void finish_chunk();

    int n_threads_;
    std::vector<std::thread> threads_;
    // The current job as one word, so a claim is one compare-and-swap that also checks the
    // job is still the one the claimer saw: epoch (32 bits) | chunk count (16) | next (16).
    std::atomic<uint64_t> job_{0};
    std::atomic<uint32_t> epoch_{0};      // the job word's epoch, for sleeping workers (futex)
    std::atomic<uint32_t> done_{0};       // chunks of the current job finished (futex)
    std::atomic<uint32_t> caller_asleep_{0};
    std::atomic<int> sleepers_{0};
    std::atomic<bool> stop_{false};
    // The job's description: written before the job word is published and unchanged until
    // every chunk is done, so a thread that claimed a chunk reads it safely.
    const RangeFn *fn_ = nullptr;
    int64_t n_ = 0, chunk_ = 1;
    uint32_t n_chunks_ = 0;
    std::exception_ptr error_;
    std::mutex err_mu_;
    // Sharing the cores (caller side, but for active_ which workers read).
    bool share_cores_ = true;
    int n_cpus_ = 1;
    uint32_t loops_ = 0;
    int64_t next_sample_ns_ = 0;
    int crowded_samples_ = 0;
    std::atomic<uint32_t> active_{1};   // futex: inactive workers wait for it to change
};

}  // namespace ds4
