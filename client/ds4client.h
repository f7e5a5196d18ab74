/* libds4client C ABI: a thin layer over the C++ client (ds4client.hpp) for other languages.
 *
 * Every fallible call returns DS4C_OK (0) or a DS4C_ERR_* code and writes a NUL-terminated
 * message into the caller's err buffer (err may be NULL). No exception crosses this ABI.
 * A ds4c_client is used by one thread at a time, except ds4c_cancel. */
#ifndef DS4CLIENT_H
#define DS4CLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    DS4C_OK = 0,
    DS4C_ERR_ARG = 1,      /* bad argument (NULL handle, buffer too small, ...) */
    DS4C_ERR_CONNECT = 2,  /* the daemon could not be reached */
    DS4C_ERR_PROTOCOL = 3, /* connection lost or unusable reply */
    DS4C_ERR_SERVER = 4    /* the daemon answered with an error: see ds4c_server_error_code */
};

/* ds4c_server_error_code values: the wire protocol's ErrorCode. */
enum {
    DS4C_SERVER_NONE = 0,
    DS4C_SERVER_BAD_FRAME = 1,
    DS4C_SERVER_FRAME_TOO_LARGE = 2,
    DS4C_SERVER_VERSION_MISMATCH = 3,
    DS4C_SERVER_PROTOCOL = 4,
    DS4C_SERVER_BAD_REQUEST = 5,
    DS4C_SERVER_UNKNOWN_SESSION = 6,
    DS4C_SERVER_SESSION_BUSY = 7,
    DS4C_SERVER_SESSION_LIMIT = 8,
    DS4C_SERVER_CONTEXT_OVERFLOW = 9,
    DS4C_SERVER_ENGINE = 10,
    DS4C_SERVER_NOT_IMPLEMENTED = 11,
    DS4C_SERVER_SHUTTING_DOWN = 12,
    DS4C_SERVER_PERMISSION_DENIED = 13,
    DS4C_SERVER_INTERNAL = 14,
    DS4C_SERVER_BUSY = 15,
    DS4C_SERVER_STORE = 16,
    DS4C_SERVER_SESSION_CORRUPT = 17,
    DS4C_SERVER_NO_STORE = 18
};

/* Finish reasons, the same values as the wire protocol's FinishReason. */
enum {
    DS4C_FINISH_STOP = 0,
    DS4C_FINISH_STOP_STRING = 1,
    DS4C_FINISH_LENGTH = 2,
    DS4C_FINISH_CONTEXT = 3,
    DS4C_FINISH_CANCELLED = 4
};

typedef struct ds4c_client ds4c_client;

typedef struct {
    uint32_t protocol_version;
    char family[32];
    char name[64];
    char backend[16];
    uint32_t n_layer, n_embd, n_vocab, n_ctx_max, n_head, n_expert;
    uint32_t default_ctx;
} ds4c_model_info;

typedef struct {
    uint64_t session;              /* 0: one-shot session */
    /* Exactly one prompt form: text, or tokens (n_tokens > 0), or chat messages. Text is
     * length-delimited: text_len bytes (need not end in NUL; NUL bytes are text), and
     * chat_contents[i] is chat_content_lens[i] bytes. Roles are NUL-terminated. */
    const char *text;
    size_t text_len;
    const int32_t *tokens;
    size_t n_tokens;
    const char *const *chat_roles;
    const char *const *chat_contents;
    const size_t *chat_content_lens;
    size_t n_chat;
    float temperature;             /* 0: greedy */
    int32_t top_k;
    float top_p;
    float min_p;
    uint64_t seed;
    uint32_t max_tokens;
    const char *const *stop_strings;
    size_t n_stop_strings;
    const int32_t *stop_tokens;
    size_t n_stop_tokens;
    int32_t ignore_eos;
    int32_t thinking;
    uint64_t *request_id_out;      /* optional: set before the first chunk, for ds4c_cancel from another thread */
} ds4c_generate_options;

typedef struct {
    uint64_t request_id;
    int32_t reason;                /* DS4C_FINISH_* */
    uint32_t prompt_tokens, cached_tokens, generated_tokens;
    uint64_t prefill_us, decode_us;
    int32_t stop_token;
} ds4c_done;

typedef struct {
    double uptime_s;
    uint32_t sessions, connections, active_requests, queued_requests;
    uint64_t requests_total, tokens_in, tokens_cached, tokens_out;
    double prefill_tok_s, decode_tok_s;
    uint64_t weights_bytes, cache_bytes, scratch_bytes, device_free, device_total;
} ds4c_stats;

