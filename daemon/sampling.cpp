#include "daemon/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ds4::daemon {

bool SamplingControls::changes_logits() const {
    return !logit_bias.empty() || (repeat_penalty != 1.0f && repeat_last_n != 0) || frequency_penalty != 0.0f ||
           presence_penalty != 0.0f;
}

void apply_controls(std::vector<float> &row, const SamplingControls &c, std::span<const int32_t> context,
                    const TokenCounts &generated) {
    for (const auto &[t, b] : c.logit_bias) row[size_t(t)] += b;
    if (c.repeat_penalty != 1.0f && c.repeat_last_n != 0) {
        const size_t n = c.repeat_last_n < 0 ? context.size() : std::min(context.size(), size_t(c.repeat_last_n));
        // Each distinct token once, however often it appears in the window.
        std::vector<int32_t> seen(context.end() - ptrdiff_t(n), context.end());
        std::sort(seen.begin(), seen.end());
        seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
        for (int32_t t : seen) {
            if (t < 0 || size_t(t) >= row.size()) continue;
            float &l = row[size_t(t)];
            l = l > 0 ? l / c.repeat_penalty : l * c.repeat_penalty;
        }
    }
    if (c.frequency_penalty != 0.0f || c.presence_penalty != 0.0f) {
        for (const auto &[t, count] : generated) {
            if (t < 0 || size_t(t) >= row.size()) continue;
            row[size_t(t)] -= float(count) * c.frequency_penalty + (count > 0 ? c.presence_penalty : 0.0f);
        }
    }
}

int32_t row_argmax(const std::vector<float> &row) {
    return int32_t(std::max_element(row.begin(), row.end()) - row.begin());
}

TokenLogprob logprob_of(const std::vector<float> &row, float temperature, int32_t token, uint32_t top_n) {
    const double inv_t = temperature > 0 ? 1.0 / double(temperature) : 1.0;
    const float mx = *std::max_element(row.begin(), row.end());
    double sum = 0;
    for (float v : row) sum += std::exp((double(v) - mx) * inv_t);
    const double lse = std::log(sum);  // of (row - mx) / T
    auto lp = [&](int32_t t) { return float((double(row[size_t(t)]) - mx) * inv_t - lse); };
    TokenLogprob out;
    out.logprob = lp(token);
    const size_t n = std::min<size_t>(top_n, row.size());
    if (n) {
        std::vector<int32_t> idx(row.size());
        std::iota(idx.begin(), idx.end(), 0);
        std::partial_sort(idx.begin(), idx.begin() + ptrdiff_t(n), idx.end(), [&](int32_t a, int32_t b) {
            return row[size_t(a)] > row[size_t(b)] || (row[size_t(a)] == row[size_t(b)] && a < b);
        });
        for (size_t i = 0; i < n; ++i) out.top.emplace_back(idx[i], lp(idx[i]));
    }
    return out;
}

}  // namespace ds4::daemon
