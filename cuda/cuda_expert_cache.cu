#include "cuda/cuda_expert_cache.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_check.h"
#include "engine/common/error.h"
#include "engine/model/config.h"
#include "engine/model/weights.h"

namespace ds4::cuda {

namespace {

constexpr uint64_t kPieceAlign = 256;   // every piece starts 256-byte aligned (16-byte loads need 16)
constexpr size_t kRing = 256;           // ordering events; one is reused only once it has completed
constexpr size_t kStages = 4;           // pinned staging buffers of one slot each

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

uint64_t now_ns() {
    return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace

DeviceExpertCache::DeviceExpertCache(const ModelConfig &c, const ModelWeights &w, std::unique_ptr<ExpertSource> host,
                                     uint64_t cache_experts, uint64_t cache_bytes, bool prefetch)
    : n_layer_(c.n_layer), n_expert_(c.n_expert), n_used_(c.n_expert_used), w_(w), host_(std::move(host)),
      prefetch_(prefetch) {
    uint64_t most[3] = {0, 0, 0};
    for (const LayerWeights &L : w.layers) {
        const ExpertsView *v[3] = {&L.gate_exps, &L.up_exps, &L.down_exps};
        for (int i = 0; i < 3; ++i) {
            if (v[i]->empty()) fail("VRAM expert cache: a layer without routed expert tensors");
            most[i] = std::max(most[i], v[i]->first.bytes());
        }
    }
    piece_off_[0] = 0;
    piece_off_[1] = align_up(most[0], kPieceAlign);
    piece_off_[2] = piece_off_[1] + align_up(most[1], kPieceAlign);
    slot_bytes_ = align_up(piece_off_[2] + most[2], kPieceAlign);
    if (!cache_experts && !cache_bytes) cache_bytes = uint64_t(4) << 30;
    const uint64_t want = cache_experts ? cache_experts : cache_bytes / slot_bytes_;
    capacity_ = (size_t)std::min<uint64_t>(want, (uint64_t)n_layer_ * n_expert_);
    if (capacity_ < (size_t)n_used_)
        failf("the VRAM expert cache is too small: it holds %zu experts of %.1f MB, a token uses %d per layer (raise "
              "--expert-cache-bytes or --expert-cache-experts)",
              capacity_, slot_bytes_ / 1e6, n_used_);
    size_t fr = 0, tot = 0;
    DS4_CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    const uint64_t need = (uint64_t)capacity_ * slot_bytes_;
    if (need + (256ull << 20) > fr)
        failf("the VRAM expert cache needs %.2f GiB (%zu experts of %.1f MB), %.2f GiB of %.2f GiB are free", need / 1073741824.0,
              capacity_, slot_bytes_ / 1e6, fr / 1073741824.0, tot / 1073741824.0);
    try {
        DS4_CUDA_CHECK(cudaMalloc(reinterpret_cast<void **>(&arena_), need));
        DS4_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
        ring_.resize(kRing, nullptr);
        ring_gen_.assign(kRing, 0);
        for (cudaEvent_t &e : ring_) DS4_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        stage_.resize(kStages, nullptr);
        stage_ev_.resize(kStages, nullptr);
        stage_busy_.assign(kStages, false);
        for (size_t i = 0; i < kStages; ++i) {
            DS4_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void **>(&stage_[i]), slot_bytes_, cudaHostAllocDefault));
            DS4_CUDA_CHECK(cudaEventCreateWithFlags(&stage_ev_[i], cudaEventDisableTiming));
        }
    } catch (...) {
        free_all();
        throw;
    }
    slots_.resize(capacity_);
    slot_of_.assign((size_t)n_layer_ * n_expert_, -1);
    st_.capacity = capacity_;
    st_.capacity_bytes = need;
}

DeviceExpertCache::~DeviceExpertCache() { free_all(); }

void DeviceExpertCache::free_all() {
    if (copy_) cudaStreamSynchronize(copy_);
    for (const Timing &t : timing_) cudaEventDestroy(t.start), cudaEventDestroy(t.end);
    timing_.clear();
    for (cudaEvent_t e : spare_) cudaEventDestroy(e);
    spare_.clear();
    for (cudaEvent_t &e : ring_)
        if (e) cudaEventDestroy(e), e = nullptr;
    for (size_t i = 0; i < stage_.size(); ++i) {
        if (stage_[i]) cudaFreeHost(stage_[i]), stage_[i] = nullptr;
        if (stage_ev_[i]) cudaEventDestroy(stage_ev_[i]), stage_ev_[i] = nullptr;
    }
    if (copy_) cudaStreamDestroy(copy_), copy_ = nullptr;
    if (arena_) cudaFree(arena_), arena_ = nullptr;
}

DeviceExpertCache::Tag DeviceExpertCache::record(cudaStream_t s) {
    const size_t i = ring_next_++ % kRing;
    // The recording this replaces must be over before a waiter could confuse the two; it is
    // kRing recordings old, so this does not wait in practice.
    if (ring_gen_[i]) DS4_CUDA_CHECK(cudaEventSynchronize(ring_[i]));
    DS4_CUDA_CHECK(cudaEventRecord(ring_[i], s));
    return {(int)i, ++ring_gen_[i]};
}

void DeviceExpertCache::wait(cudaStream_t s, Tag t) {
    // An older generation was synchronised before its event was reused: nothing to wait for.
    if (t.i >= 0 && ring_gen_[t.i] == t.gen) DS4_CUDA_CHECK(cudaStreamWaitEvent(s, ring_[t.i], 0));
}

int DeviceExpertCache::take_slot() {
    int best = -1;
    for (size_t s = 0; s < slots_.size(); ++s) {
        const Slot &x = slots_[s];
        if (x.pins) continue;
        if (x.key < 0) return (int)s;
        if (best < 0 || x.tick < slots_[best].tick) best = (int)s;
    }
    if (best >= 0) {
        Slot &x = slots_[best];
        slot_of_[x.key] = -1;
        x.key = -1, x.prefetched = false;   // keeps `used`: the next upload waits for those kernels
    }
    return best;
}

void DeviceExpertCache::upload(int layer, const std::vector<std::pair<int, int>> &todo, bool prefetch) {
    if (todo.empty()) return;
    const uint64_t t0 = now_ns();
    const LayerWeights &L = w_.layers[layer];
    const uint64_t len = piece_off_[2] + L.down_exps.first.bytes();
    const uint64_t real = L.gate_exps.first.bytes() + L.up_exps.first.bytes() + L.down_exps.first.bytes();
    // Every wait for earlier kernels first, so the batch's timing covers copies only.
    for (const auto &[e, s] : todo) wait(copy_, slots_[s].used);
    cudaEvent_t ev[2];
    for (cudaEvent_t &x : ev) {
        if (spare_.empty()) {
            DS4_CUDA_CHECK(cudaEventCreate(&x));
        } else {
            x = spare_.back();
            spare_.pop_back();
        }
    }
    DS4_CUDA_CHECK(cudaEventRecord(ev[0], copy_));
    const size_t group = std::max<size_t>(1, std::min(host_->max_acquire(), todo.size()));
    std::vector<int> ids;
    for (size_t g0 = 0; g0 < todo.size(); g0 += group) {
        const size_t n = std::min(group, todo.size() - g0);
        ids.clear();
        for (size_t i = 0; i < n; ++i) ids.push_back(todo[g0 + i].first);
        views_.resize(n);
        host_->acquire(layer, ids, views_.data());
        for (size_t i = 0; i < n; ++i) {
            const size_t k = stage_next_++ % kStages;
            if (stage_busy_[k]) DS4_CUDA_CHECK(cudaEventSynchronize(stage_ev_[k]));
            uint8_t *st = stage_[k];
            const ExpertView &v = views_[i];
            std::memcpy(st + piece_off_[0], v.gate.data, v.gate.bytes());
            std::memcpy(st + piece_off_[1], v.up.data, v.up.bytes());
            std::memcpy(st + piece_off_[2], v.down.data, v.down.bytes());
            DS4_CUDA_CHECK(cudaMemcpyAsync(arena_ + (uint64_t)todo[g0 + i].second * slot_bytes_, st, len,
                                           cudaMemcpyHostToDevice, copy_));
            DS4_CUDA_CHECK(cudaEventRecord(stage_ev_[k], copy_));
            stage_busy_[k] = true;
        }
        host_->release();
    }
    DS4_CUDA_CHECK(cudaEventRecord(ev[1], copy_));
    timing_.push_back({ev[0], ev[1], real * todo.size()});
    const Tag t = record(copy_);
    for (const auto &[e, s] : todo) slots_[s].ready = t;
    st_.bytes_read += real * todo.size();
    (prefetch ? st_.prefetch_read_ns : st_.demand_read_ns) += now_ns() - t0;
    if (!prefetch) st_.wait_ns += now_ns() - t0;
    if (timing_.size() > 64) harvest(false);
}

void DeviceExpertCache::harvest(bool all) const {
    size_t keep = 0;
    for (size_t i = 0; i < timing_.size(); ++i) {
        Timing &t = timing_[i];
        const bool must = all || timing_.size() - i > 64;
        if (!must && cudaEventQuery(t.end) != cudaSuccess) {
            timing_[keep++] = t;
            continue;
        }
        if (must) cudaEventSynchronize(t.end);
        float ms = 0;
        if (cudaEventElapsedTime(&ms, t.start, t.end) == cudaSuccess) st_.io_busy_ns += (uint64_t)(ms * 1e6);
        spare_.push_back(t.start), spare_.push_back(t.end);
    }
    timing_.resize(keep);
    (void)cudaGetLastError();   // a not-ready query leaves no sticky error; clear the soft one
}

void DeviceExpertCache::acquire_slots(int layer, std::span<const int> ids, cudaStream_t compute, int *slots) {
    if (layer < 0 || layer >= n_layer_) failf("VRAM expert cache: layer %d of %d", layer, n_layer_);
    if (ids.size() > capacity_) failf("VRAM expert cache: %zu experts asked at once, it holds %zu", ids.size(), capacity_);
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<int> &held = held_[std::this_thread::get_id()];
    if (!held.empty()) fail("internal: VRAM expert slots acquired twice without done()");
    std::vector<std::pair<int, int>> todo;
    std::vector<size_t> miss_at;
    for (size_t i = 0; i < ids.size(); ++i) {
        const int e = ids[i];
        if (e < 0 || e >= n_expert_) failf("VRAM expert cache: expert %d of layer %d (it has %d)", e, layer, n_expert_);
        const int s = slot_of_[(size_t)layer * n_expert_ + e];
        slots[i] = s;
        if (s < 0) {
            miss_at.push_back(i);
            continue;
        }
        Slot &x = slots_[s];
        if (x.prefetched) ++st_.prefetch_used, x.prefetched = false;
        ++x.pins;
        held.push_back(s);
    }
    for (size_t i : miss_at) {
        const int s = take_slot();
        if (s < 0) {
            for (const auto &[e, t] : todo) slot_of_[slots_[t].key] = -1, slots_[t].key = -1;
            for (int h : held) --slots_[h].pins;
            held.clear();
            failf("VRAM expert cache: no free slot for %zu experts (other executors hold the rest of %zu)", ids.size(), capacity_);
        }
        Slot &x = slots_[s];
        x.key = layer * n_expert_ + ids[i];
        slot_of_[x.key] = s;
        ++x.pins;
        held.push_back(s);
        slots[i] = s;
        todo.push_back({ids[i], s});
    }
    try {
        upload(layer, todo, false);
    } catch (...) {
        for (const auto &[e, s] : todo) slot_of_[slots_[s].key] = -1, slots_[s].key = -1;
        for (int h : held) --slots_[h].pins;
        held.clear();
        throw;
    }
    st_.acquired += ids.size();
    st_.misses += todo.size();
    int last = -1;
    for (size_t i = 0; i < ids.size(); ++i) {
        Slot &x = slots_[slots[i]];
        x.tick = ++tick_;
        if (x.ready.i != last) wait(compute, x.ready), last = x.ready.i;
    }
}

void DeviceExpertCache::done(cudaStream_t compute) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = held_.find(std::this_thread::get_id());
    if (it == held_.end() || it->second.empty()) return;
    const Tag t = record(compute);
    for (int s : it->second) {
        slots_[s].used = t;
        --slots_[s].pins;
    }
    it->second.clear();
}

