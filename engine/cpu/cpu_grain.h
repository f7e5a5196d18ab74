// Items per parallel task so that a task is worth a wake-up (~64K multiply-adds).
#pragma once
#include <algorithm>
#include <cstdint>

namespace ds4 {
inline int64_t cpu_grain(int64_t cost_per_item) {
    return std::max<int64_t>(1, (64 << 10) / std::max<int64_t>(1, cost_per_item));
}
}  // namespace ds4
