// A std::vector whose data starts on a cache line. The packed tiles (tile_pack) read their
// activation panels in 64-byte loads; from a malloc'd buffer (16 bytes past a line) each of
// those loads straddles two lines, which cost the Q8_0 tile ~20% and IQ2_XXS ~5%.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace ds4::quant {

// Buffers of a few MB and more (a prefill step's activations and scratch: tens of MB each)
// start on a 2 MB boundary and are offered to transparent huge pages, so their first touch
// faults once per 2 MB instead of once per 4 KB page.
inline constexpr std::size_t kHugeFrom = std::size_t(4) << 20;
inline constexpr std::align_val_t kHuge{std::size_t(2) << 20};
void huge_pages(void *p, std::size_t bytes);

template <class T>
struct CacheLineAllocator {
    using value_type = T;
    static constexpr std::align_val_t kAlign{64};
    CacheLineAllocator() = default;
    template <class U>
    CacheLineAllocator(const CacheLineAllocator<U> &) {}
    T *allocate(std::size_t n) {
        const std::size_t bytes = n * sizeof(T);
        if (bytes < kHugeFrom) return static_cast<T *>(::operator new(bytes, kAlign));
        void *p = ::operator new(bytes, kHuge);
        huge_pages(p, bytes);
        return static_cast<T *>(p);
    }
    void deallocate(T *p, std::size_t n) {
        if (n * sizeof(T) < kHugeFrom) ::operator delete(p, kAlign);
        else ::operator delete(p, kHuge);
    }
    template <class U>
    bool operator==(const CacheLineAllocator<U> &) const { return true; }
};

template <class T>
using CacheAlignedVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace ds4::quant
