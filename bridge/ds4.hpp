// C++ RAII layer over ds4_bridge.h: the only way the daemon and other hosts use the
// engine. Errors become ds4::bridge::BridgeError; each handle's destructor is the only
// caller of its *_free. Header-only over the C ABI, so it never sees engine types.
//
// The namespace is ds4::bridge, not ds4: libds4 holds the engine's own ds4::Model and
// ds4::Session, and wrappers of the same names would be a second definition of those
// classes (their inline members and the engine's would share symbols).
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bridge/ds4_bridge.h"

namespace ds4::bridge {

struct BridgeError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

namespace detail {
struct Err {
    char buf[1024] = {0};
    [[noreturn]] void raise(const char *what) const {
        throw BridgeError(std::string(what) + ": " + (buf[0] ? buf : "unknown error"));
    }
};
}  // namespace detail

struct ModelOptions {
    std::string model_path;
    std::string mtp_path;
    int backend = DS4_BRIDGE_BACKEND_CPU;
    int n_threads = 0;
    bool defer_boot_prewarm = false;
    std::string drafter_path;   // speculative decoding: sibling drafter with the same tokenizer
    int draft_max = 0;          // 0 = the bridge's default
    // SSD expert streaming (ds4_bridge_model_open_options' ssd_streaming_* fields).
    bool ssd_streaming = false, ssd_streaming_cold = false;
    uint32_t ssd_streaming_cache_experts = 0;
    uint64_t ssd_streaming_cache_bytes = 0;
    std::string ssd_streaming_store_dir;
    std::string drafter_import;  // socket of a ds4d sharing its drafter (falls back to drafter_path)
};

// One speculative trial (ds4_bridge_spec_trial): width 0 = fall back to ordinary decoding.
struct SpecTrial {
    int width = 0;
    int accepted = 0;
    std::vector<int32_t> tokens, argmax;   // width entries each
};

class Model {
public:
    explicit Model(const ModelOptions &o) {
        ds4_bridge_model_open_options opt;
        ds4_bridge_model_open_options_init(&opt);
        opt.model_path = o.model_path.c_str();
        opt.mtp_path = o.mtp_path.empty() ? nullptr : o.mtp_path.c_str();
        opt.backend = o.backend;
        opt.n_threads = o.n_threads;
        opt.defer_boot_prewarm = o.defer_boot_prewarm;
        opt.drafter_path = o.drafter_path.empty() ? nullptr : o.drafter_path.c_str();
        opt.draft_max = o.draft_max;
        opt.ssd_streaming = o.ssd_streaming;
        opt.ssd_streaming_cold = o.ssd_streaming_cold;
        opt.ssd_streaming_cache_experts = o.ssd_streaming_cache_experts;
        opt.ssd_streaming_cache_bytes = o.ssd_streaming_cache_bytes;
        opt.ssd_streaming_store_dir = o.ssd_streaming_store_dir.empty() ? nullptr : o.ssd_streaming_store_dir.c_str();
        opt.drafter_import = o.drafter_import.empty() ? nullptr : o.drafter_import.c_str();
        detail::Err e;
        if (ds4_bridge_model_open(&m_, &opt, e.buf, sizeof e.buf) != 0) e.raise("open model");
        note_ = e.buf;  // why a drafter_import fell back (empty otherwise)
    }
    ~Model() { ds4_bridge_model_free(m_); }
    Model(const Model &) = delete;
    Model &operator=(const Model &) = delete;
    Model(Model &&o) noexcept : m_(std::exchange(o.m_, nullptr)), note_(std::move(o.note_)) {}

