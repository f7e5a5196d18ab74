#include "engine/quant/cache_aligned.h"

#include <sys/mman.h>

namespace ds4::quant {

void huge_pages(void *p, std::size_t bytes) {
    // Advice only: where transparent huge pages are off (or never), the buffer stays on 4 KB
    // pages and works as before, so the result is not checked.
    (void)madvise(p, bytes, MADV_HUGEPAGE);
}

}  // namespace ds4::quant
