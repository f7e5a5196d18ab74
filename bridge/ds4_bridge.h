/* ds4_bridge.h: the one C ABI of the ds4 engine.
 *
 * Contract (docs/ARCHITECTURE.md section 3):
 *  - Handles are opaque. Only plain scalar/POD option and info structs cross by layout.
 *  - Every fallible call returns int (0 = ok) and takes a caller-owned `char *err, size_t
 *    errlen`, NUL-terminated on failure (err may be NULL). No exception, abort or crash
 *    crosses the ABI: NULL handles and bad arguments are errors.
 *  - Every successful *_create / *_open has exactly one *_free (free(NULL) is a no-op).
 *  - Token arrays are borrowed for the call. Strings go into caller-owned buffers; when a
 *    buffer is too small the call fails and *len_out / *n_out says how much is needed.
 *  - Text going in is length-delimited (`const char *text, size_t text_len`): it need not
 *    be NUL-terminated and may contain NUL bytes, which are text like any other byte.
 *    Paths and role names stay NUL-terminated C strings.
 *  - Handles are thread-affine: use a session from one thread at a time. A model may be
 *    shared by sessions on one thread; sessions of one model on different threads must
 *    not run concurrently (they share the model's thread pool).
 *  - Validation happens before mutation: a rejected call leaves the session as it was. A
 *    failure after the engine started mutating invalidates the session and bumps its
 *    generation, so callers drop stale checkpoints.
 *  - Prefill progress callbacks run on the calling thread, only at durable chunk
 *    frontiers, and must not re-enter the session (re-entry is an error).
 *  - No CUDA types, streams or device pointers.
 */
#ifndef DS4_BRIDGE_H
#define DS4_BRIDGE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DS4_BRIDGE_API __attribute__((visibility("default")))

typedef struct ds4_bridge_model ds4_bridge_model;
typedef struct ds4_bridge_session ds4_bridge_session;
typedef struct ds4_bridge_gguf ds4_bridge_gguf;
typedef void (*ds4_bridge_prefill_fn)(void *ud, int32_t current, int32_t total);

/* AUTO: CUDA when this build has it and a usable GPU is present, else the CPU. CUDA without a
 * usable GPU, or with too little free VRAM for the weights, fails the open with the numbers. */
enum { DS4_BRIDGE_BACKEND_CUDA = 0, DS4_BRIDGE_BACKEND_CPU = 2, DS4_BRIDGE_BACKEND_AUTO = 3 };

typedef struct { /* POD; initialise with ds4_bridge_model_open_options_init */
    const char *model_path;
    const char *mtp_path; /* optional sibling drafter/MTP GGUF, NULL if none */
    int32_t backend;      /* DS4_BRIDGE_BACKEND_* */
    int32_t n_threads;    /* 0 = all cores */
    int32_t defer_boot_prewarm;
    /* SSD expert streaming (CPU backend): routed experts are read on demand into a cache of
     * at most cache_experts experts or cache_bytes bytes (give one; both 0 = 4 GiB). A budget
     * that holds fewer experts than a token uses per layer fails the open. cold: start with
     * an empty cache instead of loading the store's hot set. The other fields need
     * ssd_streaming set. */
    int32_t ssd_streaming, ssd_streaming_cold;
    uint32_t ssd_streaming_cache_experts;
    uint64_t ssd_streaming_cache_bytes;
    int32_t mtp_draft_tokens; /* an MTP head is not implemented: must be 0 */
    /* Host-owned tables (see "host-owned tables" at the end of this header); NULL = none. */
    const struct ds4_bridge_tensor_directory *tensor_directory;
    const struct ds4_bridge_bind_plan *bind_plan;
    /* Speculative decoding (appended; docs/ARCHITECTURE.md section 7, "Speculation"). */
    const char *drafter_path; /* sibling drafter GGUF with the model's tokenizer, NULL if none.
                               * mtp_path is an older name for the same; set one of them. */
    int32_t draft_max;        /* drafts per trial at most, 1..64; 0 = 4 */
    /* Directory of the expert store (experts re-laid out for direct reads, checksummed, with
     * use counts for the next start's prewarm); NULL or "" = none, experts read from the GGUF. */
    const char *ssd_streaming_store_dir;
    /* A drafter shared by another process (appended): the socket of a ds4d running with
     * --drafter. The open asks it for the drafter, checks the descriptor (fingerprint,
     * vocabulary, size) against the sealed file it receives and against the model's
     * tokenizer, and maps it read-only (ds4_bridge_drafter_shared then returns 1). When that
     * fails (no daemon, a refusal, a mismatch) the open still succeeds: with drafter_path set
     * it loads that privately, else it has no drafter; the reason goes to stderr and into err.
     * NULL or "" = no import. */
    const char *drafter_import;
} ds4_bridge_model_open_options;

