// The C ABI over the engine. Every entry point catches everything: exceptions become an
// int status and a message in the caller's buffer, never an abort across the boundary.
#include "bridge/ds4_bridge.h"
#include "bridge/expert_store_link.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "bridge/drafter_import.h"
#include "bridge/durable_file.h"
#include "bridge/payload_header.h"
#include "engine/common/error.h"
#include "engine/gguf/gguf.h"
#include "engine/model/model.h"
#include "engine/model/session.h"
#include "engine/model/speculative.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"

struct ds4_bridge_model {
    std::unique_ptr<ds4::Model> model;
    std::unique_ptr<ds4::Model> drafter;   // sibling drafter: loaded privately, or imported
    bool drafter_shared = false;           // mapped from another process's export (drafter_import)
    // The pool and scratch that this model's sessions run on; the contract makes sessions of
    // one model thread-affine to one thread at a time, so they can share it. The drafter's
    // sessions run on their own executor (other shapes), on the same thread.
    std::unique_ptr<ds4::Executor> ex, drafter_ex;
    ds4::SpecOptions spec;
    ds4::SpecCounters spec_total;   // under mu
    ds4::tok::Tokenizer tok = ds4::tok::Tokenizer::byte_fallback(259);
    std::mutex mu;
    std::set<ds4_bridge_session *> sessions;
};

struct ds4_bridge_session {
    ds4_bridge_model *owner = nullptr;
    std::unique_ptr<ds4::Session> s;
    // Speculative decoding: the drafter's session and the decoder, made at the first trial.
    std::unique_ptr<ds4::Session> draft;
    std::unique_ptr<ds4::SpeculativeDecoder> spec;
    ds4::SpecCounters spec_reported;   // the part of spec->counters() already in the model's total
    bool in_callback = false;   // inside sync_cb's progress callback: mutation is re-entry
};

