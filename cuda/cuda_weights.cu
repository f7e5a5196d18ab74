#include "cuda/cuda_weights.h"

#include "cuda/cuda_check.h"

namespace ds4::cuda {

bool DeviceWeights::is_routed_expert(const gguf::TensorInfo &t) { return t.name.find("_exps.") != std::string::npos; }

uint64_t DeviceWeights::routed_expert_bytes(const gguf::Reader &r) {
    uint64_t n = 0;
    for (const gguf::TensorInfo &t : r.tensors())
        if (is_routed_expert(t)) n += t.nbytes;
    return n;
}

DeviceWeights::DeviceWeights(const gguf::Reader &r, const ModelWeights &w,
                             const std::function<void(uint64_t, uint64_t)> &progress, bool skip_experts) {
    try {
        const uint64_t total = r.total_tensor_bytes() - (skip_experts ? routed_expert_bytes(r) : 0);
        uint64_t done = 0, shown = 0;
        for (const gguf::TensorInfo &t : r.tensors()) {
            if (skip_experts && is_routed_expert(t)) continue;
            if (t.data && t.nbytes) place(t.data, t.nbytes);
            done += t.nbytes;
            if (progress && (done - shown >= (1ull << 30) || done == total)) progress(shown = done, total);
        }
        auto vec = [&](const std::vector<float> &v) {
            if (!v.empty()) place(v.data(), v.size() * sizeof(float));
        };
        vec(w.output_norm), vec(w.output_hc_base), vec(w.output_hc_scale);
        for (const LayerWeights &L : w.layers) {
            for (const std::vector<float> *v : {&L.attn_norm, &L.ffn_norm, &L.hc_attn_base, &L.hc_attn_scale, &L.hc_ffn_base,
                                                &L.hc_ffn_scale, &L.q_a_norm, &L.kv_norm, &L.sinks, &L.probs_b,
                                                &L.comp.ape, &L.comp.norm, &L.icomp.ape, &L.icomp.norm})
                vec(*v);
        }
    } catch (...) {
        for (void *p : allocs_) cudaFree(p);
        throw;
    }
}

DeviceWeights::~DeviceWeights() {
    for (void *p : allocs_) cudaFree(p);
}

void DeviceWeights::place(const void *host, uint64_t n) {
    void *dev = nullptr;
    DS4_CUDA_CHECK(cudaMalloc(&dev, n));
    allocs_.push_back(dev);
    DS4_CUDA_CHECK(cudaMemcpy(dev, host, n, cudaMemcpyHostToDevice));
    ranges_[static_cast<const uint8_t *>(host)] = {n, dev};
    bytes_ += n;
}

const void *DeviceWeights::device(const void *p) const {
    if (!p) return nullptr;
    const uint8_t *b = static_cast<const uint8_t *>(p);
    auto it = ranges_.upper_bound(b);
    if (it == ranges_.begin()) fail("CUDA backend: a weight pointer outside the placed tensors");
    --it;
    if (b >= it->first + it->second.n) fail("CUDA backend: a weight pointer outside the placed tensors");
    return static_cast<const uint8_t *>(it->second.dev) + (b - it->first);
}

}  // namespace ds4::cuda