    ds4_bridge_model *handle() const { return m_; }
    void boot_prewarm() {
        detail::Err e;
        if (ds4_bridge_model_boot_prewarm(m_, e.buf, sizeof e.buf) != 0) e.raise("boot prewarm");
    }
    // progress(done, total) in weight bytes, on this thread (ds4_bridge_model_boot_prewarm_cb).
    void boot_prewarm(const std::function<void(uint64_t, uint64_t)> &progress) {
        detail::Err e;
        auto tramp = [](void *ud, uint64_t done, uint64_t total) {
            (*static_cast<const std::function<void(uint64_t, uint64_t)> *>(ud))(done, total);
        };
        if (ds4_bridge_model_boot_prewarm_cb(m_, tramp, const_cast<std::function<void(uint64_t, uint64_t)> *>(&progress),
                                             e.buf, sizeof e.buf) != 0)
            e.raise("boot prewarm");
    }
    int vocab_size() const { return ds4_bridge_model_vocab_size(m_); }
    bool drafter_shared() const { return ds4_bridge_drafter_shared(m_) == 1; }
    // Why drafter_import was not used ("" when it was, or was not asked for).
    const std::string &drafter_import_note() const { return note_; }
    ds4_bridge_model_info_t drafter_info() const {
        ds4_bridge_model_info_t i;
        detail::Err e;
        if (ds4_bridge_drafter_info(m_, &i, e.buf, sizeof e.buf) != 0) e.raise("drafter info");
        return i;
    }
    // The drafter's device weights: exported, imported, or why not (ds4_bridge_drafter_device).
    ds4_bridge_drafter_device_t drafter_device() const {
        ds4_bridge_drafter_device_t d{};
        detail::Err e;
        if (ds4_bridge_drafter_device(m_, &d, sizeof d, e.buf, sizeof e.buf) != 0) e.raise("drafter device");
        return d;
    }
    ds4_bridge_spec_counters_t spec_counters() const {
        ds4_bridge_spec_counters_t c{};
        detail::Err e;
        if (ds4_bridge_spec_counters(m_, &c, e.buf, sizeof e.buf) != 0) e.raise("speculative counters");
        return c;
    }
    uint64_t fingerprint() const { return ds4_bridge_model_fingerprint(m_); }
    ds4_bridge_model_info_t info() const {
        ds4_bridge_model_info_t i;
        detail::Err e;
        if (ds4_bridge_model_info(m_, &i, e.buf, sizeof e.buf) != 0) e.raise("model info");
        return i;
    }
    ds4_bridge_memory_t memory() const {
        ds4_bridge_memory_t mem{};
        detail::Err e;
        if (ds4_bridge_memory_stats(m_, &mem, e.buf, sizeof e.buf) != 0) e.raise("memory stats");
        return mem;
    }
    ds4_bridge_memory_ex_t memory_ex() const {
        ds4_bridge_memory_ex_t mem{};
        detail::Err e;
        if (ds4_bridge_memory_stats_ex(m_, &mem, sizeof mem, e.buf, sizeof e.buf) != 0) e.raise("memory stats");
        return mem;
    }
    ds4_bridge_expert_stats_t expert_stats() const {
        ds4_bridge_expert_stats_t st{};
        detail::Err e;
        if (ds4_bridge_expert_stats(m_, &st, e.buf, sizeof e.buf) != 0) e.raise("expert stats");
        return st;
    }
    ds4_bridge_expert_stats_ex_t expert_stats_ex() const {
        ds4_bridge_expert_stats_ex_t st{};
        detail::Err e;
        if (ds4_bridge_expert_stats_ex(m_, &st, sizeof st, e.buf, sizeof e.buf) != 0) e.raise("expert stats");
        return st;
    }
    // Text is length-delimited: NUL bytes are tokenized like any other byte.
    std::vector<int32_t> tokenize(std::string_view text, bool rendered_chat = false) const {
        std::vector<int32_t> out(text.size() + 16);
        for (;;) {
            int n = 0;
            detail::Err e;
            int rc = rendered_chat ? ds4_bridge_tokenize_rendered_chat(m_, text.data(), text.size(), out.data(), (int)out.size(), &n, e.buf, sizeof e.buf)
                                   : ds4_bridge_tokenize_text(m_, text.data(), text.size(), out.data(), (int)out.size(), &n, e.buf, sizeof e.buf);
            if (rc == 0) {
                out.resize(n);
                return out;
            }
            if (n <= (int)out.size()) e.raise("tokenize");
            out.resize(n);
        }
    }
    std::vector<int32_t> render_chat(const std::vector<std::pair<std::string, std::string>> &msgs, bool thinking = false) const {
        std::vector<ds4_bridge_chat_msg> m;
        size_t bytes = 16;
        for (const auto &[role, content] : msgs) {
            m.push_back({role.c_str(), content.data(), content.size()});
            bytes += content.size() + 16;
        }
        std::vector<int32_t> out(bytes);
        for (;;) {
            int n = 0;
            detail::Err e;
            if (ds4_bridge_render_chat(m_, m.data(), (int)m.size(), 1, thinking, out.data(), (int)out.size(), &n, e.buf, sizeof e.buf) == 0) {
                out.resize(n);
                return out;
            }
            if (n <= (int)out.size()) e.raise("render chat");
            out.resize(n);
        }
    }
    std::string detokenize(std::span<const int32_t> toks) const {
        std::string s(toks.size() * 8 + 16, '\0');
        for (;;) {
            size_t len = 0;
            detail::Err e;
            if (ds4_bridge_detokenize(m_, toks.data(), (int)toks.size(), s.data(), s.size(), &len, e.buf, sizeof e.buf) == 0) {
                s.resize(len);
                return s;
            }
            if (len + 1 <= s.size()) e.raise("detokenize");
            s.resize(len + 1);
        }
    }
    std::string token_text(int32_t t) const { return detokenize(std::span<const int32_t>(&t, 1)); }
    int32_t eos() const { return ds4_bridge_token_eos(m_); }
    bool is_stop(int32_t t) const { return ds4_bridge_token_is_stop(m_, t) == 1; }
    bool is_special(int32_t t) const { return ds4_bridge_token_is_special(m_, t) == 1; }
    bool has_chat_template() const { return ds4_bridge_model_has_chat_template(m_) == 1; }

private:
    ds4_bridge_model *m_ = nullptr;
    std::string note_;
};

// Borrows its model: the Model must outlive the Session.
class Session {
public:
    Session(Model &m, int ctx) {
        detail::Err e;
        if (ds4_bridge_session_create(&s_, m.handle(), ctx, e.buf, sizeof e.buf) != 0) e.raise("create session");
    }
    ~Session() { ds4_bridge_session_free(s_); }
    Session(const Session &) = delete;
    Session &operator=(const Session &) = delete;
    Session(Session &&o) noexcept : s_(std::exchange(o.s_, nullptr)) {}

