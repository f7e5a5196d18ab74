// Measures the machine's sustainable memory read bandwidth with the same thread pool the
// engine uses, so decode throughput can be reported as a fraction of what the machine
// can actually stream.
#pragma once
#include <cstdint>

#include "engine/kernels/threadpool.h"

namespace ds4 {

// Best-of-`reps` read bandwidth over a buffer of `bytes` (bytes per second).
double measure_read_bandwidth(ThreadPool &pool, uint64_t bytes = 1ull << 30, int reps = 5);

}  // namespace ds4
