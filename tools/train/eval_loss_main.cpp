// ds4-eval-loss: the engine's mean next-token loss (and perplexity) over fixed token
// sequences, to compare with the numbers HF computes for the same weights
// (tools/train/evaluate.py). Each sequence is evaluated in a fresh session by one prefill;
// loss is -log softmax(logits after token i)[token i+1], averaged over the seq-1 predicted
// positions of every sequence, accumulated in double.
//
// With --ref-argmax (int32, one per position, HF's) it also reports how often the engine's
// argmax agrees; with --ref-nll (float32, seq-1 per sequence) the largest per-position gap.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "engine/common/error.h"
#include "engine/model/model.h"
#include "engine/model/session.h"
#include "tools/backend_option.h"
#include "ds4_version.h"

namespace {

const char *kUsage =
    "usage: ds4-eval-loss -m MODEL.gguf --tokens-file F.i32 [--seq 512] [--n N] [--threads N]\n"
    "                     [--backend auto|cpu|cuda]\n"
    "                     [--ref-argmax F.i32] [--ref-nll F.f32] [--nll-out F.f32] [--argmax-out F.i32]\n"
    "  --tokens-file  little-endian int32 token ids, row-major, rows of --seq tokens\n"
    "  --n            evaluate only the first N rows\n"
    "  --ref-argmax   reference argmax per position (int32, same layout as the tokens)\n"
    "  --ref-nll      reference loss per predicted position (float32, seq-1 per row)\n"
    "  --nll-out      write the engine's loss per predicted position (float32, seq-1 per row)\n"
    "  --argmax-out   write the engine's argmax per position (int32; another model's run can\n"
    "                 take it as --ref-argmax: a drafter's greedy agreement with the main model)\n"
    "Prints one JSON object: rows, positions, mean_loss, perplexity (+ agreement / gaps).\n";

template <typename T>
std::vector<T> read_array(const std::string &path) {
    std::ifstream f(path, std::ios::binary | std::ios::ate);
    if (!f) throw ds4::Error("cannot open " + path + ": " + std::strerror(errno));
    const std::streamoff n = f.tellg();
    if (n % (std::streamoff)sizeof(T) != 0)
        throw ds4::Error(path + ": size " + std::to_string(n) + " is not a multiple of " + std::to_string(sizeof(T)));
    std::vector<T> v((size_t)n / sizeof(T));
    f.seekg(0);
    if (!f.read(reinterpret_cast<char *>(v.data()), n)) throw ds4::Error("cannot read " + path);
    return v;
}

template <typename T>
void write_array(const std::string &path, const std::vector<T> &v) {
    FILE *f = std::fopen(path.c_str(), "wb");
    if (!f) throw ds4::Error("cannot open " + path + ": " + std::strerror(errno));
    bool ok = std::fwrite(v.data(), sizeof(T), v.size(), f) == v.size();
    ok = (std::fclose(f) == 0) && ok;
    if (!ok) throw ds4::Error("writing " + path + " failed");
}

int parse_int(const std::string &flag, const std::string &s, int lo) {
    char *end = nullptr;
    errno = 0;
    long v = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end || errno || v < lo || v > 1 << 24) throw ds4::Error(flag + ": bad value '" + s + "'");
    return (int)v;
}

}  // namespace

