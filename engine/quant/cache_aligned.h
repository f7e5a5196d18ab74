// A std::vector whose data starts on a cache line. The packed tiles (tile_pack) read their
// activation panels in 64-byte loads; from a malloc'd buffer (16 bytes past a line) each of
// those loads straddles two lines, which cost the Q8_0 tile ~20% and IQ2_XXS ~5%.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace ds4::quant {

template <class T>
struct CacheLineAllocator {
    using value_type = T;
    static constexpr std::align_val_t kAlign{64};
    CacheLineAllocator() = default;
    template <class U>
    CacheLineAllocator(const CacheLineAllocator<U> &) {}
    T *allocate(std::size_t n) { return static_cast<T *>(::operator new(n * sizeof(T), kAlign)); }
    void deallocate(T *p, std::size_t) { ::operator delete(p, kAlign); }
    template <class U>
    bool operator==(const CacheLineAllocator<U> &) const { return true; }
};

template <class T>
using CacheAlignedVector = std::vector<T, CacheLineAllocator<T>>;

// A step's scratch (the CPU executor's activations, quantised and packed activations: tens
// of MB each in a prefill step, touched first by that step): from 4 MB on, buffers start on
// a 2 MB boundary and are offered to transparent huge pages, so their first touch faults
// once per 2 MB instead of once per 4 KB page; below, a cache line as above. Not for a
// session's caches: on huge pages their power-of-two row strides fall in fewer cache sets
// (a 16K-context decode on the Zen 5 VM ran slower and less steadily with them there).
inline constexpr std::size_t kHugeFrom = std::size_t(4) << 20;
void huge_pages(void *p, std::size_t bytes);
// Where the next big scratch buffer starts past its 2 MB boundary: 16 offsets of 4 KB + 128
// bytes in turn. All at the boundary, the first rows of every buffer (all a decode step
// touches after a prefill grew them) fell in the same L2 sets: the default model's decode
// after a 2048-token prefill ran ~25% slower.
std::size_t huge_offset();

template <class T>
struct ScratchAllocator {
    using value_type = T;
    static constexpr std::size_t kHugePage = std::size_t(2) << 20;
    ScratchAllocator() = default;
    template <class U>
    ScratchAllocator(const ScratchAllocator<U> &) {}
    T *allocate(std::size_t n) {
        const std::size_t bytes = n * sizeof(T);
        if (bytes < kHugeFrom) return CacheLineAllocator<T>().allocate(n);
        const std::size_t off = huge_offset();
        auto *p = static_cast<unsigned char *>(::operator new(bytes + off, std::align_val_t{kHugePage}));
        huge_pages(p, bytes + off);
        return reinterpret_cast<T *>(p + off);
    }
    void deallocate(T *p, std::size_t n) {
        if (n * sizeof(T) < kHugeFrom) return CacheLineAllocator<T>().deallocate(p, n);
        // the offset is under 2 MB and the block starts on a 2 MB boundary
        const auto a = reinterpret_cast<std::uintptr_t>(p) & ~std::uintptr_t(kHugePage - 1);
        ::operator delete(reinterpret_cast<void *>(a), std::align_val_t{kHugePage});
    }
    template <class U>
    bool operator==(const ScratchAllocator<U> &) const { return true; }
};

template <class T>
using ScratchVector = std::vector<T, ScratchAllocator<T>>;

}  // namespace ds4::quant
