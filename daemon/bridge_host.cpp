#include "daemon/bridge_host.h"

#include <cstring>

namespace ds4::daemon {
namespace {

std::string fixed_str(const char *p, size_t cap) { return std::string(p, strnlen(p, cap)); }

}  // namespace

BridgeModel::BridgeModel(const ModelOpenConfig &cfg) {
    ds4::bridge::ModelOptions o;
    o.model_path = cfg.model_path;
    o.drafter_path = cfg.drafter_path;
    o.draft_max = cfg.draft_max;
    o.backend = cfg.backend == ModelOpenConfig::Backend::Cuda ? DS4_BRIDGE_BACKEND_CUDA : DS4_BRIDGE_BACKEND_CPU;
    o.n_threads = cfg.threads;
    o.ssd_streaming = cfg.ssd_streaming;
    o.ssd_streaming_cold = cfg.ssd_cold;
    o.ssd_streaming_cache_experts = cfg.expert_cache_experts;
    o.ssd_streaming_cache_bytes = cfg.expert_cache_bytes;
    o.ssd_streaming_store_dir = cfg.expert_store_dir;
    // The open touches the weights and runs one dummy forward; with a progress callback that
    // happens right after it, reporting as it goes.
    o.defer_boot_prewarm = bool(cfg.on_prewarm);
    m_ = std::make_unique<ds4::bridge::Model>(o);
    if (cfg.on_prewarm) m_->boot_prewarm(cfg.on_prewarm);
    const ds4_bridge_model_info_t info = m_->info();
    summary_.family = fixed_str(info.family, sizeof info.family);
    summary_.name = fixed_str(info.name, sizeof info.name);
    summary_.backend = cfg.backend == ModelOpenConfig::Backend::Cuda ? "cuda" : "cpu";
    summary_.n_layer = uint32_t(info.n_layer);
    summary_.n_embd = uint32_t(info.n_embd);
    summary_.n_vocab = uint32_t(info.n_vocab);
    summary_.n_ctx_max = uint32_t(info.n_ctx_max);
    summary_.n_head = uint32_t(info.n_head);
    summary_.n_expert = uint32_t(info.n_expert);
    summary_.chat_template = m_->has_chat_template();
    if (!cfg.drafter_path.empty()) {
        const ds4_bridge_model_info_t d = m_->drafter_info();
        summary_.has_drafter = true;
        summary_.drafter_fingerprint = d.fingerprint;
        summary_.drafter_n_vocab = uint32_t(d.n_vocab);
        summary_.drafter_device = m_->drafter_device();
    }
    vocab_ = m_->vocab_size();
}

std::vector<int32_t> BridgeModel::tokenize(std::string_view text, bool special) { return m_->tokenize(text, special); }

std::vector<int32_t> BridgeModel::render_chat(const std::vector<ChatTurn> &msgs, bool add_generation_prompt,
                                              bool thinking) {
    // The DeepSeek-V4 template always ends a final user turn with the assistant prefix
    // (ds4.hpp renders with it); refusing the other combination keeps the flag honest.
    if (!add_generation_prompt && !msgs.empty() && msgs.back().role == "user")
        throw BridgeFailure("render chat: a conversation ending with a user turn always ends with the assistant prefix");
    std::vector<std::pair<std::string, std::string>> m;
    m.reserve(msgs.size());
    for (const auto &t : msgs) m.emplace_back(t.role, t.content);
    return m_->render_chat(m, thinking);
}

std::string BridgeModel::token_text(int32_t token) { return m_->token_text(token); }

std::string BridgeModel::detokenize(std::span<const int32_t> tokens) { return m_->detokenize(tokens); }

bool BridgeModel::is_stop(int32_t token) { return m_->is_stop(token); }
bool BridgeModel::is_special(int32_t token) { return m_->is_special(token); }

MemorySnapshot BridgeModel::memory() {
    const ds4_bridge_memory_ex_t ex = m_->memory_ex();
    const ds4_bridge_memory_t &mem = ex.base;
    MemorySnapshot out;
    out.drafter_bytes = ex.drafter_weights_bytes;
    out.drafter_mapped_bytes = ex.drafter_mapped_bytes;
    out.shared_bytes = ex.shared_bytes;
    out.private_bytes = ex.private_bytes;
    out.weights_bytes = mem.weights_bytes;
    out.cache_bytes = mem.cache_bytes;
    out.scratch_bytes = mem.scratch_bytes;
    out.device_free = mem.device_free;
    out.device_total = mem.device_total;
    out.device_weights_bytes = mem.device_weights_bytes;
    out.device = fixed_str(mem.device, sizeof mem.device);
    return out;
}

uint64_t BridgeModel::cache_bytes_for(uint32_t ctx, uint64_t n) {
    char err[256] = {0};
    uint64_t b = 0;
    if (ds4_bridge_cache_bytes_for(m_->handle(), int(ctx), int(std::min<uint64_t>(n, ctx)), &b, err, sizeof err) != 0)
        throw BridgeFailure(std::string("cache size: ") + err);
    return b;
}

uint64_t BridgeModel::drafter_cache_bytes_for(uint32_t ctx, uint64_t n) {
    char err[256] = {0};
    uint64_t b = 0;
    if (ds4_bridge_drafter_cache_bytes_for(m_->handle(), int(ctx), int(std::min<uint64_t>(n, ctx)), &b, err, sizeof err) !=
        0)
        throw BridgeFailure(std::string("drafter cache size: ") + err);
    return b;
}

uint64_t BridgeSession::cache_bytes() const {
    uint64_t b = 0;
    char err[64];
    return ds4_bridge_session_cache_bytes(s_.handle(), &b, err, sizeof err) == 0 ? b : 0;
}

BridgeSession::BridgeSession(BridgeModel &model, int ctx) : s_(model.model(), ctx), ctx_(ctx) {}

void BridgeSession::sync(std::span<const int32_t> tokens) { s_.sync(tokens); }

void BridgeSession::eval(int32_t token) { s_.eval(token); }

int32_t BridgeSession::argmax() { return s_.argmax(); }

int32_t BridgeSession::sample(float temperature, int top_k, float top_p, float min_p, uint64_t *rng) {
    return s_.sample(temperature, top_k, top_p, min_p, rng);
}

int BridgeSession::pos() { return s_.pos(); }

std::vector<uint8_t> BridgeSession::save_payload() { return s_.save_payload(); }

void BridgeSession::load_payload(std::span<const uint8_t> bytes) { s_.load_payload(bytes); }

}  // namespace ds4::daemon