int main(int argc, char **argv) {
    if (ds4_wants_version(argc, argv)) {
        ds4_print_version("ds4-eval-loss");
        return 0;
    }
    std::string model, tokens_file, ref_argmax, ref_nll, nll_out, argmax_out;
    int seq = 512, n_rows = 0, threads = 0;
    ds4::BackendKind backend = ds4::BackendKind::Auto;
    bool parsing = true;  // errors before the work starts are usage errors: exit 2
    try {
        for (int i = 1; i < argc; ++i) {
            std::string a = argv[i];
            auto val = [&]() -> std::string {
                if (i + 1 >= argc) throw ds4::Error(a + " needs a value");
                return argv[++i];
            };
            if (a == "-m" || a == "--model") model = val();
            else if (a == "--tokens-file") tokens_file = val();
            else if (a == "--seq") seq = parse_int(a, val(), 2);
            else if (a == "--n") n_rows = parse_int(a, val(), 1);
            else if (a == "--threads") threads = parse_int(a, val(), 0);
            else if (a == "--backend") backend = ds4::tools::backend_arg("ds4-eval-loss", val());
            else if (a == "--ref-argmax") ref_argmax = val();
            else if (a == "--ref-nll") ref_nll = val();
            else if (a == "--nll-out") nll_out = val();
            else if (a == "--argmax-out") argmax_out = val();
            else if (a == "-h" || a == "--help") {
                std::fputs(kUsage, stdout);
                return 0;
            } else {
                throw ds4::Error("unknown argument " + a);
            }
        }
        if (model.empty() && std::getenv("DS4_MODEL")) model = std::getenv("DS4_MODEL");  // --model default
        if (model.empty() || tokens_file.empty()) throw ds4::Error("-m and --tokens-file are required");
        parsing = false;

        const std::vector<int32_t> toks = read_array<int32_t>(tokens_file);
        if (toks.empty() || toks.size() % (size_t)seq != 0)
            throw ds4::Error(tokens_file + ": " + std::to_string(toks.size()) + " tokens is not a whole number of rows of " +
                             std::to_string(seq));
        const int rows_in_file = (int)(toks.size() / seq);
        const int rows = n_rows > 0 ? std::min(n_rows, rows_in_file) : rows_in_file;
        std::vector<int32_t> ref_arg;
        std::vector<float> ref_l;
        if (!ref_argmax.empty()) {
            ref_arg = read_array<int32_t>(ref_argmax);
            if (ref_arg.size() < (size_t)rows * seq) throw ds4::Error(ref_argmax + ": fewer positions than the tokens");
        }
        if (!ref_nll.empty()) {
            ref_l = read_array<float>(ref_nll);
            if (ref_l.size() < (size_t)rows * (seq - 1)) throw ds4::Error(ref_nll + ": fewer positions than the tokens");
        }

        auto m = ds4::Model::open(model, ds4::tools::model_options(threads, backend));
        ds4::tools::say_backend("ds4-eval-loss", *m);
        const int V = m->config().n_vocab;
        double sum = 0, ref_sum = 0, max_gap = 0;
        long agree = 0, compared = 0;
        std::vector<float> nll_all;
        nll_all.reserve((size_t)rows * (seq - 1));
        std::vector<int32_t> argmax_all;
        argmax_all.reserve((size_t)rows * seq);
        std::vector<float> logits;
        for (int r = 0; r < rows; ++r) {
            std::span<const int32_t> row(toks.data() + (size_t)r * seq, (size_t)seq);
            ds4::Session s(*m, seq);
            logits.clear();
            s.sync(row, {}, &logits);
            if (logits.size() != (size_t)seq * V) throw ds4::Error("internal: wrong number of logit rows");
            for (int i = 0; i < seq; ++i) {
                const float *l = logits.data() + (size_t)i * V;
                const int am = (int)(std::max_element(l, l + V) - l);
                argmax_all.push_back(am);
                if (!ref_arg.empty()) {
                    agree += am == ref_arg[(size_t)r * seq + i];
                    ++compared;
                }
                if (i + 1 == seq) break;
                double mx = l[am], z = 0;
                for (int v = 0; v < V; ++v) z += std::exp((double)l[v] - mx);
                const double nll = mx + std::log(z) - (double)l[row[i + 1]];
                sum += nll;
                nll_all.push_back((float)nll);
                if (!ref_l.empty()) {
                    const double ref = ref_l[(size_t)r * (seq - 1) + i];
                    ref_sum += ref;
                    max_gap = std::max(max_gap, std::fabs(nll - ref));
                }
            }
        }
        const long positions = (long)rows * (seq - 1);
        const double mean = sum / (double)positions;
        std::printf("{\"model\": \"%s\", \"rows\": %d, \"seq\": %d, \"positions\": %ld, \"mean_loss\": %.6f, "
                    "\"perplexity\": %.4f",
                    model.c_str(), rows, seq, positions, mean, std::exp(mean));
        if (compared) std::printf(", \"argmax_agreement\": %.6f", (double)agree / (double)compared);
        if (!ref_l.empty()) {
            const double ref_mean = ref_sum / (double)positions;
            std::printf(", \"ref_mean_loss\": %.6f, \"rel_diff\": %.3e, \"max_position_gap\": %.4f", ref_mean,
                        (mean - ref_mean) / ref_mean, max_gap);
        }
        std::printf("}\n");
        if (!nll_out.empty()) write_array(nll_out, nll_all);
        if (!argmax_out.empty()) write_array(argmax_out, argmax_all);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "ds4-eval-loss: %s\n%s", e.what(), parsing ? kUsage : "");
        return parsing ? 2 : 1;
    }
    return 0;
}
