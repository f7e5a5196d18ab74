// Deterministic pseudo-random token prompts for the daemon benchmarks: different salts give
// prompts that share no prefix, so no run reuses another's cached state.
#pragma once
#include <cstdint>
#include <vector>

inline std::vector<int32_t> make_prompt(int n, int vocab, int salt) {
    std::vector<int32_t> p;
    uint64_t x = 0x9E3779B97F4A7C15ull * uint64_t(salt + 1);
    for (int i = 0; i < n; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p.push_back(int32_t(x % uint64_t(vocab)));
    }
    return p;
}