typedef struct {
    char family[32]; /* "deepseek4" */
    char name[64];   /* general.name, or the file name */
    int32_t n_layer, n_embd, n_vocab, n_head, head_dim, n_expert, n_expert_used;
    int32_t n_ctx_max; /* the model's training context (0 if unknown) */
    uint64_t fingerprint;
} ds4_bridge_model_info_t;

typedef struct {
    uint64_t weights_bytes; /* tensor bytes mapped + small f32 copies */
    uint64_t cache_bytes;   /* all live sessions' caches */
    uint64_t scratch_bytes; /* all live sessions' scratch buffers */
    uint64_t device_free, device_total; /* 0 without a device */
    uint64_t device_weights_bytes;      /* weights copied to the device (0 on the CPU) */
    char backend[8];                    /* "cpu" | "cuda" */
    char device[64];                    /* the GPU's name, or "cpu" */
} ds4_bridge_memory_t;

/* ds4_bridge_memory_t split by who else holds the pages (ds4_bridge_memory_stats_ex). Appended
 * fields only: a caller passes sizeof its own copy, so an older, shorter struct keeps working. */
typedef struct {
    ds4_bridge_memory_t base;       /* exactly what ds4_bridge_memory_stats gives */
    uint64_t drafter_weights_bytes; /* the drafter's part of base.weights_bytes (0: none) */
    uint64_t drafter_mapped_bytes;  /* of which referenced in place in its file or shared memfd
                                     * (the rest are this process's f32 copies) */
    uint64_t shared_bytes;          /* weights mapped from another process's export
                                     * (drafter_import): that process holds the same pages */
    uint64_t private_bytes;         /* weights, caches and scratch of this process alone:
                                     * base.weights + cache + scratch bytes less shared_bytes */
} ds4_bridge_memory_ex_t;

typedef struct { /* expert source counters since the open (all 0 when not streaming) */
    int32_t streaming;                 /* 1 when routed experts are streamed from SSD */
    uint64_t acquired;                 /* experts used by steps */
    uint64_t misses;                   /* of which were read on demand */
    uint64_t late;                     /* of which waited for their prefetch */
    uint64_t prefetched, prefetch_used;
    uint64_t bytes_read;               /* demand + prefetch */
    uint64_t store_reads, store_corrupt;
    uint64_t demand_read_ns, prefetch_read_ns, wait_ns;
    uint64_t io_busy_ns;               /* wall time with at least one read in flight */
    uint64_t resident, capacity, capacity_bytes;
} ds4_bridge_expert_stats_t;

typedef struct {
    const char *role;    /* "system" | "user" | "assistant" (NUL-terminated) */
    const char *content; /* content_len bytes, may contain NUL; NULL only when content_len is 0 */
    size_t content_len;
} ds4_bridge_chat_msg;

/* --- models ------------------------------------------------------------------------ */
DS4_BRIDGE_API void ds4_bridge_model_open_options_init(ds4_bridge_model_open_options *opt);
DS4_BRIDGE_API int ds4_bridge_model_open(ds4_bridge_model **out, const ds4_bridge_model_open_options *opt, char *err,
                                         size_t errlen);
/* Touches every weight page and runs one dummy forward (done by _open unless deferred, and
 * then a failure fails the open). */
DS4_BRIDGE_API int ds4_bridge_model_boot_prewarm(ds4_bridge_model *m, char *err, size_t errlen);
/* The same, reporting the weight bytes touched so far and their total (about every 64 MiB and
 * once at the end, on the calling thread; the callback must not re-enter the bridge), so a host
 * can show a large model's loading. progress may be NULL. */
typedef void (*ds4_bridge_load_fn)(void *ud, uint64_t done_bytes, uint64_t total_bytes);
DS4_BRIDGE_API int ds4_bridge_model_boot_prewarm_cb(ds4_bridge_model *m, ds4_bridge_load_fn progress, void *ud,
                                                    char *err, size_t errlen);