    ds4_bridge_session *handle() const { return s_; }
    void sync(std::span<const int32_t> toks, ds4_bridge_prefill_fn cb = nullptr, void *ud = nullptr) {
        detail::Err e;
        if (ds4_bridge_session_sync_cb(s_, toks.data(), (int)toks.size(), cb, ud, e.buf, sizeof e.buf) != 0) e.raise("sync");
    }
    void eval(int32_t t) {
        detail::Err e;
        if (ds4_bridge_eval(s_, t, e.buf, sizeof e.buf) != 0) e.raise("eval");
    }
    int32_t argmax() const {
        int32_t t = -1;
        detail::Err e;
        if (ds4_bridge_session_argmax(s_, &t, e.buf, sizeof e.buf) != 0) e.raise("argmax");
        return t;
    }
    int32_t sample(float temperature, int top_k, float top_p, float min_p, uint64_t *rng) const {
        int32_t t = -1;
        detail::Err e;
        if (ds4_bridge_session_sample(s_, temperature, top_k, top_p, min_p, rng, &t, e.buf, sizeof e.buf) != 0) e.raise("sample");
        return t;
    }
    std::vector<float> logits(int vocab) const {
        std::vector<float> out(vocab);
        detail::Err e;
        if (ds4_bridge_session_logits(s_, out.data(), vocab, e.buf, sizeof e.buf) != 0) e.raise("logits");
        return out;
    }
    // Into a caller's buffer (resized to vocab), so a loop can reuse it.
    void logits_into(std::vector<float> &out, int vocab) const {
        out.resize(size_t(vocab));
        detail::Err e;
        if (ds4_bridge_session_logits(s_, out.data(), vocab, e.buf, sizeof e.buf) != 0) e.raise("logits");
    }
    int pos() const { return ds4_bridge_session_pos(s_); }
    int ctx() const { return ds4_bridge_session_ctx(s_); }
    void rewind(int p) {
        detail::Err e;
        if (ds4_bridge_session_rewind(s_, p, e.buf, sizeof e.buf) != 0) e.raise("rewind");
    }
    void invalidate() {
        detail::Err e;
        if (ds4_bridge_session_invalidate(s_, e.buf, sizeof e.buf) != 0) e.raise("invalidate");
    }
    uint64_t generation() const { return ds4_bridge_session_generation(s_); }
    // Drafts and verifies after `pending` (see ds4_bridge.h); cap bounds the width.
    SpecTrial spec_trial(int32_t pending, float temperature, int top_k, float top_p, float min_p, uint64_t *rng, int max_new,
                         int cap = 65) {
        SpecTrial t;
        t.tokens.resize(cap > 0 ? cap : 0);
        t.argmax.resize(t.tokens.size());
        detail::Err e;
        t.width = ds4_bridge_spec_trial(s_, pending, temperature, top_k, top_p, min_p, rng, max_new, t.tokens.data(), t.argmax.data(),
                                        cap, &t.accepted, e.buf, sizeof e.buf);
        if (t.width < 0) e.raise("speculative trial");
        t.tokens.resize(t.width);
        t.argmax.resize(t.width);
        return t;
    }
    void spec_commit(int n) {
        detail::Err e;
        if (ds4_bridge_spec_commit(s_, n, e.buf, sizeof e.buf) != 0) e.raise("speculative commit");
    }
    void spec_reset() {
        detail::Err e;
        if (ds4_bridge_session_spec_reset(s_, e.buf, sizeof e.buf) != 0) e.raise("speculative reset");
    }
    ds4_bridge_spec_counters_t spec_counters() const {
        ds4_bridge_spec_counters_t c{};
        detail::Err e;
        if (ds4_bridge_session_spec_counters(s_, &c, e.buf, sizeof e.buf) != 0) e.raise("speculative counters");
        return c;
    }
    int prefill_cap() const { return ds4_bridge_session_prefill_cap(s_); }
    std::vector<uint8_t> save_payload() const {
        uint64_t n = 0;
        detail::Err e;
        if (ds4_bridge_session_payload_size(s_, &n, e.buf, sizeof e.buf) != 0) e.raise("payload size");
        std::vector<uint8_t> buf(n);
        size_t len = 0;
        if (ds4_bridge_session_save_payload_mem(s_, buf.data(), buf.size(), &len, e.buf, sizeof e.buf) != 0) e.raise("save payload");
        buf.resize(len);
        return buf;
    }
    void save_payload(const std::string &path) const {
        detail::Err e;
        if (ds4_bridge_session_save_payload(s_, path.c_str(), e.buf, sizeof e.buf) != 0) e.raise("save payload");
    }
    void load_payload(std::span<const uint8_t> bytes) {
        detail::Err e;
        if (ds4_bridge_session_load_payload_mem(s_, bytes.data(), bytes.size(), e.buf, sizeof e.buf) != 0) e.raise("load payload");
    }
    void load_payload(const std::string &path, uint64_t offset = 0, uint64_t length = 0) {
        detail::Err e;
        int rc = length ? ds4_bridge_session_load_payload_range(s_, path.c_str(), offset, length, e.buf, sizeof e.buf)
                        : ds4_bridge_session_load_payload(s_, path.c_str(), e.buf, sizeof e.buf);
        if (rc != 0) e.raise("load payload");
    }

private:
    ds4_bridge_session *s_ = nullptr;
};

// One forward step over several sessions (ds4_bridge_batch_eval); borrows the model.
class Batch {
public:
    explicit Batch(Model &m) {
        detail::Err e;
        if (ds4_bridge_batch_create(&b_, m.handle(), e.buf, sizeof e.buf) != 0) e.raise("create batch");
    }
    ~Batch() { ds4_bridge_batch_free(b_); }
    Batch(const Batch &) = delete;
    Batch &operator=(const Batch &) = delete;

