// A loaded DeepSeek-V4 model: the mapped GGUF, its config, bound weights, rope tables, the
// backend that runs it and the source of its routed experts. Immutable after open, so any
// number of sessions and executors on any threads can share it; the thread pool and
// scratch of a computation belong to an Executor (backend.h), one per worker thread.
#pragma once
#include <cstdint>
#include <functional>
#include <string_view>
#include <memory>
#include <string>

#include "engine/gguf/gguf.h"
#include "engine/backend/backend.h"
#include "engine/backend/streaming_experts.h"
#include "engine/model/config.h"
#include "engine/model/rope.h"
#include "engine/model/weights.h"

namespace ds4 {

// Auto: CUDA when this build has it and a usable GPU is present, else the CPU.
enum class BackendKind { Auto, Cpu, Cuda };
// "auto" | "cpu" | "cuda"; false for anything else.
bool parse_backend_kind(std::string_view name, BackendKind *out);

struct ModelOptions {
    int n_threads = 0;   // default for executors made by make_executor(): 0 = all cores
    BackendKind backend = BackendKind::Cpu;
    // Called while weights are copied to a device (bytes done, bytes total).
    std::function<void(uint64_t done, uint64_t total)> progress = nullptr;
    // Host-owned tables (the bridge's open options), used during open only: the tensor table
    // to use instead of parsing the files' own, and the name -> tensor index to bind by.
    const gguf::HostDirectory *directory = nullptr;
    const TensorPlan *plan = nullptr;
    // Routed experts read from SSD into a bounded cache instead of used from the mapping
    // (CPU backend only for now).
    ExpertStreamingOptions streaming = {};
    // Device weights exportable to, or imported from, another process (CUDA backend; ignored
    // on the CPU). Backend::device_share() says what was done.
    DeviceShareOptions device_share = {};
};

class Model {
public:
    static std::unique_ptr<Model> open(const std::string &path, const ModelOptions &opt = {});

    const ModelConfig &config() const { return cfg_; }
    const ModelWeights &weights() const { return w_; }
    const gguf::Reader &reader() const { return *reader_; }
    const Rope &rope(bool compressed) const { return compressed ? rope_compress_ : rope_main_; }
    const Backend &backend() const { return *backend_; }
    // Thread-safe (the source keeps its own locks/counters).
    ExpertSource &experts() const { return *experts_; }
    // An executor with the model's default thread count (n_threads < 0) or the given one.
    std::unique_ptr<Executor> make_executor(int n_threads = -1) const;
    // Identifies the exact model (shape + tensor inventory + sampled tensor bytes) so a
    // saved session is never restored into a different model.
    uint64_t fingerprint() const { return fingerprint_; }
    const std::string &path() const { return path_; }
    // Touches every weight page once so the first request does not pay for page faults;
    // with SSD streaming, every page but the routed experts', and then the expert source's
    // own prewarm (the persisted hot set). progress (optional) gets the bytes touched so far and
    // the total, about every 64 MiB and once at the end.
    void prewarm(const std::function<void(uint64_t done, uint64_t total)> &progress = {}) const;
    bool streams_experts() const { return streaming_; }

private:
    Model() = default;
    std::string path_;
    std::unique_ptr<gguf::Reader> reader_;
    ModelConfig cfg_;
    ModelWeights w_;
    Rope rope_main_, rope_compress_;
    std::unique_ptr<Backend> backend_;
    std::unique_ptr<ExpertSource> experts_;
    int default_threads_ = 0;
    bool streaming_ = false;
    uint64_t fingerprint_ = 0;
};

}  // namespace ds4
