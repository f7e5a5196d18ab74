// C ABI over ds4::client::Client: exceptions become DS4C_ERR_* codes plus a message.
#include "client/ds4client.h"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "client/ds4client.hpp"
#include "ipc/protocol.h"

namespace fbx = ds4::ipc::fb;
static_assert(DS4C_SERVER_BAD_FRAME == int(fbx::ErrorCode::BadFrame));
static_assert(DS4C_SERVER_UNKNOWN_SESSION == int(fbx::ErrorCode::UnknownSession));
static_assert(DS4C_SERVER_CONTEXT_OVERFLOW == int(fbx::ErrorCode::ContextOverflow));
static_assert(DS4C_SERVER_BUSY == int(fbx::ErrorCode::Busy));
static_assert(DS4C_SERVER_NO_STORE == int(fbx::ErrorCode::NoStore) && fbx::ErrorCode::NoStore == fbx::ErrorCode::MAX);
static_assert(DS4C_FINISH_CANCELLED == int(fbx::FinishReason::Cancelled) && fbx::FinishReason::Cancelled == fbx::FinishReason::MAX);
static_assert(DS4C_FINISH_STOP_STRING == int(fbx::FinishReason::StopString));

struct ds4c_session_list {
    std::vector<ds4::client::StoredSession> v;
};

struct ds4c_client {
    std::unique_ptr<ds4::client::Client> client;
    std::string path;
    int server_code = 0;
};

namespace {

using namespace ds4::client;

void set_err(char *err, size_t errlen, const char *msg) {
    if (!err || errlen == 0) return;
    std::snprintf(err, errlen, "%s", msg);
}

void copy_str(char *dst, size_t cap, const std::string &s) { std::snprintf(dst, cap, "%s", s.c_str()); }

// Runs f, mapping every exception to a status code.
template <class F> int guarded(ds4c_client *c, char *err, size_t errlen, F &&f) {
    try {
        f();
        return DS4C_OK;
    } catch (const ServerError &e) {
        if (c) c->server_code = e.code;
        set_err(err, errlen, e.what());
        return DS4C_ERR_SERVER;
    } catch (const ConnectError &e) {
        set_err(err, errlen, e.what());
        return DS4C_ERR_CONNECT;
    } catch (const ProtocolError &e) {
        set_err(err, errlen, e.what());
        return DS4C_ERR_PROTOCOL;
    } catch (const std::bad_alloc &) {
        set_err(err, errlen, "out of memory");
        return DS4C_ERR_PROTOCOL;
    } catch (const std::exception &e) {
        set_err(err, errlen, e.what());
        return DS4C_ERR_PROTOCOL;
    } catch (...) {
        set_err(err, errlen, "unknown error");
        return DS4C_ERR_PROTOCOL;
    }
}

bool check_client(ds4c_client *c, char *err, size_t errlen) {
    if (c && c->client) return true;
    set_err(err, errlen, c ? "ds4c_client is not connected (call ds4c_reconnect)" : "ds4c_client is NULL");
    return false;
}

}  // namespace