    // sessions[i] appends counts[i] tokens, taken in order from `tokens`.
    void eval(std::span<ds4_bridge_session *const> sessions, std::span<const int32_t> counts,
              std::span<const int32_t> tokens) {
        size_t total = 0;
        for (int32_t c : counts) total += size_t(c > 0 ? c : 0);
        if (sessions.size() != counts.size() || total != tokens.size())
            throw BridgeError("batch eval: sessions, counts and tokens disagree in size");
        detail::Err e;
        if (ds4_bridge_batch_eval(b_, sessions.data(), counts.data(), int(sessions.size()), tokens.data(), e.buf,
                                  sizeof e.buf) != 0)
            e.raise("batch eval");
    }
    // eval() plus a speculative row per spec entry (ds4_bridge_batch_eval_spec); each entry's
    // tokens/argmax point at caller-owned arrays of cap entries; width/accepted are filled.
    void eval_spec(std::span<ds4_bridge_session *const> sessions, std::span<const int32_t> counts,
                   std::span<const int32_t> tokens, std::span<ds4_bridge_spec_row> spec) {
        size_t total = 0;
        for (int32_t c : counts) total += size_t(c > 0 ? c : 0);
        if (sessions.size() != counts.size() || total != tokens.size())
            throw BridgeError("batch eval: sessions, counts and tokens disagree in size");
        detail::Err e;
        if (ds4_bridge_batch_eval_spec(b_, sessions.data(), counts.data(), int(sessions.size()), tokens.data(), spec.data(),
                                       int(spec.size()), e.buf, sizeof e.buf) != 0)
            e.raise("batch eval");
    }
    ds4_bridge_batch_stats_t stats() const {
        ds4_bridge_batch_stats_t s{};
        detail::Err e;
        if (ds4_bridge_batch_stats(b_, &s, e.buf, sizeof e.buf) != 0) e.raise("batch stats");
        return s;
    }

private:
    ds4_bridge_batch *b_ = nullptr;
};

// The session sampler over a caller's row (ds4_bridge_sample_logits).
inline int32_t sample_logits(std::span<const float> row, float temperature, int top_k, float top_p, float min_p,
                             uint64_t *rng) {
    int32_t t = -1;
    detail::Err e;
    if (ds4_bridge_sample_logits(row.data(), int(row.size()), temperature, top_k, top_p, min_p, rng, &t, e.buf,
                                 sizeof e.buf) != 0)
        e.raise("sample_logits");
    return t;
}

}  // namespace ds4::bridge