/* Called for every streamed chunk; text is not NUL-terminated. Return nonzero to cancel. */
typedef int (*ds4c_chunk_fn)(void *ud, const int32_t *tokens, size_t n_tokens, const char *text, size_t text_len);

/* socket_path NULL or "": the default ($XDG_RUNTIME_DIR/ds4.sock, else /tmp/ds4-$UID.sock). */
int ds4c_connect(ds4c_client **out, const char *socket_path, char *err, size_t errlen);
int ds4c_reconnect(ds4c_client *c, char *err, size_t errlen);
void ds4c_free(ds4c_client *c);

/* The ErrorCode of the last DS4C_ERR_SERVER failure on this client, 0 if none. */
int ds4c_server_error_code(const ds4c_client *c);

int ds4c_get_model_info(ds4c_client *c, ds4c_model_info *out, char *err, size_t errlen);

/* name NULL or "": an anonymous session owned by this connection. */
int ds4c_open_session(ds4c_client *c, const char *name, uint32_t ctx, uint64_t *session_out, uint32_t *n_tokens_out,
                      char *err, size_t errlen);
int ds4c_close_session(ds4c_client *c, uint64_t session, char *err, size_t errlen);

void ds4c_generate_options_init(ds4c_generate_options *opt);
int ds4c_generate(ds4c_client *c, const ds4c_generate_options *opt, ds4c_chunk_fn on_chunk, void *ud,
                  ds4c_done *done_out, char *err, size_t errlen);
int ds4c_cancel(ds4c_client *c, uint64_t request_id, char *err, size_t errlen);

/* Sampling controls and log-probabilities (ds4.fbs Sampling/Generate say the formulas).
 * Versioned by size: ds4c_sampling_controls_init(x, sizeof *x) sets the defaults for the
 * caller's size and records it, so a caller built against a shorter, older struct keeps
 * working and the fields it lacks keep their defaults. */
typedef struct {
    size_t size;                   /* set by ds4c_sampling_controls_init */
    float repeat_penalty;          /* 1: off; llama.cpp semantics over the last repeat_last_n */
    int32_t repeat_last_n;         /* 64; 0: off; -1: the whole context */
    float frequency_penalty;       /* 0: off; OpenAI semantics over the generated tokens */
    float presence_penalty;        /* 0: off */
    const int32_t *logit_bias_tokens; /* n_logit_bias distinct ids, biases in [-100, 100] */
    const float *logit_bias_values;
    size_t n_logit_bias;
    int32_t logprobs;              /* nonzero: each token's log-probability */
    uint32_t top_logprobs;         /* 0..20 alternatives with each */
    /* appended: nonzero makes the output one JSON object (constrained decoding; the request
     * ends with DS4C_FINISH_STOP when it closes; max_tokens >= 2) */
    int32_t json_object;
} ds4c_sampling_controls;

/* One generated token's log-probability and its top alternatives (most likely first):
 * log-softmax of the logits after bias and penalties, over the temperature when above 0. */
typedef struct {
    float logprob;
    const int32_t *top_tokens;
    const float *top_logprobs;
    size_t n_top;
} ds4c_token_logprob;

/* As ds4c_chunk_fn, plus logprobs: n_tokens entries when asked for, else NULL. */
typedef int (*ds4c_chunk_ex_fn)(void *ud, const int32_t *tokens, size_t n_tokens, const char *text, size_t text_len,
                                const ds4c_token_logprob *logprobs);

void ds4c_sampling_controls_init(ds4c_sampling_controls *x, size_t size);
/* ds4c_generate with controls (NULL: none); controls->size must come from the init. */
int ds4c_generate_ex(ds4c_client *c, const ds4c_generate_options *opt, const ds4c_sampling_controls *controls,
                     ds4c_chunk_ex_fn on_chunk, void *ud, ds4c_done *done_out, char *err, size_t errlen);

/* text: text_len bytes, may contain NUL (NULL only when text_len is 0). *n_out gets the
 * token count even when cap is too small (then DS4C_ERR_ARG). */
int ds4c_tokenize(ds4c_client *c, const char *text, size_t text_len, int32_t *out, size_t cap, size_t *n_out,
                  char *err, size_t errlen);
/* *len_out gets the text length (without NUL); buf needs len+1 bytes, else DS4C_ERR_ARG. */
int ds4c_detokenize(ds4c_client *c, const int32_t *tokens, size_t n, char *buf, size_t cap, size_t *len_out, char *err,
                    size_t errlen);
