#include "engine/backend/streaming_experts.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "engine/common/error.h"
#include "engine/gguf/gguf.h"
#include "engine/model/config.h"
#include "engine/model/weights.h"

namespace ds4 {

namespace {

using io::kIoAlign;
using io::round_up;

uint64_t now_ns() {
    return (uint64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

const char *kPieceName[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};

// After this many tokens (acquires of layer 0) the use counts go to the store.
constexpr uint64_t kUsageFlushTokens = 64;

}  // namespace

StreamingExperts::StreamingExperts(const ModelWeights &w, const ModelConfig &c, const gguf::Reader &r,
                                   const ExpertStreamingOptions &opt)
    : w_(w), n_layer_(c.n_layer), n_expert_(c.n_expert), n_used_(c.n_expert_used), opt_(opt),
      demand_reader_(io::ExtentReaderOptions{std::max(opt.queue_depth, 1u)}) {
    // Open each split that holds experts once.
    auto fd_of = [&](int split) {
        const std::string &path = r.split_file(split);
        for (size_t i = 0; i < files_.size(); ++i)
            if (files_[i] == path) return fds_[i];
        bool direct = false;
        const int fd = io::open_for_direct_read(path, &direct);
        if (fd < 0) fail(path + ": cannot open for expert streaming: " + std::strerror(-fd));
        files_.push_back(path);
        fds_.push_back(fd);
        return fd;
    };
    pieces_.resize((size_t)n_layer_ * 3);
    for (int l = 0; l < n_layer_; ++l) {
        const ExpertsView *ev[3] = {&w.layers[l].gate_exps, &w.layers[l].up_exps, &w.layers[l].down_exps};
        uint64_t slot = 0;
        for (int i = 0; i < 3; ++i) {
            const std::string name = "blk." + std::to_string(l) + "." + kPieceName[i] + ".weight";
            const gguf::TensorInfo *t = r.tensor(name);
            if (!t) fail("expert streaming: tensor " + name + " is missing");
            Piece &p = pieces_[(size_t)l * 3 + i];
            p.fd = fd_of(t->split);
            p.base = r.file_offset(*t);
            p.bytes = ev[i]->expert_bytes;
            slot += round_up(p.bytes, kIoAlign) + kIoAlign;  // room for the misaligned start
        }
        slot_bytes_ = std::max(slot_bytes_, slot);
    }
    const uint64_t all = (uint64_t)n_layer_ * n_expert_;
    uint64_t cap = opt.cache_experts;
    const uint64_t bytes = opt.cache_bytes ? opt.cache_bytes : ExpertStreamingOptions::kDefaultCacheBytes;
    if (!cap) cap = bytes / slot_bytes_;
    cap = std::min(cap, all);
    if (cap < (uint64_t)n_used_)
        failf("expert cache budget too small: it holds %llu experts of %llu bytes, a token uses %d per layer "
              "(give at least %llu bytes or %d experts)",
              (unsigned long long)cap, (unsigned long long)slot_bytes_, n_used_,
              (unsigned long long)(slot_bytes_ * (uint64_t)n_used_), n_used_);
    capacity_ = (size_t)cap;
    try {
        buf_.resize(capacity_ * slot_bytes_);
    } catch (const std::bad_alloc &) {
        failf("expert cache: cannot allocate %llu bytes", (unsigned long long)(capacity_ * slot_bytes_));
    }
    // Touched now, so the budget is memory held from the start and the first reads into each
    // slot do not also pay page faults (measured: a 4 GiB cache filled lazily read at a
    // tenth of the disk's speed while the kernel found and zeroed pages).
    std::memset(buf_.data(), 0, buf_.capacity());
    slots_.resize(capacity_);
    slot_of_.assign(all, -1);
    usage_.assign(all, 0);
    layer_epoch_.assign(n_layer_, 0);
    st_.capacity = capacity_;
    st_.capacity_bytes = capacity_ * slot_bytes_;
    if (opt_.prefetch) io_ = std::thread([this] { io_thread(); });
}

StreamingExperts::~StreamingExperts() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (io_.joinable()) io_.join();
    try {
        flush_usage();
    } catch (...) {
    }
    for (int fd : fds_) ::close(fd);
}

uint64_t StreamingExperts::record_bytes(int layer) const {
    uint64_t n = 0;
    for (int i = 0; i < 3; ++i) n += round_up(pieces_[(size_t)layer * 3 + i].bytes, kIoAlign);
    return n;
}

const LayerWeights *StreamingExperts::predictor(int layer) const {
    return opt_.prefetch && layer + 1 < n_layer_ ? &w_.layers[layer + 1] : nullptr;
}

int StreamingExperts::take_slot(std::unique_lock<std::mutex> &lk, bool wait) {
    while (true) {
        int best = -1;
        for (size_t s = 0; s < slots_.size(); ++s) {
            const Slot &x = slots_[s];
            if (x.pins) continue;
            if (x.state == State::Empty && x.key < 0) return (int)s;
            if (x.state == State::Ready && (best < 0 || x.tick < slots_[best].tick)) best = (int)s;
        }
        if (best >= 0) {
            Slot &x = slots_[best];
            slot_of_[x.key] = -1;
            x = Slot{};
            return best;
        }
        if (!wait) return -1;
        cv_.wait(lk);  // every slot is held or loading: wait for a release or a load
    }
}

void StreamingExperts::unpin_thread_locked(std::thread::id t) {
    auto it = held_.find(t);
    if (it == held_.end()) return;
    for (int s : it->second) --slots_[s].pins;
    const bool any = !it->second.empty();
    it->second.clear();
    if (any) cv_.notify_all();
}

void StreamingExperts::abandon(const std::vector<Load> &loads) {
    std::lock_guard<std::mutex> lk(mu_);
    for (const Load &ld : loads) {
        Slot &x = slots_[ld.slot];
        slot_of_[ld.key] = -1;
        x.key = -1;
        x.state = State::Empty;
    }
    cv_.notify_all();
}

void StreamingExperts::release() {
    std::lock_guard<std::mutex> lk(mu_);
    unpin_thread_locked(std::this_thread::get_id());
}

void StreamingExperts::load(io::ExtentReader &reader, std::vector<Load> &loads, bool prefetch) {
    struct Where {
        uint64_t piece[3];
    };
    std::vector<Where> where(loads.size());
    std::vector<io::ReadExtent> ex;
    std::vector<uint64_t> need;  // bytes each extent must deliver
    auto gguf_extents = [&](size_t i) {
        const int layer = loads[i].key / n_expert_, e = loads[i].key % n_expert_;
        uint8_t *base = slot_data(loads[i].slot);
        uint64_t region = 0;
        for (int k = 0; k < 3; ++k) {
            const Piece &p = pieces_[(size_t)layer * 3 + k];
            const uint64_t off = p.base + (uint64_t)e * p.bytes;
            const uint64_t a = off / kIoAlign * kIoAlign;
            const uint64_t end = round_up(off + p.bytes, kIoAlign);
            ex.push_back({p.fd, a, (size_t)(end - a), base + region, 0});
            need.push_back(off + p.bytes - a);
            where[i].piece[k] = region + (off - a);
            region += round_up(p.bytes, kIoAlign) + kIoAlign;
        }
    };
    auto record_offsets = [&](int layer, uint64_t *out) {
        uint64_t o = 0;
        for (int k = 0; k < 3; ++k) {
            out[k] = o;
            o += round_up(pieces_[(size_t)layer * 3 + k].bytes, kIoAlign);
        }
    };
    auto run = [&](std::vector<size_t> &which) {
        uint64_t t0;
        {
            std::lock_guard<std::mutex> lk(mu_);
            t0 = now_ns();
            if (reading_++ == 0) busy_since_ = t0;
        }
        const int rc = reader.read(ex);
        uint64_t dt;
        {
            std::lock_guard<std::mutex> lk(mu_);
            const uint64_t t1 = now_ns();
            dt = t1 - t0;
            if (--reading_ == 0) st_.io_busy_ns += t1 - busy_since_;
        }
        uint64_t got = 0;
        for (size_t j = 0; j < ex.size(); ++j) {
            if (ex[j].got < 0) failf("expert read failed: %s", std::strerror((int)-ex[j].got));
            if ((uint64_t)ex[j].got < need[j])
                failf("expert read: %llu of %llu bytes at offset %llu (file shorter than its tensors?)",
                      (unsigned long long)ex[j].got, (unsigned long long)need[j], (unsigned long long)ex[j].offset);
            got += (uint64_t)ex[j].got;
        }
        if (rc < 0) failf("expert read failed: %s", std::strerror(-rc));
        std::lock_guard<std::mutex> lk(mu_);
        (prefetch ? st_.prefetch_read_ns : st_.demand_read_ns) += dt;
        st_.bytes_read += got;
        (void)which;
    };

    // First pass: store records where there are any, the GGUF otherwise.
    std::vector<size_t> idx;
    for (size_t i = 0; i < loads.size(); ++i) {
        Load &ld = loads[i];
        const int layer = ld.key / n_expert_, e = ld.key % n_expert_;
        ld.store = opt_.store && opt_.store->find(layer, e, &ld.rec) && ld.rec.length == record_bytes(layer) &&
                   ld.rec.offset % kIoAlign == 0;
        if (ld.store) {
            ex.push_back({ld.rec.fd, ld.rec.offset, (size_t)ld.rec.length, slot_data(ld.slot), 0});
            need.push_back(ld.rec.length);
            record_offsets(layer, where[i].piece);
        } else {
            gguf_extents(i);
        }
        idx.push_back(i);
    }
    run(idx);

    // Records that fail their checksum are never used: read again from the GGUF (and
    // replaced in the store below).
    ex.clear();
    need.clear();
    std::vector<size_t> again;
    uint64_t corrupt = 0, store_reads = 0;
    for (size_t i = 0; i < loads.size(); ++i) {
        Load &ld = loads[i];
        if (!ld.store) continue;
        const int layer = ld.key / n_expert_, e = ld.key % n_expert_;
        if (opt_.store->verify(layer, e, slot_data(ld.slot), ld.rec.length)) {
            ++store_reads;
            continue;
        }
        ++corrupt;
        ld.store = false;
        gguf_extents(i);
        again.push_back(i);
    }
    if (!again.empty()) run(again);

    // Experts read from the GGUF go to the store in its layout: the pieces move down to
    // their record offsets inside the slot (each only moves left, so in order they never
    // overlap a piece not yet moved) and the gaps are zeroed, so the checksum is stable.
    if (opt_.store) {
        for (size_t i = 0; i < loads.size(); ++i) {
            Load &ld = loads[i];
            if (ld.store) continue;
            const int layer = ld.key / n_expert_, e = ld.key % n_expert_;
            uint8_t *base = slot_data(ld.slot);
            uint64_t rec[3];
            record_offsets(layer, rec);
            for (int k = 0; k < 3; ++k) {
                const uint64_t b = pieces_[(size_t)layer * 3 + k].bytes;
                std::memmove(base + rec[k], base + where[i].piece[k], b);
                const uint64_t stop = k < 2 ? rec[k + 1] : record_bytes(layer);
                std::memset(base + rec[k] + b, 0, stop - rec[k] - b);
                where[i].piece[k] = rec[k];
            }
            try {
                opt_.store->put(layer, e, base, record_bytes(layer));
            } catch (...) {
                // The store is a cache: failing to extend it must not fail inference.
            }
        }
    }

    std::lock_guard<std::mutex> lk(mu_);
    st_.store_corrupt += corrupt;
    st_.store_reads += store_reads;
    for (size_t i = 0; i < loads.size(); ++i) {
        Slot &s = slots_[loads[i].slot];
        std::memcpy(s.piece, where[i].piece, sizeof s.piece);
        s.state = State::Ready;
        s.from_store = loads[i].store;
        s.prefetched = prefetch && s.pins == 0;  // a pinned one was acquired (late) while loading
        s.tick = ++tick_;
    }
    if (prefetch) st_.prefetched += loads.size();
    cv_.notify_all();
}

void StreamingExperts::acquire(int layer, std::span<const int> ids, ExpertView *out) {
    if (layer < 0 || layer >= n_layer_) failf("expert source: layer %d out of range", layer);
    if (ids.size() > capacity_)
        failf("expert source: %zu experts asked at once, the cache holds %zu", ids.size(), capacity_);
    for (int e : ids)
        if (e < 0 || e >= n_expert_) failf("expert source: expert %d of layer %d out of range", e, layer);
    const std::thread::id me = std::this_thread::get_id();
    const uint64_t t0 = now_ns();
    std::vector<Load> loads;
    std::vector<int> mine(ids.size());
    bool waited = false, flush = false;
    {
        std::unique_lock<std::mutex> lk(mu_);
        unpin_thread_locked(me);
        ++layer_epoch_[layer];
        if (layer == 0 && ++tokens_since_flush_ >= kUsageFlushTokens) {
            tokens_since_flush_ = 0;
            flush = true;
        }
        for (size_t i = 0; i < ids.size(); ++i) {
            const int key = layer * n_expert_ + ids[i];
            ++usage_[key];
            ++st_.acquired;
            int s = slot_of_[key];
            if (s < 0) {
                const int got = take_slot(lk, true);
                s = slot_of_[key];  // another thread may have loaded it while we waited
                if (s < 0) {
                    s = got;
                    Slot &x = slots_[s];
                    x = Slot{};
                    x.key = key;
                    x.state = State::Loading;
                    slot_of_[key] = s;
                    loads.push_back({s, key});
                    ++st_.misses;
                }
            } else if (slots_[s].state == State::Loading) {
                ++st_.late;
                waited = true;
            } else if (slots_[s].prefetched) {
                ++st_.prefetch_used;
                slots_[s].prefetched = false;
            }
            ++slots_[s].pins;
            held_[me].push_back(s);
            mine[i] = s;
        }
    }
    if (!loads.empty()) {
        try {
            std::lock_guard<std::mutex> dl(demand_mu_);
            load(demand_reader_, loads, false);
        } catch (...) {
            abandon(loads);
            throw;
        }
    }
    {
        std::unique_lock<std::mutex> lk(mu_);
        for (size_t i = 0; i < ids.size(); ++i) {
            const int key = layer * n_expert_ + ids[i];
            cv_.wait(lk, [&] { return slots_[mine[i]].state != State::Loading || slots_[mine[i]].key != key; });
            const Slot &x = slots_[mine[i]];
            if (x.key != key || x.state != State::Ready)
                failf("expert source: the prefetch of expert %d of layer %d failed", ids[i], layer);
            const uint8_t *base = buf_.data() + (uint64_t)mine[i] * slot_bytes_;
            const LayerWeights &L = w_.layers[layer];
            const ExpertsView *ev[3] = {&L.gate_exps, &L.up_exps, &L.down_exps};
            WeightView v[3];
            for (int k = 0; k < 3; ++k) {
                v[k] = ev[k]->first;
                v[k].data = base + x.piece[k];
            }
            out[i] = {v[0], v[1], v[2]};
            slots_[mine[i]].tick = ++tick_;
        }
        if (!loads.empty() || waited) st_.wait_ns += now_ns() - t0;
    }
    if (flush) flush_usage();
}

void StreamingExperts::prefetch(int layer, std::span<const int> ids) {
    if (!opt_.prefetch || layer < 0 || layer >= n_layer_) return;
    {
        std::lock_guard<std::mutex> lk(mu_);
        Job j{layer, layer_epoch_[layer], {}};
        for (int e : ids)
            if (e >= 0 && e < n_expert_ && slot_of_[layer * n_expert_ + e] < 0) j.ids.push_back(e);
        if (j.ids.empty()) return;
        while (jobs_.size() >= 4) jobs_.pop_front();  // stale predictions first
        jobs_.push_back(std::move(j));
    }
    cv_.notify_all();
}

void StreamingExperts::io_thread() {
    io::ExtentReader reader(io::ExtentReaderOptions{std::max(opt_.queue_depth, 1u)});
    std::unique_lock<std::mutex> lk(mu_);
    std::vector<Load> loads;
    while (true) {
        cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
        if (stop_) return;
        Job j = std::move(jobs_.front());
        jobs_.pop_front();
        if (layer_epoch_[j.layer] != j.epoch) continue;  // the layer ran already: too late
        loads.clear();
        // At most half the cache is given to one prediction, so demand always finds room.
        const size_t limit = std::max<size_t>(capacity_ / 2, 1);
        for (int e : j.ids) {
            if (loads.size() >= limit) break;
            const int key = j.layer * n_expert_ + e;
            if (slot_of_[key] >= 0) continue;
            const int s = take_slot(lk, false);
            if (s < 0) break;
            Slot &x = slots_[s];
            x = Slot{};
            x.key = key;
            x.state = State::Loading;
            slot_of_[key] = s;
            loads.push_back({s, key});
        }
        if (loads.empty()) continue;
        lk.unlock();
        bool ok = true;
        try {
            load(reader, loads, true);
        } catch (...) {
            ok = false;
        }
        if (!ok) abandon(loads);
        lk.lock();
    }
}

void StreamingExperts::prewarm() {
    if (opt_.cold || !opt_.store) return;
    std::vector<std::pair<int, int>> hot = opt_.store->hot_set(capacity_);
    // Loaded coldest first, so the hottest are the most recently used (evicted last).
    std::reverse(hot.begin(), hot.end());
    std::vector<Load> loads;
    auto flush_loads = [&] {
        if (loads.empty()) return;
        std::lock_guard<std::mutex> dl(demand_mu_);
        try {
            load(demand_reader_, loads, false);
        } catch (...) {
            abandon(loads);
            throw;
        }
        loads.clear();
    };
    for (const auto &[layer, e] : hot) {
        if (layer < 0 || layer >= n_layer_ || e < 0 || e >= n_expert_) continue;
        {
            std::unique_lock<std::mutex> lk(mu_);
            const int key = layer * n_expert_ + e;
            if (slot_of_[key] >= 0) continue;
            const int s = take_slot(lk, false);
            if (s < 0) break;
            Slot &x = slots_[s];
            x = Slot{};
            x.key = key;
            x.state = State::Loading;
            slot_of_[key] = s;
            loads.push_back({s, key});
        }
        if (loads.size() >= 64) flush_loads();
    }
    flush_loads();
}

void StreamingExperts::flush_usage() {
    if (!opt_.store) return;
    std::vector<uint32_t> counts;
    {
        std::lock_guard<std::mutex> lk(mu_);
        counts = usage_;
        std::fill(usage_.begin(), usage_.end(), 0u);
    }
    opt_.store->add_usage(counts, n_expert_);
}

bool StreamingExperts::cached(int layer, int expert) const {
    if (layer < 0 || layer >= n_layer_ || expert < 0 || expert >= n_expert_) return false;
    std::lock_guard<std::mutex> lk(mu_);
    const int s = slot_of_[layer * n_expert_ + expert];
    return s >= 0 && slots_[s].state == State::Ready;
}

ExpertSourceStats StreamingExperts::stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    ExpertSourceStats s = st_;
    s.resident = 0;
    for (const Slot &x : slots_) s.resident += x.state == State::Ready;
    return s;
}

}  // namespace ds4