DS4_BRIDGE_API void ds4_bridge_model_free(ds4_bridge_model *m);
/* 1 when the drafter was imported from another process, 0 when loaded privately or absent. */
DS4_BRIDGE_API int ds4_bridge_drafter_shared(ds4_bridge_model *m);
/* The drafter's identity (fingerprint, vocabulary, shape); fails when the model has none. */
DS4_BRIDGE_API int ds4_bridge_drafter_info(ds4_bridge_model *m, ds4_bridge_model_info_t *out, char *err, size_t errlen);
/* The drafter's device weights and their sharing across processes (the CUDA backend;
 * ARCHITECTURE.md §5, "Shared drafter"). A drafter opened from drafter_path on a GPU is placed
 * in one allocation exportable as a file descriptor (CUDA VMM); one imported through
 * drafter_import sits on the exporter's device memory when it can (same GPU, same layout),
 * else it is uploaded privately and `why` says why. Appended fields only: out_size is sizeof
 * the caller's struct. Fails when the model has no drafter. */
typedef struct {
    int32_t on_device;   /* 1: the drafter runs on a GPU */
    int32_t export_fd;   /* >= 0: the exportable handle of its weights (owned by the model, valid
                          * until it is freed; dup it to keep it); -1: none */
    int32_t imported;    /* 1: its weights are another process's device memory */
    int32_t read_only;   /* imported and mapped read-only (0: read-write, never written) */
    uint64_t bytes;      /* the exported or imported allocation's size */
    uint64_t granularity;/* the device's allocation granularity */
    uint64_t layout_hash;/* the ranges' sizes and offsets and the bytes made at open */
    uint8_t uuid[16];    /* the GPU's UUID */
    char why[256];       /* an export or import that was asked for and not done ("" otherwise) */
} ds4_bridge_drafter_device_t;
DS4_BRIDGE_API int ds4_bridge_drafter_device(ds4_bridge_model *m, ds4_bridge_drafter_device_t *out, size_t out_size,
                                             char *err, size_t errlen);
DS4_BRIDGE_API int32_t ds4_bridge_model_vocab_size(ds4_bridge_model *m); /* -1 for NULL */
DS4_BRIDGE_API int ds4_bridge_model_info(ds4_bridge_model *m, ds4_bridge_model_info_t *out, char *err, size_t errlen);
DS4_BRIDGE_API int ds4_bridge_memory_stats(ds4_bridge_model *m, ds4_bridge_memory_t *out, char *err, size_t errlen);
/* out_size: sizeof the caller's ds4_bridge_memory_ex_t, at least sizeof(ds4_bridge_memory_t);
 * fields beyond it are not written, fields this library does not know are zeroed. */
DS4_BRIDGE_API int ds4_bridge_memory_stats_ex(ds4_bridge_model *m, ds4_bridge_memory_ex_t *out, size_t out_size,
                                              char *err, size_t errlen);
DS4_BRIDGE_API int ds4_bridge_expert_stats(ds4_bridge_model *m, ds4_bridge_expert_stats_t *out, char *err,
                                           size_t errlen);
/* The same with the tiers told apart. Streaming on the CUDA backend keeps experts in a VRAM
 * cache over a RAM cache: base then counts the VRAM tier (base.bytes_read: bytes uploaded,
 * base.io_busy_ns: the copy stream's busy time) and the host_* fields the RAM tier's reads
 * from disk. Appended fields only: out_size is sizeof the caller's struct, at least
 * sizeof(ds4_bridge_expert_stats_t); fields this library does not know are zeroed. */
typedef struct {
    ds4_bridge_expert_stats_t base;  /* exactly what ds4_bridge_expert_stats gives */
    int32_t tiers;                   /* 0 not streaming, 1 one cache (RAM), 2 VRAM over RAM */
    uint64_t host_misses;            /* experts the RAM tier read from disk (tiers == 2) */
    uint64_t host_bytes_read;        /* bytes it read */
    uint64_t host_capacity_bytes;    /* its size */
} ds4_bridge_expert_stats_ex_t;
DS4_BRIDGE_API int ds4_bridge_expert_stats_ex(ds4_bridge_model *m, ds4_bridge_expert_stats_ex_t *out, size_t out_size,
                                              char *err, size_t errlen);

