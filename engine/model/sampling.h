// Choosing the next token from a row of logits: greedy, temperature with top-k / top-p /
// min-p, and top log-probabilities. Pure functions; the caller owns the RNG state.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

namespace ds4 {

struct SamplingParams {
    float temperature = 0.f;   // 0 = greedy
    int top_k = 0;             // 0 = off
    float top_p = 1.f;
    float min_p = 0.f;
};

int argmax(const std::vector<float> &logits);
// Greedy when temperature <= 0 (rng may then be null). Throws ds4::Error on bad params.
int sample(const std::vector<float> &logits, const SamplingParams &p, uint64_t *rng);
std::vector<std::pair<int, float>> top_logprobs(const std::vector<float> &logits, int n);

}  // namespace ds4
