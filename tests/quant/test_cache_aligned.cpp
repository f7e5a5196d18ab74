// CacheAlignedVector: buffers on a cache line. ScratchVector (a step's scratch): small ones
// too, big ones on a 2 MB boundary and advised to transparent huge pages (the kernel then
// marks their mapping "hg" in /proc/self/smaps); a session's caches (CacheAlignedVector)
// are not.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/quant/cache_aligned.h"

namespace {

using ds4::quant::CacheAlignedVector;
using ds4::quant::ScratchVector;

// The VmFlags of the mapping that holds p, or "" if none was found.
std::string vm_flags(const void *p) {
    std::ifstream smaps("/proc/self/smaps");
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    std::string line;
    bool inside = false;
    while (std::getline(smaps, line)) {
        uintptr_t lo = 0, hi = 0;
        char dash = 0;
        std::istringstream head(line);
        if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
            inside = lo <= a && a < hi;
            continue;
        }
        if (inside && line.rfind("VmFlags:", 0) == 0) return line;
    }
    return "";
}

bool thp_available() {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string s;
    return std::getline(f, s) && s.find("[never]") == std::string::npos;
}

TEST(CacheAligned, BuffersStartOnACacheLine) {
    for (size_t n : {size_t(1), size_t(15), size_t(1000), size_t(100000), size_t(3) << 20}) {
        CacheAlignedVector<float> v(n, 1.f);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % 64, 0u) << n;
        ScratchVector<float> s(n, 1.f);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(s.data()) % 64, 0u) << n;
    }
}

TEST(CacheAligned, BigScratchKeepsItsContentsWhenItGrows) {
    ScratchVector<float> v(1000, 0.f);
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
    v.resize(size_t(3) << 20);   // 12 MB: reallocated as a big buffer
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % 64, 0u);
    for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(v[i], float(i));
    EXPECT_EQ(v[v.size() - 1], 0.f);
    v.clear();
    v.shrink_to_fit();   // freed as it was allocated
}

// Big scratch buffers made one after another start at different places in the L2's sets
// (their offsets past the 2 MB boundary differ in the bits of a 64 KB way), so the first
// rows of a step's buffers do not all compete for the same sets.
TEST(CacheAligned, BigScratchBuffersStartInDifferentCacheSets) {
    std::vector<ScratchVector<float>> bufs;
    std::vector<uintptr_t> sets;
    for (int i = 0; i < 8; ++i) {
        bufs.emplace_back(size_t(1) << 20, 0.f);   // 4 MB each
        sets.push_back(reinterpret_cast<uintptr_t>(bufs.back().data()) % (64 << 10));
    }
    std::sort(sets.begin(), sets.end());
    EXPECT_EQ(std::unique(sets.begin(), sets.end()), sets.end()) << "two of 8 buffers start in the same set";
}

TEST(CacheAligned, BigScratchIsAdvisedToHugePagesASessionsCachesAreNot) {
    if (!thp_available()) GTEST_SKIP() << "transparent huge pages are off on this kernel";
    ScratchVector<uint8_t> big(size_t(8) << 20, 1);
    const std::string flags = vm_flags(big.data());
    ASSERT_FALSE(flags.empty()) << "no mapping found for the buffer";
    EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
    CacheAlignedVector<uint8_t> cache(size_t(8) << 20, 1);
    const std::string cflags = vm_flags(cache.data());
    ASSERT_FALSE(cflags.empty()) << "no mapping found for the buffer";
    EXPECT_EQ(cflags.find(" hg"), std::string::npos) << cflags;
}

}  // namespace
