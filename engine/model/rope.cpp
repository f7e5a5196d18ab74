#include "engine/model/rope.h"

#include <algorithm>
#include <cmath>

namespace ds4 {

Rope Rope::plain(int n_rot, double base) {
    Rope r;
    r.n_pairs = n_rot / 2;
    for (int i = 0; i < r.n_pairs; ++i) {
        float expo = (float)(2 * i) / (float)n_rot;
        r.inv_freq.push_back((float)(1.0 / std::pow(base, (double)expo)));
    }
    return r;
}

// YaRN as transformers computes it (truncated correction range, linear ramp over pairs).
Rope Rope::yarn(int n_rot, double base, double factor, int orig_ctx, double beta_fast, double beta_slow) {
    Rope r;
    r.n_pairs = n_rot / 2;
    const double dim = n_rot;
    auto corr_dim = [&](double rot) { return dim * std::log((double)orig_ctx / (rot * 2 * M_PI)) / (2 * std::log(base)); };
    double low = std::floor(corr_dim(beta_fast)), high = std::ceil(corr_dim(beta_slow));
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1);
    if (low == high) high += 0.001;
    for (int i = 0; i < r.n_pairs; ++i) {
        const float expo = (float)(2 * i) / (float)n_rot;
        const float pos_freq = (float)std::pow(base, (double)expo);
        const float extrap = 1.0f / pos_freq;
        const float interp = 1.0f / ((float)factor * pos_freq);
        float ramp = (float)(((double)i - low) / (high - low));
        ramp = std::clamp(ramp, 0.0f, 1.0f);
        const float extrap_w = 1.0f - ramp;
        r.inv_freq.push_back(interp * (1.0f - extrap_w) + extrap * extrap_w);
    }
    return r;
}

Rope Rope::for_layer_kind(const ModelConfig &c, bool compressed) {
    if (!compressed) return plain(c.n_rot, c.rope_base);
    if (c.yarn) return yarn(c.n_rot, c.compress_rope_base, c.yarn_factor, c.yarn_orig_ctx, c.yarn_beta_fast, c.yarn_beta_slow);
    return plain(c.n_rot, c.compress_rope_base);
}

void Rope::cos_sin(int64_t pos, float *cos, float *sin) const {
    const float p = (float)pos;
    for (int i = 0; i < n_pairs; ++i) {
        const float a = inv_freq[i] * p;   // float product, as the reference computes it
        cos[i] = (float)std::cos((double)a);
        sin[i] = (float)std::sin((double)a);
    }
}

}  // namespace ds4
