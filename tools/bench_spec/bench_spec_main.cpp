// ds4-bench-spec: what speculative decoding with a drafter buys on this machine.
//  - throughput: greedy decode tok/s over the same prompts with and without the drafter
//    (plain and speculative runs alternate per prompt, so load drift hits both), acceptance
//    rate, accepted drafts per trial, and whether the outputs were token-identical;
//  - --verify-cost: the price of verification, one target step of w = k+1 rows (a trial
//    dropped with commit(0)) against a one-row step, on any model (e.g. flash-shape).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "engine/model/session.h"
#include "engine/model/speculative.h"
#include "engine/tokenizer/tokenizer.h"
#include "tools/backend_option.h"
#include "ds4_version.h"

namespace {

const char *kUsage =
    "usage: ds4-bench-spec -m TARGET.gguf --drafter DRAFTER.gguf [--draft-max K] [--min-gain G] [--prompts N]\n"
    "                      [--gen-tokens N] [--threads N] [--backend B] [--json]\n"
    "       ds4-bench-spec -m MODEL.gguf --verify-cost K [--context N] [--reps N] [--threads N] [--backend B] [--json]\n"
    "  --drafter PATH      drafter with the target's vocabulary\n"
    "  --draft-max K       drafts per trial at most (default 4)\n"
    "  --min-gain G        adaptive k: draft while the estimated acceptance of the last draft is >= G\n"
    "                      (default 0.3; 0.000001 = always K)\n"
    "  --prompts N         built-in prompts used, 1..20 (default 20)\n"
    "  --gen-tokens N      greedy tokens per prompt (default 64)\n"
    "  --verify-cost K     time target steps of 1..K+1 rows instead\n"
    "  --context N         tokens before the measured steps (default 64)\n"
    "  --reps N            measured steps per width (default 5)\n"
    "  --threads N         engine threads (default: all cores)\n"
    "  --json              one JSON object instead of text\n"
    "Decode timings exclude the prompts' prefill (the drafter's is reported apart).\n";

// Beginnings of Python source, the kind of text the committed pystd models know. For a
// model without a tokenizer, prompts are pseudo-random token ids instead.
const char *const kPrompts[20] = {
    "import os\nimport sys\n\n\ndef main(argv):\n",
    "class Queue:\n    \"\"\"A simple FIFO queue.\"\"\"\n\n    def __init__(self, maxsize=0):\n",
    "def read_lines(path, encoding='utf-8'):\n    with open(path",
    "    def __repr__(self):\n        return",
    "from collections import namedtuple\n\nPoint = namedtuple(",
    "try:\n    import _thread\nexcept ImportError:\n",
    "    for i, item in enumerate(items):\n        if",
    "def _check_arg(name, value):\n    if not isinstance(value, str):\n        raise TypeError(",
    "\"\"\"Utilities for parsing command-line options.\n\nThis module",
    "    @property\n    def name(self):\n",
    "if __name__ == '__main__':\n",
    "    def close(self):\n        if self._file is not None:\n",
    "import re\n\n_pattern = re.compile(r",
    "class Error(Exception):\n    pass\n\n\nclass",
    "def copyfile(src, dst, *, follow_symlinks=True):\n    \"\"\"Copy data from src to dst",
    "    result = []\n    while True:\n        line = f.readline()\n",
    "__all__ = [",
    "    def __eq__(self, other):\n        if not isinstance(other, self.__class__):\n",
    "def join(a, *p):\n    \"\"\"Join two or more pathname components",
    "        except OSError as e:\n            if e.errno",
};

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::vector<int32_t> prompt_tokens(const ds4::Model &m, int i) {
    if (m.reader().has("tokenizer.ggml.tokens")) {
        const ds4::tok::Tokenizer tok = ds4::tok::Tokenizer::from_gguf(m.reader());
        std::vector<int32_t> t = tok.encode(kPrompts[i]);
        if (tok.bos() >= 0) t.insert(t.begin(), tok.bos());
        return t;
    }
    std::vector<int32_t> t(16 + i);
    uint64_t r = 88172645463325252ull + i;
    for (auto &x : t) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        x = (int32_t)(r % (uint64_t)m.config().n_vocab);
    }
    return t;
}

