// A step's kernels replayed as CUDA graphs. A decode step is ~35 kernels a layer, and each
// cudaLaunchKernelEx costs the host microseconds; in graphs the host enqueues a one-row step in
// a fifth of the time (4-layer file, H100: 401 -> 70 us), stays far ahead of the device, and
// the device runs the step 2-4% faster. While a step records, launch_pdl() stores each
// launch (kernel, grid, block, shared memory, argument bytes) instead of issuing it; at a cut
// (the end of a layer, or before any stream operation that is not a kernel) the recorded
// kernels run as one graph. Graphs are kept per (rows of the step, segment of the step,
// kernel sequence); a kept graph whose nodes' arguments or grids changed since its last run
// gets those nodes updated (cudaGraphExecKernelNodeSetParams), which costs far less than a
// launch. Consecutive kernels are joined by programmatic edges, as the stream's programmatic
// serialisation joins them, so the kernels run exactly as launched on the stream would.
//
// A graph that cannot be built, updated or launched (out of device memory, a driver that
// refuses a node) does not fail the step: the recorded kernels are launched on the stream as
// they would have been without graphs, the kept graphs are freed, and this executor launches
// on the stream from then on (one line on stderr says so). A fault that poisons the context fails
// those launches too, and the step fails as before.
//
// Rules for code that touches the executor's stream: a stream operation other than a kernel
// launch, a synchronisation, or freeing device memory first calls settle() (or
// settle_thread()), so recorded kernels are issued before it.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

namespace ds4::cuda {

class StepGraphs;
namespace graph_detail {
// What this thread is recording. Shared with the recorder, which may be destroyed on another
// thread (or after a step that failed half way): then owner is null and nothing records.
struct Ctl {
    StepGraphs *owner = nullptr;
    cudaStream_t s = nullptr;
    bool on = false;
};
extern thread_local std::shared_ptr<Ctl> t_ctl;
}  // namespace graph_detail

class StepGraphs {
public:
    // The env DS4_CUDA_GRAPH sets the layers a segment spans: 0 = off (launch on the stream),
    // N = N layers; default 1.
    StepGraphs();
    ~StepGraphs();
    StepGraphs(const StepGraphs &) = delete;
    StepGraphs &operator=(const StepGraphs &) = delete;

    bool enabled() const { return per_cut_ > 0; }
    // Starts recording a step of `rows` rows on stream s (nothing happens when disabled).
    void begin(cudaStream_t s, int rows);
    // A layer ended: cut a segment every DS4_CUDA_GRAPH layers.
    void layer_done();
    // Issues what is recorded.
    void cut();
    // Issues what is recorded and stops recording until the next begin().
    void stop();

    // One launch, recorded. args[i] points at the i-th parameter (already of the kernel's
    // parameter type), size[i] its size.
    void add(const void *func, dim3 grid, dim3 block, size_t shm, bool pdl, const void *const *args, const size_t *size, int n);

    struct Stats {
        uint64_t replays = 0, built = 0, node_updates = 0, nodes = 0, fallbacks = 0;
    };
    const Stats &stats() const { return stats_; }

    // Tests: after k more graph builds in this process the next one fails as an out-of-memory
    // instantiation would (the fallback above is otherwise hard to reach on a healthy device);
    // k < 0 disarms.
    static void fail_build_after(int k);

private:
    struct Rec {
        const void *func;
        dim3 grid, block;
        unsigned shm;
        bool pdl;
        uint32_t a0, na;   // argument offsets offs_[a0, a0 + na)
        uint32_t b0, b1;   // argument bytes blob_[b0, b1)
    };
    struct Variant {
        std::vector<const void *> funcs;
        cudaGraph_t g = nullptr;
        cudaGraphExec_t x = nullptr;
        std::vector<cudaGraphNode_t> nodes;
        std::vector<Rec> recs;          // as last run (offsets into blob)
        std::vector<uint8_t> blob;
        std::vector<uint32_t> offs;
        uint64_t used = 0;
    };
    static constexpr size_t kVariants = 8;   // kept per segment; the least recently run goes
    cudaError_t replay();
    void launch_on_stream(cudaError_t why);
    cudaError_t build(Variant &v);
    void drop(Variant &v);
    static bool same_launch(const Rec &a, const uint8_t *ab, const Rec &b, const uint8_t *bb);

    int per_cut_ = 1;
    std::shared_ptr<graph_detail::Ctl> ctl_;
    cudaStream_t s_ = nullptr;
    int rows_ = 0, seg_ = 0, layers_ = 0;
    uint64_t clock_ = 0;
    std::vector<Rec> recs_;
    std::vector<uint8_t> blob_;
    std::vector<uint32_t> offs_;
    std::vector<void *> ptrs_;
    std::map<int, std::vector<std::vector<Variant>>> kept_;   // rows -> segment -> variants
    Stats stats_;
};

// The recorder recording stream s on this thread, if any.
inline StepGraphs *recording(cudaStream_t s) {
    const graph_detail::Ctl *c = graph_detail::t_ctl.get();
    return c && c->on && c->s == s ? c->owner : nullptr;
}
// Issues what this thread recorded on s (before a stream operation that is not a kernel).
inline void settle(cudaStream_t s) {
    if (StepGraphs *g = recording(s)) g->cut();
}
// Issues what this thread recorded on any stream (before device memory is freed).
inline void settle_thread() {
    const graph_detail::Ctl *c = graph_detail::t_ctl.get();
    if (c && c->on) c->owner->cut();
}

}  // namespace ds4::cuda
