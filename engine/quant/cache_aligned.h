// A std::vector whose data starts on a cache line. The packed tiles (tile_pack) read their
// activation panels in 64-byte loads; from a malloc'd buffer (16 bytes past a line) each of
// those loads straddles two lines, which cost the Q8_0 tile ~20% and IQ2_XXS ~5%.
#pragma once

#include <cstddef>
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

}  // namespace ds4::quant
