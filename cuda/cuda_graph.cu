#include "cuda/cuda_graph.h"

#include <algorithm>
#include <cstdlib>

#include "cuda/cuda_check.h"

namespace ds4::cuda {

namespace graph_detail {
thread_local std::shared_ptr<Ctl> t_ctl;
}

namespace {
// Steps of more rows (prefill chunks) are device-bound and rarely repeat a shape.
constexpr int kMaxRows = 16;
}  // namespace

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
            DS4_CUDA_CHECK(cudaGraphExecKernelNodeSetParams(v->x, v->nodes[i], &p));
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
        build(*v);
    }
    v->used = ++clock_;
    DS4_CUDA_CHECK(cudaGraphLaunch(v->x, s_));
    ++stats_.replays;
    stats_.nodes += recs_.size();
    recs_.clear(), blob_.clear(), offs_.clear();
}

void StepGraphs::build(Variant &v) {
    DS4_CUDA_CHECK(cudaGraphCreate(&v.g, 0));
    v.nodes.resize(v.recs.size());
    for (size_t i = 0; i < v.recs.size(); ++i) {
        const Rec &r = v.recs[i];
        ptrs_.resize(r.na);
        for (uint32_t j = 0; j < r.na; ++j) ptrs_[j] = v.blob.data() + v.offs[r.a0 + j];
        cudaKernelNodeParams p{const_cast<void *>(r.func), r.grid, r.block, r.shm, ptrs_.data(), nullptr};
        DS4_CUDA_CHECK(cudaGraphAddKernelNode(&v.nodes[i], v.g, nullptr, 0, &p));
        if (i == 0) continue;
        // the stream's programmatic serialisation as an edge: the kernel may start once every
        // block of the one before has begun (launch_dependents) and waits for its completion
        // in pdl_enter
        cudaGraphEdgeData e{};
        if (r.pdl) {
            e.from_port = cudaGraphKernelNodePortProgrammatic;
            e.type = cudaGraphDependencyTypeProgrammatic;
        }
        DS4_CUDA_CHECK(cudaGraphAddDependencies(v.g, &v.nodes[i - 1], &v.nodes[i], &e, 1));
    }
    DS4_CUDA_CHECK(cudaGraphInstantiate(&v.x, v.g, 0));
    ++stats_.built;
}

void StepGraphs::drop(Variant &v) {
    if (v.x) cudaGraphExecDestroy(v.x);   // one still running is freed when it completes
    if (v.g) cudaGraphDestroy(v.g);
    v.x = nullptr, v.g = nullptr;
}

}  // namespace ds4::cuda