/* Cumulative speculative-decoding counters (POD). "accepted" counts drafts the model agreed
 * with, whether or not the caller kept them; acceptance rate = accepted / drafted, mean
 * accepted length per trial = accepted / trials. */
typedef struct {
    uint64_t trials;    /* target trials run */
    uint64_t drafted;   /* draft tokens proposed */
    uint64_t accepted;  /* drafts accepted */
    uint64_t fallbacks; /* ds4_bridge_spec_trial calls that returned 0 with a drafter loaded */
    uint64_t committed; /* trial tokens kept by commits (each trial's pending token included) */
    int32_t draft_max;  /* the model's bound; 0 without a drafter */
    int32_t draft_width;/* session: the draft count its next trial aims for (before room
                         * limits; 0 before its first trial); model: 0 */
} ds4_bridge_spec_counters_t;

/* --- sessions ---------------------------------------------------------------------- */
DS4_BRIDGE_API int ds4_bridge_session_create(ds4_bridge_session **out, ds4_bridge_model *m, int ctx_size, char *err,
                                             size_t errlen);
DS4_BRIDGE_API void ds4_bridge_session_free(ds4_bridge_session *s);
DS4_BRIDGE_API int ds4_bridge_session_sync(ds4_bridge_session *s, const int32_t *tokens, int n_tokens, char *err,
                                           size_t errlen);
DS4_BRIDGE_API int ds4_bridge_session_sync_cb(ds4_bridge_session *s, const int32_t *tokens, int n_tokens,
                                              ds4_bridge_prefill_fn progress, void *ud, char *err, size_t errlen);
DS4_BRIDGE_API int ds4_bridge_eval(ds4_bridge_session *s, int32_t token, char *err, size_t errlen);
/* The most likely next token (lowest id on ties) into *token_out. */
DS4_BRIDGE_API int ds4_bridge_session_argmax(ds4_bridge_session *s, int32_t *token_out, char *err, size_t errlen);
/* Greedy when temperature <= 0 (rng may then be NULL); top_k 0 = off, top_p 1 = off,
 * min_p 0 = off. *token_out gets the sampled token; rng advances. */
DS4_BRIDGE_API int ds4_bridge_session_sample(ds4_bridge_session *s, float temperature, int top_k, float top_p,
                                             float min_p, uint64_t *rng, int32_t *token_out, char *err,
                                             size_t errlen);
/* The sampler of ds4_bridge_session_sample applied to a caller's row of n logits (e.g. a
 * session's logits after the host's penalties and biases): same transform, same rng use,
 * so an unchanged row gives the same token. Greedy (lowest id on ties) when temperature <= 0. */
DS4_BRIDGE_API int ds4_bridge_sample_logits(const float *logits, int n, float temperature, int top_k, float top_p,
                                            float min_p, uint64_t *rng, int32_t *token_out, char *err, size_t errlen);
/* Copies the last position's logits (cap >= vocab size). */
DS4_BRIDGE_API int ds4_bridge_session_logits(ds4_bridge_session *s, float *out, int cap, char *err, size_t errlen);
DS4_BRIDGE_API int ds4_bridge_session_pos(ds4_bridge_session *s); /* -1 for NULL */
DS4_BRIDGE_API int ds4_bridge_session_ctx(ds4_bridge_session *s); /* -1 for NULL */
/* Drops positions >= pos; pos must be in 0..ds4_bridge_session_pos (pos == current is a
 * no-op). Out of range is an error and leaves the session unchanged. */
DS4_BRIDGE_API int ds4_bridge_session_rewind(ds4_bridge_session *s, int pos, char *err, size_t errlen);
/* Drops the whole state (pos becomes 0) and bumps the generation. */
DS4_BRIDGE_API int ds4_bridge_session_invalidate(ds4_bridge_session *s, char *err, size_t errlen);
DS4_BRIDGE_API uint64_t ds4_bridge_session_generation(ds4_bridge_session *s); /* 0 for NULL */
/* Most tokens of the session in one forward step (its prefill chunks, a batch's count):
 * the backend's step size (1024 on the CPU, whose rings hold 256 and whose attention runs
 * in pieces of that; 2048 on a GPU), at most the context. -1 for NULL. */
