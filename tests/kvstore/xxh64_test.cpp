#include "kvstore/xxh64.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ds4::kvstore {
namespace {

std::string ramp(size_t reps) {
    std::string s;
    for (size_t r = 0; r < reps; ++r)
        for (int i = 0; i < 256; ++i) s.push_back(char(i));
    return s;
}

// Expected values computed with the reference xxHash library (libxxhash 0.8.1).
TEST(Xxh64, ReferenceVectors) {
    EXPECT_EQ(xxh64("", 0), 0xEF46DB3751D8E999ull);
    EXPECT_EQ(xxh64("a", 1), 0xD24EC4F1A98C6E5Bull);
    EXPECT_EQ(xxh64("abc", 3), 0x44BC2CF5AD770999ull);
    EXPECT_EQ(xxh64("abc", 3, 1), 0xBEA9CA8199328908ull);
    EXPECT_EQ(xxh64("0123456789abcdef0123456789abcde", 31), 0x1FDFC63FEBACFDE7ull);
    EXPECT_EQ(xxh64("0123456789abcdef0123456789abcdef", 32), 0x642A94958E71E6C5ull);
    const std::string big = ramp(4) + "xyz";
    EXPECT_EQ(xxh64(big.data(), big.size()), 0xE146CB31B65BC21Aull);
    EXPECT_EQ(xxh64(big.data(), big.size(), 0x9E3779B97F4A7C15ull), 0x86B7211D04E93C1Full);
}

TEST(Xxh64, StreamingEqualsOneShotForAnySplit) {
    const std::string d = ramp(3) + "tail-bytes!";
    const uint64_t want = xxh64(d.data(), d.size(), 42);
    for (size_t step : {1, 3, 7, 31, 32, 33, 100, 1000}) {
        Xxh64 h(42);
        for (size_t at = 0; at < d.size(); at += step) h.update(d.data() + at, std::min(step, d.size() - at));
        EXPECT_EQ(h.digest(), want) << step;
    }
    // digest() leaves the state usable: prefix digests along the way.
    Xxh64 h;
    for (size_t n = 0; n < 100; ++n) {
        EXPECT_EQ(h.digest(), xxh64(d.data(), n)) << n;
        h.update(d.data() + n, 1);
    }
}

}  // namespace
}  // namespace ds4::kvstore