int ds4c_get_stats(ds4c_client *c, ds4c_stats *out, char *err, size_t errlen);

/* ds4c_stats and the rest of the daemon's figures (ds4.fbs StatsResult says what each means).
 * Versioned by size: ds4c_stats_ex_init(x, sizeof *x) zeroes the struct and records the size,
 * and ds4c_get_stats_ex fills only what lies within it, so a caller built against a shorter,
 * older struct keeps working; fields are only ever appended. */
typedef struct {
    size_t size;                   /* set by ds4c_stats_ex_init */
    ds4c_stats base;
    uint64_t saves_failed;         /* session saves that failed since ds4d started */
    uint64_t device_weights_bytes; /* weights held in device memory */
    char device[64];               /* the GPU's name, or "cpu" */
    /* continuous batching: forward steps, the rows and requests they carried, their time */
    uint64_t steps, step_rows, step_requests;
    double step_seconds;
    uint32_t max_batch, step_tokens;   /* --max-batch, --step-tokens */
    /* speculative decoding (ds4d --drafter; draft_max 0: none) */
    uint32_t draft_max;
    uint64_t spec_trials, spec_drafted, spec_accepted, spec_fallbacks, spec_tokens;
    uint64_t spec_solo_tokens;     /* of trials that ran alone in their step: tokens, seconds */
    double spec_solo_seconds;
    uint64_t solo_steps;           /* plain one-row steps that ran alone: count, seconds */
    double solo_seconds;
    /* session-cache budget (--kv-budget): bytes, requests waiting for memory or a slot, refused */
    uint64_t kv_budget, kv_in_use, kv_refused;
    uint32_t kv_waiting, slot_waiting;
    /* memory split: the drafter's weights, weights other processes map too, ds4d's alone */
    uint64_t drafter_bytes, shared_bytes, private_bytes;
    /* SSD expert streaming (ds4d --ssd-streaming; streaming 0: none): counters since start */
    int32_t streaming;
    uint64_t expert_acquired, expert_misses, expert_late, expert_prefetched, expert_prefetch_used;
    uint64_t expert_bytes_read, expert_resident, expert_capacity;
    double expert_wait_s, expert_io_busy_s;
} ds4c_stats_ex;

void ds4c_stats_ex_init(ds4c_stats_ex *x, size_t size);
/* out->size must come from ds4c_stats_ex_init. */
int ds4c_get_stats_ex(ds4c_client *c, ds4c_stats_ex *out, char *err, size_t errlen);

/* 1 when the model's GGUF has a chat template (prompts are meant as chat messages), 0 for a
 * plain completion model (send text as it is), -1 for NULL. */
int ds4c_model_has_chat_template(const ds4c_client *c);

/* --- persistent named sessions (a daemon with a store; else DS4C_ERR_SERVER, NO_STORE) --- */

/* One stored or live named session. The strings belong to the list they came from. */
typedef struct {
    const char *name;
    const char *save_error;        /* "" unless the latest save failed (then: why) */
    uint32_t n_tokens;             /* the live history's length */
    uint32_t stored_tokens;        /* the stored version's length */
    uint64_t bytes;                /* payload bytes in the store (0: not stored yet) */
    uint64_t created_unix, last_used_unix;
    int32_t pinned, live;          /* live: held in daemon memory */
} ds4c_session_entry;

typedef struct ds4c_session_list ds4c_session_list;

int ds4c_list_sessions(ds4c_client *c, ds4c_session_list **out, char *err, size_t errlen);
size_t ds4c_session_list_count(const ds4c_session_list *l);
/* DS4C_ERR_ARG when i >= count. */
int ds4c_session_list_get(const ds4c_session_list *l, size_t i, ds4c_session_entry *out);
void ds4c_session_list_free(ds4c_session_list *l);

/* Durable when it returns. session 0: the named session `name`; a session id saves that
 * session (e.g. an anonymous one) under `name`. Outputs may be NULL. */
int ds4c_save_session(ds4c_client *c, const char *name, uint64_t session, uint32_t *n_tokens_out,
                      uint64_t *bytes_out, char *err, size_t errlen);
/* Opens the stored session `name` (UNKNOWN_SESSION when neither stored nor live). */
int ds4c_load_session(ds4c_client *c, const char *name, uint32_t ctx, uint64_t *session_out,
                      uint32_t *n_tokens_out, char *err, size_t errlen);
int ds4c_delete_session(ds4c_client *c, const char *name, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* DS4CLIENT_H */