DS4_BRIDGE_API int ds4_bridge_session_prefill_cap(ds4_bridge_session *s);
/* Top-n (token, logprob) of the last position; *n_out = entries written. */
DS4_BRIDGE_API int ds4_bridge_session_top_logprobs(ds4_bridge_session *s, int n, int32_t *ids, float *logprobs,
                                                   int *n_out, char *err, size_t errlen);

/* --- batches: one forward step over several sessions -------------------------------- */
/* A batch runs decode tokens of some sessions and prefill chunks of others in one step, so
 * the weights are read once for all of them (continuous batching). It borrows its model
 * (free the batch first) and, for each call only, the sessions it is given. Like sessions it
 * is thread-affine and shares the model's thread pool. */
typedef struct ds4_bridge_batch ds4_bridge_batch;
typedef struct {
    uint64_t steps;    /* ds4_bridge_batch_eval calls that ran */
    uint64_t rows;     /* tokens evaluated in them */
    uint64_t sessions; /* session segments in them (steps * mean sessions per step) */
    uint64_t failed;   /* steps that failed after the engine started (sessions invalidated) */
} ds4_bridge_batch_stats_t;

DS4_BRIDGE_API int ds4_bridge_batch_create(ds4_bridge_batch **out, ds4_bridge_model *m, char *err, size_t errlen);
DS4_BRIDGE_API void ds4_bridge_batch_free(ds4_bridge_batch *b);
/* Appends counts[i] tokens to sessions[i] for i < n_sessions, in one step; `tokens` holds
 * them back to back (sum of counts). Sessions are distinct, of the batch's model, not in a
 * callback; 1 <= counts[i] <= ds4_bridge_session_prefill_cap(sessions[i]); each fits its
 * context. Afterwards every session's logits are those after its last token, exactly as
 * if it had evaluated its tokens alone. Rejected arguments change nothing; a failure
 * inside the step invalidates every session in it (their generations bump). */
DS4_BRIDGE_API int ds4_bridge_batch_eval(ds4_bridge_batch *b, ds4_bridge_session *const *sessions,
                                         const int32_t *counts, int n_sessions, const int32_t *tokens, char *err,
                                         size_t errlen);
DS4_BRIDGE_API int ds4_bridge_batch_stats(ds4_bridge_batch *b, ds4_bridge_batch_stats_t *out, char *err,
                                          size_t errlen);

/* --- speculative decoding (a model opened with drafter_path) ------------------------
 * The caller's decode loop holds a pending token: chosen after the session's history and
 * already given out, not yet evaluated. ds4_bridge_spec_trial drafts up to k tokens with the
 * drafter (k adapts to the recent acceptance rate, bounded by draft_max, max_new - 1 and
 * cap - 1), evaluates pending + drafts as one journaled trial of width w = k + 1 and fills
 *   tokens[0..w): pending, then the drafts;
 *   argmax[0..w): the model's next token after tokens[0..i]: with temperature <= 0 the
 *     argmax of that position; with temperature > 0 the speculative-sampling outcome (the
 *     draft where accepted, the residual draw at the first rejection, the bonus token after
 *     all), -1 past the first rejection. The output distribution is the model's own
 *     (same temperature/top_k/top_p/min_p transform as ds4_bridge_session_sample).
 * Drafts accepted: the longest run with argmax[i] == tokens[i + 1] (*accepted_out, may be
 * NULL). Returns w >= 2 with the trial pending (commit before anything else changes the
 * session), 0 to fall back to ordinary decoding (no drafter, max_new < 2, no room in the
 * context; the session is unchanged: eval pending, then argmax/sample), -1 on failure. */
DS4_BRIDGE_API int ds4_bridge_spec_trial(ds4_bridge_session *s, int32_t pending, float temperature, int top_k,
                                         float top_p, float min_p, uint64_t *rng, int max_new, int32_t *tokens,
                                         int32_t *argmax, int cap, int *accepted_out, char *err, size_t errlen);
/* Keeps n of the trial's tokens, 0 <= n <= accepted + 1: the session then holds its history
 * plus tokens[0..n) (rejected rows restored from the journal, nothing re-evaluated); the new
 * pending token is argmax[n - 1]. */
