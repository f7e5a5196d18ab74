// ds4-bench: prefill and decode throughput of a model on this machine, the weight bytes a
// decoded token streams, and that figure as achieved bandwidth against the machine's
// read bandwidth measured in the same run.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/kernels/matmul.h"
#include "engine/model/model.h"
#include "engine/model/session.h"
#include "tools/backend_option.h"
#include "tools/bench/membw.h"
#include "ds4_version.h"

namespace {

const char *kUsage =
    "usage: ds4-bench -m MODEL.gguf [--prompt-tokens N] [--gen-tokens N] [--threads N] [--backend auto|cpu|cuda] [--json]\n"
    "  --prompt-tokens N   tokens prefilled before decoding (default 128)\n"
    "  --gen-tokens N      tokens decoded greedily after the prompt (default 32)\n"
    "  --threads N         engine threads (default: all cores)\n"
    "  --backend B         auto (default: CUDA when a usable GPU is present), cpu or cuda;\n"
    "                      the bandwidth measured is the host's (achieved GB/s is the backend's)\n"
    "  --json              one JSON object instead of text\n"
    "Reports prefill tok/s, decode tok/s, weight bytes streamed per decoded token, the\n"
    "achieved GB/s and the machine's read bandwidth measured in the same run.\n";

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

int main(int argc, char **argv) {
    if (ds4_wants_version(argc, argv)) {
        ds4_print_version("ds4-bench");
        return 0;
    }
    std::string model;
    int prompt = 128, gen = 32, threads = 0;
    bool json = false;
    ds4::BackendKind backend = ds4::BackendKind::Auto;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto val = [&]() -> const char * {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "ds4-bench: %s needs a value\n%s", a.c_str(), kUsage);
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "-m" || a == "--model") model = val();
        else if (a == "--prompt-tokens") prompt = std::atoi(val());
        else if (a == "--gen-tokens") gen = std::atoi(val());
        else if (a == "--threads") threads = std::atoi(val());
        else if (a == "--json") json = true;
        else if (a == "--backend") backend = ds4::tools::backend_arg("ds4-bench", val());
        else if (a == "-h" || a == "--help") {
            std::fputs(kUsage, stdout);
            return 0;
        } else {
            std::fprintf(stderr, "ds4-bench: unknown argument %s\n%s", a.c_str(), kUsage);
            return 2;
        }
    }
    if (model.empty() && std::getenv("DS4_MODEL")) model = std::getenv("DS4_MODEL");  // --model default
    if (model.empty() || prompt < 1 || gen < 1) {
        std::fputs(kUsage, stderr);
        return 2;
    }
    try {
        const double t_open = now();
        auto m = ds4::Model::open(model, ds4::tools::model_options(threads, backend, json));
        if (!json) ds4::tools::say_backend("ds4-bench", *m);
        m->prewarm();
        const double open_s = now() - t_open;
        const ds4::ModelConfig &c = m->config();
        double bw = 0;
        int n_threads = 0;
        {
            ds4::ThreadPool pool(threads);   // the same thread count the session's executor gets
            bw = ds4::measure_read_bandwidth(pool);
            n_threads = pool.size();
        }
        std::vector<int32_t> toks(prompt);
        uint64_t r = 88172645463325252ull;
        for (auto &t : toks) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            t = (int32_t)(r % (uint64_t)c.n_vocab);
        }
        ds4::Session s(*m, prompt + gen + 1);
        const double t0 = now();
        s.sync(toks);
        const double prefill_s = now() - t0;
        // One warm-up decode step, then the timed ones.
        s.eval(s.argmax());
        const uint64_t b0 = s.executor().stats().weight_bytes;
        const double t1 = now();
        for (int i = 1; i < gen; ++i) s.eval(s.argmax());
        const double decode_s = now() - t1;
        const int n_dec = gen - 1;
        const double bytes_per_tok = n_dec > 0 ? (double)(s.executor().stats().weight_bytes - b0) / n_dec : 0;
        const double dec_tps = n_dec > 0 ? n_dec / decode_s : 0;
        const double achieved = bytes_per_tok * dec_tps;
        if (json) {
            std::printf("{\"model\":\"%s\",\"backend\":\"%s\",\"threads\":%d,\"open_s\":%.3f,\"prompt_tokens\":%d,\"gen_tokens\":%d,"
                        "\"prefill_tok_s\":%.3f,\"decode_tok_s\":%.3f,\"bytes_per_token\":%.0f,\"achieved_gb_s\":%.3f,"
                        "\"machine_read_gb_s\":%.3f,\"fraction_of_bandwidth\":%.4f}\n",
                        model.c_str(), m->backend().name().c_str(), n_threads, open_s, prompt, gen, prompt / prefill_s, dec_tps, bytes_per_tok,
                        achieved / 1e9, bw / 1e9, achieved / bw);
        } else {
            std::printf("model            %s\n                 %s\n", model.c_str(), c.summary().c_str());
            std::printf("backend          %s\n", m->backend().name().c_str());
            std::printf("threads          %d\n", n_threads);
            std::printf("open + prewarm   %.2f s\n", open_s);
            std::printf("prefill          %d tokens in %.3f s = %.2f tok/s\n", prompt, prefill_s, prompt / prefill_s);
            std::printf("decode           %d tokens in %.3f s = %.2f tok/s\n", n_dec, decode_s, dec_tps);
            std::printf("weights/token    %.3f GB\n", bytes_per_tok / 1e9);
            std::printf("achieved         %.2f GB/s\n", achieved / 1e9);
            std::printf("machine read bw  %.2f GB/s (measured now)\n", bw / 1e9);
            std::printf("fraction         %.1f%% of measured bandwidth\n", 100 * achieved / bw);
        }
    } catch (const std::exception &e) {
        std::fprintf(stderr, "ds4-bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
