#include "engine/quant/cache_aligned.h"

#include <sys/mman.h>

#include <atomic>

namespace ds4::quant {

void huge_pages(void *p, std::size_t bytes) {
    // Advice only: where transparent huge pages are off (or never), the buffer stays on 4 KB
    // pages and works as before, so the result is not checked.
    (void)madvise(p, bytes, MADV_HUGEPAGE);
}

std::size_t huge_offset() {
    static std::atomic<unsigned> next{0};
    return std::size_t(next.fetch_add(1, std::memory_order_relaxed) % 16) * (4096 + 128);
}

}  // namespace ds4::quant
