#include "engine/backend/expert_source.h"

#include "engine/common/error.h"
#include "engine/model/weights.h"

namespace ds4 {

void ResidentExperts::acquire(int layer, std::span<const int> ids, ExpertView *out) {
    if (layer < 0 || layer >= (int)w_.layers.size()) failf("expert source: layer %d out of range", layer);
    const LayerWeights &L = w_.layers[layer];
    for (size_t i = 0; i < ids.size(); ++i) {
        const int e = ids[i];
        if (e < 0 || e >= L.gate_exps.n_expert) failf("expert source: expert %d of layer %d out of range", e, layer);
        out[i] = {L.gate_exps.expert(e), L.up_exps.expert(e), L.down_exps.expert(e)};
    }
    acquired_.fetch_add(ids.size(), std::memory_order_relaxed);
}

ExpertSourceStats ResidentExperts::stats() const {
    ExpertSourceStats s;
    s.acquired = acquired_.load(std::memory_order_relaxed);
    return s;
}

}  // namespace ds4
