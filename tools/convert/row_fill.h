// Tensor bytes produced on demand for gguf::Writer::add_tensor_fill. The writer asks for
// arbitrary byte ranges (fixed-size chunks that cut rows anywhere); this turns them into
// whole encoded rows, spread over worker threads, so converters and generators only
// write "encode rows [first, first + n)". Row encoders must be pure functions of the row
// index (rows at chunk edges are encoded twice).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "engine/gguf/gguf.h"

namespace ds4::convert {

// dst receives n rows of row_bytes each.
using RowsFn = std::function<void(int64_t first_row, int64_t n, uint8_t *dst)>;

// Progress lines on stderr (at most one a second) while a file is written.
class Progress {
public:
    Progress(uint64_t total_bytes, bool enabled, std::string verb = "writing");
    void add(uint64_t bytes, const std::string &tensor);
    void finish();
    double seconds() const;

private:
    uint64_t total_;
    bool enabled_;
    std::string verb_;
    std::atomic<uint64_t> done_{0};
    std::mutex mu_;
    std::chrono::steady_clock::time_point start_, last_;
};

gguf::Writer::FillFn make_row_fill(std::string name, uint64_t row_bytes, int64_t n_rows, RowsFn rows, int threads,
                                   Progress *progress);

// Splits [0, n) over `threads` workers (the caller's thread is one of them).
void parallel_for(int64_t n, int threads, const std::function<void(int64_t begin, int64_t end)> &fn);

int default_threads();

}  // namespace ds4::convert
