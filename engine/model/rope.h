// Rotary position tables. Sliding-only layers use plain RoPE at rope_base; compressed
// layers (their queries, keys, compressed entries and the indexer) use compress_rope_base
// with YaRN frequency blending but without YaRN's magnitude scaling, as the reference does.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/model/config.h"

namespace ds4 {

struct Rope {
    int n_pairs = 0;
    std::vector<float> inv_freq;   // [n_pairs], float32 like the reference

    static Rope plain(int n_rot, double base);
    static Rope yarn(int n_rot, double base, double factor, int orig_ctx, double beta_fast, double beta_slow);
    static Rope for_layer_kind(const ModelConfig &c, bool compressed);
    // cos/sin of every pair at absolute position pos.
    void cos_sin(int64_t pos, float *cos, float *sin) const;
};

}  // namespace ds4
