#include "engine/model/model.h"

#include <cstring>

#include "engine/common/error.h"
#include "engine/cpu/cpu_backend.h"
#ifdef DS4_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace ds4 {

namespace {

struct Fnv {
    uint64_t h = 1469598103934665603ull;
    void add(const void *p, size_t n) {
        const uint8_t *b = static_cast<const uint8_t *>(p);
        for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    }
    void add(const std::string &s) { add(s.data(), s.size() + 1); }
    template <class T> void pod(T v) { add(&v, sizeof v); }
};

uint64_t compute_fingerprint(const gguf::Reader &r) {
    Fnv f;
    for (const auto &[k, v] : r.metadata()) {
        if (k.rfind("tokenizer.", 0) == 0) continue;   // vocab strings are large; ids matter via shape
        f.add(k);
        f.pod(v.type);
        f.pod(v.u), f.pod(v.i), f.pod(v.f), f.add(v.s);
        for (const auto &e : v.arr) f.pod(e.u), f.pod(e.i), f.pod(e.f);
    }
    for (const auto &t : r.tensors()) {
        f.add(t.name);
        f.pod(t.type);
        for (int64_t d : t.ne) f.pod(d);
        // Sample the head of each tensor: cheap even for 100+ GB files, and any
        // re-quantisation or re-generation changes it.
        if (t.data) f.add(t.data, (size_t)std::min<uint64_t>(t.nbytes, 64));
    }
    return f.h;
}

}  // namespace

std::unique_ptr<Model> Model::open(const std::string &path, const ModelOptions &opt) {
    std::unique_ptr<Model> m(new Model());
    m->path_ = path;
    m->reader_ = gguf::Reader::open(path, true, opt.directory);
    m->cfg_ = ModelConfig::from_gguf(*m->reader_);
    m->w_ = ModelWeights::bind(*m->reader_, m->cfg_, opt.plan);
    m->rope_main_ = Rope::for_layer_kind(m->cfg_, false);
    m->rope_compress_ = Rope::for_layer_kind(m->cfg_, true);
    BackendKind kind = opt.backend;
    if (kind == BackendKind::Auto) {
        kind = BackendKind::Cpu;
#ifdef DS4_HAVE_CUDA
        if (cuda::cuda_device_available(nullptr)) kind = BackendKind::Cuda;
#endif
    }
    if (kind == BackendKind::Cuda) {
#ifdef DS4_HAVE_CUDA
        m->backend_ = cuda::make_cuda_backend(m->cfg_, *m->reader_, m->w_, m->rope_main_, m->rope_compress_, opt.progress,
                                              opt.device_share, opt.streaming.enabled);
#else
        fail("this build of ds4 has no CUDA backend (configure with a CUDA compiler, DS4_CUDA=ON)");
#endif
    } else {
        m->backend_ = make_cpu_backend(m->cfg_);
    }
    m->fingerprint_ = compute_fingerprint(*m->reader_);
    if (opt.streaming.enabled) {
        ExpertStreamingOptions so = opt.streaming;
        if (!so.store && so.open_store) so.store = so.open_store(m->fingerprint_);
        if (kind == BackendKind::Cuda) {
#ifdef DS4_HAVE_CUDA
            // The budget is VRAM; RAM holds a tier of host_cache_bytes the slots are filled from.
            ExpertStreamingOptions host = so;
            host.cache_experts = 0;
            host.cache_bytes = so.host_cache_bytes ? so.host_cache_bytes : ExpertStreamingOptions::kDefaultHostTierBytes;
            m->experts_ = cuda::make_device_expert_cache(m->cfg_, m->w_,
                                                         std::make_unique<StreamingExperts>(m->w_, m->cfg_, *m->reader_, host),
                                                         so.cache_experts, so.cache_bytes, so.prefetch);
#endif
        } else {
            m->experts_ = std::make_unique<StreamingExperts>(m->w_, m->cfg_, *m->reader_, so);
        }
        m->streaming_ = true;
    } else {
        m->experts_ = std::make_unique<ResidentExperts>(m->w_);
    }
    m->default_threads_ = opt.n_threads;
    return m;
}

bool parse_backend_kind(std::string_view name, BackendKind *out) {
    if (name == "auto") *out = BackendKind::Auto;
    else if (name == "cpu") *out = BackendKind::Cpu;
    else if (name == "cuda") *out = BackendKind::Cuda;
    else return false;
    return true;
}

std::unique_ptr<Executor> Model::make_executor(int n_threads) const {
    return backend_->make_executor(n_threads < 0 ? default_threads_ : n_threads);
}

void Model::prewarm(const std::function<void(uint64_t done, uint64_t total)> &progress) const {
    auto wanted = [&](const gguf::TensorInfo &t) {
        return t.data && !(streaming_ && t.name.find("_exps.") != std::string::npos);   // experts: read by the source
    };
    uint64_t total = 0, done = 0, reported = 0;
    for (const auto &t : reader_->tensors())
        if (wanted(t)) total += t.nbytes;
    constexpr uint64_t kStep = uint64_t(64) << 20;
    volatile uint64_t sink = 0;
    for (const auto &t : reader_->tensors()) {
        if (!wanted(t)) continue;
        uint64_t s = 0;
        for (uint64_t off = 0; off < t.nbytes; off += 4096) {
            s += t.data[off];
            if (progress && done + off >= reported + kStep) {
                reported = done + off;
                progress(reported, total);
            }
        }
        done += t.nbytes;
        sink = sink + s;
    }
    (void)sink;
    if (progress) progress(total, total);
    experts_->prewarm();
}

}  // namespace ds4