extern "C" {

int ds4c_connect(ds4c_client **out, const char *socket_path, char *err, size_t errlen) {
    if (!out) {
        set_err(err, errlen, "ds4c_connect: out is NULL");
        return DS4C_ERR_ARG;
    }
    *out = nullptr;
    ds4c_client *c = new (std::nothrow) ds4c_client;
    if (!c) {
        set_err(err, errlen, "out of memory");
        return DS4C_ERR_PROTOCOL;
    }
    int rc = guarded(c, err, errlen, [&] {
        c->path = socket_path ? socket_path : "";
        c->client = std::make_unique<Client>(c->path, "libds4client-c");
    });
    if (rc != DS4C_OK) {
        delete c;
        return rc;
    }
    *out = c;
    return DS4C_OK;
}

int ds4c_reconnect(ds4c_client *c, char *err, size_t errlen) {
    if (!c) {
        set_err(err, errlen, "ds4c_client is NULL");
        return DS4C_ERR_ARG;
    }
    return guarded(c, err, errlen, [&] {
        if (c->client)
            c->client->reconnect();
        else
            c->client = std::make_unique<Client>(c->path, "libds4client-c");
    });
}

void ds4c_free(ds4c_client *c) { delete c; }

int ds4c_server_error_code(const ds4c_client *c) { return c ? c->server_code : 0; }

int ds4c_get_model_info(ds4c_client *c, ds4c_model_info *out, char *err, size_t errlen) {
    if (!check_client(c, err, errlen)) return DS4C_ERR_ARG;
    if (!out) {
        set_err(err, errlen, "ds4c_get_model_info: out is NULL");
        return DS4C_ERR_ARG;
    }
    const ServerInfo &s = c->client->server_info();
    std::memset(out, 0, sizeof *out);
    out->protocol_version = s.protocol_version;
    copy_str(out->family, sizeof out->family, s.model.family);
    copy_str(out->name, sizeof out->name, s.model.name);
    copy_str(out->backend, sizeof out->backend, s.model.backend);
    out->n_layer = s.model.n_layer;
    out->n_embd = s.model.n_embd;
    out->n_vocab = s.model.n_vocab;
    out->n_ctx_max = s.model.n_ctx_max;
    out->n_head = s.model.n_head;
    out->n_expert = s.model.n_expert;
    out->default_ctx = s.default_ctx;
    return DS4C_OK;
}

int ds4c_open_session(ds4c_client *c, const char *name, uint32_t ctx, uint64_t *session_out, uint32_t *n_tokens_out,
                      char *err, size_t errlen) {
    if (!check_client(c, err, errlen)) return DS4C_ERR_ARG;
    if (!session_out) {
        set_err(err, errlen, "ds4c_open_session: session_out is NULL");
        return DS4C_ERR_ARG;
    }
    return guarded(c, err, errlen, [&] {
        SessionInfo s = c->client->open_session(name ? name : "", ctx);
        *session_out = s.id;
        if (n_tokens_out) *n_tokens_out = s.n_tokens;
    });
}

int ds4c_close_session(ds4c_client *c, uint64_t session, char *err, size_t errlen) {
    if (!check_client(c, err, errlen)) return DS4C_ERR_ARG;
    return guarded(c, err, errlen, [&] { c->client->close_session(session); });
}

void ds4c_generate_options_init(ds4c_generate_options *opt) {
    if (!opt) return;
    std::memset(opt, 0, sizeof *opt);
    opt->top_p = 1.0f;
    opt->max_tokens = 256;
}

void ds4c_sampling_controls_init(ds4c_sampling_controls *x, size_t size) {
    if (!x || size < sizeof(size_t)) return;
    ds4c_sampling_controls d;
    std::memset(&d, 0, sizeof d);
    d.size = std::min(size, sizeof d);
    d.repeat_penalty = 1.0f;
    d.repeat_last_n = 64;
    std::memcpy(x, &d, d.size);
}

namespace {

// The controls a caller of any struct size gave: fields past its size keep their defaults.
bool read_controls(const ds4c_sampling_controls *in, GenerateRequest &req, char *err, size_t errlen) {
    if (!in) return true;
    if (in->size < sizeof(size_t) || in->size > 4096) {
        set_err(err, errlen, "ds4c_generate_ex: controls->size is not set (use ds4c_sampling_controls_init)");
        return false;
    }
    ds4c_sampling_controls x;
    ds4c_sampling_controls_init(&x, sizeof x);
    std::memcpy(&x, in, std::min(in->size, sizeof x));
    if (x.n_logit_bias && (!x.logit_bias_tokens || !x.logit_bias_values)) {
        set_err(err, errlen, "ds4c_generate_ex: n_logit_bias is set but its arrays are NULL");
        return false;
    }
    req.repeat_penalty = x.repeat_penalty;
    req.repeat_last_n = x.repeat_last_n;
    req.frequency_penalty = x.frequency_penalty;
    req.presence_penalty = x.presence_penalty;
    for (size_t i = 0; i < x.n_logit_bias; ++i) req.logit_bias.emplace_back(x.logit_bias_tokens[i], x.logit_bias_values[i]);
    req.logprobs = x.logprobs != 0;
    req.top_logprobs = x.top_logprobs;
    req.json_object = x.json_object != 0;
    return true;
}

}  // namespace

int ds4c_generate(ds4c_client *c, const ds4c_generate_options *opt, ds4c_chunk_fn on_chunk, void *ud,
                  ds4c_done *done_out, char *err, size_t errlen) {
    struct Plain {
        ds4c_chunk_fn fn;
        void *ud;
    } plain{on_chunk, ud};
    ds4c_chunk_ex_fn ex = nullptr;
    if (on_chunk)
        ex = [](void *p, const int32_t *t, size_t n, const char *text, size_t len, const ds4c_token_logprob *) {
            const Plain *pl = static_cast<const Plain *>(p);
            return pl->fn(pl->ud, t, n, text, len);
        };
    return ds4c_generate_ex(c, opt, nullptr, ex, &plain, done_out, err, errlen);
}

int ds4c_generate_ex(ds4c_client *c, const ds4c_generate_options *opt, const ds4c_sampling_controls *controls,
                     ds4c_chunk_ex_fn on_chunk, void *ud, ds4c_done *done_out, char *err, size_t errlen) {
    if (!check_client(c, err, errlen)) return DS4C_ERR_ARG;
    if (!opt) {
        set_err(err, errlen, "ds4c_generate: options are NULL");
        return DS4C_ERR_ARG;
    }
    const int forms = (opt->text != nullptr) + (opt->n_tokens > 0) + (opt->n_chat > 0);
    if (forms != 1) {
        set_err(err, errlen, "ds4c_generate: give exactly one of text, tokens, chat messages");
        return DS4C_ERR_ARG;
    }
    if ((opt->text_len && !opt->text) || (opt->n_tokens && !opt->tokens) ||
        (opt->n_chat && (!opt->chat_roles || !opt->chat_contents || !opt->chat_content_lens)) ||
        (opt->n_stop_strings && !opt->stop_strings) || (opt->n_stop_tokens && !opt->stop_tokens)) {
        set_err(err, errlen, "ds4c_generate: a count is set but its array is NULL");
        return DS4C_ERR_ARG;
    }
    for (size_t i = 0; i < opt->n_chat; ++i)
        if (!opt->chat_roles[i] || (!opt->chat_contents[i] && opt->chat_content_lens[i])) {
            set_err(err, errlen, "ds4c_generate: NULL chat role or content");
            return DS4C_ERR_ARG;
        }
    for (size_t i = 0; i < opt->n_stop_strings; ++i)
        if (!opt->stop_strings[i]) {
            set_err(err, errlen, "ds4c_generate: NULL stop string");
            return DS4C_ERR_ARG;
        }
    GenerateRequest req;
    if (!read_controls(controls, req, err, errlen)) return DS4C_ERR_ARG;
    return guarded(c, err, errlen, [&] {
        req.session = opt->session;
        if (opt->text) {
            req.kind = GenerateRequest::Prompt::Text;
            req.text.assign(opt->text, opt->text_len);
        } else if (opt->n_tokens) {
            req.kind = GenerateRequest::Prompt::Tokens;
            req.tokens.assign(opt->tokens, opt->tokens + opt->n_tokens);
        } else {
            req.kind = GenerateRequest::Prompt::Chat;
            for (size_t i = 0; i < opt->n_chat; ++i) {
                const size_t len = opt->chat_content_lens[i];
                req.messages.push_back({opt->chat_roles[i], len ? std::string(opt->chat_contents[i], len) : std::string()});
            }
        }
        req.temperature = opt->temperature;
        req.top_k = opt->top_k;
        req.top_p = opt->top_p;
        req.min_p = opt->min_p;
        req.seed = opt->seed;
        req.max_tokens = opt->max_tokens;
        for (size_t i = 0; i < opt->n_stop_strings; ++i) req.stop_strings.emplace_back(opt->stop_strings[i]);
        req.stop_tokens.assign(opt->stop_tokens, opt->stop_tokens + opt->n_stop_tokens);
        req.ignore_eos = opt->ignore_eos != 0;
        req.thinking = opt->thinking != 0;
        GenerateCallbacks cb;
        if (opt->request_id_out)
            cb.on_start = [&](uint64_t id) { __atomic_store_n(opt->request_id_out, id, __ATOMIC_RELEASE); };
        std::vector<ds4c_token_logprob> lps;
        std::vector<int32_t> top_ids;
        std::vector<float> top_lps;
        if (on_chunk)
            cb.on_chunk = [&](const Chunk &ch) {
                const ds4c_token_logprob *lp = nullptr;
                if (!ch.logprobs.empty()) {
                    lps.clear();
                    top_ids.clear();
                    top_lps.clear();
                    for (const TokenLogprob &l : ch.logprobs)
                        for (const auto &[t, v] : l.top) top_ids.push_back(t), top_lps.push_back(v);
                    size_t at = 0;
                    for (const TokenLogprob &l : ch.logprobs) {
                        lps.push_back({l.logprob, top_ids.data() + at, top_lps.data() + at, l.top.size()});
                        at += l.top.size();
                    }
                    lp = lps.data();
                }
                return on_chunk(ud, ch.tokens.data(), ch.tokens.size(), ch.text.data(), ch.text.size(), lp) == 0;
            };
        DoneInfo d = c->client->generate(req, cb);
        if (done_out) {
            done_out->request_id = d.request_id;
            done_out->reason = int32_t(d.reason);
            done_out->prompt_tokens = d.prompt_tokens;
            done_out->cached_tokens = d.cached_tokens;
            done_out->generated_tokens = d.generated_tokens;
            done_out->prefill_us = d.prefill_us;
            done_out->decode_us = d.decode_us;
            done_out->stop_token = d.stop_token;
        }
    });
}

int ds4c_cancel(ds4c_client *c, uint64_t request_id, char *err, size_t errlen) {
    if (!check_client(c, err, errlen)) return DS4C_ERR_ARG;
    return guarded(c, err, errlen, [&] { c->client->cancel(request_id); });
}

int ds4c_tokenize(ds4c_client *c, const char *text, size_t text_len, int32_t *out, size_t cap, size_t *n_out,
                  char *err, size_t errlen) {
    if (!check_client(c, err, errlen)) return DS4C_ERR_ARG;
    if ((!text && text_len) || !n_out || (cap && !out)) {
        set_err(err, errlen, "ds4c_tokenize: NULL text, output or count");
        return DS4C_ERR_ARG;
    }
    std::vector<int32_t> toks;
    int rc = guarded(c, err, errlen, [&] { toks = c->client->tokenize(text_len ? std::string(text, text_len) : std::string()); });
    if (rc != DS4C_OK) return rc;
    *n_out = toks.size();
    if (toks.size() > cap) {
        char msg[96];
        std::snprintf(msg, sizeof msg, "ds4c_tokenize: %zu tokens do not fit a buffer of %zu", toks.size(), cap);
        set_err(err, errlen, msg);
        return DS4C_ERR_ARG;
    }
    if (!toks.empty()) std::memcpy(out, toks.data(), toks.size() * sizeof(int32_t));
    return DS4C_OK;
}

int ds4c_detokenize(ds4c_client *c, const int32_t *tokens, size_t n, char *buf, size_t cap, size_t *len_out, char *err,
                    size_t errlen) {
    if (!check_client(c, err, errlen)) return DS4C_ERR_ARG;
    if ((n && !tokens) || !len_out || (cap && !buf)) {
        set_err(err, errlen, "ds4c_detokenize: NULL tokens, buffer or length");
        return DS4C_ERR_ARG;
    }
    std::string text;
    int rc = guarded(c, err, errlen, [&] { text = c->client->detokenize(std::span<const int32_t>(tokens, n)); });
    if (rc != DS4C_OK) return rc;
    *len_out = text.size();
    if (text.size() + 1 > cap) {
        char msg[96];
        std::snprintf(msg, sizeof msg, "ds4c_detokenize: %zu bytes do not fit a buffer of %zu", text.size() + 1, cap);
        set_err(err, errlen, msg);
        return DS4C_ERR_ARG;
    }
    std::memcpy(buf, text.data(), text.size());
    buf[text.size()] = '\0';
    return DS4C_OK;
}

namespace {

void fill_stats(const Stats &s, ds4c_stats *out) {
    out->uptime_s = s.uptime_s;
    out->sessions = s.sessions;
    out->connections = s.connections;
    out->active_requests = s.active_requests;
    out->queued_requests = s.queued_requests;
    out->requests_total = s.requests_total;
    out->tokens_in = s.tokens_in;
    out->tokens_cached = s.tokens_cached;
    out->tokens_out = s.tokens_out;
    out->prefill_tok_s = s.prefill_tok_s;
    out->decode_tok_s = s.decode_tok_s;
    out->weights_bytes = s.memory.weights_bytes;
    out->cache_bytes = s.memory.cache_bytes;
    out->scratch_bytes = s.memory.scratch_bytes;
    out->device_free = s.memory.device_free;
    out->device_total = s.memory.device_total;
}

}  // namespace

int ds4c_get_stats(ds4c_client *c, ds4c_stats *out, char *err, size_t errlen) {
    if (!check_client(c, err, errlen)) return DS4C_ERR_ARG;
    if (!out) {
        set_err(err, errlen, "ds4c_get_stats: out is NULL");
        return DS4C_ERR_ARG;
    }
    return guarded(c, err, errlen, [&] { fill_stats(c->client->stats(), out); });
}

void ds4c_stats_ex_init(ds4c_stats_ex *x, size_t size) {
    if (!x || size < sizeof(size_t)) return;
    std::memset(x, 0, size);
    x->size = size;
}

int ds4c_get_stats_ex(ds4c_client *c, ds4c_stats_ex *out, char *err, size_t errlen) {
    if (!check_client(c, err, errlen)) return DS4C_ERR_ARG;
    if (!out || out->size < offsetof(ds4c_stats_ex, base) + sizeof(ds4c_stats) || out->size > 65536) {
        set_err(err, errlen, out ? "ds4c_get_stats_ex: out->size is not set (use ds4c_stats_ex_init)"
                                 : "ds4c_get_stats_ex: out is NULL");
        return DS4C_ERR_ARG;
    }
    ds4c_stats_ex x;
    ds4c_stats_ex_init(&x, sizeof x);
    const int rc = guarded(c, err, errlen, [&] {
        const Stats s = c->client->stats();
        fill_stats(s, &x.base);
        x.saves_failed = s.saves_failed;
        x.device_weights_bytes = s.memory.device_weights_bytes;
        copy_str(x.device, sizeof x.device, s.memory.device);
        x.steps = s.steps;
        x.step_rows = s.step_rows;
        x.step_requests = s.step_requests;
        x.step_seconds = s.step_seconds;
        x.max_batch = s.max_batch;
        x.step_tokens = s.step_tokens;
        x.draft_max = s.draft_max;
        x.spec_trials = s.spec_trials;
        x.spec_drafted = s.spec_drafted;
        x.spec_accepted = s.spec_accepted;
        x.spec_fallbacks = s.spec_fallbacks;
        x.spec_tokens = s.spec_tokens;
        x.spec_solo_tokens = s.spec_solo_tokens;
        x.spec_solo_seconds = s.spec_solo_seconds;
        x.solo_steps = s.solo_steps;
        x.solo_seconds = s.solo_seconds;
        x.kv_budget = s.kv_budget;
        x.kv_in_use = s.kv_in_use;
        x.kv_refused = s.kv_refused;
        x.kv_waiting = s.kv_waiting;
        x.slot_waiting = s.slot_waiting;
        x.drafter_bytes = s.memory.drafter_bytes;
        x.shared_bytes = s.memory.shared_bytes;
        x.private_bytes = s.memory.private_bytes;
        x.streaming = s.streaming ? 1 : 0;
        x.expert_acquired = s.experts.acquired;
        x.expert_misses = s.experts.misses;
        x.expert_late = s.experts.late;
        x.expert_prefetched = s.experts.prefetched;
        x.expert_prefetch_used = s.experts.prefetch_used;
        x.expert_bytes_read = s.experts.bytes_read;
        x.expert_resident = s.experts.resident;
        x.expert_capacity = s.experts.capacity;
        x.expert_wait_s = s.experts.wait_s;
        x.expert_io_busy_s = s.experts.io_busy_s;
    });
    if (rc != DS4C_OK) return rc;
    const size_t n = std::min(out->size, sizeof x);
    x.size = n;
    std::memcpy(out, &x, n);
    return DS4C_OK;
}

int ds4c_model_has_chat_template(const ds4c_client *c) {
    if (!c || !c->client) return -1;
    return c->client->server_info().model.chat_template ? 1 : 0;
}

int ds4c_list_sessions(ds4c_client *c, ds4c_session_list **out, char *err, size_t errlen) {
    if (!check_client(c, err, errlen)) return DS4C_ERR_ARG;
    if (!out) {
        set_err(err, errlen, "ds4c_list_sessions: out is NULL");
        return DS4C_ERR_ARG;
    }
    *out = nullptr;
    return guarded(c, err, errlen, [&] {
        auto l = std::make_unique<ds4c_session_list>();
        l->v = c->client->list_sessions();
        *out = l.release();
    });
}

size_t ds4c_session_list_count(const ds4c_session_list *l) { return l ? l->v.size() : 0; }

int ds4c_session_list_get(const ds4c_session_list *l, size_t i, ds4c_session_entry *out) {
    if (!l || !out || i >= l->v.size()) return DS4C_ERR_ARG;
    const StoredSession &s = l->v[i];
    out->name = s.name.c_str();
    out->save_error = s.save_error.c_str();
    out->n_tokens = s.n_tokens;
    out->stored_tokens = s.stored_tokens;
    out->bytes = s.bytes;
    out->created_unix = s.created_unix;
    out->last_used_unix = s.last_used_unix;
    out->pinned = s.pinned;
    out->live = s.live;
    return DS4C_OK;
}

void ds4c_session_list_free(ds4c_session_list *l) { delete l; }

int ds4c_save_session(ds4c_client *c, const char *name, uint64_t session, uint32_t *n_tokens_out, uint64_t *bytes_out,
                      char *err, size_t errlen) {
    if (!check_client(c, err, errlen)) return DS4C_ERR_ARG;
    if (!name || !*name) {
        set_err(err, errlen, "ds4c_save_session: name is NULL or empty");
        return DS4C_ERR_ARG;
    }
    return guarded(c, err, errlen, [&] {
        SavedSession s = c->client->save_session(name, session);
        if (n_tokens_out) *n_tokens_out = s.n_tokens;
        if (bytes_out) *bytes_out = s.bytes;
    });
}

int ds4c_load_session(ds4c_client *c, const char *name, uint32_t ctx, uint64_t *session_out, uint32_t *n_tokens_out,
                      char *err, size_t errlen) {
    if (!check_client(c, err, errlen)) return DS4C_ERR_ARG;
    if (!name || !*name || !session_out) {
        set_err(err, errlen, "ds4c_load_session: name is NULL or empty, or session_out is NULL");
        return DS4C_ERR_ARG;
    }
    return guarded(c, err, errlen, [&] {
        SessionInfo s = c->client->load_session(name, ctx);
        *session_out = s.id;
        if (n_tokens_out) *n_tokens_out = s.n_tokens;
    });
}

int ds4c_delete_session(ds4c_client *c, const char *name, char *err, size_t errlen) {
    if (!check_client(c, err, errlen)) return DS4C_ERR_ARG;
    if (!name || !*name) {
        set_err(err, errlen, "ds4c_delete_session: name is NULL or empty");
        return DS4C_ERR_ARG;
    }
    return guarded(c, err, errlen, [&] { c->client->delete_session(name); });
}

}  // extern "C"
