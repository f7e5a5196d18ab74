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

// Throws ds4::Error naming the bad field of p (top_p, min_p, top_k).
void check_sampling(const SamplingParams &p);
// The distribution sample() draws from when temperature > 0 (the same temperature, top-k,
// top-p and min-p transform), over the whole vocabulary: 0 outside the kept candidates,
// summing to 1. Speculative sampling applies it to both the target and the drafter.
void sampling_probs(const std::vector<float> &logits, const SamplingParams &p, std::vector<double> *probs);
// A uniform double in [0, 1) from the caller's rng state (the generator sample() uses).
double uniform01(uint64_t *rng);
// One draw from non-negative weights (normalised here); throws when they are all zero.
int sample_from(const std::vector<double> &weights, uint64_t *rng);

}  // namespace ds4
