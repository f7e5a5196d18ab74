#include "engine/cpu/cpu_backend.h"

#include "engine/cpu/cpu_executor.h"
#include "engine/cpu/cpu_state.h"

namespace ds4 {

namespace {

class CpuBackend final : public Backend {
public:
    explicit CpuBackend(const ModelConfig &c) : c_(c) {}
    std::string name() const override { return "cpu"; }
    int prefill_chunk() const override { return 256; }
    // A prompt step of 1024 rows: each routed expert's weights are read once for four times
    // the tokens (a trained router spreads a 256-row step ~6 rows an expert, where the
    // products are bound by reading the weights), while the attention runs in 256-row
    // pieces, so no session's rings grow.
    int prefill_step_rows() const override { return 1024; }
    bool attention_in_pieces() const override { return true; }
    DeviceInfo device_info() const override { return DeviceInfo{"cpu", 0, 0, 0}; }
    std::unique_ptr<SessionState> make_state(const CacheGeometry &g) const override {
        return std::make_unique<CpuSessionState>(g);
    }
    std::unique_ptr<Executor> make_executor(int n_threads) const override {
        return std::make_unique<CpuExecutor>(c_, n_threads);
    }

private:
    const ModelConfig &c_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const ModelConfig &c) { return std::make_unique<CpuBackend>(c); }

}  // namespace ds4
