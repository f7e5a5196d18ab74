/* Exercises every function of ds4_bridge.h from C, including the error paths. Compiled as
 * C and linked against libds4 only. argv[1]: a model, argv[2]: a different model, argv[3]:
 * a scratch directory. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bridge/ds4_bridge.h"

static int failures = 0, checks = 0;
#define CHECK(cond)                                                          \
    do {                                                                     \
        ++checks;                                                            \
        if (!(cond)) {                                                       \
            ++failures;                                                      \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                    \
    } while (0)
#define CHECK_ERR(call, needle)                                                        \
    do {                                                                               \
        char e_[256];                                                                  \
        memset(e_, 'x', sizeof e_);                                                    \
        char *err = e_;                                                                \
        size_t errlen = sizeof e_;                                                     \
        (void)err, (void)errlen;                                                       \
        int rc_ = (call);                                                              \
        CHECK(rc_ != 0);                                                               \
        CHECK(memchr(e_, 0, sizeof e_) != NULL);                                       \
        if (rc_ != 0 && strstr(e_, needle) == NULL) {                                  \
            ++failures;                                                                \
            fprintf(stderr, "%s:%d: error '%s' lacks '%s'\n", __FILE__, __LINE__, e_, needle); \
        }                                                                              \
    } while (0)

static char errbuf[512];
#define E errbuf, sizeof errbuf

static void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (!p) abort();
    return p;
}

static int same_floats(const float *a, const float *b, int n) { return memcmp(a, b, sizeof(float) * (size_t)n) == 0; }

typedef struct {
    ds4_bridge_session *s;
    int calls, last_current, reentry_rejected;
    const char *ckpt_path;
    int ckpt_at;
} cb_state;

static void progress(void *ud, int32_t current, int32_t total) {
    cb_state *st = (cb_state *)ud;
    st->calls++;
    st->last_current = current;
    CHECK(current > 0 && current <= total);
    CHECK(ds4_bridge_session_pos(st->s) == current);   /* a durable frontier */
    char e[128];
    if (ds4_bridge_eval(st->s, 1, e, sizeof e) != 0 && strstr(e, "re-entered")) st->reentry_rejected++;
    if (st->calls == 1) {   /* a checkpoint taken from inside the callback */
        CHECK(ds4_bridge_session_save_payload(st->s, st->ckpt_path, e, sizeof e) == 0);
        st->ckpt_at = current;
    }
}