DS4_BRIDGE_API int ds4_bridge_spec_commit(ds4_bridge_session *s, int n, char *err, size_t errlen);
/* Speculation inside a batch step: ds4_bridge_batch_eval_spec runs the ordinary segments
 * (sessions/counts/tokens exactly as ds4_bridge_batch_eval; n_sessions may be 0) and, in the
 * same forward step, a speculative row for each spec[i]: its session drafts as
 * ds4_bridge_spec_trial does and contributes w = k + 1 journaled rows (pending and the
 * drafts), so rows of different sessions carry different widths. Filled per entry:
 *   width >= 2: the trial is pending as after ds4_bridge_spec_trial (tokens, argmax and
 *     accepted likewise); commit it with ds4_bridge_spec_commit before anything else;
 *   width == 1: no drafts (no drafter, max_new < 2, no room): pending was evaluated as an
 *     ordinary row in this step and the session's logits follow it (argmax/sample as usual);
 *     tokens[0] = pending.
 * A session's draws from rng are the same as in ds4_bridge_spec_trial, so its output does
 * not depend on what else shares the step. All sessions (both lists) are distinct and none
 * has a trial pending; everything is checked before anything runs. A failure while drafting
 * leaves the targets unchanged; one inside the step invalidates every session in it. */
typedef struct {
    ds4_bridge_session *session;
    int32_t pending;
    float temperature; /* sampling as in ds4_bridge_session_sample; <= 0: greedy */
    int32_t top_k;
    float top_p, min_p;
    uint64_t *rng;     /* required when temperature > 0; advances */
    int32_t max_new;   /* tokens the caller can still take (>= 1) */
    int32_t *tokens;   /* caller-owned, cap entries */
    int32_t *argmax;   /* caller-owned, cap entries */
    int32_t cap;       /* >= 2: bounds the width */
    int32_t width;     /* out */
    int32_t accepted;  /* out: drafts accepted */
} ds4_bridge_spec_row;
DS4_BRIDGE_API int ds4_bridge_batch_eval_spec(ds4_bridge_batch *b, ds4_bridge_session *const *sessions,
                                              const int32_t *counts, int n_sessions, const int32_t *tokens,
                                              ds4_bridge_spec_row *spec, int n_spec, char *err, size_t errlen);
/* Forgets the session's acceptance history: its next trial's width is a fresh session's (the
 * counters are kept). A host resets at a request's start so the widths, and with them a
 * sampled request's random draws, depend on that request only. Not while a trial is
 * pending; a no-op without a drafter or before the first trial. */
DS4_BRIDGE_API int ds4_bridge_session_spec_reset(ds4_bridge_session *s, char *err, size_t errlen);
/* Snapshots: the model's totals over all its sessions, or one session's. */
DS4_BRIDGE_API int ds4_bridge_spec_counters(ds4_bridge_model *m, ds4_bridge_spec_counters_t *out, char *err,
                                            size_t errlen);
DS4_BRIDGE_API int ds4_bridge_session_spec_counters(ds4_bridge_session *s, ds4_bridge_spec_counters_t *out, char *err,
                                                    size_t errlen);

/* --- payloads (docs/ARCHITECTURE.md section 4) ------------------------------------- */
DS4_BRIDGE_API int ds4_bridge_session_save_payload(ds4_bridge_session *s, const char *path, char *err, size_t errlen);
DS4_BRIDGE_API int ds4_bridge_session_load_payload(ds4_bridge_session *s, const char *path, char *err, size_t errlen);
DS4_BRIDGE_API int ds4_bridge_session_load_payload_range(ds4_bridge_session *s, const char *path, uint64_t offset,
                                                         uint64_t length, char *err, size_t errlen);
/* In-memory forms (the store writes payloads through its own I/O path). */
DS4_BRIDGE_API int ds4_bridge_session_payload_size(ds4_bridge_session *s, uint64_t *size_out, char *err, size_t errlen);
DS4_BRIDGE_API int ds4_bridge_session_save_payload_mem(ds4_bridge_session *s, uint8_t *buf, size_t cap,
                                                       size_t *len_out, char *err, size_t errlen);
DS4_BRIDGE_API int ds4_bridge_session_load_payload_mem(ds4_bridge_session *s, const uint8_t *data, size_t len,
                                                       char *err, size_t errlen);
