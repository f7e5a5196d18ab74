#include "cuda/cuda_graph.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "cuda/cuda_check.h"

namespace ds4::cuda {

namespace graph_detail {
thread_local std::shared_ptr<Ctl> t_ctl;
}

namespace {
// Steps of more rows (prefill chunks) are device-bound and rarely repeat a shape.
constexpr int kMaxRows = 16;
std::atomic<int> g_fail_at{-1};   // builds left before one fails (fail_build_after)
}  // namespace

void StepGraphs::fail_build_after(int k) { g_fail_at = k; }

// A CUDA call inside replay(): its error is returned, not thrown, so cut() can fall back.
#define DS4_GRAPH_TRY(call)                          \
    do {                                             \
        const cudaError_t ds4_e_ = (call);           \
        if (ds4_e_ != cudaSuccess) return ds4_e_;    \
    } while (0)

StepGraphs::StepGraphs() : ctl_(std::make_shared<graph_detail::Ctl>()) {
    const char *e = std::getenv("DS4_CUDA_GRAPH");
    if (e && *e) per_cut_ = std::max(0, std::atoi(e));
    ctl_->owner = this;
}

StepGraphs::~StepGraphs() {
    ctl_->on = false;
    ctl_->owner = nullptr;
    if (graph_detail::t_ctl == ctl_) graph_detail::t_ctl.reset();
    for (auto &[rows, segs] : kept_)
        for (auto &vs : segs)
            for (Variant &v : vs) drop(v);
}

void StepGraphs::begin(cudaStream_t s, int rows) {
    recs_.clear(), blob_.clear(), offs_.clear();
    ctl_->on = false;
    if (!enabled() || rows > kMaxRows) return;
    s_ = s, rows_ = rows, seg_ = 0, layers_ = 0;
    ctl_->s = s;
    ctl_->on = true;
    graph_detail::t_ctl = ctl_;
}

void StepGraphs::layer_done() {
    if (ctl_->on && ++layers_ % per_cut_ == 0) cut();
}

void StepGraphs::stop() {
    if (!ctl_->on) return;
    cut();
    ctl_->on = false;
    if (graph_detail::t_ctl == ctl_) graph_detail::t_ctl.reset();
}

void StepGraphs::add(const void *func, dim3 grid, dim3 block, size_t shm, bool pdl, const void *const *args, const size_t *size,
                     int n) {
    // Each launch's arguments start 16-aligned and gaps stay zero, so one launch's bytes lay out
    // the same in every step and compare with memcmp.
    blob_.resize((blob_.size() + 15) & ~size_t(15));
    Rec r{func, grid, block, (unsigned)shm, pdl, (uint32_t)offs_.size(), (uint32_t)n, (uint32_t)blob_.size(), 0};
    for (int i = 0; i < n; ++i) {
        const size_t at = (blob_.size() + 15) & ~size_t(15);
        blob_.resize(at + size[i]);
        std::memcpy(blob_.data() + at, args[i], size[i]);
        offs_.push_back((uint32_t)at);
    }
    r.b1 = (uint32_t)blob_.size();
    recs_.push_back(r);
}

bool StepGraphs::same_launch(const Rec &a, const uint8_t *ab, const Rec &b, const uint8_t *bb) {
    return a.grid.x == b.grid.x && a.grid.y == b.grid.y && a.grid.z == b.grid.z && a.block.x == b.block.x &&
           a.block.y == b.block.y && a.block.z == b.block.z && a.shm == b.shm && a.b1 - a.b0 == b.b1 - b.b0 &&
           std::memcmp(ab + a.b0, bb + b.b0, a.b1 - a.b0) == 0;
}

void StepGraphs::cut() {
    if (!ctl_->on || recs_.empty()) return;
    if (const cudaError_t e = replay(); e != cudaSuccess) launch_on_stream(e);
    recs_.clear(), blob_.clear(), offs_.clear();
}

cudaError_t StepGraphs::replay() {
    std::vector<std::vector<Variant>> &segs = kept_[rows_];
    if ((int)segs.size() <= seg_) segs.resize(seg_ + 1);
    std::vector<Variant> &vs = segs[seg_++];
    Variant *v = nullptr;
    for (Variant &c : vs) {
        if (c.funcs.size() != recs_.size()) continue;
        bool same = true;
        for (size_t i = 0; i < recs_.size() && same; ++i) same = c.funcs[i] == recs_[i].func;
        if (same) {
            v = &c;
            break;
        }
    }
    if (v) {
        // Same kernels in the same order: the same parameter types, so the same byte layout.
        for (size_t i = 0; i < recs_.size(); ++i) {
            const Rec &a = recs_[i];
            Rec &b = v->recs[i];
            if (same_launch(a, blob_.data(), b, v->blob.data())) continue;
            std::memcpy(v->blob.data() + b.b0, blob_.data() + a.b0, a.b1 - a.b0);
            b.grid = a.grid, b.block = a.block, b.shm = a.shm;
            ptrs_.resize(b.na);
            for (uint32_t j = 0; j < b.na; ++j) ptrs_[j] = v->blob.data() + v->offs[b.a0 + j];
            cudaKernelNodeParams p{const_cast<void *>(b.func), b.grid, b.block, b.shm, ptrs_.data(), nullptr};
            DS4_GRAPH_TRY(cudaGraphExecKernelNodeSetParams(v->x, v->nodes[i], &p));
            ++stats_.node_updates;
        }
    } else {
        if (vs.size() >= kVariants) {
            auto old = std::min_element(vs.begin(), vs.end(), [](const Variant &a, const Variant &b) { return a.used < b.used; });
            drop(*old);
            vs.erase(old);
        }
        vs.emplace_back();
        v = &vs.back();
        for (const Rec &r : recs_) v->funcs.push_back(r.func);
        v->recs = recs_, v->blob = blob_, v->offs = offs_;
        if (const cudaError_t e = build(*v); e != cudaSuccess) {
            drop(*v);
            vs.pop_back();
            return e;
        }
    }
    v->used = ++clock_;
    DS4_GRAPH_TRY(cudaGraphLaunch(v->x, s_));
    ++stats_.replays;
    stats_.nodes += recs_.size();
    return cudaSuccess;
}

// The recorded kernels issued one by one, as launch_pdl issues them outside a recording, and
// graphs off for good.
void StepGraphs::launch_on_stream(cudaError_t why) {
    (void)cudaGetLastError();   // a failed build leaves no sticky error; a poisoned context fails below
    std::fprintf(stderr, "ds4: CUDA graph failed (%s); kernels are launched on the stream from now on\n",
                 cudaGetErrorString(why));
    ++stats_.fallbacks;
    for (const Rec &r : recs_) {
        ptrs_.resize(r.na);
        for (uint32_t j = 0; j < r.na; ++j) ptrs_[j] = blob_.data() + offs_[r.a0 + j];
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = r.grid, cfg.blockDim = r.block, cfg.dynamicSmemBytes = r.shm, cfg.stream = s_;
        cfg.attrs = at, cfg.numAttrs = r.pdl ? 1 : 0;
        DS4_CUDA_CHECK(cudaLaunchKernelExC(&cfg, r.func, ptrs_.data()));
    }
    per_cut_ = 0;
    ctl_->on = false;
    if (graph_detail::t_ctl == ctl_) graph_detail::t_ctl.reset();
    for (auto &[rows, segs] : kept_)
        for (auto &vs : segs)
            for (Variant &v : vs) drop(v);
    kept_.clear();
}

cudaError_t StepGraphs::build(Variant &v) {
    if (const int k = g_fail_at.load(); k >= 0) {
        g_fail_at = k - 1;
        if (k == 0) return cudaErrorMemoryAllocation;
    }
    DS4_GRAPH_TRY(cudaGraphCreate(&v.g, 0));
    v.nodes.resize(v.recs.size());
    for (size_t i = 0; i < v.recs.size(); ++i) {
        const Rec &r = v.recs[i];
        ptrs_.resize(r.na);
        for (uint32_t j = 0; j < r.na; ++j) ptrs_[j] = v.blob.data() + v.offs[r.a0 + j];
        cudaKernelNodeParams p{const_cast<void *>(r.func), r.grid, r.block, r.shm, ptrs_.data(), nullptr};
        DS4_GRAPH_TRY(cudaGraphAddKernelNode(&v.nodes[i], v.g, nullptr, 0, &p));
        if (i == 0) continue;
        // the stream's programmatic serialisation as an edge: the kernel may start once every
        // block of the one before has begun (launch_dependents) and waits for its completion
        // in pdl_enter
        cudaGraphEdgeData e{};
        if (r.pdl) {
            e.from_port = cudaGraphKernelNodePortProgrammatic;
            e.type = cudaGraphDependencyTypeProgrammatic;
        }
        DS4_GRAPH_TRY(cudaGraphAddDependencies(v.g, &v.nodes[i - 1], &v.nodes[i], &e, 1));
    }
    DS4_GRAPH_TRY(cudaGraphInstantiate(&v.x, v.g, 0));
    ++stats_.built;
    return cudaSuccess;
}

void StepGraphs::drop(Variant &v) {
    if (v.x) cudaGraphExecDestroy(v.x);   // one still running is freed when it completes
    if (v.g) cudaGraphDestroy(v.g);
    v.x = nullptr, v.g = nullptr;
}

}  // namespace ds4::cuda