static long file_size(const char *p) {
    FILE *f = fopen(p, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n;
}

static unsigned char *read_file(const char *p, long *n) {
    *n = file_size(p);
    FILE *f = fopen(p, "rb");
    unsigned char *b = xmalloc((size_t)*n + 1);
    if (fread(b, 1, (size_t)*n, f) != (size_t)*n) abort();
    fclose(f);
    return b;
}

static void write_file(const char *p, const unsigned char *b, long n) {
    FILE *f = fopen(p, "wb");
    if (fwrite(b, 1, (size_t)n, f) != (size_t)n) abort();
    fclose(f);
}

struct load_seen {
    int calls;
    uint64_t done, total;
    int rising;
};

static void on_load(void *ud, uint64_t done, uint64_t total) {
    struct load_seen *s = (struct load_seen *)ud;
    if (s->calls && (done < s->done || total != s->total)) s->rising = 0;
    if (done > total) s->rising = 0;
    s->calls++;
    s->done = done;
    s->total = total;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: bridge_c_test MODEL OTHER_MODEL SCRATCH_DIR\n");
        return 2;
    }
    const char *model_path = argv[1], *other_path = argv[2], *dir = argv[3];
    char path[1024], path2[1024], ckpt[1024];

    /* ---- options and open errors ---- */
    ds4_bridge_model_open_options opt;
    ds4_bridge_model_open_options_init(&opt);
    ds4_bridge_model_open_options_init(NULL);
    CHECK(opt.backend == DS4_BRIDGE_BACKEND_CPU && opt.model_path == NULL);
    ds4_bridge_model *m = (ds4_bridge_model *)1;
    CHECK_ERR(ds4_bridge_model_open(&m, &opt, err, errlen), "model_path");
    CHECK(m == NULL);
    CHECK_ERR(ds4_bridge_model_open(NULL, &opt, err, errlen), "NULL");
    CHECK_ERR(ds4_bridge_model_open(&m, NULL, err, errlen), "NULL");
    opt.model_path = "/nonexistent/model.gguf";
    CHECK_ERR(ds4_bridge_model_open(&m, &opt, err, errlen), "nonexistent");
    opt.model_path = model_path;
    opt.backend = DS4_BRIDGE_BACKEND_CUDA;
    CHECK_ERR(ds4_bridge_model_open(&m, &opt, err, errlen), "CUDA");
    opt.backend = 7;
    CHECK_ERR(ds4_bridge_model_open(&m, &opt, err, errlen), "backend");
    opt.backend = DS4_BRIDGE_BACKEND_CPU;
    /* SSD streaming: budgets need the switch, one budget at a time, and one that cannot hold a
     * token's experts of one layer is refused. */
    opt.ssd_streaming_cache_experts = 64;
    CHECK_ERR(ds4_bridge_model_open(&m, &opt, err, errlen), "need ssd_streaming");
    opt.ssd_streaming = 1;
    opt.ssd_streaming_cache_bytes = 1u << 20;
    CHECK_ERR(ds4_bridge_model_open(&m, &opt, err, errlen), "not both");
    opt.ssd_streaming_cache_bytes = 0;
    opt.ssd_streaming_cache_experts = 1;
    CHECK_ERR(ds4_bridge_model_open(&m, &opt, err, errlen), "too small");
    opt.ssd_streaming_cache_experts = 0;
    opt.ssd_streaming_cache_bytes = 4096;
    CHECK_ERR(ds4_bridge_model_open(&m, &opt, err, errlen), "too small");
    opt.ssd_streaming_cache_bytes = 0;
    {
        /* A streamed model decodes and counts its expert reads. */
        ds4_bridge_model *sm = NULL;
        opt.ssd_streaming_cache_experts = 8;
        opt.n_threads = 2;
        CHECK(ds4_bridge_model_open(&sm, &opt, E) == 0);
        ds4_bridge_expert_stats_t es;
        CHECK(ds4_bridge_expert_stats(sm, &es, E) == 0);
        CHECK(es.streaming == 1 && es.capacity == 8 && es.acquired > 0 && es.bytes_read > 0 && es.resident <= 8);
        CHECK_ERR(ds4_bridge_expert_stats(NULL, &es, err, errlen), "NULL");
        /* One tier on the CPU: base equals the plain call's, no RAM tier below it. */
        ds4_bridge_expert_stats_ex_t ex;
        memset(&ex, 0xAB, sizeof ex);
        CHECK(ds4_bridge_expert_stats_ex(sm, &ex, sizeof ex, E) == 0);
        CHECK(ds4_bridge_expert_stats(sm, &es, E) == 0);
        CHECK(memcmp(&ex.base, &es, sizeof es) == 0);
        CHECK(ex.tiers == 1 && ex.host_misses == 0 && ex.host_bytes_read == 0 && ex.host_capacity_bytes == 0);
        /* An older caller's shorter struct: nothing written past it; a longer one: zeroed. */
        unsigned char buf[sizeof(ds4_bridge_expert_stats_ex_t) + 16];
        memset(buf, 0xCD, sizeof buf);
        CHECK(ds4_bridge_expert_stats_ex(sm, (ds4_bridge_expert_stats_ex_t *)buf, sizeof(ds4_bridge_expert_stats_t), E) == 0);
        CHECK(buf[sizeof(ds4_bridge_expert_stats_t)] == 0xCD && ((ds4_bridge_expert_stats_t *)buf)->streaming == 1);
        memset(buf, 0xCD, sizeof buf);
        CHECK(ds4_bridge_expert_stats_ex(sm, (ds4_bridge_expert_stats_ex_t *)buf, sizeof buf, E) == 0);
        CHECK(buf[sizeof buf - 1] == 0 && ((ds4_bridge_expert_stats_ex_t *)buf)->tiers == 1);
        CHECK_ERR(ds4_bridge_expert_stats_ex(sm, &ex, sizeof(ds4_bridge_expert_stats_t) - 1, err, errlen), "out_size");
        CHECK_ERR(ds4_bridge_expert_stats_ex(NULL, &ex, sizeof ex, err, errlen), "NULL");
        CHECK_ERR(ds4_bridge_expert_stats_ex(sm, NULL, sizeof ex, err, errlen), "NULL");
        ds4_bridge_model_free(sm);
        opt.ssd_streaming_cache_experts = 0;
        opt.n_threads = 0;
    }
    opt.ssd_streaming = 0;
    opt.mtp_draft_tokens = 3;
    CHECK_ERR(ds4_bridge_model_open(&m, &opt, err, errlen), "speculative");
    opt.mtp_draft_tokens = 0;
    opt.n_threads = -1;
    CHECK_ERR(ds4_bridge_model_open(&m, &opt, err, errlen), "n_threads");
    opt.n_threads = 2;
    opt.defer_boot_prewarm = 1;
    CHECK(ds4_bridge_model_open(&m, &opt, E) == 0);
    CHECK(m != NULL);
    CHECK(ds4_bridge_model_boot_prewarm(m, E) == 0);
    CHECK_ERR(ds4_bridge_model_boot_prewarm(NULL, err, errlen), "NULL");
    {
        /* With progress: rising byte counts ending at the total, once per call at least. */
        struct load_seen ls = {0, 0, 0, 1};
        CHECK(ds4_bridge_model_boot_prewarm_cb(m, on_load, &ls, E) == 0);
        CHECK(ls.calls >= 1 && ls.rising && ls.total > 0 && ls.done == ls.total);
        CHECK(ds4_bridge_model_boot_prewarm_cb(m, NULL, NULL, E) == 0);
        CHECK_ERR(ds4_bridge_model_boot_prewarm_cb(NULL, on_load, &ls, err, errlen), "NULL");
    }
    CHECK(ds4_bridge_drafter_shared(m) == 0);
    {
        ds4_bridge_expert_stats_t es;
        CHECK(ds4_bridge_expert_stats(m, &es, E) == 0);
        CHECK(es.streaming == 0 && es.misses == 0 && es.bytes_read == 0);
        ds4_bridge_expert_stats_ex_t ex;
        CHECK(ds4_bridge_expert_stats_ex(m, &ex, sizeof ex, E) == 0);
        CHECK(ex.tiers == 0 && ex.base.streaming == 0);
    }

    /* ---- model info ---- */
    const int V = ds4_bridge_model_vocab_size(m);
    CHECK(V > 0);
    CHECK(ds4_bridge_model_vocab_size(NULL) == -1);
    ds4_bridge_model_info_t info;
    CHECK(ds4_bridge_model_info(m, &info, E) == 0);
    CHECK(strcmp(info.family, "deepseek4") == 0 && info.n_vocab == V && info.n_layer > 0);
    CHECK(info.fingerprint == ds4_bridge_model_fingerprint(m) && info.fingerprint != 0);
    CHECK(ds4_bridge_model_fingerprint(NULL) == 0);
    CHECK_ERR(ds4_bridge_model_info(NULL, &info, err, errlen), "NULL");
    CHECK_ERR(ds4_bridge_model_info(m, NULL, err, errlen), "NULL");
    ds4_bridge_memory_t mem;
    CHECK(ds4_bridge_memory_stats(m, &mem, E) == 0 && mem.weights_bytes > 0 && mem.cache_bytes == 0);
    CHECK_ERR(ds4_bridge_memory_stats(NULL, &mem, err, errlen), "NULL");
    CHECK_ERR(ds4_bridge_memory_stats(m, NULL, err, errlen), "NULL");

    /* ---- sessions: create errors ---- */
    ds4_bridge_session *s = NULL;
    CHECK_ERR(ds4_bridge_session_create(&s, NULL, 64, err, errlen), "NULL");
    CHECK_ERR(ds4_bridge_session_create(&s, m, 0, err, errlen), "ctx");
    CHECK_ERR(ds4_bridge_session_create(&s, m, -5, err, errlen), "ctx");
    CHECK_ERR(ds4_bridge_session_create(NULL, m, 64, err, errlen), "NULL");
    const int CTX = 700;
    CHECK(ds4_bridge_session_create(&s, m, CTX, E) == 0);
    CHECK(ds4_bridge_memory_stats(m, &mem, E) == 0 && mem.cache_bytes > 0);
    CHECK(ds4_bridge_session_ctx(s) == CTX && ds4_bridge_session_pos(s) == 0);
    CHECK(ds4_bridge_session_ctx(NULL) == -1 && ds4_bridge_session_pos(NULL) == -1);
    CHECK(ds4_bridge_session_prefill_cap(s) > 0 && ds4_bridge_session_prefill_cap(NULL) == -1);
    CHECK(ds4_bridge_session_generation(NULL) == 0);
    int32_t am = -1;
    CHECK_ERR(ds4_bridge_session_argmax(s, &am, err, errlen), "no logits");
    float *lg = xmalloc(sizeof(float) * (size_t)V), *lg2 = xmalloc(sizeof(float) * (size_t)V);
    CHECK_ERR(ds4_bridge_session_logits(s, lg, V, err, errlen), "no logits");

    /* ---- sync / eval and their errors ---- */
    int32_t toks[650];
    uint32_t r = 12345;
    for (int i = 0; i < 650; ++i) {
        r = r * 1103515245u + 12345u;
        toks[i] = (int32_t)((r >> 8) % (uint32_t)V);
    }
    CHECK_ERR(ds4_bridge_session_sync(NULL, toks, 4, err, errlen), "NULL");
    CHECK_ERR(ds4_bridge_session_sync(s, NULL, 4, err, errlen), "NULL");
    CHECK_ERR(ds4_bridge_session_sync(s, toks, 0, err, errlen), "positive");
    CHECK_ERR(ds4_bridge_session_sync(s, toks, -3, err, errlen), "positive");
    {
        ds4_bridge_session *small = NULL;
        CHECK(ds4_bridge_session_create(&small, m, 16, E) == 0);
        CHECK_ERR(ds4_bridge_session_sync(small, toks, 17, err, errlen), "does not fit");
        CHECK(ds4_bridge_session_sync(small, toks, 16, E) == 0);
        CHECK_ERR(ds4_bridge_eval(small, 1, err, errlen), "context full");
        CHECK(ds4_bridge_session_pos(small) == 16);
        ds4_bridge_session_free(small);
    }
    CHECK(ds4_bridge_session_sync(s, toks, 20, E) == 0);
    CHECK(ds4_bridge_session_pos(s) == 20);
    const uint64_t gen = ds4_bridge_session_generation(s);
    CHECK(ds4_bridge_session_logits(s, lg, V, E) == 0);
    int32_t badt[21];
    memcpy(badt, toks, sizeof(int32_t) * 20);
    badt[20] = V;
    CHECK_ERR(ds4_bridge_session_sync(s, badt, 21, err, errlen), "out of range");
    badt[20] = -7;
    CHECK_ERR(ds4_bridge_session_sync(s, badt, 21, err, errlen), "out of range");
    CHECK_ERR(ds4_bridge_eval(s, V, err, errlen), "out of range");
    CHECK_ERR(ds4_bridge_eval(NULL, 1, err, errlen), "NULL");
    CHECK(ds4_bridge_session_pos(s) == 20 && ds4_bridge_session_generation(s) == gen);
    CHECK(ds4_bridge_session_logits(s, lg2, V, E) == 0 && same_floats(lg, lg2, V));
    CHECK_ERR(ds4_bridge_session_logits(s, lg2, V - 1, err, errlen), "too small");
    CHECK_ERR(ds4_bridge_session_logits(s, NULL, V, err, errlen), "NULL");
    CHECK_ERR(ds4_bridge_session_logits(NULL, lg2, V, err, errlen), "NULL");
    CHECK(ds4_bridge_session_argmax(s, &am, E) == 0);
    CHECK(am >= 0 && am < V);
    for (int i = 0; i < V; ++i) CHECK(lg[i] <= lg[am]);
    CHECK_ERR(ds4_bridge_session_argmax(NULL, &am, err, errlen), "NULL");
    CHECK_ERR(ds4_bridge_session_argmax(s, NULL, err, errlen), "NULL");
    uint64_t rng = 99, rng2 = 99;
    int32_t t1 = -1, t2 = -2;
    CHECK(ds4_bridge_session_sample(s, 0.f, 0, 1.f, 0.f, NULL, &t1, E) == 0 && t1 == am);
    CHECK(ds4_bridge_session_sample(s, 0.9f, 20, 0.95f, 0.01f, &rng, &t1, E) == 0);
    CHECK(ds4_bridge_session_sample(s, 0.9f, 20, 0.95f, 0.01f, &rng2, &t2, E) == 0);
    CHECK(t1 >= 0 && t1 < V && t1 == t2);
    CHECK_ERR(ds4_bridge_session_sample(s, 0.9f, 0, 1.f, 0.f, NULL, &t1, err, errlen), "rng");
    CHECK_ERR(ds4_bridge_session_sample(s, 0.9f, 0, 0.f, 0.f, &rng, &t1, err, errlen), "top_p");
    CHECK_ERR(ds4_bridge_session_sample(s, 0.9f, -1, 1.f, 0.f, &rng, &t1, err, errlen), "top_k");
    CHECK_ERR(ds4_bridge_session_sample(s, 0.f, 0, 1.f, 0.f, NULL, NULL, err, errlen), "NULL");
    CHECK_ERR(ds4_bridge_session_sample(NULL, 0.f, 0, 1.f, 0.f, &rng, &t1, err, errlen), "NULL");
    int32_t ids[5];
    float lps[5];
    int n_top = 0;
    CHECK(ds4_bridge_session_top_logprobs(s, 5, ids, lps, &n_top, E) == 0 && n_top == 5 && ids[0] == am && lps[0] <= 0.f);
    CHECK_ERR(ds4_bridge_session_top_logprobs(s, -1, ids, lps, &n_top, err, errlen), "n must");
    CHECK_ERR(ds4_bridge_session_top_logprobs(s, 5, NULL, lps, &n_top, err, errlen), "NULL");
    CHECK(ds4_bridge_eval(s, toks[20], E) == 0 && ds4_bridge_session_pos(s) == 21);

    /* ---- speculative decoding from C ---- */
    {
        int32_t stoks[8], sarg[8];
        int acc = -1;
        ds4_bridge_spec_counters_t sc;
        /* No drafter: always fall back, nothing changes. */
        CHECK(ds4_bridge_spec_trial(s, am, 0.f, 0, 1.f, 0.f, NULL, 4, stoks, sarg, 8, &acc, E) == 0);
        CHECK(ds4_bridge_session_pos(s) == 21);
        CHECK(ds4_bridge_spec_counters(m, &sc, E) == 0 && sc.draft_max == 0 && sc.trials == 0);
        CHECK_ERR(ds4_bridge_spec_trial(s, am, 0.f, 0, 1.f, 0.f, NULL, 4, NULL, sarg, 8, &acc, err, errlen), "NULL");
        CHECK_ERR(ds4_bridge_spec_commit(s, 1, err, errlen), "no speculative trial");
        /* A drafter of another vocabulary is refused at open; the model itself is accepted. */
        ds4_bridge_model_open_options so;
        ds4_bridge_model_open_options_init(&so);
        so.model_path = model_path;
        so.n_threads = 1;
        so.drafter_path = other_path;
        ds4_bridge_model *sm = NULL;
        CHECK_ERR(ds4_bridge_model_open(&sm, &so, err, errlen), "vocabulary");
        so.drafter_path = model_path;
        so.draft_max = 3;
        CHECK(ds4_bridge_model_open(&sm, &so, E) == 0);
        CHECK(ds4_bridge_drafter_shared(sm) == 0);
        ds4_bridge_session *ss = NULL;
        CHECK(ds4_bridge_session_create(&ss, sm, 64, E) == 0);
        CHECK(ds4_bridge_session_sync(ss, toks, 10, E) == 0);
        int32_t first = -1;
        CHECK(ds4_bridge_session_argmax(ss, &first, E) == 0);
        const int w = ds4_bridge_spec_trial(ss, first, 0.f, 0, 1.f, 0.f, NULL, 16, stoks, sarg, 8, &acc, E);
        CHECK(w >= 2 && w <= 4 && stoks[0] == first && acc == w - 1); /* a drafter equal to the model is always right */
        CHECK(ds4_bridge_spec_commit(ss, acc + 1, E) == 0 && ds4_bridge_session_pos(ss) == 10 + acc + 1);
        CHECK(ds4_bridge_session_spec_counters(ss, &sc, E) == 0 && sc.trials == 1 && sc.accepted == (uint64_t)acc &&
              sc.draft_max == 3);
        /* The same through a batch step (ds4_bridge_batch_eval_spec), after a reset. */
        CHECK(ds4_bridge_session_spec_reset(ss, E) == 0);
        ds4_bridge_batch *sb = NULL;
        CHECK(ds4_bridge_batch_create(&sb, sm, E) == 0);
        ds4_bridge_spec_row row;
        memset(&row, 0, sizeof row);
        row.session = ss;
        row.pending = sarg[acc];
        row.max_new = 16;
        row.tokens = stoks;
        row.argmax = sarg;
        row.cap = 8;
        const int32_t pos0 = ds4_bridge_session_pos(ss);
        CHECK(ds4_bridge_batch_eval_spec(sb, NULL, NULL, 0, NULL, &row, 1, E) == 0);
        CHECK(row.width >= 2 && row.width <= 4 && row.accepted == row.width - 1 && stoks[0] == row.pending);
        CHECK_ERR(ds4_bridge_session_spec_reset(ss, err, errlen), "pending");
        CHECK(ds4_bridge_spec_commit(ss, row.accepted + 1, E) == 0 && ds4_bridge_session_pos(ss) == pos0 + row.accepted + 1);
        ds4_bridge_batch_free(sb);
        ds4_bridge_session_free(ss);
        ds4_bridge_model_free(sm);
    }

    /* ---- rewind / invalidate ---- */
    CHECK_ERR(ds4_bridge_session_rewind(s, 100, err, errlen), "0..21");   /* out of range: an error, no change */
    CHECK_ERR(ds4_bridge_session_rewind(s, -1, err, errlen), "0..21");
    CHECK_ERR(ds4_bridge_session_rewind(NULL, 3, err, errlen), "NULL");
    CHECK(ds4_bridge_session_pos(s) == 21);
    CHECK(ds4_bridge_session_rewind(s, 20, E) == 0);
    CHECK(ds4_bridge_session_pos(s) == 20 && ds4_bridge_session_generation(s) > gen);
    CHECK_ERR(ds4_bridge_session_argmax(s, &t1, err, errlen), "no logits");
    CHECK(ds4_bridge_eval(s, toks[20], E) == 0);
    CHECK(ds4_bridge_session_rewind(s, 20, E) == 0);
    CHECK(ds4_bridge_session_sync(s, toks, 20, E) == 0);   /* re-derives position 19's logits */
    CHECK(ds4_bridge_session_logits(s, lg2, V, E) == 0 && same_floats(lg, lg2, V));
    const uint64_t g2 = ds4_bridge_session_generation(s);
    CHECK(ds4_bridge_session_invalidate(s, E) == 0);
    CHECK_ERR(ds4_bridge_session_invalidate(NULL, err, errlen), "NULL");
    CHECK(ds4_bridge_session_pos(s) == 0 && ds4_bridge_session_generation(s) > g2);

    /* ---- sync_cb: progress at chunk frontiers, re-entry, checkpoint from the callback ---- */
    snprintf(ckpt, sizeof ckpt, "%s/ckpt.payload", dir);
    cb_state st = {s, 0, 0, 0, ckpt, 0};
    CHECK(ds4_bridge_session_sync_cb(s, toks, 600, progress, &st, E) == 0);
    const int cap = ds4_bridge_session_prefill_cap(s);
    CHECK(st.calls == (600 + cap - 1) / cap && st.last_current == 600);
    CHECK(st.reentry_rejected == st.calls);
    CHECK(ds4_bridge_session_pos(s) == 600);
    CHECK(ds4_bridge_session_logits(s, lg, V, E) == 0);
    {
        ds4_bridge_session *a = NULL, *b = NULL;
        CHECK(ds4_bridge_session_create(&a, m, CTX, E) == 0 && ds4_bridge_session_create(&b, m, CTX, E) == 0);
        CHECK(ds4_bridge_session_load_payload(a, ckpt, E) == 0);
        CHECK(ds4_bridge_session_pos(a) == st.ckpt_at);
        CHECK(ds4_bridge_session_sync(b, toks, st.ckpt_at, E) == 0);
        CHECK(ds4_bridge_session_logits(a, lg2, V, E) == 0);
        float *lb = xmalloc(sizeof(float) * (size_t)V);
        CHECK(ds4_bridge_session_logits(b, lb, V, E) == 0 && same_floats(lb, lg2, V));
        /* continuing from the checkpoint reaches the uninterrupted session's state */
        CHECK(ds4_bridge_session_sync(a, toks, 600, E) == 0 && ds4_bridge_session_logits(a, lg2, V, E) == 0);
        CHECK(same_floats(lg, lg2, V));
        free(lb);
        ds4_bridge_session_free(a);
        ds4_bridge_session_free(b);
    }

    /* ---- payloads: round trip at several positions, file and memory, range ---- */
    const int at[] = {5, 12, 31, 33, 600};
    for (size_t k = 0; k < sizeof at / sizeof at[0]; ++k) {
        ds4_bridge_session *a = NULL, *b = NULL;
        CHECK(ds4_bridge_session_create(&a, m, CTX, E) == 0 && ds4_bridge_session_create(&b, m, CTX, E) == 0);
        CHECK(ds4_bridge_session_sync(a, toks, at[k], E) == 0);
        snprintf(path, sizeof path, "%s/p%d.payload", dir, at[k]);
        CHECK(ds4_bridge_session_save_payload(a, path, E) == 0);
        CHECK(ds4_bridge_session_load_payload(b, path, E) == 0);
        CHECK(ds4_bridge_session_pos(b) == at[k]);
        for (int i = at[k]; i < at[k] + 8 && i < 650; ++i) {
            CHECK(ds4_bridge_session_logits(a, lg, V, E) == 0 && ds4_bridge_session_logits(b, lg2, V, E) == 0);
            CHECK(same_floats(lg, lg2, V));
            int32_t ta = -1, tb = -2;
            CHECK(ds4_bridge_session_argmax(a, &ta, E) == 0 && ds4_bridge_session_argmax(b, &tb, E) == 0 && ta == tb);
            CHECK(ds4_bridge_eval(a, toks[i], E) == 0 && ds4_bridge_eval(b, toks[i], E) == 0);
        }
        ds4_bridge_session_free(a);
        ds4_bridge_session_free(b);
    }
    /* memory form + a payload inside a larger file */
    uint64_t psz = 0;
    CHECK(ds4_bridge_session_payload_size(s, &psz, E) == 0 && psz > 0);
    CHECK_ERR(ds4_bridge_session_payload_size(NULL, &psz, err, errlen), "NULL");
    CHECK_ERR(ds4_bridge_session_payload_size(s, NULL, err, errlen), "NULL");
    unsigned char *pbuf = xmalloc((size_t)psz + 200);
    size_t plen = 0;
    CHECK_ERR(ds4_bridge_session_save_payload_mem(s, pbuf, 10, &plen, err, errlen), "too small");
    CHECK(plen == psz);
    CHECK(ds4_bridge_session_save_payload_mem(s, pbuf + 100, (size_t)psz, &plen, E) == 0 && plen == psz);
    memset(pbuf, 0xAB, 100);
    memset(pbuf + 100 + psz, 0xCD, 100);
    snprintf(path, sizeof path, "%s/container.bin", dir);
    write_file(path, pbuf, (long)psz + 200);
    {
        ds4_bridge_session *b = NULL;
        CHECK(ds4_bridge_session_create(&b, m, CTX, E) == 0);
        CHECK(ds4_bridge_session_load_payload_range(b, path, 100, psz, E) == 0 && ds4_bridge_session_pos(b) == 600);
        CHECK(ds4_bridge_session_logits(b, lg2, V, E) == 0 && ds4_bridge_session_logits(s, lg, V, E) == 0 && same_floats(lg, lg2, V));
        CHECK(ds4_bridge_session_load_payload_mem(b, pbuf + 100, (size_t)psz, E) == 0);
        /* ranges that include foreign bytes, or cut the payload, are rejected */
        CHECK_ERR(ds4_bridge_session_load_payload_range(b, path, 100, psz + 1, err, errlen), "");
        CHECK_ERR(ds4_bridge_session_load_payload_range(b, path, 99, psz, err, errlen), "");
        CHECK_ERR(ds4_bridge_session_load_payload_range(b, path, 100, psz + 1000, err, errlen), "outside");
        CHECK_ERR(ds4_bridge_session_load_payload(b, path, err, errlen), "");
        ds4_bridge_session_free(b);
    }

    /* ---- rejected payloads leave the session exactly as it was ---- */
    {
        ds4_bridge_session *b = NULL;
        CHECK(ds4_bridge_session_create(&b, m, CTX, E) == 0);
        CHECK(ds4_bridge_session_sync(b, toks, 9, E) == 0);
        const uint64_t gb = ds4_bridge_session_generation(b);
        CHECK(ds4_bridge_session_logits(b, lg, V, E) == 0);
        snprintf(path, sizeof path, "%s/p31.payload", dir);
        long n = 0;
        unsigned char *good = read_file(path, &n);
        snprintf(path2, sizeof path2, "%s/bad.payload", dir);
        write_file(path2, good, n - 1); /* truncated */
        CHECK_ERR(ds4_bridge_session_load_payload(b, path2, err, errlen), "");
        good[60] ^= 0x10; /* bit flip inside the token ids */
        write_file(path2, good, n);
        CHECK_ERR(ds4_bridge_session_load_payload(b, path2, err, errlen), "");
        good[60] ^= 0x10;
        good[4] = 2; /* older format version */
        write_file(path2, good, n);
        CHECK_ERR(ds4_bridge_session_load_payload(b, path2, err, errlen), "version");
        good[4] = 3;
        good[n - 20] ^= 0x40; /* a flipped bit in the engine tail: caught by the tail checksum */
        write_file(path2, good, n);
        CHECK_ERR(ds4_bridge_session_load_payload(b, path2, err, errlen), "checksum");
        good[n - 20] ^= 0x40;
        CHECK_ERR(ds4_bridge_session_load_payload(b, "/nonexistent/x", err, errlen), "nonexistent");
        CHECK_ERR(ds4_bridge_session_load_payload(NULL, path, err, errlen), "NULL");
        CHECK_ERR(ds4_bridge_session_load_payload(b, NULL, err, errlen), "empty");
        CHECK_ERR(ds4_bridge_session_load_payload_mem(b, NULL, 10, err, errlen), "NULL");
        CHECK_ERR(ds4_bridge_session_load_payload_mem(b, good, 20, err, errlen), "");
        ds4_bridge_session *tiny = NULL;
        CHECK(ds4_bridge_session_create(&tiny, m, 16, E) == 0);
        CHECK_ERR(ds4_bridge_session_load_payload(tiny, path, err, errlen), "fit");
        ds4_bridge_session_free(tiny);
        /* wrong model */
        ds4_bridge_model_open_options o2;
        ds4_bridge_model_open_options_init(&o2);
        o2.model_path = other_path;
        o2.defer_boot_prewarm = 1;
        ds4_bridge_model *m2 = NULL;
        CHECK(ds4_bridge_model_open(&m2, &o2, E) == 0);
        ds4_bridge_session *s2 = NULL;
        CHECK(ds4_bridge_session_create(&s2, m2, CTX, E) == 0);
        CHECK_ERR(ds4_bridge_session_load_payload(s2, path, err, errlen), "different model");
        CHECK(ds4_bridge_session_pos(s2) == 0);
        ds4_bridge_session_free(s2);
        ds4_bridge_model_free(m2);
        CHECK(ds4_bridge_session_pos(b) == 9 && ds4_bridge_session_generation(b) == gb);
        CHECK(ds4_bridge_session_logits(b, lg2, V, E) == 0 && same_floats(lg, lg2, V));
        free(good);
        ds4_bridge_session_free(b);
    }
    CHECK_ERR(ds4_bridge_session_save_payload(s, "/nonexistent/dir/x.payload", err, errlen), "nonexistent");
    CHECK_ERR(ds4_bridge_session_save_payload(s, NULL, err, errlen), "empty");
    CHECK_ERR(ds4_bridge_session_save_payload(NULL, path, err, errlen), "NULL");

    /* ---- tokenizer ---- */
    int32_t tk[256];
    int nt = 0;
    CHECK(ds4_bridge_tokenize_text(m, "hello, world", 12, tk, 256, &nt, E) == 0 && nt > 0);
    char text[1024];
    size_t tl = 0;
    CHECK(ds4_bridge_detokenize(m, tk, nt, text, sizeof text, &tl, E) == 0 && strcmp(text, "hello, world") == 0 && tl == 12);
    CHECK_ERR(ds4_bridge_detokenize(m, tk, nt, text, 5, &tl, err, errlen), "too small");
    CHECK(tl == 12);
    CHECK_ERR(ds4_bridge_detokenize(m, NULL, 3, text, sizeof text, &tl, err, errlen), "NULL");
    int32_t bogus = V + 10;
    CHECK_ERR(ds4_bridge_detokenize(m, &bogus, 1, text, sizeof text, &tl, err, errlen), "");
    CHECK_ERR(ds4_bridge_tokenize_text(m, "hello, world", 12, tk, 1, &nt, err, errlen), "too small");
    CHECK(nt > 1);
    CHECK_ERR(ds4_bridge_tokenize_text(NULL, "x", 1, tk, 256, &nt, err, errlen), "NULL");
    CHECK_ERR(ds4_bridge_tokenize_text(m, NULL, 1, tk, 256, &nt, err, errlen), "NULL");
    CHECK(ds4_bridge_tokenize_text(m, NULL, 0, tk, 256, &nt, E) == 0 && nt == 0);
    CHECK_ERR(ds4_bridge_tokenize_text(m, "x", 1, tk, -1, &nt, err, errlen), "");
    CHECK(ds4_bridge_tokenize_rendered_chat(m, "abc", 3, tk, 256, &nt, E) == 0 && nt > 0);
    CHECK_ERR(ds4_bridge_tokenize_rendered_chat(m, NULL, 3, tk, 256, &nt, err, errlen), "NULL");
    CHECK(ds4_bridge_token_text(m, tk[0], text, sizeof text, &tl, E) == 0 && tl > 0);
    CHECK_ERR(ds4_bridge_token_text(m, -1, text, sizeof text, &tl, err, errlen), "range");
    CHECK_ERR(ds4_bridge_token_text(m, V, text, sizeof text, &tl, err, errlen), "range");
    CHECK_ERR(ds4_bridge_token_text(NULL, 1, text, sizeof text, &tl, err, errlen), "NULL");
    const int32_t eos = ds4_bridge_token_eos(m);
    CHECK(eos >= 0 && eos < V && ds4_bridge_token_eos(NULL) == -1);
    CHECK(ds4_bridge_token_is_stop(m, eos) == 1 && ds4_bridge_token_is_stop(NULL, eos) == -1);
    /* The generated model: no chat template; EOS is markup, a byte of text is not. */
    CHECK(ds4_bridge_model_has_chat_template(m) == 0 && ds4_bridge_model_has_chat_template(NULL) == -1);
    CHECK(ds4_bridge_token_is_special(m, eos) == 1);
    CHECK(ds4_bridge_tokenize_text(m, "a", 1, tk, 256, &nt, E) == 0 && nt == 1 && ds4_bridge_token_is_special(m, tk[0]) == 0);
    CHECK(ds4_bridge_token_is_special(m, -1) == -1 && ds4_bridge_token_is_special(m, V) == -1 &&
          ds4_bridge_token_is_special(NULL, 0) == -1);
    ds4_bridge_chat_msg msgs[2] = {{"system", "be brief", 8}, {"user", "hi", 2}};
    CHECK(ds4_bridge_render_chat(m, msgs, 2, 1, 0, tk, 256, &nt, E) == 0 && nt > 2);
    ds4_bridge_chat_msg badm = {"robot", "x", 1};
    CHECK_ERR(ds4_bridge_render_chat(m, &badm, 1, 1, 0, tk, 256, &nt, err, errlen), "");
    CHECK_ERR(ds4_bridge_render_chat(m, NULL, 1, 1, 0, tk, 256, &nt, err, errlen), "NULL");
    CHECK_ERR(ds4_bridge_render_chat(NULL, msgs, 2, 1, 0, tk, 256, &nt, err, errlen), "NULL");

    /* ---- a batch step from C: two sessions, 3 prefill tokens and 1 decode token ---- */
    {
        ds4_bridge_session *a = NULL, *b = NULL, *ra = NULL, *rb = NULL;
        ds4_bridge_batch *bt = NULL;
        CHECK(ds4_bridge_session_create(&a, m, 64, E) == 0 && ds4_bridge_session_create(&b, m, 64, E) == 0);
        CHECK(ds4_bridge_session_create(&ra, m, 64, E) == 0 && ds4_bridge_session_create(&rb, m, 64, E) == 0);
        CHECK(ds4_bridge_session_sync(b, toks, 5, E) == 0 && ds4_bridge_session_sync(rb, toks, 5, E) == 0);
        CHECK(ds4_bridge_batch_create(&bt, m, E) == 0 && bt != NULL);
        ds4_bridge_session *ss[2] = {a, b};
        const int32_t counts[2] = {3, 1};
        const int32_t bt_toks[4] = {toks[30], toks[31], toks[32], toks[5]};
        CHECK(ds4_bridge_batch_eval(bt, ss, counts, 2, bt_toks, E) == 0);
        CHECK(ds4_bridge_session_pos(a) == 3 && ds4_bridge_session_pos(b) == 6);
        /* Each equals its tokens evaluated alone. */
        CHECK(ds4_bridge_session_sync(ra, &toks[30], 3, E) == 0 && ds4_bridge_eval(rb, toks[5], E) == 0);
        CHECK(ds4_bridge_session_logits(a, lg, V, E) == 0 && ds4_bridge_session_logits(ra, lg2, V, E) == 0);
        CHECK(same_floats(lg, lg2, V));
        CHECK(ds4_bridge_session_logits(b, lg, V, E) == 0 && ds4_bridge_session_logits(rb, lg2, V, E) == 0);
        CHECK(same_floats(lg, lg2, V));
        ds4_bridge_batch_stats_t bs;
        CHECK(ds4_bridge_batch_stats(bt, &bs, E) == 0 && bs.steps == 1 && bs.rows == 4 && bs.sessions == 2);
        ds4_bridge_session *dup[2] = {a, a};
        CHECK_ERR(ds4_bridge_batch_eval(bt, dup, counts, 2, bt_toks, err, errlen), "twice");
        CHECK(ds4_bridge_session_pos(a) == 3);
        CHECK_ERR(ds4_bridge_batch_eval(NULL, ss, counts, 2, bt_toks, err, errlen), "NULL");
        ds4_bridge_batch_free(bt);
        ds4_bridge_batch_free(NULL);
        ds4_bridge_session_free(a);
        ds4_bridge_session_free(b);
        ds4_bridge_session_free(ra);
        ds4_bridge_session_free(rb);
    }

    /* ---- GGUF identification ---- */
    ds4_bridge_gguf *g = NULL;
    CHECK(ds4_bridge_gguf_open(&g, model_path, E) == 0);
    ds4_bridge_gguf_info_t gi;
    CHECK(ds4_bridge_gguf_info(g, &gi, E) == 0);
    CHECK(strcmp(gi.family, "deepseek4") == 0 && gi.n_vocab == V && gi.n_tensors > 0 && gi.split_count == 1);
    ds4_bridge_gguf_tensor_t ti;
    CHECK(ds4_bridge_gguf_tensor(g, 0, &ti, E) == 0 && ti.name[0] && ti.n_dims >= 1 && ti.nbytes > 0);
    CHECK_ERR(ds4_bridge_gguf_tensor(g, gi.n_tensors, &ti, err, errlen), "range");
    CHECK_ERR(ds4_bridge_gguf_tensor(g, -1, &ti, err, errlen), "range");
    CHECK_ERR(ds4_bridge_gguf_info(NULL, &gi, err, errlen), "NULL");
    ds4_bridge_gguf_free(g);
    ds4_bridge_gguf_free(NULL);
    CHECK_ERR(ds4_bridge_gguf_open(&g, "/nonexistent.gguf", err, errlen), "nonexistent");
    snprintf(path, sizeof path, "%s/garbage.gguf", dir);
    write_file(path, (const unsigned char *)"GGUFnotreally", 13);
    CHECK_ERR(ds4_bridge_gguf_open(&g, path, err, errlen), "");
    opt.model_path = path;
    { ds4_bridge_model *mx = NULL; CHECK_ERR(ds4_bridge_model_open(&mx, &opt, err, errlen), ""); CHECK(mx == NULL); }

    ds4_bridge_session_free(s);
    ds4_bridge_session_free(NULL);
    ds4_bridge_model_free(m);
    ds4_bridge_model_free(NULL);
    free(lg);
    free(lg2);
    free(pbuf);
    printf("%d passed, %d failed\n", checks - failures, failures);
    return failures ? 1 : 0;
}
