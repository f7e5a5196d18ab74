/* Continue a text with a running ds4d (libds4client's C ABI), streaming it to stdout.
 *   cc generate.c $(pkg-config --cflags --libs ds4client) -o generate
 *   ./generate "def fib(n):"          (socket: $DS4_SOCKET or the default) */
#include <stdio.h>
#include <string.h>

#include <client/ds4client.h>

static int on_chunk(void *ud, const int32_t *tokens, size_t n_tokens, const char *text, size_t len) {
    (void)ud, (void)tokens, (void)n_tokens;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0; /* nonzero would cancel */
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s PROMPT\n", argv[0]);
        return 2;
    }
    char err[512];
    ds4c_client *c = NULL;
    if (ds4c_connect(&c, NULL, err, sizeof err) != DS4C_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    ds4c_generate_options opt;
    ds4c_generate_options_init(&opt); /* greedy, 256 tokens at most */
    opt.text = argv[1];
    opt.text_len = strlen(argv[1]);
    opt.max_tokens = 16;
    ds4c_done done;
    int rc = ds4c_generate(c, &opt, on_chunk, NULL, &done, err, sizeof err);
    if (rc != DS4C_OK) fprintf(stderr, "%s\n", err);
    else printf("\n");
    ds4c_free(c);
    return rc == DS4C_OK ? 0 : 1;
}
