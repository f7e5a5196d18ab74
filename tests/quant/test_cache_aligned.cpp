// CacheAlignedVector: small buffers on a cache line, big ones on a 2 MB boundary and advised
// to transparent huge pages (the kernel then marks their mapping "hg" in /proc/self/smaps).
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "engine/quant/cache_aligned.h"

namespace {

using ds4::quant::CacheAlignedVector;

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

TEST(CacheAligned, SmallBuffersStartOnACacheLine) {
    for (size_t n : {1, 15, 1000, 100000}) {
        CacheAlignedVector<float> v(n, 1.f);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % 64, 0u) << n;
    }
}

TEST(CacheAligned, BigBuffersStartOnAHugePageAndKeepTheirContents) {
    CacheAlignedVector<float> v(1000, 0.f);
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
    v.resize(size_t(3) << 20);   // 12 MB: reallocated as a big buffer
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % (size_t(2) << 20), 0u);
    for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(v[i], float(i));
    EXPECT_EQ(v[v.size() - 1], 0.f);
    v.clear();
    v.shrink_to_fit();   // freed as it was allocated
}

TEST(CacheAligned, BigBuffersAreAdvisedToHugePages) {
    if (!thp_available()) GTEST_SKIP() << "transparent huge pages are off on this kernel";
    CacheAlignedVector<uint8_t> big(size_t(8) << 20, 1);
    const std::string flags = vm_flags(big.data());
    ASSERT_FALSE(flags.empty()) << "no mapping found for the buffer";
    EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
}

}  // namespace
