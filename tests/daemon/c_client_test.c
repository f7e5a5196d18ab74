/* libds4client's C ABI, compiled as C, against a running ds4d: every call and its error
 * paths. Usage: ds4-c-client-test SOCKET. Exit 0 when every check passed. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "client/ds4client.h"

static int failures = 0;

#define CHECK(cond, ...)                                          \
    do {                                                          \
        if (!(cond)) {                                            \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                         \
            fprintf(stderr, "\n");                                \
            ++failures;                                           \
        }                                                         \
    } while (0)

struct collect {
    int32_t tokens[64];
    size_t n;
    size_t chunks;
    size_t stop_after;
};

struct collect_lp {
    int32_t tokens[64];
    float logprob[64], top_first[64];
    int32_t top_token[64];
    size_t n, with_lp, bad_order;
};

static int on_chunk_ex(void *ud, const int32_t *tokens, size_t n_tokens, const char *text, size_t text_len,
                       const ds4c_token_logprob *lp) {
    struct collect_lp *c = (struct collect_lp *)ud;
    (void)text;
    (void)text_len;
    for (size_t i = 0; i < n_tokens && c->n < 64; ++i) {
        if (lp) {
            ++c->with_lp;
            c->logprob[c->n] = lp[i].logprob;
            c->top_first[c->n] = lp[i].n_top ? lp[i].top_logprobs[0] : 1.0f;
            c->top_token[c->n] = lp[i].n_top ? lp[i].top_tokens[0] : -1;
            for (size_t k = 1; k < lp[i].n_top; ++k)
                if (lp[i].top_logprobs[k] > lp[i].top_logprobs[k - 1] || lp[i].n_top != 3) ++c->bad_order;
        }
        c->tokens[c->n++] = tokens[i];
    }
    return 0;
}

static int on_chunk(void *ud, const int32_t *tokens, size_t n_tokens, const char *text, size_t text_len) {
    struct collect *c = (struct collect *)ud;
    (void)text;
    (void)text_len;
    for (size_t i = 0; i < n_tokens && c->n < 64; ++i) c->tokens[c->n++] = tokens[i];
    ++c->chunks;
    return c->stop_after && c->n >= c->stop_after;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s SOCKET\n", argv[0]);
        return 2;
    }
    char err[512];
    ds4c_client *c = NULL;

    /* Connection errors. */
    CHECK(ds4c_connect(NULL, argv[1], err, sizeof err) == DS4C_ERR_ARG, "NULL out");
    CHECK(ds4c_connect(&c, "/nonexistent/ds4.sock", err, sizeof err) == DS4C_ERR_CONNECT, "%s", err);
    CHECK(c == NULL, "handle set on failure");
    CHECK(strstr(err, "cannot connect") != NULL, "message: %s", err);

    int rc = ds4c_connect(&c, argv[1], err, sizeof err);
    CHECK(rc == DS4C_OK, "connect: %s", err);
    if (rc != DS4C_OK) return 1;

    ds4c_model_info mi;
    CHECK(ds4c_get_model_info(c, &mi, err, sizeof err) == DS4C_OK, "%s", err);
    CHECK(mi.n_vocab > 0 && strcmp(mi.family, "deepseek4") == 0, "family %s vocab %u", mi.family, mi.n_vocab);
    CHECK(ds4c_get_model_info(NULL, &mi, err, sizeof err) == DS4C_ERR_ARG, "NULL client");
    CHECK(ds4c_get_model_info(c, NULL, err, sizeof err) == DS4C_ERR_ARG, "NULL out");

    /* Tokenize / detokenize round trip, and too-small buffers. */
    int32_t toks[64];
    size_t n = 0;
    CHECK(ds4c_tokenize(c, "hello world", 11, toks, 64, &n, err, sizeof err) == DS4C_OK, "%s", err);
    CHECK(n > 0, "no tokens");
    size_t need = 0;
    CHECK(ds4c_tokenize(c, "hello world", 11, toks, 1, &need, err, sizeof err) == (n > 1 ? DS4C_ERR_ARG : DS4C_OK), "small cap");
    CHECK(need == n, "needed %zu, have %zu", need, n);
    char text[256];
    size_t len = 0;
    CHECK(ds4c_detokenize(c, toks, n, text, sizeof text, &len, err, sizeof err) == DS4C_OK, "%s", err);
    CHECK(strcmp(text, "hello world") == 0, "round trip gave '%s'", text);
    CHECK(ds4c_detokenize(c, toks, n, text, 3, &len, err, sizeof err) == DS4C_ERR_ARG, "small buffer accepted");
    CHECK(len == strlen("hello world"), "len %zu", len);
    CHECK(ds4c_tokenize(c, NULL, 3, toks, 64, &n, err, sizeof err) == DS4C_ERR_ARG, "NULL text");
    /* Text is length-delimited: a NUL byte is text, and what follows it is not dropped. */
    {
        int32_t a[64], b[64], ab[64];
        size_t na = 0, nb = 0, nab = 0, nz = 9;
        CHECK(ds4c_tokenize(c, "import os", 9, a, 64, &na, err, sizeof err) == DS4C_OK, "%s", err);
        CHECK(ds4c_tokenize(c, "\0", 1, b, 64, &nb, err, sizeof err) == DS4C_OK, "%s", err);
        CHECK(ds4c_tokenize(c, "import os\0import sys", 20, ab, 64, &nab, err, sizeof err) == DS4C_OK, "%s", err);
        CHECK(nab > na + nb, "\"import os\\0import sys\" gave %zu tokens, \"import os\" %zu", nab, na);
        CHECK(nab >= na && memcmp(ab, a, na * sizeof(int32_t)) == 0, "the text before the NUL tokenizes differently");
        CHECK(ds4c_tokenize(c, NULL, 0, ab, 64, &nz, err, sizeof err) == DS4C_OK && nz == 0, "empty text: %s", err);
    }

    /* Generation: greedy twice on fresh one-shot sessions gives the same tokens. */
    ds4c_generate_options opt;
    ds4c_generate_options_init(&opt);
    CHECK(opt.top_p == 1.0f && opt.max_tokens == 256, "defaults");
    int32_t prompt[3] = {400, 17, 99};
    opt.tokens = prompt;
    opt.n_tokens = 3;
    opt.max_tokens = 6;
    opt.ignore_eos = 1;
    uint64_t rid = 0;
    opt.request_id_out = &rid;
    struct collect a = {{0}, 0, 0, 0}, b = {{0}, 0, 0, 0};
    ds4c_done done;
    CHECK(ds4c_generate(c, &opt, on_chunk, &a, &done, err, sizeof err) == DS4C_OK, "%s", err);
    CHECK(done.reason == DS4C_FINISH_LENGTH && done.generated_tokens == 6 && a.n == 6, "reason %d generated %u got %zu",
          done.reason, done.generated_tokens, a.n);
    CHECK(done.prompt_tokens == 3, "prompt %u", done.prompt_tokens);
    CHECK(rid != 0 && rid == done.request_id, "request id %llu vs %llu", (unsigned long long)rid,
          (unsigned long long)done.request_id);
    CHECK(ds4c_generate(c, &opt, on_chunk, &b, &done, err, sizeof err) == DS4C_OK, "%s", err);
    CHECK(a.n == b.n && memcmp(a.tokens, b.tokens, a.n * sizeof(int32_t)) == 0, "greedy runs differ");

    /* Controls and logprobs (ds4c_generate_ex): greedy with logprobs keeps the tokens, each
     * token is its own top alternative; a bias of -100 on the first token changes it. */
    {
        ds4c_sampling_controls x;
        ds4c_sampling_controls_init(&x, sizeof x);
        CHECK(x.size == sizeof x && x.repeat_penalty == 1.0f && x.repeat_last_n == 64 && x.logprobs == 0, "control defaults");
        x.logprobs = 1;
        x.top_logprobs = 3;
        struct collect_lp l;
        memset(&l, 0, sizeof l);
        CHECK(ds4c_generate_ex(c, &opt, &x, on_chunk_ex, &l, &done, err, sizeof err) == DS4C_OK, "%s", err);
        CHECK(l.n == a.n && memcmp(l.tokens, a.tokens, a.n * sizeof(int32_t)) == 0, "logprobs changed the greedy tokens");
        CHECK(l.with_lp == l.n && l.bad_order == 0, "logprobs for %zu of %zu tokens, %zu misordered", l.with_lp, l.n,
              l.bad_order);
        for (size_t i = 0; i < l.n; ++i)
            CHECK(l.logprob[i] <= 0 && l.top_token[i] == l.tokens[i] && l.top_first[i] == l.logprob[i],
                  "token %zu: logprob %g, top %d (%g)", i, l.logprob[i], l.top_token[i], l.top_first[i]);
        int32_t bias_tok = a.tokens[0];
        float bias_val = -100.0f;
        x.logprobs = 0;
        x.top_logprobs = 0;
        x.logit_bias_tokens = &bias_tok;
        x.logit_bias_values = &bias_val;
        x.n_logit_bias = 1;
        memset(&l, 0, sizeof l);
        CHECK(ds4c_generate_ex(c, &opt, &x, on_chunk_ex, &l, &done, err, sizeof err) == DS4C_OK, "%s", err);
        CHECK(l.n == 6 && l.tokens[0] != a.tokens[0] && l.with_lp == 0, "bias ignored: first token %d", l.tokens[0]);
        x.n_logit_bias = 1;
        x.logit_bias_tokens = NULL;
        CHECK(ds4c_generate_ex(c, &opt, &x, on_chunk_ex, &l, &done, err, sizeof err) == DS4C_ERR_ARG, "NULL bias array");
        x.top_logprobs = 21;
        x.n_logit_bias = 0;
        x.logprobs = 1;
        CHECK(ds4c_generate_ex(c, &opt, &x, on_chunk_ex, &l, &done, err, sizeof err) == DS4C_ERR_SERVER &&
                  ds4c_server_error_code(c) == DS4C_SERVER_BAD_REQUEST && strstr(err, "top_logprobs"),
              "top_logprobs 21: %s", err);
        /* An older caller's shorter struct: the fields past its size are never read. */
        unsigned char raw[sizeof(ds4c_sampling_controls) + 16];
        memset(raw, 0xFF, sizeof raw);
        ds4c_sampling_controls *old = (ds4c_sampling_controls *)raw;
        const size_t old_size = offsetof(ds4c_sampling_controls, logprobs);
        ds4c_sampling_controls_init(old, old_size);
        CHECK(old->size == old_size && raw[old_size] == 0xFF, "init wrote past the caller's size");
        memset(&l, 0, sizeof l);
        CHECK(ds4c_generate_ex(c, &opt, old, on_chunk_ex, &l, &done, err, sizeof err) == DS4C_OK, "%s", err);
        CHECK(l.n == a.n && memcmp(l.tokens, a.tokens, a.n * sizeof(int32_t)) == 0 && l.with_lp == 0,
              "short struct: %zu tokens, %zu with logprobs", l.n, l.with_lp);
        ds4c_sampling_controls unset;
        memset(&unset, 0, sizeof unset);
        CHECK(ds4c_generate_ex(c, &opt, &unset, NULL, NULL, &done, err, sizeof err) == DS4C_ERR_ARG, "size 0 accepted");
    }

    /* Cancel from the callback. */
    struct collect s = {{0}, 0, 0, 2};
    opt.max_tokens = 500;
    prompt[0] = 402;
    CHECK(ds4c_generate(c, &opt, on_chunk, &s, &done, err, sizeof err) == DS4C_OK, "%s", err);
    CHECK(done.reason == DS4C_FINISH_CANCELLED && done.generated_tokens < 500, "reason %d generated %u", done.reason,
          done.generated_tokens);

    /* Option errors are caught before anything is sent. */
    ds4c_generate_options bad;
    ds4c_generate_options_init(&bad);
    CHECK(ds4c_generate(c, &bad, NULL, NULL, NULL, err, sizeof err) == DS4C_ERR_ARG, "no prompt accepted");
    bad.text = "x";
    bad.text_len = 1;
    bad.tokens = prompt;
    bad.n_tokens = 1;
    CHECK(ds4c_generate(c, &bad, NULL, NULL, NULL, err, sizeof err) == DS4C_ERR_ARG, "two prompts accepted");
    CHECK(ds4c_generate(c, NULL, NULL, NULL, NULL, err, sizeof err) == DS4C_ERR_ARG, "NULL options");

    /* Server errors carry the daemon's code. */
    ds4c_generate_options_init(&bad);
    bad.tokens = prompt;
    bad.n_tokens = 1;
    bad.session = 123456789;
    CHECK(ds4c_generate(c, &bad, NULL, NULL, NULL, err, sizeof err) == DS4C_ERR_SERVER, "unknown session accepted");
    CHECK(ds4c_server_error_code(c) == DS4C_SERVER_UNKNOWN_SESSION, "code %d (%s)", ds4c_server_error_code(c), err);
    CHECK(strstr(err, "UnknownSession") != NULL, "message: %s", err);

    /* Sessions, chat messages, close. */
    uint64_t sid = 0;
    uint32_t ntok = 99;
    CHECK(ds4c_open_session(c, NULL, 0, &sid, &ntok, err, sizeof err) == DS4C_OK, "%s", err);
    CHECK(sid != 0 && ntok == 0, "session %llu tokens %u", (unsigned long long)sid, ntok);
    const char *roles[1] = {"user"};
    const char *contents[1] = {"hi"};
    const size_t content_lens[1] = {2};
    ds4c_generate_options chat;
    ds4c_generate_options_init(&chat);
    chat.session = sid;
    chat.chat_roles = roles;
    chat.chat_contents = contents;
    chat.n_chat = 1;
    CHECK(ds4c_generate(c, &chat, NULL, NULL, &done, err, sizeof err) == DS4C_ERR_ARG, "chat without lengths accepted");
    chat.chat_content_lens = content_lens;
    chat.max_tokens = 3;
    CHECK(ds4c_generate(c, &chat, NULL, NULL, &done, err, sizeof err) == DS4C_OK, "%s", err);
    CHECK(done.prompt_tokens > 2, "chat prompt of %u tokens", done.prompt_tokens);
    CHECK(ds4c_close_session(c, sid, err, sizeof err) == DS4C_OK, "%s", err);
    CHECK(ds4c_close_session(c, sid, err, sizeof err) == DS4C_ERR_SERVER, "closed twice");

    ds4c_stats st;
    CHECK(ds4c_get_stats(c, &st, err, sizeof err) == DS4C_OK, "%s", err);
    CHECK(st.requests_total >= 4 && st.tokens_out >= 12 && st.weights_bytes > 0, "requests %llu out %llu",
          (unsigned long long)st.requests_total, (unsigned long long)st.tokens_out);

    /* The extended stats: the same figures as ds4c_stats plus batching, speculation, budget. */
    ds4c_stats_ex sx;
    ds4c_stats_ex_init(&sx, sizeof sx);
    CHECK(sx.size == sizeof sx && sx.steps == 0, "init: size %zu", sx.size);
    CHECK(ds4c_get_stats_ex(c, &sx, err, sizeof err) == DS4C_OK, "%s", err);
    CHECK(sx.size == sizeof sx, "size after the call: %zu", sx.size);
    CHECK(sx.base.requests_total >= st.requests_total && sx.base.weights_bytes == st.weights_bytes,
          "base: requests %llu, weights %llu", (unsigned long long)sx.base.requests_total,
          (unsigned long long)sx.base.weights_bytes);
    /* Every generation above ran in forward steps within the daemon's limits. */
    CHECK(sx.steps > 0 && sx.step_rows >= sx.steps && sx.step_requests >= sx.steps && sx.step_seconds > 0,
          "steps %llu rows %llu requests %llu", (unsigned long long)sx.steps, (unsigned long long)sx.step_rows,
          (unsigned long long)sx.step_requests);
    CHECK(sx.max_batch >= 1 && sx.step_tokens >= 1, "max_batch %u step_tokens %u", sx.max_batch, sx.step_tokens);
    CHECK(sx.kv_budget > 0 && sx.kv_in_use <= sx.kv_budget, "kv budget %llu in use %llu",
          (unsigned long long)sx.kv_budget, (unsigned long long)sx.kv_in_use);
    CHECK(strcmp(sx.device, "cpu") == 0, "device \"%s\"", sx.device);
    /* No drafter, no other process, no streaming: everything is ds4d's own. */
    CHECK(sx.drafter_bytes == 0 && sx.shared_bytes == 0 && sx.private_bytes >= sx.base.weights_bytes &&
              sx.streaming == 0 && sx.expert_acquired == 0,
          "drafter %llu shared %llu private %llu streaming %d", (unsigned long long)sx.drafter_bytes,
          (unsigned long long)sx.shared_bytes, (unsigned long long)sx.private_bytes, sx.streaming);
    /* An older caller's struct that ends after the budget's first field: nothing written past it. */
    {
        unsigned char raw[sizeof(ds4c_stats_ex) + 16];
        memset(raw, 0xA5, sizeof raw);
        ds4c_stats_ex *old = (ds4c_stats_ex *)raw;
        const size_t old_size = offsetof(ds4c_stats_ex, kv_in_use);
        ds4c_stats_ex_init(old, old_size);
        CHECK(ds4c_get_stats_ex(c, old, err, sizeof err) == DS4C_OK, "short struct: %s", err);
        CHECK(old->size == old_size && old->kv_budget == sx.kv_budget && old->max_batch == sx.max_batch,
              "short struct: size %zu budget %llu", old->size, (unsigned long long)old->kv_budget);
        size_t untouched = 0;
        for (size_t i = old_size; i < sizeof raw; ++i) untouched += raw[i] == 0xA5;
        CHECK(untouched == sizeof raw - old_size, "%zu bytes past the caller's struct were written",
              sizeof raw - old_size - untouched);
        ds4c_stats_ex unset;
        memset(&unset, 0, sizeof unset);
        CHECK(ds4c_get_stats_ex(c, &unset, err, sizeof err) == DS4C_ERR_ARG, "size 0 accepted");
        CHECK(ds4c_get_stats_ex(c, NULL, err, sizeof err) == DS4C_ERR_ARG, "NULL accepted");
    }
    /* The tiny model's GGUF has no chat template. */
    CHECK(ds4c_model_has_chat_template(c) == 0, "chat template: %d", ds4c_model_has_chat_template(c));
    CHECK(ds4c_model_has_chat_template(NULL) == -1, "NULL client");

    CHECK(ds4c_reconnect(c, err, sizeof err) == DS4C_OK, "%s", err);
    CHECK(ds4c_get_stats(c, &st, err, sizeof err) == DS4C_OK, "after reconnect: %s", err);
    CHECK(ds4c_cancel(c, 424242, err, sizeof err) == DS4C_OK, "cancel of nothing: %s", err);
    ds4c_free(c);
    ds4c_free(NULL);
    if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