void DeviceExpertCache::acquire(int, std::span<const int>, ExpertView *) {
    fail("internal: the VRAM expert cache is read through acquire_slots (the CUDA executor), not as host views");
}

void DeviceExpertCache::prefetch(int layer, std::span<const int> ids) {
    if (layer < 0 || layer >= n_layer_) return;
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<std::pair<int, int>> todo;
    for (int e : ids) {
        if (todo.size() >= capacity_ / 2) break;
        if (e < 0 || e >= n_expert_ || slot_of_[(size_t)layer * n_expert_ + e] >= 0) continue;
        const int s = take_slot();
        if (s < 0) break;
        Slot &x = slots_[s];
        x.key = layer * n_expert_ + e;
        x.tick = ++tick_;
        x.prefetched = true;
        slot_of_[x.key] = s;
        todo.push_back({e, s});
    }
    try {
        upload(layer, todo, true);
    } catch (...) {
        for (const auto &[e, s] : todo) slot_of_[slots_[s].key] = -1, slots_[s].key = -1, slots_[s].prefetched = false;
        throw;
    }
    st_.prefetched += todo.size();
}

const LayerWeights *DeviceExpertCache::predictor(int layer) const {
    return prefetch_ && layer + 1 < n_layer_ ? &w_.layers[layer + 1] : nullptr;
}

ExpertSourceStats DeviceExpertCache::stats() const {
    const ExpertSourceStats h = host_->stats();
    std::lock_guard<std::mutex> lk(mu_);
    harvest(false);
    ExpertSourceStats s = st_;
    s.resident = 0;
    for (const Slot &x : slots_) s.resident += x.key >= 0;
    s.store_reads = h.store_reads, s.store_corrupt = h.store_corrupt;
    s.host_misses = h.misses, s.host_bytes_read = h.bytes_read, s.host_capacity_bytes = h.capacity_bytes;
    return s;
}

std::unique_ptr<ExpertSource> make_device_expert_cache(const ModelConfig &c, const ModelWeights &w,
                                                       std::unique_ptr<ExpertSource> host, uint64_t cache_experts,
                                                       uint64_t cache_bytes, bool prefetch) {
    return std::make_unique<DeviceExpertCache>(c, w, std::move(host), cache_experts, cache_bytes, prefetch);
}

}  // namespace ds4::cuda
