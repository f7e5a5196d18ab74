// Deterministic random tensor contents for generated models. Every value is a pure
// function of (seed, tensor name, element index) — a counter-based hash (splitmix64's
// finaliser) rather than a sequential stream — so rows can be produced in any order, on
// any number of threads, and the file is identical for the same seed and options.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/gguf/gguf.h"
#include "tools/convert/layout.h"

namespace ds4::make_model {

inline uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t tensor_key(uint64_t seed, const std::string &name);

// How the values of a role are distributed.
struct Dist {
    enum Kind { Normal, Uniform } kind = Normal;
    float a = 0, b = 1;   // Normal: mean a, std b. Uniform: [a, b).
};
// The generator's distribution for SPEC: linear weights N(0, 1/fan_in) (fan_in = ne[0]),
// embedding N(0,1), norms U(0.7,1.3), sinks N(0,1), position biases N(0,0.5), hc base
// N(0,0.5), hc scale U(0.5,1.5), router bias N(0,0.5).
Dist role_dist(const convert::TensorSpec &spec);

// Exact mode: true Gaussian / uniform f32 values of elements [first, first + n).
void exact_values(uint64_t key, const Dist &d, int64_t first, int64_t n, float *out);
// Fast mode: an Irwin-Hall (sum of four uniforms) approximation of the same normal, one
// hash per element. Uniform roles are the same as exact.
void fast_values(uint64_t key, const Dist &d, int64_t first, int64_t n, float *out);
// Fast mode for block formats: blocks synthesised directly from hashed bytes (random
// codes, one scale per tensor chosen so the dequantised values have mean 0 and the wanted
// std), no float detour and no quantiser search. Q8_0: codes uniform in -127..127; Q4_K /
// Q2_K: all sub-block scales and mins at their maximum, codes uniform; IQ2_XXS: random
// grid points and signs at the largest sub-block scale. Row r of ne0 elements.
bool fast_block_supported(gguf::Type t);
void fast_block_row(gguf::Type t, uint64_t key, const Dist &d, int64_t row, int64_t ne0, uint8_t *dst);

// tid2eid: for every token, n_used distinct experts out of n_expert. ne = [n_used, vocab].
std::vector<int32_t> hash_table(uint64_t key, int n_used, int n_expert, int64_t vocab);

}  // namespace ds4::make_model