DS4_BRIDGE_API uint64_t ds4_bridge_model_fingerprint(ds4_bridge_model *m); /* 0 for NULL */

/* --- tokenizer --------------------------------------------------------------------- */
/* text: text_len bytes (NULL only when text_len is 0). Plain text never yields control
 * tokens; rendered chat text matches them. */
DS4_BRIDGE_API int ds4_bridge_tokenize_text(ds4_bridge_model *m, const char *text, size_t text_len, int32_t *out,
                                            int cap, int *n_out, char *err, size_t errlen);
DS4_BRIDGE_API int ds4_bridge_tokenize_rendered_chat(ds4_bridge_model *m, const char *text, size_t text_len,
                                                     int32_t *out, int cap, int *n_out, char *err, size_t errlen);
DS4_BRIDGE_API int ds4_bridge_token_text(ds4_bridge_model *m, int32_t token, char *buf, size_t cap, size_t *len_out,
                                         char *err, size_t errlen);
DS4_BRIDGE_API int ds4_bridge_detokenize(ds4_bridge_model *m, const int32_t *tokens, int n, char *buf, size_t cap,
                                         size_t *len_out, char *err, size_t errlen);
/* Renders messages with the DeepSeek-V4 chat template and tokenizes them on the special
 * path. add_generation_prompt: end with the assistant prefix; thinking: open <think>.
 * Message content is length-delimited (ds4_bridge_chat_msg.content_len). */
DS4_BRIDGE_API int ds4_bridge_render_chat(ds4_bridge_model *m, const ds4_bridge_chat_msg *msgs, int n_msgs,
                                          int add_generation_prompt, int thinking, int32_t *out, int cap, int *n_out,
                                          char *err, size_t errlen);
DS4_BRIDGE_API int32_t ds4_bridge_token_eos(ds4_bridge_model *m); /* -1 for NULL */
DS4_BRIDGE_API int ds4_bridge_token_is_stop(ds4_bridge_model *m, int32_t token); /* 1 / 0; -1 for NULL */
/* 1 when the GGUF carries a chat template (tokenizer.chat_template): a model made for chat,
 * whose prompts a host wraps with ds4_bridge_render_chat; 0 for a model of plain text
 * completion (a host should not wrap its prompts); -1 for NULL. */
DS4_BRIDGE_API int ds4_bridge_model_has_chat_template(ds4_bridge_model *m);
/* 1 when token is not plain text: a control, user-defined, unknown or unused token (its
 * text is markup such as <｜User｜>, never produced by ds4_bridge_tokenize_text); 0 for a
 * normal or byte token; -1 for NULL or an id outside the vocabulary. */
DS4_BRIDGE_API int ds4_bridge_token_is_special(ds4_bridge_model *m, int32_t token);

/* --- GGUF identification without opening the engine -------------------------------- */
typedef struct {
    char family[32];
    char name[64];
    int32_t n_layer, n_embd, n_vocab, n_head, n_expert;
    int32_t n_tensors, split_count;
    uint64_t tensor_bytes;
} ds4_bridge_gguf_info_t;

typedef struct {
    char name[128];
    char type[16];
    int32_t n_dims;
    int64_t ne[4];
    int32_t split; /* which split file holds it */
    uint64_t offset, nbytes; /* within that split's data section */
} ds4_bridge_gguf_tensor_t;

DS4_BRIDGE_API int ds4_bridge_gguf_open(ds4_bridge_gguf **out, const char *path, char *err, size_t errlen);
DS4_BRIDGE_API void ds4_bridge_gguf_free(ds4_bridge_gguf *g);
DS4_BRIDGE_API int ds4_bridge_gguf_info(ds4_bridge_gguf *g, ds4_bridge_gguf_info_t *out, char *err, size_t errlen);
DS4_BRIDGE_API int ds4_bridge_gguf_tensor(ds4_bridge_gguf *g, int index, ds4_bridge_gguf_tensor_t *out, char *err,
                                          size_t errlen);

/* === host-owned tables ================================================================
 * A host that parses the GGUF itself (the Rust binding does) hands its tables to the open
 * instead of letting the engine parse them again. They are borrowed for the _open call only:
 * the engine checks every entry, copies what it keeps (names included) and holds no pointer
 * into them once _open returns, so the host may free them right after.
 *
 * An open with a directory and a plan that describe the file exactly behaves like an open
 * without them (bit-identical logits, same fingerprint). */

