#include "tools/convert/row_fill.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <thread>
#include <vector>

#include "engine/common/error.h"

namespace ds4::convert {

int default_threads() {
    unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 1 : static_cast<int>(std::min(n, 16u));
}

void parallel_for(int64_t n, int threads, const std::function<void(int64_t, int64_t)> &fn) {
    if (n <= 0) return;
    int t = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, n)));
    if (t == 1) {
        fn(0, n);
        return;
    }
    std::vector<std::exception_ptr> errs(static_cast<size_t>(t));
    std::vector<std::thread> pool;
    auto run = [&](int i) {
        int64_t b = n * i / t, e = n * (i + 1) / t;
        try {
            fn(b, e);
        } catch (...) {
            errs[static_cast<size_t>(i)] = std::current_exception();
        }
    };
    for (int i = 1; i < t; i++) pool.emplace_back(run, i);
    run(0);
    for (auto &th : pool) th.join();
    for (auto &e : errs)
        if (e) std::rethrow_exception(e);
}

Progress::Progress(uint64_t total, bool enabled, std::string verb)
    : total_(total), enabled_(enabled), verb_(std::move(verb)), start_(std::chrono::steady_clock::now()), last_(start_) {}

double Progress::seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::add(uint64_t bytes, const std::string &tensor) {
    uint64_t d = done_.fetch_add(bytes) + bytes;
    if (!enabled_) return;
    auto now = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lk(mu_);
    if (now - last_ < std::chrono::seconds(1)) return;
    last_ = now;
    double s = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "%s: %.2f / %.2f GB (%3.0f%%)  %.2f GB/s  %s\n", verb_.c_str(), d / 1e9, total_ / 1e9,
                 total_ ? 100.0 * d / total_ : 100.0, s > 0 ? d / 1e9 / s : 0.0, tensor.c_str());
}

void Progress::finish() {
    if (!enabled_) return;
    double s = seconds();
    uint64_t d = done_.load();
    std::fprintf(stderr, "%s: %.2f GB of tensor data in %.1f s (%.2f GB/s)\n", verb_.c_str(), d / 1e9, s,
                 s > 0 ? d / 1e9 / s : 0.0);
}

gguf::Writer::FillFn make_row_fill(std::string name, uint64_t rb, int64_t n_rows, RowsFn rows, int threads,
                                   Progress *progress) {
    if (rb == 0) fail("row fill: " + name + ": zero-byte rows");
    auto shared_rows = std::make_shared<RowsFn>(std::move(rows));
    return [name = std::move(name), rb, n_rows, shared_rows, threads, progress](uint64_t off, uint8_t *dst, size_t n) {
        const RowsFn &fn = *shared_rows;
        if (off + n > rb * static_cast<uint64_t>(n_rows)) fail("row fill: " + name + ": range past the tensor end");
        std::vector<uint8_t> tmp;
        const uint64_t end = off + n;
        uint64_t pos = off;
        // Leading partial row.
        if (pos % rb != 0) {
            const int64_t r = static_cast<int64_t>(pos / rb);
            tmp.resize(rb);
            fn(r, 1, tmp.data());
            const uint64_t in = pos % rb;
            const uint64_t take = std::min<uint64_t>(rb - in, end - pos);
            std::memcpy(dst, tmp.data() + in, take);
            pos += take;
        }
        // Whole rows, split over the workers in large slices.
        const int64_t first = static_cast<int64_t>(pos / rb);
        const int64_t count = static_cast<int64_t>((end - pos) / rb);
        if (count > 0) {
            uint8_t *base = dst + (pos - off);
            const int t = (count * rb < (256u << 10)) ? 1 : threads;
            parallel_for(count, t, [&](int64_t b, int64_t e) { fn(first + b, e - b, base + static_cast<uint64_t>(b) * rb); });
            pos += static_cast<uint64_t>(count) * rb;
        }
        // Trailing partial row.
        if (pos < end) {
            tmp.resize(rb);
            fn(static_cast<int64_t>(pos / rb), 1, tmp.data());
            std::memcpy(dst + (pos - off), tmp.data(), end - pos);
        }
        if (progress) progress->add(n, name);
    };
}

}  // namespace ds4::convert
