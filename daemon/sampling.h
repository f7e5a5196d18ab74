// Per-request sampling controls the engine's sampler does not have: logit bias, repetition
// penalties and log-probabilities (ARCHITECTURE.md §5). Pure functions over one row of
// logits; the daemon applies them to a copy of a session's row and samples that row with the
// engine's sampler (ds4_bridge_sample_logits), so a request without them is unchanged.
#pragma once
#include <cstdint>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ds4::daemon {

struct SamplingControls {
    float repeat_penalty = 1.0f;    // llama.cpp: over the last repeat_last_n context tokens
    int32_t repeat_last_n = 64;     // 0: off, -1: the whole context
    float frequency_penalty = 0.0f; // OpenAI: over the generated tokens
    float presence_penalty = 0.0f;
    std::vector<std::pair<int32_t, float>> logit_bias;  // distinct token ids
    bool logprobs = false;
    uint32_t top_logprobs = 0;      // 0..20

    // False when the row is sampled as it is (the engine's own path).
    bool changes_logits() const;
    bool active() const { return logprobs || changes_logits(); }
};

// Counts of the tokens a request generated (for frequency/presence penalties).
using TokenCounts = std::unordered_map<int32_t, uint32_t>;

// In order: logit_bias, repeat penalty over the last repeat_last_n tokens of context,
// frequency/presence penalties over generated. Token ids must be < row.size().
void apply_controls(std::vector<float> &row, const SamplingControls &c, std::span<const int32_t> context,
                    const TokenCounts &generated);

// Lowest id on ties, as the engine's argmax.
int32_t row_argmax(const std::vector<float> &row);

struct TokenLogprob {
    float logprob = 0;
    std::vector<std::pair<int32_t, float>> top;  // most likely first, lowest id on ties
};

// log-softmax of row / T (T = temperature when > 0, else 1) at `token`, and the top_n best.
TokenLogprob logprob_of(const std::vector<float> &row, float temperature, int32_t token, uint32_t top_n);

}  // namespace ds4::daemon
