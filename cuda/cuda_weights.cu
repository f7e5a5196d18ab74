#include "cuda/cuda_weights.h"

#include <cstdio>

#include "cuda/cuda_check.h"
#include "cuda/cuda_vmm.h"

namespace ds4::cuda {

DeviceWeights::DeviceWeights(const gguf::Reader &r, const ModelWeights &w, const std::vector<HostRange> &extra,
                             const DeviceShareOptions &share, const std::function<void(uint64_t, uint64_t)> &progress,
                             bool skip_routed_experts) {
    const WeightLayout L = plan_weight_layout(r, w, extra, skip_routed_experts);
    const std::vector<Planned> &plan = L.ranges;
    const uint64_t total = L.bytes;
    try {
        if (share.import_fd >= 0) {
            if (place_imported(plan, total, L.hash, share)) {
                if (progress) progress(total, total);
                return;
            }
            std::fprintf(stderr, "ds4: CUDA: the shared device weights were not imported (%s); uploading them privately\n",
                         share_.why.c_str());
        } else if (share.exportable) {
            if (place_exported(plan, total, L.hash, progress)) return;
            std::fprintf(stderr, "ds4: CUDA: device weights not exportable (%s); uploading them privately\n",
                         share_.why.c_str());
        }
        place_private(plan, progress);
    } catch (...) {
        free_all();
        throw;
    }
}

void DeviceWeights::place_private(const std::vector<Planned> &plan, const std::function<void(uint64_t, uint64_t)> &progress) {
    uint64_t total = 0, done = 0, shown = 0;
    for (const Planned &p : plan) total += p.n;
    for (const Planned &p : plan) {
        void *dev = nullptr;
        DS4_CUDA_CHECK(cudaMalloc(&dev, p.n));
        allocs_.push_back(dev);
        DS4_CUDA_CHECK(cudaMemcpy(dev, p.host, p.n, cudaMemcpyHostToDevice));
        ranges_[p.host] = {p.n, dev};
        bytes_ += p.n;
        done += p.n;
        if (progress && (done - shown >= (1ull << 30) || done == total)) progress(shown = done, total);
    }
}

bool DeviceWeights::place_exported(const std::vector<Planned> &plan, uint64_t total, uint64_t hash,
                                   const std::function<void(uint64_t, uint64_t)> &progress) {
    std::string why;
    std::unique_ptr<VmmAllocation> a = VmmAllocation::create(total, &why);
    DeviceWeightsLayout L;
    if (a && !current_device_uuid(L.uuid)) a.reset(), why = "cannot read this GPU's UUID";
    int fd = a ? a->export_fd(&why) : -1;
    if (fd < 0) {
        share_.why = why;
        return false;
    }
    uint8_t *base = static_cast<uint8_t *>(a->ptr());
    uint64_t done = 0, shown = 0;
    for (const Planned &p : plan) {
        DS4_CUDA_CHECK(cudaMemcpy(base + p.offset, p.host, p.n, cudaMemcpyHostToDevice));
        ranges_[p.host] = {p.n, base + p.offset};
        done = p.offset + p.n;
        if (progress && done - shown >= (1ull << 30)) progress(shown = done, total);
    }
    if (progress) progress(total, total);
    L.bytes = a->bytes();
    L.granularity = a->granularity();
    L.layout_hash = hash;
    bytes_ = a->bytes();
    share_.export_fd = fd;
    share_.layout = L;
    vmm_ = std::move(a);
    return true;
}

bool DeviceWeights::place_imported(const std::vector<Planned> &plan, uint64_t total, uint64_t hash,
                                   const DeviceShareOptions &s) {
    const DeviceWeightsLayout &L = s.import_layout;
    if (L.layout_hash != hash) {
        share_.why = "the exporter placed its weights differently (layout hash " + std::to_string(L.layout_hash) +
                     ", this library's " + std::to_string(hash) + ")";
        return false;
    }
    if (L.bytes < total) {
        share_.why = "the exported allocation has " + std::to_string(L.bytes) + " bytes, the weights need " +
                     std::to_string(total);
        return false;
    }
    std::unique_ptr<VmmAllocation> a = VmmAllocation::import(s.import_fd, L, &share_.why);
    if (!a) return false;
    uint8_t *base = static_cast<uint8_t *>(a->ptr());
    for (const Planned &p : plan) ranges_[p.host] = {p.n, base + p.offset};
    share_.imported = true;
    share_.read_only = a->read_only();
    share_.layout = L;
    vmm_ = std::move(a);
    return true;
}

void DeviceWeights::free_all() {
    for (void *p : allocs_) cudaFree(p);
    allocs_.clear();
    vmm_.reset();
    ranges_.clear();
}

DeviceWeights::~DeviceWeights() { free_all(); }

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