namespace {

void set_err(char *err, size_t errlen, const std::string &msg) {
    if (!err || errlen == 0) return;
    size_t n = std::min(msg.size(), errlen - 1);
    std::memcpy(err, msg.data(), n);
    err[n] = '\0';
}

// Runs fn, mapping exceptions to -1 + message.
template <class F>
int guarded(char *err, size_t errlen, F &&fn) {
    try {
        return fn();
    } catch (const std::bad_alloc &) {
        set_err(err, errlen, "out of memory");
    } catch (const std::exception &e) {
        set_err(err, errlen, e.what());
    } catch (...) {
        set_err(err, errlen, "unknown internal error");
    }
    return -1;
}

// A size-versioned struct (fields only appended) into the caller's copy of out_size bytes:
// the fields both know, zeros in any the library does not.
template <class T>
void copy_versioned(void *out, size_t out_size, const T &v) {
    const size_t n = std::min(out_size, sizeof v);
    std::memcpy(out, &v, n);
    if (out_size > n) std::memset(static_cast<char *>(out) + n, 0, out_size - n);
}

int bad(char *err, size_t errlen, const char *msg) {
    set_err(err, errlen, msg);
    return -1;
}

#define NEED(cond, msg)                           \
    do {                                          \
        if (!(cond)) return bad(err, errlen, msg); \
    } while (0)

#define NEED_MUTABLE(s)                                                                               \
    do {                                                                                              \
        if (!(s)) return bad(err, errlen, "session is NULL");                                        \
        if ((s)->in_callback) return bad(err, errlen, "session re-entered from its progress callback"); \
    } while (0)

// Token ids must mean the same text in both models: same count and the same bytes for every
// id (a model without an embedded tokenizer only matches another without one).
void check_drafter_vocab(const ds4::Model &target, const ds4::tok::Tokenizer &ttok, const ds4::Model &drafter) {
    const int vt = target.config().n_vocab, vd = drafter.config().n_vocab;
    if (vt != vd)
        throw ds4::Error("drafter " + drafter.path() + " does not fit the model: its vocabulary has " + std::to_string(vd) +
                         " tokens, the model's " + std::to_string(vt));
    const bool ht = target.reader().has("tokenizer.ggml.tokens"), hd = drafter.reader().has("tokenizer.ggml.tokens");
    if (ht != hd)
        throw ds4::Error("drafter " + drafter.path() + " does not fit the model: " +
                         (ht ? "the model embeds a tokenizer and the drafter none" : "the drafter embeds a tokenizer and the model none"));
    if (!ht) return;
    const ds4::tok::Tokenizer dtok = ds4::tok::Tokenizer::from_gguf(drafter.reader());
    if (dtok.vocab_size() != ttok.vocab_size())
        throw ds4::Error("drafter " + drafter.path() + " does not fit the model: its tokenizer has " +
                         std::to_string(dtok.vocab_size()) + " tokens, the model's " + std::to_string(ttok.vocab_size()));
    for (int32_t id = 0; id < ttok.vocab_size(); ++id) {
        if (dtok.token_bytes(id) == ttok.token_bytes(id)) continue;
        auto show = [](const std::string &b) {
            std::string o;
            for (unsigned char c : b.substr(0, 24)) {
                char hex[8];
                if (c >= 0x20 && c < 0x7f && c != '\\') o += (char)c;
                else std::snprintf(hex, sizeof hex, "\\x%02x", c), o += hex;
            }
            return o;
        };
        throw ds4::Error("drafter " + drafter.path() + " does not fit the model: different tokenizer (token " + std::to_string(id) +
                         " is \"" + show(dtok.token_bytes(id)) + "\" in the drafter, \"" + show(ttok.token_bytes(id)) + "\" in the model)");
    }
}

void fill_counters(ds4_bridge_spec_counters_t *out, const ds4::SpecCounters &c, int draft_max, int width) {
    std::memset(out, 0, sizeof *out);
    out->trials = c.trials;
    out->drafted = c.drafted;
    out->accepted = c.accepted;
    out->fallbacks = c.fallbacks;
    out->committed = c.committed;
    out->draft_max = draft_max;
    out->draft_width = width;
}

// Adds what the session's decoder counted since the last report to the model's totals.
void report_counters(ds4_bridge_session *s) {
    const ds4::SpecCounters &now = s->spec->counters();
    ds4::SpecCounters d;
    d.trials = now.trials - s->spec_reported.trials;
    d.drafted = now.drafted - s->spec_reported.drafted;
    d.accepted = now.accepted - s->spec_reported.accepted;
    d.fallbacks = now.fallbacks - s->spec_reported.fallbacks;
    d.committed = now.committed - s->spec_reported.committed;
    s->spec_reported = now;
    std::lock_guard<std::mutex> lk(s->owner->mu);
    s->owner->spec_total += d;
}

bool spec_pending(const ds4_bridge_session *s) { return s->spec && s->spec->in_trial(); }

void copy_str(char *dst, size_t cap, const std::string &s) {
    size_t n = std::min(s.size(), cap - 1);
    std::memcpy(dst, s.data(), n);
    dst[n] = '\0';
}

std::vector<uint8_t> encode_payload(ds4_bridge_session *s) {
    const ds4::ModelConfig &c = s->owner->model->config();
    std::vector<uint8_t> tail = s->s->save_tail();
    ds4::payload::Header h;
    h.ctx_size = (uint32_t)s->s->ctx();
    h.n_tokens = (uint32_t)s->s->pos();
    h.n_layer = (uint32_t)c.n_layer;
    h.n_embd = (uint32_t)c.n_embd;
    h.n_vocab = (uint32_t)c.n_vocab;
    h.head_dim = (uint32_t)c.head_dim;
    h.fingerprint = s->owner->model->fingerprint();
    h.tail_bytes = tail.size();
    std::vector<uint8_t> out;
    std::string e;
    if (!ds4::payload::encode_prefix(h, s->s->tokens().data(), s->s->tokens().size(), &out, &e))
        throw ds4::Error("payload: " + e);
    out.insert(out.end(), tail.begin(), tail.end());
    return out;
}

// Validates header, model identity and fit, then hands the tail to the engine (which
// validates it fully before mutating).
void decode_payload_into(ds4_bridge_session *s, const uint8_t *data, size_t len) {
    ds4::payload::Header h;
    std::vector<int32_t> toks;
    std::string e;
    if (!ds4::payload::decode_payload(data, len, &h, &toks, &e)) throw ds4::Error("payload rejected: " + e);
    const ds4::ModelConfig &c = s->owner->model->config();
    if (h.fingerprint != s->owner->model->fingerprint() || (int)h.n_layer != c.n_layer || (int)h.n_embd != c.n_embd ||
        (int)h.n_vocab != c.n_vocab || (int)h.head_dim != c.head_dim)
        throw ds4::Error("payload rejected: it was saved with a different model");
    if ((int64_t)h.n_tokens > s->s->ctx())
        throw ds4::Error("payload rejected: " + std::to_string(h.n_tokens) + " tokens do not fit the session context of " +
                         std::to_string(s->s->ctx()));
    const size_t pre = ds4::payload::prefix_bytes(h.n_tokens);
    s->s->load_tail(data + pre, len - pre, toks);
}

std::vector<uint8_t> read_range(const char *path, uint64_t offset, uint64_t length, bool whole) {
    int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw ds4::Error(std::string("cannot open payload ") + path + ": " + std::strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        ::close(fd);
        throw ds4::Error(std::string("cannot stat ") + path + ": " + std::strerror(e));
    }
    const uint64_t size = (uint64_t)st.st_size;
    if (whole) offset = 0, length = size;
    if (offset > size || length > size - offset) {
        ::close(fd);
        throw ds4::Error("payload range [" + std::to_string(offset) + ", +" + std::to_string(length) + ") is outside " + path +
                         " (" + std::to_string(size) + " bytes)");
    }
    std::vector<uint8_t> buf(length);
    uint64_t done = 0;
    while (done < length) {
        ssize_t r = ::pread(fd, buf.data() + done, length - done, (off_t)(offset + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = errno;
            ::close(fd);
            throw ds4::Error(std::string("reading ") + path + " failed: " + (r == 0 ? "unexpected end of file" : std::strerror(e)));
        }
        done += (uint64_t)r;
    }
    ::close(fd);
    return buf;
}

int tokens_out(const std::vector<int32_t> &ids, int32_t *out, int cap, int *n_out, char *err, size_t errlen) {
    if (n_out) *n_out = (int)ids.size();
    if (cap < 0) return bad(err, errlen, "negative buffer capacity");
    if ((size_t)cap < ids.size()) {
        set_err(err, errlen, "token buffer too small: need " + std::to_string(ids.size()));
        return -1;
    }
    if (!ids.empty()) {
        if (!out) return bad(err, errlen, "token buffer is NULL");
        std::memcpy(out, ids.data(), ids.size() * sizeof(int32_t));
    }
    return 0;
}

int bytes_out(const std::string &s, char *buf, size_t cap, size_t *len_out, char *err, size_t errlen) {
    if (len_out) *len_out = s.size();
    if (cap < s.size() + 1) {
        set_err(err, errlen, "text buffer too small: need " + std::to_string(s.size() + 1) + " bytes");
        return -1;
    }
    if (!buf) return bad(err, errlen, "text buffer is NULL");
    std::memcpy(buf, s.data(), s.size());
    buf[s.size()] = '\0';
    return 0;
}

// The host's tables as engine structures (names copied), with the checks that need no file.
ds4::gguf::HostDirectory to_host_directory(const ds4_bridge_tensor_directory &d) {
    if (d.n_tensors < 0) throw ds4::Error("tensor directory: n_tensors is negative");
    if (d.n_splits < 1) throw ds4::Error("tensor directory: n_splits must be at least 1");
    if (d.n_tensors > 0 && !d.tensors) throw ds4::Error("tensor directory: tensors is NULL");
    if (!d.split_data_offset) throw ds4::Error("tensor directory: split_data_offset is NULL");
    ds4::gguf::HostDirectory out;
    out.data_offset.assign(d.split_data_offset, d.split_data_offset + d.n_splits);
    out.tensors.reserve((size_t)d.n_tensors);
    std::set<std::string_view> names;
    for (int32_t i = 0; i < d.n_tensors; ++i) {
        const ds4_bridge_host_tensor &h = d.tensors[i];
        const std::string at = "tensor directory entry " + std::to_string(i);
        if (!h.name || !h.name[0]) throw ds4::Error(at + " has no name");
        if (h.n_dims < 1 || h.n_dims > 4) throw ds4::Error(at + " (" + h.name + ") has " + std::to_string(h.n_dims) + " dimensions");
        if (!ds4::gguf::type_known(h.type) || !ds4::gguf::type_supported((ds4::gguf::Type)h.type))
            throw ds4::Error(at + " (" + h.name + ") has unsupported type id " + std::to_string(h.type));
        if (h.split < 0 || h.split >= d.n_splits)
            throw ds4::Error(at + " (" + h.name + ") is in split " + std::to_string(h.split) + " of " + std::to_string(d.n_splits));
        if (!names.insert(h.name).second) throw ds4::Error(at + ": duplicate tensor name " + h.name);
        ds4::gguf::TensorInfo t;
        t.name = h.name;
        t.type = (ds4::gguf::Type)h.type;
        t.ne.assign(h.ne, h.ne + h.n_dims);
        t.split = h.split;
        t.offset = h.offset;
        t.nbytes = h.nbytes;
        int64_t nel = 1;
        for (int64_t e : t.ne) {
            if (e <= 0 || __builtin_mul_overflow(nel, e, &nel)) throw ds4::Error(at + " (" + h.name + ") has a bad dimension");
        }
        const int64_t be = ds4::gguf::type_block_elems(t.type);
        if (t.ne[0] % be != 0) throw ds4::Error(at + " (" + h.name + "): row length is not a multiple of the block size");
        uint64_t nb;
        if (__builtin_mul_overflow(ds4::gguf::row_bytes(t.type, t.ne[0]), (uint64_t)(nel / t.ne[0]), &nb) || nb != t.nbytes)
            throw ds4::Error(at + " (" + h.name + ") says " + std::to_string(t.nbytes) + " bytes, its type and shape make " +
                             std::to_string(nb));
        out.tensors.push_back(std::move(t));
    }
    return out;
}

ds4::TensorPlan to_plan(const ds4_bridge_bind_plan &p, size_t n_inventory) {
    if (p.n < 0) throw ds4::Error("bind plan: n is negative");
    if (p.n > 0 && (!p.names || !p.slots)) throw ds4::Error("bind plan: names or slots is NULL");
    ds4::TensorPlan out;
    out.reserve((size_t)p.n);
    for (int32_t i = 0; i < p.n; ++i) {
        if (!p.names[i]) throw ds4::Error("bind plan entry " + std::to_string(i) + " has a NULL name");
        if (p.slots[i] < 0 || (size_t)p.slots[i] >= n_inventory)
            throw ds4::Error("bind plan entry " + std::to_string(i) + " (" + p.names[i] + ") has slot " + std::to_string(p.slots[i]) +
                             ", the inventory holds " + std::to_string(n_inventory) + " tensors");
        if (!out.emplace(p.names[i], (size_t)p.slots[i]).second)
            throw ds4::Error(std::string("bind plan names tensor ") + p.names[i] + " twice");
    }
    return out;
}

}  // namespace

extern "C" {

void ds4_bridge_model_open_options_init(ds4_bridge_model_open_options *opt) {
    if (!opt) return;
    std::memset(opt, 0, sizeof *opt);
    opt->backend = DS4_BRIDGE_BACKEND_CPU;
}

int ds4_bridge_model_open(ds4_bridge_model **out, const ds4_bridge_model_open_options *opt, char *err, size_t errlen) {
    NEED(out, "out is NULL");
    *out = nullptr;
    NEED(opt, "options are NULL");
    NEED(opt->model_path && opt->model_path[0], "model_path is empty");
    NEED(opt->n_threads >= 0 && opt->n_threads <= 1024, "n_threads must be in 0..1024");
    NEED(opt->backend == DS4_BRIDGE_BACKEND_CPU || opt->backend == DS4_BRIDGE_BACKEND_CUDA ||
             opt->backend == DS4_BRIDGE_BACKEND_AUTO,
         "unknown backend (DS4_BRIDGE_BACKEND_AUTO, _CPU or _CUDA)");
    if (!opt->ssd_streaming && (opt->ssd_streaming_cold || opt->ssd_streaming_cache_experts ||
                                opt->ssd_streaming_cache_bytes || (opt->ssd_streaming_store_dir && opt->ssd_streaming_store_dir[0])))
        return bad(err, errlen, "ssd_streaming_cold, _cache_experts, _cache_bytes and _store_dir need ssd_streaming");
    NEED(!(opt->ssd_streaming_cache_experts && opt->ssd_streaming_cache_bytes),
         "give the expert cache budget in experts or in bytes, not both");
    if (opt->mtp_draft_tokens != 0)
        return bad(err, errlen, "mtp_draft_tokens: an MTP head is not implemented yet (speculative decoding takes drafter_path and draft_max)");
    const bool has_drafter = opt->drafter_path && opt->drafter_path[0], has_mtp = opt->mtp_path && opt->mtp_path[0];
    NEED(!(has_drafter && has_mtp), "set drafter_path or mtp_path (an older name for it), not both");
    NEED(opt->draft_max >= 0 && opt->draft_max <= 64, "draft_max must be in 0..64 (0 = 4)");
    const bool has_import = opt->drafter_import && opt->drafter_import[0];
    NEED(opt->draft_max == 0 || has_drafter || has_mtp || has_import, "draft_max is set but no drafter_path or drafter_import");
    return guarded(err, errlen, [&] {
        auto m = std::make_unique<ds4_bridge_model>();
        ds4::ModelOptions mo;
        mo.n_threads = opt->n_threads;
        mo.backend = opt->backend == DS4_BRIDGE_BACKEND_CUDA  ? ds4::BackendKind::Cuda
                     : opt->backend == DS4_BRIDGE_BACKEND_AUTO ? ds4::BackendKind::Auto
                                                               : ds4::BackendKind::Cpu;
        // The host's tables live only for this call: converted (names copied) here, dropped
        // when it returns; nothing the model keeps points into them.
        ds4::gguf::HostDirectory dir;
        ds4::TensorPlan plan;
        if (opt->tensor_directory) {
            dir = to_host_directory(*opt->tensor_directory);
            mo.directory = &dir;
        }
        if (opt->bind_plan) {
            // Slots index the directory when there is one; the file's own table is checked by
            // the binder (a slot past it fails there).
            plan = to_plan(*opt->bind_plan, opt->tensor_directory ? dir.tensors.size() : SIZE_MAX);
            mo.plan = &plan;
        }
        if (opt->ssd_streaming) {
            mo.streaming.enabled = true;
            mo.streaming.cold = opt->ssd_streaming_cold != 0;
            mo.streaming.cache_experts = opt->ssd_streaming_cache_experts;
            mo.streaming.cache_bytes = opt->ssd_streaming_cache_bytes;
            if (opt->ssd_streaming_store_dir && opt->ssd_streaming_store_dir[0]) {
                const std::string store_dir = opt->ssd_streaming_store_dir, model_path = opt->model_path;
                mo.streaming.open_store = [store_dir, model_path](uint64_t fp) {
                    return ds4::bridge_impl::open_expert_store_link(store_dir, fp, model_path);
                };
            }
        }
        m->model = ds4::Model::open(opt->model_path, mo);
        m->ex = m->model->make_executor();
        const ds4::gguf::Reader &r = m->model->reader();
        if (r.has("tokenizer.ggml.tokens")) {
            m->tok = ds4::tok::Tokenizer::from_gguf(r);
            if (m->tok.vocab_size() > m->model->config().n_vocab)
                throw ds4::Error("tokenizer has more tokens than the model's vocabulary");
        } else {
            m->tok = ds4::tok::Tokenizer::byte_fallback(m->model->config().n_vocab);
        }
        ds4::ModelOptions dmo = mo;
        dmo.backend = m->model->backend().name() == "cuda" ? ds4::BackendKind::Cuda : ds4::BackendKind::Cpu;
        // A drafter on a GPU is placed so that its device weights can be exported (ds4d hands
        // them to importers; ds4_bridge_drafter_device). One allocation instead of many.
        dmo.device_share = {};
        dmo.device_share.exportable = dmo.backend == ds4::BackendKind::Cuda;
        // The host's tables and expert streaming describe the model's file, not the drafter's.
        dmo.directory = nullptr;
        dmo.plan = nullptr;
        dmo.streaming = {};
        if (has_import) {
            // A refused or failed import is not an error of the open: the reason is logged and
            // left in err, and the open goes on with a private drafter (or none).
            std::string why;
            m->drafter = ds4::bridge_impl::import_drafter(opt->drafter_import, dmo, &why, [&](const ds4::Model &d) {
                check_drafter_vocab(*m->model, m->tok, d);
            });
            if (m->drafter) {
                m->drafter_shared = true;
            } else {
                why = std::string("drafter_import from ") + opt->drafter_import + ": " + why + "; " +
                      (has_drafter || has_mtp ? "loading the drafter privately" : "no drafter");
                std::fprintf(stderr, "ds4: %s\n", why.c_str());
                set_err(err, errlen, why);
            }
        }
        if (!m->drafter && (has_drafter || has_mtp)) {
            m->drafter = ds4::Model::open(has_drafter ? opt->drafter_path : opt->mtp_path, dmo);
            check_drafter_vocab(*m->model, m->tok, *m->drafter);
        }
        if (m->drafter) {
            m->drafter_ex = m->drafter->make_executor();
            m->spec.draft_max = opt->draft_max ? opt->draft_max : 4;
        }
        if (!opt->defer_boot_prewarm) {
            char why[512] = {0};
            if (ds4_bridge_model_boot_prewarm(m.get(), why, sizeof why) != 0) throw ds4::Error(std::string("boot prewarm: ") + why);
        }
        *out = m.release();
        return 0;
    });
}

int ds4_bridge_model_boot_prewarm(ds4_bridge_model *m, char *err, size_t errlen) {
    return ds4_bridge_model_boot_prewarm_cb(m, nullptr, nullptr, err, errlen);
}

int ds4_bridge_model_boot_prewarm_cb(ds4_bridge_model *m, ds4_bridge_load_fn progress, void *ud, char *err,
                                     size_t errlen) {
    NEED(m, "model is NULL");
    return guarded(err, errlen, [&] {
        if (progress) m->model->prewarm([&](uint64_t done, uint64_t total) { progress(ud, done, total); });
        else m->model->prewarm();
        // One dummy forward allocates the kernels' scratch and faults in code paths.
        ds4::Session s(*m->model, *m->ex, 4);
        const int32_t t = m->tok.bos() >= 0 && m->tok.bos() < m->model->config().n_vocab ? m->tok.bos() : 0;
        s.eval(t);
        if (m->drafter) {
            m->drafter->prewarm();
            ds4::Session d(*m->drafter, *m->drafter_ex, 4);
            d.eval(t);
        }
        return 0;
    });
}

void ds4_bridge_model_free(ds4_bridge_model *m) { delete m; }

int ds4_bridge_drafter_shared(ds4_bridge_model *m) { return m && m->drafter_shared ? 1 : 0; }

int ds4_bridge_drafter_device(ds4_bridge_model *m, ds4_bridge_drafter_device_t *out, size_t out_size, char *err,
                              size_t errlen) {
    NEED(m, "model is NULL");
    NEED(out, "out is NULL");
    NEED(out_size > 0, "out_size is 0");
    NEED(m->drafter, "the model has no drafter");
    return guarded(err, errlen, [&] {
        ds4_bridge_drafter_device_t d{};
        const ds4::DeviceShareState st = m->drafter->backend().device_share();
        d.on_device = m->drafter->backend().name() == "cpu" ? 0 : 1;
        d.export_fd = st.export_fd;
        d.imported = st.imported ? 1 : 0;
        d.read_only = st.read_only ? 1 : 0;
        d.bytes = st.layout.bytes;
        d.granularity = st.layout.granularity;
        d.layout_hash = st.layout.layout_hash;
        std::memcpy(d.uuid, st.layout.uuid, sizeof d.uuid);
        std::snprintf(d.why, sizeof d.why, "%s", st.why.c_str());
        copy_versioned(out, out_size, d);
        return 0;
    });
}

int32_t ds4_bridge_model_vocab_size(ds4_bridge_model *m) { return m ? m->model->config().n_vocab : -1; }

uint64_t ds4_bridge_model_fingerprint(ds4_bridge_model *m) { return m ? m->model->fingerprint() : 0; }

namespace {

void fill_info(const ds4::Model &model, ds4_bridge_model_info_t *out) {
    const ds4::ModelConfig &c = model.config();
    std::memset(out, 0, sizeof *out);
    copy_str(out->family, sizeof out->family, "deepseek4");
    std::string name = model.reader().get_string("general.name", "");
    if (name.empty()) {
        name = model.path();
        size_t slash = name.rfind('/');
        if (slash != std::string::npos) name = name.substr(slash + 1);
    }
    copy_str(out->name, sizeof out->name, name);
    out->n_layer = c.n_layer;
    out->n_embd = c.n_embd;
    out->n_vocab = c.n_vocab;
    out->n_head = c.n_head;
    out->head_dim = c.head_dim;
    out->n_expert = c.n_expert;
    out->n_expert_used = c.n_expert_used;
    out->n_ctx_max = c.n_ctx_train;
    out->fingerprint = model.fingerprint();
}

}  // namespace

int ds4_bridge_model_info(ds4_bridge_model *m, ds4_bridge_model_info_t *out, char *err, size_t errlen) {
    NEED(m, "model is NULL");
    NEED(out, "out is NULL");
    return guarded(err, errlen, [&] {
        fill_info(*m->model, out);
        return 0;
    });
}

int ds4_bridge_drafter_info(ds4_bridge_model *m, ds4_bridge_model_info_t *out, char *err, size_t errlen) {
    NEED(m, "model is NULL");
    NEED(out, "out is NULL");
    NEED(m->drafter, "the model has no drafter");
    return guarded(err, errlen, [&] {
        fill_info(*m->drafter, out);
        return 0;
    });
}

int ds4_bridge_memory_stats(ds4_bridge_model *m, ds4_bridge_memory_t *out, char *err, size_t errlen) {
    NEED(m, "model is NULL");
    NEED(out, "out is NULL");
    std::memset(out, 0, sizeof *out);
    const ds4::ModelWeights &w = m->model->weights();
    out->weights_bytes = w.mapped_bytes + w.owned_bytes;
    if (m->drafter) out->weights_bytes += m->drafter->weights().mapped_bytes + m->drafter->weights().owned_bytes;
    std::lock_guard<std::mutex> lk(m->mu);
    out->scratch_bytes = m->ex->scratch_bytes() + (m->drafter_ex ? m->drafter_ex->scratch_bytes() : 0);
    const ds4::DeviceInfo d = m->model->backend().device_info();
    std::snprintf(out->backend, sizeof out->backend, "%s", m->model->backend().name().c_str());
    std::snprintf(out->device, sizeof out->device, "%s", d.name.c_str());
    out->device_free = d.free;
    out->device_total = d.total;
    out->device_weights_bytes = d.weight_bytes;
    for (ds4_bridge_session *s : m->sessions) out->cache_bytes += s->s->memory_bytes() + (s->draft ? s->draft->memory_bytes() : 0);
    return 0;
}

int ds4_bridge_memory_stats_ex(ds4_bridge_model *m, ds4_bridge_memory_ex_t *out, size_t out_size, char *err,
                               size_t errlen) {
    NEED(m, "model is NULL");
    NEED(out, "out is NULL");
    NEED(out_size >= sizeof(ds4_bridge_memory_t), "out_size must be at least sizeof(ds4_bridge_memory_t)");
    ds4_bridge_memory_ex_t ex{};
    if (ds4_bridge_memory_stats(m, &ex.base, err, errlen) != 0) return -1;
    if (m->drafter) {
        const ds4::ModelWeights &w = m->drafter->weights();
        ex.drafter_weights_bytes = w.mapped_bytes + w.owned_bytes;
        ex.drafter_mapped_bytes = w.mapped_bytes;
        // Imported: the tensors are referenced in place in the exporter's memfd; the f32
        // copies made at open are this process's own.
        if (m->drafter_shared) ex.shared_bytes = w.mapped_bytes;
    }
    ex.private_bytes = ex.base.weights_bytes + ex.base.cache_bytes + ex.base.scratch_bytes - ex.shared_bytes;
    copy_versioned(out, out_size, ex);
    return 0;
}

int ds4_bridge_expert_stats(ds4_bridge_model *m, ds4_bridge_expert_stats_t *out, char *err, size_t errlen) {
    NEED(m, "model is NULL");
    NEED(out, "out is NULL");
    return guarded(err, errlen, [&] {
        std::memset(out, 0, sizeof *out);
        out->streaming = m->model->streams_experts() ? 1 : 0;
        const ds4::ExpertSourceStats s = m->model->experts().stats();
        out->acquired = s.acquired, out->misses = s.misses, out->late = s.late;
        out->prefetched = s.prefetched, out->prefetch_used = s.prefetch_used;
        out->bytes_read = s.bytes_read;
        out->store_reads = s.store_reads, out->store_corrupt = s.store_corrupt;
        out->demand_read_ns = s.demand_read_ns, out->prefetch_read_ns = s.prefetch_read_ns, out->wait_ns = s.wait_ns;
        out->io_busy_ns = s.io_busy_ns;
        out->resident = s.resident, out->capacity = s.capacity, out->capacity_bytes = s.capacity_bytes;
        return 0;
    });
}

int ds4_bridge_expert_stats_ex(ds4_bridge_model *m, ds4_bridge_expert_stats_ex_t *out, size_t out_size, char *err,
                               size_t errlen) {
    NEED(m, "model is NULL");
    NEED(out, "out is NULL");
    NEED(out_size >= sizeof(ds4_bridge_expert_stats_t), "out_size must be at least sizeof(ds4_bridge_expert_stats_t)");
    ds4_bridge_expert_stats_ex_t ex{};
    if (ds4_bridge_expert_stats(m, &ex.base, err, errlen) != 0) return -1;
    return guarded(err, errlen, [&] {
        const ds4::ExpertSourceStats s = m->model->experts().stats();
        ex.tiers = !ex.base.streaming ? 0 : s.host_capacity_bytes > 0 ? 2 : 1;
        ex.host_misses = s.host_misses, ex.host_bytes_read = s.host_bytes_read;
        ex.host_capacity_bytes = s.host_capacity_bytes;
        copy_versioned(out, out_size, ex);
        return 0;
    });
}

int ds4_bridge_session_create(ds4_bridge_session **out, ds4_bridge_model *m, int ctx_size, char *err, size_t errlen) {
    NEED(out, "out is NULL");
    *out = nullptr;
    NEED(m, "model is NULL");
    NEED(ctx_size > 0, "ctx_size must be positive");
    return guarded(err, errlen, [&] {
        auto s = std::make_unique<ds4_bridge_session>();
        s->owner = m;
        s->s = std::make_unique<ds4::Session>(*m->model, *m->ex, ctx_size);
        {
            std::lock_guard<std::mutex> lk(m->mu);
            m->sessions.insert(s.get());
        }
        *out = s.release();
        return 0;
    });
}

int ds4_bridge_session_cache_bytes(ds4_bridge_session *s, uint64_t *bytes_out, char *err, size_t errlen) {
    NEED(s, "session is NULL");
    NEED(bytes_out, "bytes_out is NULL");
    *bytes_out = s->s->memory_bytes() + (s->draft ? s->draft->memory_bytes() : 0);
    return 0;
}

int ds4_bridge_cache_bytes_for(ds4_bridge_model *m, int ctx_size, int n_tokens, uint64_t *bytes_out, char *err,
                               size_t errlen) {
    NEED(m, "model is NULL");
    NEED(bytes_out, "bytes_out is NULL");
    NEED(ctx_size > 0, "ctx_size must be positive");
    return guarded(err, errlen, [&] {
        *bytes_out = ds4::Session::cache_bytes_for(*m->model, ctx_size, n_tokens);
        return 0;
    });
}

int ds4_bridge_drafter_cache_bytes_for(ds4_bridge_model *m, int ctx_size, int n_tokens, uint64_t *bytes_out, char *err,
                                       size_t errlen) {
    NEED(m, "model is NULL");
    NEED(bytes_out, "bytes_out is NULL");
    NEED(ctx_size > 0, "ctx_size must be positive");
    NEED(m->drafter, "the model has no drafter");
    return guarded(err, errlen, [&] {
        *bytes_out = ds4::Session::cache_bytes_for(*m->drafter, ctx_size, n_tokens);
        return 0;
    });
}

void ds4_bridge_session_free(ds4_bridge_session *s) {
    if (!s) return;
    {
        std::lock_guard<std::mutex> lk(s->owner->mu);
        s->owner->sessions.erase(s);
    }
    delete s;
}

int ds4_bridge_session_sync_cb(ds4_bridge_session *s, const int32_t *tokens, int n_tokens, ds4_bridge_prefill_fn progress,
                               void *ud, char *err, size_t errlen) {
    NEED_MUTABLE(s);
    NEED(n_tokens > 0, "n_tokens must be positive");
    NEED(tokens, "tokens is NULL");
    return guarded(err, errlen, [&] {
        ds4::Session::Progress cb;
        if (progress)
            cb = [&](int done, int total) {
                s->in_callback = true;
                try {
                    progress(ud, done, total);
                } catch (...) {
                }
                s->in_callback = false;
            };
        s->s->sync(std::span<const int32_t>(tokens, (size_t)n_tokens), cb);
        return 0;
    });
}

int ds4_bridge_session_sync(ds4_bridge_session *s, const int32_t *tokens, int n_tokens, char *err, size_t errlen) {
    return ds4_bridge_session_sync_cb(s, tokens, n_tokens, nullptr, nullptr, err, errlen);
}

int ds4_bridge_eval(ds4_bridge_session *s, int32_t token, char *err, size_t errlen) {
    NEED_MUTABLE(s);
    return guarded(err, errlen, [&] {
        s->s->eval(token);
        return 0;
    });
}

int ds4_bridge_session_argmax(ds4_bridge_session *s, int32_t *token_out, char *err, size_t errlen) {
    NEED(s, "session is NULL");
    NEED(token_out, "token_out is NULL");
    NEED(s->s->has_logits(), "no logits: evaluate a token first");
    return guarded(err, errlen, [&] {
        *token_out = s->s->argmax();
        return 0;
    });
}

int ds4_bridge_session_sample(ds4_bridge_session *s, float temperature, int top_k, float top_p, float min_p,
                              uint64_t *rng, int32_t *token_out, char *err, size_t errlen) {
    NEED(s, "session is NULL");
    NEED(token_out, "token_out is NULL");
    NEED(s->s->has_logits(), "no logits: evaluate a token first");
    return guarded(err, errlen, [&] {
        *token_out = s->s->sample({temperature, top_k, top_p, min_p}, rng);
        return 0;
    });
}

int ds4_bridge_sample_logits(const float *logits, int n, float temperature, int top_k, float top_p, float min_p,
                             uint64_t *rng, int32_t *token_out, char *err, size_t errlen) {
    NEED(logits, "logits is NULL");
    NEED(n > 0, "n must be > 0");
    NEED(token_out, "token_out is NULL");
    return guarded(err, errlen, [&] {
        const std::vector<float> row(logits, logits + n);
        *token_out = ds4::sample(row, {temperature, top_k, top_p, min_p}, rng);
        return 0;
    });
}

int ds4_bridge_session_logits(ds4_bridge_session *s, float *out, int cap, char *err, size_t errlen) {
    NEED(s, "session is NULL");
    NEED(s->s->has_logits(), "no logits: evaluate a token first");
    const int V = s->owner->model->config().n_vocab;
    if (cap < V) {
        set_err(err, errlen, "logits buffer too small: need " + std::to_string(V));
        return -1;
    }
    NEED(out, "logits buffer is NULL");
    std::memcpy(out, s->s->logits().data(), sizeof(float) * V);
    return 0;
}

int ds4_bridge_session_top_logprobs(ds4_bridge_session *s, int n, int32_t *ids, float *logprobs, int *n_out, char *err,
                                    size_t errlen) {
    NEED(s, "session is NULL");
    NEED(n >= 0, "n must be >= 0");
    NEED(s->s->has_logits(), "no logits: evaluate a token first");
    NEED(n == 0 || (ids && logprobs), "output buffers are NULL");
    return guarded(err, errlen, [&] {
        auto top = s->s->top_logprobs(n);
        for (size_t i = 0; i < top.size(); ++i) ids[i] = top[i].first, logprobs[i] = top[i].second;
        if (n_out) *n_out = (int)top.size();
        return 0;
    });
}

// ---- batches ----

struct ds4_bridge_batch {
    ds4_bridge_model *model = nullptr;
    std::vector<ds4::BatchRow> rows;   // reused across steps
    ds4_bridge_batch_stats_t stats{};
};

int ds4_bridge_batch_create(ds4_bridge_batch **out, ds4_bridge_model *m, char *err, size_t errlen) {
    NEED(out, "out is NULL");
    *out = nullptr;
    NEED(m, "model is NULL");
    return guarded(err, errlen, [&] {
        auto b = std::make_unique<ds4_bridge_batch>();
        b->model = m;
        *out = b.release();
        return 0;
    });
}

void ds4_bridge_batch_free(ds4_bridge_batch *b) { delete b; }

int ds4_bridge_batch_eval(ds4_bridge_batch *b, ds4_bridge_session *const *sessions, const int32_t *counts,
                          int n_sessions, const int32_t *tokens, char *err, size_t errlen) {
    NEED(b, "batch is NULL");
    NEED(n_sessions > 0, "n_sessions must be positive");
    NEED(sessions && counts && tokens, "sessions, counts or tokens is NULL");
    // The engine checks rows again before it runs; these checks name the caller's mistake
    // in the caller's terms (session i, not row r).
    int64_t total = 0;
    for (int i = 0; i < n_sessions; ++i) {
        ds4_bridge_session *s = sessions[i];
        if (!s) return bad(err, errlen, ("sessions[" + std::to_string(i) + "] is NULL").c_str());
        if (s->owner != b->model)
            return bad(err, errlen, ("sessions[" + std::to_string(i) + "] belongs to another model").c_str());
        if (s->in_callback)
            return bad(err, errlen, ("sessions[" + std::to_string(i) + "] is inside its progress callback").c_str());
        for (int k = 0; k < i; ++k)
            if (sessions[k] == s)
                return bad(err, errlen, ("sessions[" + std::to_string(i) + "] appears twice").c_str());
        if (counts[i] < 1 || counts[i] > s->s->prefill_cap()) {
            set_err(err, errlen, "counts[" + std::to_string(i) + "] is " + std::to_string(counts[i]) + ", outside [1, " +
                                     std::to_string(s->s->prefill_cap()) + "] (the session's prefill cap)");
            return -1;
        }
        total += counts[i];
    }
    return guarded(err, errlen, [&] {
        b->rows.clear();
        b->rows.reserve(size_t(total));
        const int32_t *t = tokens;
        for (int i = 0; i < n_sessions; ++i) {
            ds4::Session *s = sessions[i]->s.get();
            for (int k = 0; k < counts[i]; ++k)
                b->rows.push_back(ds4::BatchRow{s, *t++, int64_t(s->pos()) + k, k + 1 == counts[i]});
        }
        std::vector<uint64_t> gens(static_cast<size_t>(n_sessions));
        for (int i = 0; i < n_sessions; ++i) gens[size_t(i)] = sessions[i]->s->generation();
        try {
            ds4::forward_batch(*b->model->ex, b->rows, nullptr);
        } catch (...) {
            // Rejected before running: nothing changed. Otherwise the engine invalidated them.
            for (int i = 0; i < n_sessions; ++i)
                if (sessions[i]->s->generation() != gens[size_t(i)]) {
                    ++b->stats.failed;
                    break;
                }
            throw;
        }
        ++b->stats.steps;
        b->stats.rows += uint64_t(total);
        b->stats.sessions += uint64_t(n_sessions);
        return 0;
    });
}

int ds4_bridge_batch_eval_spec(ds4_bridge_batch *b, ds4_bridge_session *const *sessions, const int32_t *counts,
                               int n_sessions, const int32_t *tokens, ds4_bridge_spec_row *spec, int n_spec, char *err,
                               size_t errlen) {
    NEED(b, "batch is NULL");
    NEED(n_sessions >= 0 && n_spec >= 0 && n_sessions + n_spec > 0, "n_sessions and n_spec must be >= 0, one of them positive");
    NEED(n_sessions == 0 || (sessions && counts && tokens), "sessions, counts or tokens is NULL");
    NEED(n_spec == 0 || spec, "spec is NULL");
    // Checked before anything runs (drafting included), in the caller's terms.
    std::vector<ds4_bridge_session *> all;
    for (int i = 0; i < n_sessions + n_spec; ++i) {
        const bool sp = i >= n_sessions;
        const int at = sp ? i - n_sessions : i;
        const std::string what = std::string(sp ? "spec[" : "sessions[") + std::to_string(at) + "]";
        ds4_bridge_session *s = sp ? spec[at].session : sessions[at];
        if (!s) return bad(err, errlen, (what + " has no session").c_str());
        if (s->owner != b->model) return bad(err, errlen, (what + " belongs to another model").c_str());
        if (s->in_callback) return bad(err, errlen, (what + " is inside its progress callback").c_str());
        if (spec_pending(s)) return bad(err, errlen, (what + ": a speculative trial is pending; commit it first").c_str());
        if (std::find(all.begin(), all.end(), s) != all.end()) return bad(err, errlen, (what + " appears twice").c_str());
        all.push_back(s);
        if (!sp) {
            if (counts[at] < 1 || counts[at] > s->s->prefill_cap())
                return bad(err, errlen, ("counts[" + std::to_string(at) + "] is " + std::to_string(counts[at]) + ", outside [1, " +
                                         std::to_string(s->s->prefill_cap()) + "] (the session's prefill cap)").c_str());
            continue;
        }
        const ds4_bridge_spec_row &r = spec[at];
        if (!r.tokens || !r.argmax) return bad(err, errlen, (what + ": token or argmax array is NULL").c_str());
        if (r.cap < 2) return bad(err, errlen, (what + ": cap must be >= 2 (pending plus at least one draft)").c_str());
        if (r.max_new < 1) return bad(err, errlen, (what + ": max_new must be >= 1").c_str());
        const int V = b->model->model->config().n_vocab;
        if (r.pending < 0 || r.pending >= V)
            return bad(err, errlen, (what + ": pending token " + std::to_string(r.pending) + " is out of range").c_str());
        if (r.temperature > 0.f && !r.rng) return bad(err, errlen, (what + ": rng is required when temperature > 0").c_str());
        if (r.temperature > 0.f) {
            try {
                ds4::check_sampling(ds4::SamplingParams{r.temperature, r.top_k, r.top_p, r.min_p});
            } catch (const std::exception &e) {
                return bad(err, errlen, (what + ": " + e.what()).c_str());
            }
        }
    }
    return guarded(err, errlen, [&] {
        // Drafts first (each session's drafter, its own rng), then one step for everything.
        for (int i = 0; i < n_spec; ++i) {
            ds4_bridge_spec_row &r = spec[i];
            ds4_bridge_session *s = r.session;
            r.width = 1;
            r.accepted = 0;
            r.tokens[0] = r.pending;
            if (!s->owner->drafter) continue;
            if (!s->spec) {
                s->draft = std::make_unique<ds4::Session>(*s->owner->drafter, *s->owner->drafter_ex, s->s->ctx());
                s->spec = std::make_unique<ds4::SpeculativeDecoder>(*s->s, *s->draft, s->owner->spec);
            }
            int w;
            try {
                w = s->spec->draft(r.pending, ds4::SamplingParams{r.temperature, r.top_k, r.top_p, r.min_p}, r.rng,
                                   std::min(r.max_new, r.cap));
            } catch (...) {
                report_counters(s);
                throw;
            }
            report_counters(s);
            if (w > 0) r.width = w;
        }
        b->rows.clear();
        const int32_t *t = tokens;
        for (int i = 0; i < n_sessions; ++i) {
            ds4::Session *s = sessions[i]->s.get();
            for (int k = 0; k < counts[i]; ++k)
                b->rows.push_back(ds4::BatchRow{s, *t++, int64_t(s->pos()) + k, k + 1 == counts[i]});
        }
        for (int i = 0; i < n_spec; ++i) {
            ds4::Session *s = spec[i].session->s.get();
            if (spec[i].width == 1) {
                b->rows.push_back(ds4::BatchRow{s, spec[i].pending, int64_t(s->pos()), true});
                continue;
            }
            const std::span<const int32_t> toks = spec[i].session->spec->tokens();
            for (size_t k = 0; k < toks.size(); ++k)
                b->rows.push_back(ds4::BatchRow{s, toks[k], int64_t(s->pos()) + int64_t(k), true, true});
        }
        std::vector<uint64_t> gens;
        for (ds4_bridge_session *s : all) gens.push_back(s->s->generation());
        try {
            ds4::forward_batch(*b->model->ex, b->rows, nullptr);
        } catch (...) {
            for (size_t i = 0; i < all.size(); ++i)
                if (all[i]->s->generation() != gens[i]) {
                    ++b->stats.failed;
                    break;
                }
            throw;
        }
        ++b->stats.steps;
        b->stats.rows += uint64_t(b->rows.size());
        b->stats.sessions += uint64_t(all.size());
        // Decide each trial from its rows (the session keeps them until commit).
        for (int i = 0; i < n_spec; ++i) {
            ds4_bridge_spec_row &r = spec[i];
            if (r.width < 2) continue;
            ds4_bridge_session *s = r.session;
            try {
                s->spec->verify(s->s->trial_logits(), ds4::SamplingParams{r.temperature, r.top_k, r.top_p, r.min_p}, r.rng);
            } catch (...) {
                report_counters(s);
                throw;
            }
            report_counters(s);
            std::memcpy(r.tokens, s->spec->tokens().data(), sizeof(int32_t) * size_t(r.width));
            std::memcpy(r.argmax, s->spec->next().data(), sizeof(int32_t) * size_t(r.width));
            r.accepted = s->spec->accepted();
        }
        return 0;
    });
}

int ds4_bridge_batch_stats(ds4_bridge_batch *b, ds4_bridge_batch_stats_t *out, char *err, size_t errlen) {
    NEED(b, "batch is NULL");
    NEED(out, "out is NULL");
    *out = b->stats;
    return 0;
}

int ds4_bridge_session_pos(ds4_bridge_session *s) { return s ? s->s->pos() : -1; }
int ds4_bridge_session_ctx(ds4_bridge_session *s) { return s ? s->s->ctx() : -1; }

int ds4_bridge_session_rewind(ds4_bridge_session *s, int pos, char *err, size_t errlen) {
    NEED_MUTABLE(s);
    if (pos < 0 || pos > s->s->pos()) {
        set_err(err, errlen, "rewind to " + std::to_string(pos) + ": position must be in 0.." + std::to_string(s->s->pos()) +
                                 " (the session holds " + std::to_string(s->s->pos()) + " tokens)");
        return -1;
    }
    // The engine only fails here while rebuilding, and then it has invalidated the session.
    return guarded(err, errlen, [&] {
        s->s->rewind(pos);
        return 0;
    });
}

int ds4_bridge_session_invalidate(ds4_bridge_session *s, char *err, size_t errlen) {
    NEED_MUTABLE(s);
    return guarded(err, errlen, [&] {
        s->s->invalidate();
        return 0;
    });
}

uint64_t ds4_bridge_session_generation(ds4_bridge_session *s) { return s ? s->s->generation() : 0; }
int ds4_bridge_session_prefill_cap(ds4_bridge_session *s) { return s ? s->s->prefill_cap() : -1; }

int ds4_bridge_spec_trial(ds4_bridge_session *s, int32_t pending, float temperature, int top_k, float top_p, float min_p,
                          uint64_t *rng, int max_new, int32_t *tokens, int32_t *argmax, int cap, int *accepted_out, char *err,
                          size_t errlen) {
    NEED_MUTABLE(s);
    NEED(tokens && argmax, "token or argmax array is NULL");
    NEED(cap >= 2, "cap must be >= 2 (pending plus at least one draft)");
    NEED(max_new >= 1, "max_new must be >= 1");
    const int V = s->owner->model->config().n_vocab;
    if (pending < 0 || pending >= V)
        return bad(err, errlen, ("pending token " + std::to_string(pending) + " is out of range (vocabulary has " + std::to_string(V) + " tokens)").c_str());
    NEED(!spec_pending(s), "a speculative trial is pending; commit it first");
    if (accepted_out) *accepted_out = 0;
    if (!s->owner->drafter) return 0;
    return guarded(err, errlen, [&] {
        const ds4::SamplingParams p{temperature, top_k, top_p, min_p};
        if (p.temperature > 0.f) {
            if (!rng) throw ds4::Error("rng state is required when temperature > 0");
            ds4::check_sampling(p);
        }
        if (!s->spec) {
            s->draft = std::make_unique<ds4::Session>(*s->owner->drafter, *s->owner->drafter_ex, s->s->ctx());
            s->spec = std::make_unique<ds4::SpeculativeDecoder>(*s->s, *s->draft, s->owner->spec);
        }
        int w;
        try {
            w = s->spec->trial(pending, p, rng, std::min(max_new, cap));
        } catch (...) {
            report_counters(s);
            throw;
        }
        report_counters(s);
        if (w == 0) return 0;
        std::memcpy(tokens, s->spec->tokens().data(), sizeof(int32_t) * w);
        std::memcpy(argmax, s->spec->next().data(), sizeof(int32_t) * w);
        if (accepted_out) *accepted_out = s->spec->accepted();
        return w;
    });
}

int ds4_bridge_spec_commit(ds4_bridge_session *s, int n, char *err, size_t errlen) {
    NEED_MUTABLE(s);
    NEED(spec_pending(s), "no speculative trial is pending");
    if (n < 0 || n > s->spec->accepted() + 1)
        return bad(err, errlen, ("commit of " + std::to_string(n) + " tokens: the trial can keep 0.." + std::to_string(s->spec->accepted() + 1) +
                                 " (pending and " + std::to_string(s->spec->accepted()) + " accepted drafts)").c_str());
    return guarded(err, errlen, [&] {
        s->spec->commit(n);
        report_counters(s);
        return 0;
    });
}

int ds4_bridge_session_spec_reset(ds4_bridge_session *s, char *err, size_t errlen) {
    NEED_MUTABLE(s);
    NEED(!spec_pending(s), "a speculative trial is pending; commit it first");
    if (s->spec) s->spec->reset_rate();
    return 0;
}

int ds4_bridge_spec_counters(ds4_bridge_model *m, ds4_bridge_spec_counters_t *out, char *err, size_t errlen) {
    NEED(m, "model is NULL");
    NEED(out, "out is NULL");
    std::lock_guard<std::mutex> lk(m->mu);
    fill_counters(out, m->spec_total, m->drafter ? m->spec.draft_max : 0, 0);
    return 0;
}

int ds4_bridge_session_spec_counters(ds4_bridge_session *s, ds4_bridge_spec_counters_t *out, char *err, size_t errlen) {
    NEED(s, "session is NULL");
    NEED(out, "out is NULL");
    const int dmax = s->owner->drafter ? s->owner->spec.draft_max : 0;
    if (!s->spec) fill_counters(out, {}, dmax, 0);
    else fill_counters(out, s->spec->counters(), dmax, s->spec->draft_width());
    return 0;
}

int ds4_bridge_session_payload_size(ds4_bridge_session *s, uint64_t *size_out, char *err, size_t errlen) {
    NEED(s, "session is NULL");
    NEED(!spec_pending(s), "a speculative trial is pending; commit it first");
    NEED(size_out, "size_out is NULL");
    *size_out = ds4::payload::prefix_bytes((uint64_t)s->s->pos()) + s->s->tail_bytes();
    return 0;
}

int ds4_bridge_session_save_payload_mem(ds4_bridge_session *s, uint8_t *buf, size_t cap, size_t *len_out, char *err,
                                        size_t errlen) {
    NEED(s, "session is NULL");
    NEED(!spec_pending(s), "a speculative trial is pending; commit it first");
    return guarded(err, errlen, [&] {
        std::vector<uint8_t> p = encode_payload(s);
        if (len_out) *len_out = p.size();
        if (cap < p.size()) {
            set_err(err, errlen, "payload buffer too small: need " + std::to_string(p.size()) + " bytes");
            return -1;
        }
        if (!buf) throw ds4::Error("payload buffer is NULL");
        std::memcpy(buf, p.data(), p.size());
        return 0;
    });
}

int ds4_bridge_session_save_payload(ds4_bridge_session *s, const char *path, char *err, size_t errlen) {
    NEED(s, "session is NULL");
    NEED(!spec_pending(s), "a speculative trial is pending; commit it first");
    NEED(path && path[0], "path is empty");
    return guarded(err, errlen, [&] {
        ds4::bridge_io::write_file_durable(path, encode_payload(s));
        return 0;
    });
}

int ds4_bridge_session_load_payload_mem(ds4_bridge_session *s, const uint8_t *data, size_t len, char *err, size_t errlen) {
    NEED_MUTABLE(s);
    NEED(!spec_pending(s), "a speculative trial is pending; commit it first");
    NEED(data || len == 0, "data is NULL");
    return guarded(err, errlen, [&] {
        decode_payload_into(s, data, len);
        return 0;
    });
}

int ds4_bridge_session_load_payload_range(ds4_bridge_session *s, const char *path, uint64_t offset, uint64_t length,
                                          char *err, size_t errlen) {
    NEED_MUTABLE(s);
    NEED(!spec_pending(s), "a speculative trial is pending; commit it first");
    NEED(path && path[0], "path is empty");
    return guarded(err, errlen, [&] {
        std::vector<uint8_t> buf = read_range(path, offset, length, false);
        decode_payload_into(s, buf.data(), buf.size());
        return 0;
    });
}

int ds4_bridge_session_load_payload(ds4_bridge_session *s, const char *path, char *err, size_t errlen) {
    NEED_MUTABLE(s);
    NEED(!spec_pending(s), "a speculative trial is pending; commit it first");
    NEED(path && path[0], "path is empty");
    return guarded(err, errlen, [&] {
        std::vector<uint8_t> buf = read_range(path, 0, 0, true);
        decode_payload_into(s, buf.data(), buf.size());
        return 0;
    });
}

int ds4_bridge_tokenize_text(ds4_bridge_model *m, const char *text, size_t text_len, int32_t *out, int cap, int *n_out,
                             char *err, size_t errlen) {
    NEED(m, "model is NULL");
    NEED(text || text_len == 0, "text is NULL");
    return guarded(err, errlen, [&] {
        return tokens_out(m->tok.encode(std::string_view(text, text_len)), out, cap, n_out, err, errlen);
    });
}

int ds4_bridge_tokenize_rendered_chat(ds4_bridge_model *m, const char *text, size_t text_len, int32_t *out, int cap,
                                      int *n_out, char *err, size_t errlen) {
    NEED(m, "model is NULL");
    NEED(text || text_len == 0, "text is NULL");
    return guarded(err, errlen, [&] {
        return tokens_out(m->tok.encode_special(std::string_view(text, text_len)), out, cap, n_out, err, errlen);
    });
}

int ds4_bridge_token_text(ds4_bridge_model *m, int32_t token, char *buf, size_t cap, size_t *len_out, char *err,
                          size_t errlen) {
    NEED(m, "model is NULL");
    NEED(token >= 0 && token < m->tok.vocab_size(), "token id out of range");
    return guarded(err, errlen, [&] { return bytes_out(m->tok.token_bytes(token), buf, cap, len_out, err, errlen); });
}

int ds4_bridge_detokenize(ds4_bridge_model *m, const int32_t *tokens, int n, char *buf, size_t cap, size_t *len_out,
                          char *err, size_t errlen) {
    NEED(m, "model is NULL");
    NEED(n >= 0, "n must be >= 0");
    NEED(tokens || n == 0, "tokens is NULL");
    return guarded(err, errlen, [&] {
        std::string s = m->tok.decode(std::span<const int32_t>(tokens, (size_t)n));
        return bytes_out(s, buf, cap, len_out, err, errlen);
    });
}

int ds4_bridge_render_chat(ds4_bridge_model *m, const ds4_bridge_chat_msg *msgs, int n_msgs, int add_generation_prompt,
                           int thinking, int32_t *out, int cap, int *n_out, char *err, size_t errlen) {
    NEED(m, "model is NULL");
    NEED(n_msgs >= 0, "n_msgs must be >= 0");
    NEED(msgs || n_msgs == 0, "msgs is NULL");
    return guarded(err, errlen, [&] {
        std::vector<ds4::tok::ChatMessage> conv;
        for (int i = 0; i < n_msgs; ++i) {
            const ds4_bridge_chat_msg &msg = msgs[i];
            if (!msg.role) throw ds4::Error("message " + std::to_string(i) + " has a NULL role");
            if (!msg.content && msg.content_len) throw ds4::Error("message " + std::to_string(i) + " has NULL content");
            conv.push_back({ds4::tok::chat_role_from_name(msg.role), std::string(msg.content ? msg.content : "", msg.content_len), ""});
        }
        if (!add_generation_prompt && !conv.empty() && conv.back().role == ds4::tok::ChatRole::User)
            throw ds4::Error("a conversation ending with a user turn always ends with the assistant prefix");
        ds4::tok::ChatOptions opt;
        opt.thinking = thinking != 0;
        return tokens_out(ds4::tok::render_chat_tokens(m->tok, conv, opt), out, cap, n_out, err, errlen);
    });
}

int32_t ds4_bridge_token_eos(ds4_bridge_model *m) { return m ? m->tok.eos() : -1; }

int ds4_bridge_token_is_stop(ds4_bridge_model *m, int32_t token) {
    if (!m) return -1;
    return m->tok.is_stop(token) ? 1 : 0;
}

int ds4_bridge_model_has_chat_template(ds4_bridge_model *m) {
    if (!m) return -1;
    return m->tok.vocab().chat_template.empty() ? 0 : 1;
}

int ds4_bridge_token_is_special(ds4_bridge_model *m, int32_t token) {
    if (!m || token < 0 || token >= m->tok.vocab_size()) return -1;
    const ds4::tok::TokenType t = m->tok.token_type(token);
    const bool plain = t == ds4::tok::TokenType::Normal || t == ds4::tok::TokenType::Byte ||
                       t == ds4::tok::TokenType::Undefined;
    return plain ? 0 : 1;
}

struct ds4_bridge_gguf {
    std::unique_ptr<ds4::gguf::Reader> r;
    std::string path;
};

int ds4_bridge_gguf_open(ds4_bridge_gguf **out, const char *path, char *err, size_t errlen) {
    NEED(out, "out is NULL");
    *out = nullptr;
    NEED(path && path[0], "path is empty");
    return guarded(err, errlen, [&] {
        auto g = std::make_unique<ds4_bridge_gguf>();
        g->r = ds4::gguf::Reader::open(path, false);
        g->path = path;
        *out = g.release();
        return 0;
    });
}

void ds4_bridge_gguf_free(ds4_bridge_gguf *g) { delete g; }

int ds4_bridge_gguf_info(ds4_bridge_gguf *g, ds4_bridge_gguf_info_t *out, char *err, size_t errlen) {
    NEED(g, "gguf handle is NULL");
    NEED(out, "out is NULL");
    return guarded(err, errlen, [&] {
        const ds4::gguf::Reader &r = *g->r;
        std::memset(out, 0, sizeof *out);
        const std::string arch = r.get_string("general.architecture", "");
        copy_str(out->family, sizeof out->family, arch);
        copy_str(out->name, sizeof out->name, r.get_string("general.name", ""));
        auto geti = [&](const std::string &k) { return (int32_t)r.get_int(arch + "." + k, 0); };
        out->n_layer = geti("block_count");
        out->n_embd = geti("embedding_length");
        out->n_vocab = geti("vocab_size");
        out->n_head = geti("attention.head_count");
        out->n_expert = geti("expert_count");
        out->n_tensors = (int32_t)r.tensors().size();
        out->split_count = r.split_count();
        out->tensor_bytes = r.total_tensor_bytes();
        return 0;
    });
}

int ds4_bridge_gguf_tensor(ds4_bridge_gguf *g, int index, ds4_bridge_gguf_tensor_t *out, char *err, size_t errlen) {
    NEED(g, "gguf handle is NULL");
    NEED(out, "out is NULL");
    NEED(index >= 0 && (size_t)index < g->r->tensors().size(), "tensor index out of range");
    const ds4::gguf::TensorInfo &t = g->r->tensors()[index];
    std::memset(out, 0, sizeof *out);
    copy_str(out->name, sizeof out->name, t.name);
    copy_str(out->type, sizeof out->type, ds4::gguf::type_name(t.type));
    out->n_dims = (int32_t)t.ne.size();
    for (size_t i = 0; i < t.ne.size() && i < 4; ++i) out->ne[i] = t.ne[i];
    out->split = t.split;
    out->offset = t.offset;
    out->nbytes = t.nbytes;
    return 0;
}

int ds4_bridge_gguf_required_tensors(ds4_bridge_gguf *g, char *buf, size_t cap, size_t *len_out, int32_t *n_out, char *err,
                                     size_t errlen) {
    NEED(g, "gguf handle is NULL");
    return guarded(err, errlen, [&] {
        const std::vector<std::string> names =
            ds4::ModelWeights::required_names(*g->r, ds4::ModelConfig::from_gguf(*g->r));
        std::string all;
        for (const std::string &n : names) all.append(n).push_back('\0');
        if (n_out) *n_out = (int32_t)names.size();
        if (len_out) *len_out = all.size();
        if (cap < all.size()) {
            set_err(err, errlen, "name buffer too small: need " + std::to_string(all.size()) + " bytes");
            return -1;
        }
        if (!all.empty()) {
            if (!buf) throw ds4::Error("name buffer is NULL");
            std::memcpy(buf, all.data(), all.size());
        }
        return 0;
    });
}

int ds4_bridge_bind_plan_check(ds4_bridge_gguf *g, const ds4_bridge_tensor_directory *inventory,
                               const ds4_bridge_bind_plan *plan, char *err, size_t errlen) {
    NEED(plan, "bind plan is NULL");
    NEED(inventory || g, "give an inventory, a gguf handle or both");
    return guarded(err, errlen, [&] {
        ds4::gguf::HostDirectory dir;
        if (inventory) dir = to_host_directory(*inventory);
        const ds4::TensorPlan p = to_plan(*plan, inventory ? dir.tensors.size() : g->r->tensors().size());
        if (g) {
            // The directory read against g's files (headers only), then the binder's dry run.
            std::unique_ptr<ds4::gguf::Reader> r;
            if (inventory) r = ds4::gguf::Reader::open(g->path, false, &dir);
            const ds4::gguf::Reader &use = r ? *r : *g->r;
            ds4::ModelWeights::required_names(use, ds4::ModelConfig::from_gguf(use), &p);
        }
        return 0;
    });
}

int ds4_bridge_bind_plan_match(const ds4_bridge_tensor_directory *inventory, const ds4_bridge_bind_plan *plan,
                               int32_t *identity_out, char *err, size_t errlen) {
    NEED(inventory, "inventory is NULL");
    NEED(plan, "bind plan is NULL");
    NEED(plan->n >= 0, "bind plan: n is negative");
    NEED(plan->n == 0 || (plan->names && plan->slots && identity_out), "bind plan arrays or identity_out are NULL");
    NEED(inventory->n_tensors >= 0 && (inventory->n_tensors == 0 || inventory->tensors), "inventory tensors are NULL");
    return guarded(err, errlen, [&] {
        for (int32_t i = 0; i < plan->n; ++i) {
            const int32_t slot = plan->slots[i];
            if (slot < 0 || slot >= inventory->n_tensors) {
                identity_out[i] = -1;
                continue;
            }
            const char *have = inventory->tensors[slot].name;
            identity_out[i] = have && plan->names[i] && std::strcmp(have, plan->names[i]) == 0 ? 1 : 0;
        }
        return 0;
    });
}

}  // extern "C"
