// The daemon's only contact with the engine: bridge/ds4.hpp (RAII over the bridge C ABI)
// plus the summaries the daemon reports. Everything here runs on the worker thread.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "bridge/ds4.hpp"
#include "daemon/requests.h"

namespace ds4::daemon {

using BridgeFailure = ds4::bridge::BridgeError;

struct ModelSummary {
    std::string family, name, backend;
    uint32_t n_layer = 0, n_embd = 0, n_vocab = 0, n_ctx_max = 0, n_head = 0, n_expert = 0;
    bool chat_template = false;         // the GGUF has tokenizer.chat_template
    bool has_drafter = false;           // the drafter's identity (what a shared export announces)
    uint64_t drafter_fingerprint = 0;
    uint32_t drafter_n_vocab = 0;
    // The drafter's device weights (export_fd >= 0: exportable; owned by the bridge model).
    ds4_bridge_drafter_device_t drafter_device{0, -1, 0, 0, 0, 0, 0, {}, {}};
};

struct MemorySnapshot {
    uint64_t weights_bytes = 0, cache_bytes = 0, scratch_bytes = 0, device_free = 0, device_total = 0;
    uint64_t device_weights_bytes = 0;
    std::string device;
    // The drafter's weights (in weights_bytes) and the part referenced in place in its file
    // or memfd; weights mapped from another process's export; the rest (ds4_bridge_memory_ex_t).
    uint64_t drafter_bytes = 0, drafter_mapped_bytes = 0, shared_bytes = 0, private_bytes = 0;
};

struct ModelOpenConfig {
    std::string model_path;
    std::string drafter_path;   // empty: no speculative decoding
    int32_t draft_max = 0;      // 0: the bridge's default
    enum class Backend { Cpu, Cuda } backend = Backend::Cpu;
    int32_t threads = 0;
    // SSD expert streaming: routed experts read on demand into a bounded cache.
    bool ssd_streaming = false, ssd_cold = false;
    uint32_t expert_cache_experts = 0;
    uint64_t expert_cache_bytes = 0;
    std::string expert_store_dir;  // empty: no store, experts read from the GGUF
    // Called while the weights are prewarmed (bytes touched, total), e.g. to show progress.
    std::function<void(uint64_t done, uint64_t total)> on_prewarm;
};

class BridgeModel {
public:
    explicit BridgeModel(const ModelOpenConfig &cfg);  // opens and prewarms
    BridgeModel(const BridgeModel &) = delete;
    BridgeModel &operator=(const BridgeModel &) = delete;

    const ModelSummary &summary() const { return summary_; }
    int32_t vocab() const { return vocab_; }

    std::vector<int32_t> tokenize(std::string_view text, bool special);  // length-delimited: NULs are text
    std::vector<int32_t> render_chat(const std::vector<ChatTurn> &msgs, bool add_generation_prompt, bool thinking);
    std::string token_text(int32_t token);
    std::string detokenize(std::span<const int32_t> tokens);
    bool is_stop(int32_t token);
    bool is_special(int32_t token);   // control/markup, not text
    MemorySnapshot memory();
    // Cache bytes of a session of ctx once it has held n tokens (caches grow with use).
    uint64_t cache_bytes_for(uint32_t ctx, uint64_t n);
    // The same for the drafter session speculation adds to it (the model must have a drafter).
    uint64_t drafter_cache_bytes_for(uint32_t ctx, uint64_t n);

    ds4::bridge::Model &model() { return *m_; }
    uint64_t fingerprint() const { return m_->fingerprint(); }

private:
    std::unique_ptr<ds4::bridge::Model> m_;
    ModelSummary summary_;
    int32_t vocab_ = 0;
};

class BridgeSession {
public:
    BridgeSession(BridgeModel &model, int ctx);
    BridgeSession(const BridgeSession &) = delete;
    BridgeSession &operator=(const BridgeSession &) = delete;

    // After sync the session holds exactly `tokens` (the bridge reuses the common prefix).
    void sync(std::span<const int32_t> tokens);
    void eval(int32_t token);
    int32_t argmax();
    void logits_into(std::vector<float> &row, int vocab) const { s_.logits_into(row, vocab); }
    int32_t sample(float temperature, int top_k, float top_p, float min_p, uint64_t *rng);
    int pos();
    void rewind(int pos) { s_.rewind(pos); }
    int prefill_cap() const { return s_.prefill_cap(); }
    // Speculative decoding (daemon/speculation.cpp; ds4_bridge.h says the rules): the trials
    // run in batch steps (ds4_bridge_batch_eval_spec).
    void spec_commit(int n) { s_.spec_commit(n); }
    void spec_reset() { s_.spec_reset(); }
    ds4_bridge_session *handle() const { return s_.handle(); }
    // The whole state as a payload (docs/ARCHITECTURE.md §4), and its inverse.
    std::vector<uint8_t> save_payload();
    void load_payload(std::span<const uint8_t> bytes);
    // Bumped when the engine had to rebuild the state (its prefix could not be kept).
    uint64_t generation() const { return s_.generation(); }
    int ctx() const { return ctx_; }
    uint64_t cache_bytes() const;   // what its caches occupy now

private:
    ds4::bridge::Session s_;
    int ctx_ = 0;
};

}  // namespace ds4::daemon