/* One tensor of the host's inventory. name: NUL-terminated. type: the GGML type id as the
 * file stores it. split: 0-based index of the split file that holds it; offset: within that
 * split's data section; nbytes: must equal what type and ne make. */
typedef struct ds4_bridge_host_tensor {
    const char *name;
    uint32_t type;
    int32_t n_dims;
    int64_t ne[4];
    int32_t split;
    uint64_t offset, nbytes;
} ds4_bridge_host_tensor;

/* The host's parse of a GGUF or split set: every tensor in file order (split by split), and
 * where each split's data section starts in its file. Replaces the engine's parse of the
 * tensor tables (the engine still reads the metadata); each split's tensor count, every
 * dimension, type, size, alignment, bound and overlap is checked against the files. */
typedef struct ds4_bridge_tensor_directory {
    const ds4_bridge_host_tensor *tensors;
    int32_t n_tensors;
    int32_t n_splits;
    const uint64_t *split_data_offset; /* n_splits entries */
} ds4_bridge_tensor_directory;

/* The name -> tensor index the engine binds by: the engine's tensor names[i] is the inventory
 * entry slots[i] (the directory's when one is given, else the file's own table, in file
 * order). Every name the engine binds must be present; shapes are still checked. */
typedef struct ds4_bridge_bind_plan {
    const char *const *names;
    const int32_t *slots;
    int32_t n;
} ds4_bridge_bind_plan;

/* The tensor names the engine binds for the model g describes (a dry run of the binder that
 * also checks every shape against the metadata), NUL-terminated one after another into buf;
 * *len_out gets the bytes needed, *n_out the number of names. */
DS4_BRIDGE_API int ds4_bridge_gguf_required_tensors(ds4_bridge_gguf *g, char *buf, size_t cap, size_t *len_out,
                                                    int32_t *n_out, char *err, size_t errlen);
/* 0 when the engine can consume the plan over this inventory: the directory's entries are
 * well-formed (names, 1..4 positive dims, known supported types, nbytes matching), plan
 * names unique and non-NULL, every slot in range. With g (may be NULL) also the binder's dry
 * run through the plan: every required name present, every shape as the model expects. */
DS4_BRIDGE_API int ds4_bridge_bind_plan_check(ds4_bridge_gguf *g, const ds4_bridge_tensor_directory *inventory,
                                              const ds4_bridge_bind_plan *plan, char *err, size_t errlen);
/* Slot-by-slot identity report: identity_out[i] (plan->n entries) is 1 when inventory entry
 * slots[i] is named names[i], 0 when the plan binds names[i] to a differently named tensor,
 * -1 when the slot is out of range. */
DS4_BRIDGE_API int ds4_bridge_bind_plan_match(const ds4_bridge_tensor_directory *inventory,
                                              const ds4_bridge_bind_plan *plan, int32_t *identity_out, char *err,
                                              size_t errlen);
/* === end of host-owned tables ========================================================== */

/* --- cache memory (for a host's memory budget) --------------------------------------- */
/* A session's caches grow with the tokens it has held (entry arrays in steps), not with its
 * context: *bytes_out gets what session s occupies now (its drafter session included). */
DS4_BRIDGE_API int ds4_bridge_session_cache_bytes(ds4_bridge_session *s, uint64_t *bytes_out, char *err,
                                                  size_t errlen);
/* What a session of ctx_size created on m occupies once it has held n_tokens tokens (clamped
 * to 0..ctx_size), without a drafter session: exactly ds4_bridge_session_cache_bytes of such
 * a session, so a host can reserve it before the tokens arrive. */
DS4_BRIDGE_API int ds4_bridge_cache_bytes_for(ds4_bridge_model *m, int ctx_size, int n_tokens, uint64_t *bytes_out,
                                              char *err, size_t errlen);
/* The same for the drafter session that speculative decoding adds to such a session (same
 * context; it holds the session's tokens and its drafts): a host reserves both for a request
 * that speculates. Fails when m has no drafter. */
DS4_BRIDGE_API int ds4_bridge_drafter_cache_bytes_for(ds4_bridge_model *m, int ctx_size, int n_tokens,
                                                      uint64_t *bytes_out, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* DS4_BRIDGE_H */