int verify_cost(const std::string &path, int kmax, int context, int reps, int threads, ds4::BackendKind backend, bool json) {
    auto m = ds4::Model::open(path, ds4::tools::model_options(threads, backend, json));
    if (!json) ds4::tools::say_backend("ds4-bench-spec", *m);
    m->prewarm();
    const int V = m->config().n_vocab;
    std::vector<int32_t> toks(context + kmax + 1);
    uint64_t r = 2463534242ull;
    for (auto &x : toks) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        x = (int32_t)(r % (uint64_t)V);
    }
    ds4::Session s(*m, context + kmax + 2, std::max(kmax + 1, 16));
    s.sync(std::span<const int32_t>(toks).first(context));
    std::vector<float> rows;
    std::vector<double> ms(kmax + 2), gb(kmax + 2);
    for (int w = 1; w <= kmax + 1; ++w) {
        const std::span<const int32_t> step = std::span<const int32_t>(toks).subspan(context, w);
        s.trial(step, &rows);   // warm-up (scratch sized for w rows)
        s.commit(0);
        std::vector<double> t;
        const uint64_t b0 = s.executor().stats().weight_bytes;
        for (int i = 0; i < reps; ++i) {
            const double t0 = now();
            s.trial(step, &rows);
            s.commit(0);
            t.push_back(now() - t0);
        }
        std::sort(t.begin(), t.end());
        ms[w] = 1e3 * t[t.size() / 2];
        gb[w] = (double)(s.executor().stats().weight_bytes - b0) / reps / 1e9;
    }
    if (json) {
        std::printf("{\"model\":\"%s\",\"context\":%d,\"reps\":%d,\"steps\":[", path.c_str(), context, reps);
        for (int w = 1; w <= kmax + 1; ++w)
            std::printf("%s{\"rows\":%d,\"median_ms\":%.3f,\"vs_one_row\":%.3f,\"weight_gb\":%.3f}", w > 1 ? "," : "", w, ms[w], ms[w] / ms[1], gb[w]);
        std::printf("]}\n");
    } else {
        std::printf("model      %s\n           %s\n", path.c_str(), m->config().summary().c_str());
        std::printf("context    %d tokens; median of %d steps per width (a trial then commit(0))\n", context, reps);
        std::printf("rows  median ms  vs 1 row  weights read GB\n");
        for (int w = 1; w <= kmax + 1; ++w) std::printf("%4d  %9.2f  %7.2fx  %15.3f\n", w, ms[w], ms[w] / ms[1], gb[w]);
    }
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    std::string model, drafter;
    int draft_max = 4, n_prompts = 20, gen = 64, threads = 0, verify = 0, context = 64, reps = 5;
    float min_gain = 0.3f;
    bool json = false;
    ds4::BackendKind backend = ds4::BackendKind::Auto;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto val = [&]() -> const char * {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "ds4-bench-spec: %s needs a value\n%s", a.c_str(), kUsage);
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "-m" || a == "--model") model = val();
        else if (a == "--drafter") drafter = val();
        else if (a == "--draft-max") draft_max = std::atoi(val());
        else if (a == "--min-gain") min_gain = (float)std::atof(val());
        else if (a == "--prompts") n_prompts = std::atoi(val());
        else if (a == "--gen-tokens") gen = std::atoi(val());
        else if (a == "--verify-cost") verify = std::atoi(val());
        else if (a == "--context") context = std::atoi(val());
        else if (a == "--reps") reps = std::atoi(val());
        else if (a == "--threads") threads = std::atoi(val());
        else if (a == "--json") json = true;
        else if (a == "--backend") backend = ds4::tools::backend_arg("ds4-bench-spec", val());
        else if (a == "-h" || a == "--help") {
            std::fputs(kUsage, stdout);
            return 0;
        } else if (a == "--version") {
            ds4_print_version("ds4-bench-spec");
            return 0;
        } else {
            std::fprintf(stderr, "ds4-bench-spec: unknown argument %s\n%s", a.c_str(), kUsage);
            return 2;
        }
    }
    try {
        if (verify) {
            if (model.empty() || verify < 1 || verify > 64 || context < 1 || reps < 1) {
                std::fputs(kUsage, stderr);
                return 2;
            }
            return verify_cost(model, verify, context, reps, threads, backend, json);
        }
        if (model.empty() || drafter.empty() || n_prompts < 1 || n_prompts > 20 || gen < 2) {
            std::fputs(kUsage, stderr);
            return 2;
        }
        auto t = ds4::Model::open(model, ds4::tools::model_options(threads, backend, json));
        auto d = ds4::Model::open(drafter, ds4::tools::model_options(threads, backend, json));
        if (!json) ds4::tools::say_backend("ds4-bench-spec", *t);
        t->prewarm();
        d->prewarm();
        auto tex = t->make_executor(), dex = d->make_executor();
        ds4::SpecOptions so;
        so.draft_max = draft_max;
        so.min_gain = min_gain;
        double plain_s = 0, spec_s = 0, draft_prefill_s = 0;
        uint64_t t_rows = 0, t_steps = 0, d_rows = 0, d_steps = 0;   // the speculative runs' decode work
        uint64_t tokens = 0, mismatched = 0;
        ds4::SpecCounters total;
        std::vector<double> per_prompt;
        for (int i = 0; i < n_prompts; ++i) {
            const std::vector<int32_t> prompt = prompt_tokens(*t, i);
            const int ctx = (int)prompt.size() + gen + 2;
            std::vector<int32_t> a, b;
            double ta = 0, tb = 0;
            auto run_plain = [&] {
                ds4::Session s(*t, *tex, ctx);
                s.sync(prompt);
                const double t0 = now();
                a.assign(1, s.argmax());
                while ((int)a.size() < gen) {
                    s.eval(a.back());
                    a.push_back(s.argmax());
                }
                ta = now() - t0;
            };
            auto run_spec = [&] {
                ds4::Session s(*t, *tex, ctx), ds(*d, *dex, ctx);
                ds4::SpeculativeDecoder dec(s, ds, so);
                s.sync(prompt);
                b.assign(1, s.argmax());
                std::vector<int32_t> with_pending(prompt);
                with_pending.push_back(b[0]);
                const double tp = now();
                ds.sync(with_pending);   // the drafter's prefill, timed apart
                draft_prefill_s += now() - tp;
                const ds4::ExecutorStats ts = tex->stats(), dsx = dex->stats();
                const double t0 = now();
                while ((int)b.size() < gen) dec.step(b.back(), {}, nullptr, gen - (int)b.size(), &b);
                tb = now() - t0;
                t_rows += tex->stats().rows - ts.rows, t_steps += tex->stats().steps - ts.steps;
                d_rows += dex->stats().rows - dsx.rows, d_steps += dex->stats().steps - dsx.steps;
                total += dec.counters();
            };
            if (i % 2) run_plain(), run_spec();
            else run_spec(), run_plain();
            plain_s += ta, spec_s += tb;
            tokens += gen - 1;   // the first token of both comes from the prompt's logits
            mismatched += a != b;
            per_prompt.push_back(ta / tb);
        }
        const double plain_tps = tokens / plain_s, spec_tps = tokens / spec_s;
        const double rate = total.drafted ? (double)total.accepted / total.drafted : 0;
        const double per_trial = total.trials ? (double)total.accepted / total.trials : 0;
        std::sort(per_prompt.begin(), per_prompt.end());
        if (json) {
            std::printf("{\"model\":\"%s\",\"drafter\":\"%s\",\"draft_max\":%d,\"min_gain\":%.6g,\"prompts\":%d,\"gen_tokens\":%d,"
                        "\"plain_tok_s\":%.3f,\"spec_tok_s\":%.3f,\"speedup\":%.3f,\"speedup_median_prompt\":%.3f,"
                        "\"trials\":%llu,\"drafted\":%llu,\"accepted\":%llu,\"fallbacks\":%llu,\"acceptance\":%.4f,"
                        "\"accepted_per_trial\":%.3f,\"tokens_per_trial\":%.3f,\"drafter_prefill_s\":%.3f,\"mismatched_prompts\":%llu,"
                        "\"target_rows_per_token\":%.3f,\"target_steps_per_token\":%.3f,\"drafter_rows_per_token\":%.3f,"
                        "\"drafter_steps_per_token\":%.3f}\n",
                        model.c_str(), drafter.c_str(), draft_max, min_gain, n_prompts, gen, plain_tps, spec_tps, spec_tps / plain_tps,
                        per_prompt[per_prompt.size() / 2], (unsigned long long)total.trials, (unsigned long long)total.drafted,
                        (unsigned long long)total.accepted, (unsigned long long)total.fallbacks, rate, per_trial, per_trial + 1,
                        draft_prefill_s, (unsigned long long)mismatched, (double)t_rows / tokens, (double)t_steps / tokens,
                        (double)d_rows / tokens, (double)d_steps / tokens);
        } else {
            std::printf("target           %s\ndrafter          %s\n", model.c_str(), drafter.c_str());
            std::printf("prompts          %d x %d greedy tokens (%llu timed per mode)\n", n_prompts, gen, (unsigned long long)tokens);
            std::printf("plain            %.2f tok/s\n", plain_tps);
            std::printf("speculative      %.2f tok/s (draft_max %d, min_gain %g)\n", spec_tps, draft_max, min_gain);
            std::printf("speedup          %.2fx (median prompt %.2fx)\n", spec_tps / plain_tps, per_prompt[per_prompt.size() / 2]);
            std::printf("acceptance       %.1f%% of %llu drafts; %.2f accepted per trial (%.2f tokens per target step)\n", 100 * rate,
                        (unsigned long long)total.drafted, per_trial, per_trial + 1);
            std::printf("trials           %llu (+%llu fallbacks)\n", (unsigned long long)total.trials, (unsigned long long)total.fallbacks);
            std::printf("work per token   target %.2f rows in %.2f steps, drafter %.2f rows in %.2f steps (plain: 1 target row)\n",
                        (double)t_rows / tokens, (double)t_steps / tokens, (double)d_rows / tokens, (double)d_steps / tokens);
            std::printf("drafter prefill  %.3f s in all (not in the tok/s)\n", draft_prefill_s);
            std::printf("identical        %s\n", mismatched ? "NO: outputs differ" : "yes, every prompt");
        }
        return mismatched ? 1 : 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "ds4-bench-spec: %s\n", e.what());
        return 1;
    }
}
