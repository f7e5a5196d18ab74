// The pool's contract: every index of [0, n) is handled by exactly one call of the body,
// ranges are multiples of the grain (but the last), thread indices are unique and below
// size(), exceptions come back to the caller, and all of it holds when chunks take very
// different times (a thread that stalls mid-loop, as on a core another process holds).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/kernels/threadpool.h"

namespace ds4 {
namespace {

struct Coverage {
    std::vector<std::atomic<int>> hits;
    std::atomic<int> bad_range{0}, bad_thread{0};
    explicit Coverage(int64_t n) : hits(n) {}
};

void run_and_check(ThreadPool &pool, int64_t n, int64_t grain, int stall_every = 0) {
    Coverage cov(n);
    std::vector<std::atomic<int>> busy(pool.size());
    pool.parallel_for(n, grain, [&](int64_t b, int64_t e, int th) {
        if (th < 0 || th >= pool.size() || busy[th].fetch_add(1) != 0) cov.bad_thread++;
        if (b < 0 || e > n || b >= e || (b % grain) != 0 || (e != n && (e - b) % grain != 0)) cov.bad_range++;
        for (int64_t i = b; i < e; ++i) cov.hits[i]++;
        if (stall_every && (b / grain) % stall_every == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        busy[th].fetch_sub(1);
    });
    EXPECT_EQ(cov.bad_range.load(), 0) << "n=" << n << " grain=" << grain;
    EXPECT_EQ(cov.bad_thread.load(), 0) << "n=" << n << " grain=" << grain;
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(cov.hits[i].load(), 1) << "index " << i << " n=" << n << " grain=" << grain;
}

TEST(ThreadPool, EveryIndexOnceForManySizesAndGrains) {
    for (int threads : {1, 2, 3, 5}) {
        ThreadPool pool(threads);
        ASSERT_EQ(pool.size(), threads);
        for (int64_t n : {1, 2, 7, 16, 17, 63, 64, 65, 1000, 4099, 200000})
            for (int64_t grain : {1, 3, 16, 1000}) run_and_check(pool, n, grain);
    }
}

TEST(ThreadPool, UnevenChunksAndStallsStillCoverEverything) {
    ThreadPool pool(3);
    for (int rep = 0; rep < 5; ++rep) {
        run_and_check(pool, 257, 4, 3);   // every third chunk sleeps: stragglers mid-loop
        run_and_check(pool, 5000, 1, 7);
    }
}

TEST(ThreadPool, ManyShortLoopsBackToBack) {
    // Decode's pattern: thousands of tiny loops; a worker that wakes late for one loop must
    // not take part in (or corrupt) the next one.
    ThreadPool pool(4);
    std::mt19937 rng(7);
    std::vector<int64_t> sums(64);
    for (int rep = 0; rep < 20000; ++rep) {
        const int64_t n = 1 + rng() % 64;
        std::vector<std::atomic<int64_t>> out(n);
        pool.parallel_for(n, 1 + rng() % 4, [&](int64_t b, int64_t e, int) {
            for (int64_t i = b; i < e; ++i) out[i] += i * 3 + rep;
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i].load(), i * 3 + rep) << "loop " << rep << " index " << i;
    }
}

TEST(ThreadPool, FirstExceptionReachesTheCallerAndThePoolStaysUsable) {
    ThreadPool pool(3);
    EXPECT_THROW(pool.parallel_for(1000, 1,
                                   [&](int64_t b, int64_t, int) {
                                       if (b >= 500) throw std::runtime_error("boom");
                                   }),
                 std::runtime_error);
    run_and_check(pool, 1000, 1);
}

TEST(ThreadPool, SplitsIntoMoreChunksThanThreads) {
    // Dynamic scheduling needs spare chunks: a loop with enough grains is cut into several
    // per thread, and each chunk is a whole number of grains. (Not sharing cores: a busy
    // machine, ctest -j, must not change the split under test.)
    ThreadPool pool(2, false);
    std::atomic<int> calls{0};
    pool.parallel_for(1 << 16, 16, [&](int64_t, int64_t, int) { calls++; });
    EXPECT_EQ(calls.load(), 2 * ThreadPool::kChunksPerThread);
    calls = 0;
    pool.parallel_for(5 * 16, 16, [&](int64_t, int64_t, int) { calls++; });
    EXPECT_EQ(calls.load(), 5);
}

TEST(ThreadPool, IdleWorkersSleepAndWakeForLaterLoops) {
    ThreadPool pool(3, false);
    run_and_check(pool, 999, 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));   // past the spin: workers sleep
    for (int i = 0; i < 3; ++i) {
        std::atomic<int> others{0};
        std::atomic<bool> seen[3] = {false, false, false};
        pool.parallel_for(3000, 1, [&](int64_t, int64_t, int th) {
            seen[th] = true;
            if (th) others++;
            std::this_thread::sleep_for(std::chrono::microseconds(200));   // time for workers to join
        });
        EXPECT_GT(others.load(), 0) << "no worker woke for the loop";
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

// Other processes spinning on every allowed core: after two load samples the pool runs on
// fewer threads than it has (its spinning workers would take time from the caller), and the
// loops still cover everything.
TEST(ThreadPool, GivesWayToOtherProcessesOnTheCores) {
    cpu_set_t set;
    ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
    const int cpus = CPU_COUNT(&set);
    std::vector<pid_t> kids;
    for (int i = 0; i < cpus; ++i) {
        const pid_t p = fork();
        ASSERT_GE(p, 0);
        if (p == 0) {
            volatile uint64_t x = 0;
            for (;;) {   // a busy core (volatile: the loop is not optimised away)
                const uint64_t v = x;
                x = v + 1;
            }
        }
        kids.push_back(p);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));   // the children are running
    ThreadPool pool(std::max(2, cpus));
    pool.sample_load();
    pool.sample_load();
    const int active = pool.active();
    run_and_check(pool, 5000, 3);
    for (pid_t p : kids) kill(p, SIGKILL);
    for (pid_t p : kids) waitpid(p, nullptr, 0);
    EXPECT_LT(active, pool.size()) << cpus << " busy processes on " << cpus << " cores";
    EXPECT_GE(active, 1);
}

}  // namespace
}  // namespace ds4
