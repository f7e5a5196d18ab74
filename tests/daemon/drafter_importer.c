/* A C program on the bridge for the shared-drafter tests (ARCHITECTURE.md §5, "Shared
 * drafter"): opens MODEL with its drafter imported from a ds4d socket (--import SOCK) or
 * loaded from a file (--private DRAFTER) on BACKEND (cpu, the default, or cuda), decodes N
 * tokens greedily with speculation after the prompt TEXT and prints
 *   shared S            (ds4_bridge_drafter_shared)
 *   device ON_DEVICE IMPORTED READ_ONLY BYTES   (ds4_bridge_drafter_device; why on stderr)
 *   memory SHARED PRIVATE DRAFTER   (ds4_bridge_memory_stats_ex)
 *   devmem FREE TOTAL   (the GPU's free and total bytes after decoding; 0 0 on the CPU)
 *   tokens T1 T2 ...
 *   ready
 * then waits for a line (or end of file) on stdin before freeing the model, so the caller
 * can read this process's /proc/PID/smaps_rollup (or the GPU's free memory) while it holds
 * the drafter. The line "again" decodes once more (tokens, ready) and waits again. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bridge/ds4_bridge.h"

static int fail(const char *what, const char *err) {
    fprintf(stderr, "drafter_importer: %s: %s\n", what, err);
    return 1;
}

/* Greedy speculative decoding of up to n (<= 200) tokens after TEXT into out; the count, or
 * -1 after printing the failure. */
static int decode(ds4_bridge_model *m, const char *text, int n, int32_t *out, char *err, size_t errlen) {
    ds4_bridge_session *s = NULL;
    if (ds4_bridge_session_create(&s, m, 256, err, errlen) != 0) return fail("session", err), -1;
    int32_t prompt[256], tok[65], arg[65];
    int np = 0, got = 0;
    if (ds4_bridge_tokenize_text(m, text, strlen(text), prompt, 256, &np, err, errlen) != 0) goto failed;
    if (ds4_bridge_session_sync(s, prompt, np, err, errlen) != 0) goto failed;
    if (ds4_bridge_session_argmax(s, &out[got++], err, errlen) != 0) goto failed;
    while (got < n && got < 200) {
        int accepted = 0;
        const int w = ds4_bridge_spec_trial(s, out[got - 1], 0.f, 0, 1.f, 0.f, NULL, n - got, tok, arg, 65, &accepted,
                                            err, errlen);
        if (w < 0) goto failed;
        if (w == 0) {
            if (ds4_bridge_eval(s, out[got - 1], err, errlen) != 0) goto failed;
            if (ds4_bridge_session_argmax(s, &out[got++], err, errlen) != 0) goto failed;
            continue;
        }
        int keep = 0;
        while (keep <= accepted && got < n) out[got++] = arg[keep++];
        if (ds4_bridge_spec_commit(s, keep, err, errlen) != 0) goto failed;
    }
    ds4_bridge_session_free(s);
    return got;
failed:
    fail("decode", err);
    ds4_bridge_session_free(s);
    return -1;
}

int main(int argc, char **argv) {
    if ((argc != 6 && argc != 7) || (strcmp(argv[2], "--import") != 0 && strcmp(argv[2], "--private") != 0) ||
        (argc == 7 && strcmp(argv[6], "cpu") != 0 && strcmp(argv[6], "cuda") != 0)) {
        fprintf(stderr, "usage: drafter_importer MODEL --import SOCK|--private DRAFTER N TEXT [cpu|cuda]\n");
        return 2;
    }
    char err[512] = {0};
    ds4_bridge_model_open_options o;
    ds4_bridge_model_open_options_init(&o);
    o.model_path = argv[1];
    o.backend = argc == 7 && strcmp(argv[6], "cuda") == 0 ? DS4_BRIDGE_BACKEND_CUDA : DS4_BRIDGE_BACKEND_CPU;
    o.n_threads = 1;
    if (strcmp(argv[2], "--import") == 0) o.drafter_import = argv[3];
    else o.drafter_path = argv[3];
    const int n = atoi(argv[4]);
    ds4_bridge_model *m = NULL;
    if (ds4_bridge_model_open(&m, &o, err, sizeof err) != 0) return fail("open", err);
    printf("shared %d\n", ds4_bridge_drafter_shared(m));
    ds4_bridge_drafter_device_t dev;
    if (ds4_bridge_drafter_device(m, &dev, sizeof dev, err, sizeof err) != 0) return fail("drafter device", err);
    printf("device %d %d %d %llu\n", dev.on_device, dev.imported, dev.read_only, (unsigned long long)dev.bytes);
    if (dev.why[0]) fprintf(stderr, "drafter_importer: device weights: %s\n", dev.why);
    ds4_bridge_memory_ex_t mem;
    if (ds4_bridge_memory_stats_ex(m, &mem, sizeof mem, err, sizeof err) != 0) return fail("memory", err);

    int32_t out[256];
    const int got = decode(m, argv[5], n, out, err, sizeof err);
    if (got < 0) return 1;
    if (ds4_bridge_memory_stats_ex(m, &mem, sizeof mem, err, sizeof err) != 0) return fail("memory", err);
    printf("memory %llu %llu %llu\n", (unsigned long long)mem.shared_bytes, (unsigned long long)mem.private_bytes,
           (unsigned long long)mem.drafter_mapped_bytes);
    printf("devmem %llu %llu\n", (unsigned long long)mem.base.device_free, (unsigned long long)mem.base.device_total);
    printf("tokens");
    for (int i = 0; i < got; ++i) printf(" %d", out[i]);
    printf("\nready\n");
    fflush(stdout);
    char line[16];
    /* "again": decode once more (e.g. after the exporting ds4d was killed) and wait again. */
    while (fgets(line, sizeof line, stdin) && strcmp(line, "again\n") == 0) {
        const int again = decode(m, argv[5], n, out, err, sizeof err);
        if (again < 0) return 1;
        printf("tokens");
        for (int i = 0; i < again; ++i) printf(" %d", out[i]);
        printf("\nready\n");
        fflush(stdout);
    }
    ds4_bridge_model_free(m);
    return 0;
}
