// ds4-bench-batch: what continuous batching buys. N clients at once each stream a greedy
// generation from its own prompt; the figures are taken over the window in which all N
// are decoding (after the last first token, before the first last token):
//   - aggregate decode tok/s (every client's tokens in the window / its length),
//   - p50 / p99 inter-token latency of the clients' streams in that window;
// then the time to first token of a new request arriving while --ttft-busy clients decode,
// against the same request on an idle daemon. --compare-unbatched repeats everything on
// a second ds4d with --max-batch 1 (one request per step, the old time slicing).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/ds4client.hpp"
#include "tools/bench_daemon/own_daemon.h"
#include "tools/bench_daemon/synthetic_prompt.h"
#include "ds4_version.h"

#ifndef DS4D_DEFAULT_PATH
#define DS4D_DEFAULT_PATH "ds4d"
#endif

namespace {

using Clock = std::chrono::steady_clock;
using ds4::client::Client;
using ds4::client::GenerateRequest;

struct Args {
    std::string model, ds4d = DS4D_DEFAULT_PATH, socket;
    std::vector<int> clients = {1, 2, 4, 8, 16};
    int tokens = 128, prompt_tokens = 32, threads = 0, ttft_busy = 8, ttft_prompt = 256;
    int max_batch = 16;
    std::string backend = "cpu";
    std::string drafter;   // also run a ds4d with --drafter, for the comparison
    int draft_max = 0;
    bool compare_unbatched = false, json = false;
};

[[noreturn]] void usage(int code) {
    std::fprintf(code ? stderr : stdout,
                 "usage: ds4-bench-batch --model M.gguf [--ds4d PATH | --socket PATH] [--clients 1,2,4,8,16]\n"
                 "                       [--tokens N] [--prompt-tokens N] [--threads N] [--backend cpu|cuda|auto]\n"
                 "                       [--max-batch N] [--ttft-busy N] [--ttft-prompt N] [--compare-unbatched]\n"
                 "                       [--drafter D.gguf [--draft-max K]] [--json]\n"
                 "Aggregate decode tok/s and p50/p99 inter-token latency with N concurrent clients\n"
                 "(each streams --tokens greedy tokens), and the time to first token of a request\n"
                 "(--ttft-prompt tokens) arriving while --ttft-busy clients decode. Starts its own ds4d\n"
                 "(default %s) unless --socket names a running one. --drafter: the same again with\n"
                 "ds4d --drafter D.gguf (speculative decoding), with the drafts' acceptance rate and\n"
                 "the tokens each trial yielded.\n",
                 DS4D_DEFAULT_PATH);
    std::exit(code);
}

std::vector<int> parse_list(const std::string &s) {
    std::vector<int> v;
    std::stringstream ss(s);
    std::string x;
    while (std::getline(ss, x, ',')) {
        const int n = std::atoi(x.c_str());
        if (n < 1) throw std::runtime_error("--clients takes positive counts, got \"" + s + "\"");
        v.push_back(n);
    }
    return v;
}

Args parse(int argc, char **argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        const std::string s = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "ds4-bench-batch: %s needs a value\n", s.c_str());
                usage(2);
            }
            return argv[++i];
        };
        auto num = [&]() {
            const std::string v = val();
            char *end = nullptr;
            const long n = std::strtol(v.c_str(), &end, 10);
            if (!end || *end || n < 0 || n > 1000000) {
                std::fprintf(stderr, "ds4-bench-batch: %s takes a count, got \"%s\"\n", s.c_str(), v.c_str());
                usage(2);
            }
            return int(n);
        };
        if (s == "--model") a.model = val();
        else if (s == "--ds4d") a.ds4d = val();
        else if (s == "--socket") a.socket = val();
        else if (s == "--clients") a.clients = parse_list(val());
        else if (s == "--tokens") a.tokens = num();
        else if (s == "--prompt-tokens") a.prompt_tokens = num();
        else if (s == "--threads") a.threads = num();
        else if (s == "--backend") a.backend = val();
        else if (s == "--max-batch") a.max_batch = num();
        else if (s == "--ttft-busy") a.ttft_busy = num();
        else if (s == "--ttft-prompt") a.ttft_prompt = num();
        else if (s == "--compare-unbatched") a.compare_unbatched = true;
        else if (s == "--drafter") a.drafter = val();
        else if (s == "--draft-max") a.draft_max = num();
        else if (s == "--json") a.json = true;
        else if (s == "-h" || s == "--help") usage(0);
        else {
            std::fprintf(stderr, "ds4-bench-batch: unknown argument %s\n", s.c_str());
            usage(2);
        }
    }
    if (a.model.empty() && a.socket.empty()) {
        std::fprintf(stderr, "ds4-bench-batch: --model (or --socket) is required\n");
        usage(2);
    }
    if (a.tokens < 4) {
        std::fprintf(stderr, "ds4-bench-batch: --tokens must be at least 4\n");
        usage(2);
    }
    return a;
}

double pct(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5))];
}

struct Round {
    int clients = 0;
    double agg_tok_s = 0, p50_ms = 0, p99_ms = 0, window_s = 0;
    double mean_batch = 0;  // requests per forward step during the round (from Stats)
    double accept = -1, tokens_per_trial = 0;  // speculative decoding (a drafter), from Stats
};

// One stream: the arrival time of every token.
std::vector<Clock::time_point> stream(const std::string &sock, const std::vector<int32_t> &prompt, int tokens) {
    Client c(sock, "bench-batch");
    GenerateRequest req;
    req.kind = GenerateRequest::Prompt::Tokens;
    req.tokens = prompt;
    req.max_tokens = uint32_t(tokens);
    req.ignore_eos = true;
    std::vector<Clock::time_point> t;
    t.reserve(size_t(tokens));
    ds4::client::GenerateCallbacks cb;
    cb.on_chunk = [&](const ds4::client::Chunk &ch) {
        const auto now = Clock::now();
        for (size_t i = 0; i < ch.tokens.size(); ++i) t.push_back(now);
        return true;
    };
    c.generate(req, cb);
    return t;
}

Round run_round(const std::string &sock, int n, const Args &a, int vocab) {
    Client stats_client(sock, "bench-batch-stats");
    const auto s0 = stats_client.stats();
    std::vector<std::vector<Clock::time_point>> times(static_cast<size_t>(n));
    std::vector<std::string> errors(static_cast<size_t>(n));
    std::vector<std::thread> th;
    for (int i = 0; i < n; ++i)
        th.emplace_back([&, i] {
            try {
                times[size_t(i)] = stream(sock, make_prompt(a.prompt_tokens, vocab, 1000 * n + i), a.tokens);
            } catch (const std::exception &e) {
                errors[size_t(i)] = e.what();
            }
        });
    for (auto &t : th) t.join();
    for (const auto &e : errors)
        if (!e.empty()) throw std::runtime_error("a client failed: " + e);
    const auto s1 = stats_client.stats();
    Clock::time_point lo = Clock::time_point::min(), hi = Clock::time_point::max();
    for (const auto &t : times) {
        if (t.size() < 2) throw std::runtime_error("a client got fewer than 2 tokens");
        lo = std::max(lo, t.front());
        hi = std::min(hi, t.back());
    }
    Round r;
    r.clients = n;
    std::vector<double> gaps;
    size_t count = 0;
    if (hi > lo) {
        for (const auto &t : times)
            for (size_t k = 1; k < t.size(); ++k)
                if (t[k] > lo && t[k] <= hi) {
                    ++count;
                    gaps.push_back(std::chrono::duration<double, std::milli>(t[k] - t[k - 1]).count());
                }
        r.window_s = std::chrono::duration<double>(hi - lo).count();
    }
    if (r.window_s <= 0 || count == 0) {
        // The streams did not overlap (one client, or they ran one after another): whole span.
        lo = times[0].front();
        hi = times[0].back();
        for (const auto &t : times) lo = std::min(lo, t.front()), hi = std::max(hi, t.back());
        count = 0;
        gaps.clear();
        for (const auto &t : times) {
            count += t.size() - 1;
            for (size_t k = 1; k < t.size(); ++k)
                gaps.push_back(std::chrono::duration<double, std::milli>(t[k] - t[k - 1]).count());
        }
        r.window_s = std::chrono::duration<double>(hi - lo).count();
    }
    r.agg_tok_s = r.window_s > 0 ? double(count) / r.window_s : 0;
    r.p50_ms = pct(gaps, 0.5);
    r.p99_ms = pct(gaps, 0.99);
    const uint64_t steps = s1.steps - s0.steps;
    r.mean_batch = steps ? double(s1.step_requests - s0.step_requests) / double(steps) : 0;
    if (s1.draft_max) {
        const uint64_t drafted = s1.spec_drafted - s0.spec_drafted, trials = s1.spec_trials - s0.spec_trials;
        r.accept = drafted ? double(s1.spec_accepted - s0.spec_accepted) / double(drafted) : 0;
        r.tokens_per_trial = trials ? double(s1.spec_tokens - s0.spec_tokens) / double(trials) : 0;
    }
    return r;
}

// Time to first token of a fresh --ttft-prompt request, with `busy` clients decoding.
double ttft_ms(const std::string &sock, const Args &a, int vocab, int busy) {
    std::atomic<bool> stop{false};
    std::atomic<int> streaming{0};
    std::vector<std::thread> th;
    for (int i = 0; i < busy; ++i)
        th.emplace_back([&, i] {
            try {
                Client c(sock, "bench-busy");
                GenerateRequest req;
                req.kind = GenerateRequest::Prompt::Tokens;
                req.tokens = make_prompt(a.prompt_tokens, vocab, 50000 + i);
                req.max_tokens = 100000;
                req.ignore_eos = true;
                bool counted = false;
                ds4::client::GenerateCallbacks cb;
                cb.on_chunk = [&](const ds4::client::Chunk &) {
                    if (!counted) counted = true, ++streaming;
                    return !stop.load();
                };
                c.generate(req, cb);
            } catch (const std::exception &) {
                // The context may fill first; TTFT is taken while they stream.
            }
        });
    while (streaming.load() < busy) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    Client c(sock, "bench-ttft");
    GenerateRequest req;
    req.kind = GenerateRequest::Prompt::Tokens;
    req.tokens = make_prompt(a.ttft_prompt, vocab, 77777 + busy);
    req.max_tokens = 1;
    req.ignore_eos = true;
    const auto t0 = Clock::now();
    double ms = -1;
    ds4::client::GenerateCallbacks cb;
    cb.on_chunk = [&](const ds4::client::Chunk &) {
        if (ms < 0) ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        return true;
    };
    c.generate(req, cb);
    stop = true;
    for (auto &t : th) t.join();
    return ms;
}

struct Report {
    std::string label;
    std::vector<Round> rounds;
    double ttft_idle = 0, ttft_busy = 0;
};

Report bench(const std::string &label, const std::string &sock, const Args &a) {
    Client c(sock, "bench-batch");
    const int vocab = int(c.server_info().model.n_vocab);
    const uint32_t ctx = c.server_info().default_ctx;
    if (uint32_t(a.prompt_tokens + a.tokens) >= ctx)
        throw std::runtime_error("--prompt-tokens + --tokens exceed the daemon's context of " + std::to_string(ctx));
    Report rep;
    rep.label = label;
    (void)stream(sock, make_prompt(a.prompt_tokens, vocab, 1), 4);  // warm-up
    for (int n : a.clients) {
        rep.rounds.push_back(run_round(sock, n, a, vocab));
        const Round &r = rep.rounds.back();
        std::fprintf(stderr, "  [%s] %2d clients: %.1f tok/s aggregate, inter-token p50 %.2f ms p99 %.2f ms, %.2f requests/step\n",
                     label.c_str(), n, r.agg_tok_s, r.p50_ms, r.p99_ms, r.mean_batch);
        if (r.accept >= 0)
            std::fprintf(stderr, "  [%s] %2d clients: %.1f%% of drafts accepted, %.2f tokens per trial\n", label.c_str(), n,
                         100 * r.accept, r.tokens_per_trial);
    }
    if (a.ttft_busy > 0) {
        rep.ttft_idle = ttft_ms(sock, a, vocab, 0);
        rep.ttft_busy = ttft_ms(sock, a, vocab, a.ttft_busy);
    }
    return rep;
}

void print(const Report &r, const Args &a) {
    const double one = r.rounds.empty() ? 0 : r.rounds.front().agg_tok_s;
    std::printf("%s\n", r.label.c_str());
    const bool spec = !r.rounds.empty() && r.rounds.front().accept >= 0;
    std::printf("  clients  aggregate tok/s  vs first  p50 ms  p99 ms  requests/step%s\n",
                spec ? "  drafts accepted  tokens/trial" : "");
    for (const Round &x : r.rounds) {
        std::printf("  %7d  %15.1f  %7.2fx  %6.2f  %6.2f  %13.2f", x.clients, x.agg_tok_s, one > 0 ? x.agg_tok_s / one : 0,
                    x.p50_ms, x.p99_ms, x.mean_batch);
        if (spec) std::printf("  %14.1f%%  %12.2f", 100 * x.accept, x.tokens_per_trial);
        std::printf("\n");
    }
    if (a.ttft_busy > 0)
        std::printf("  time to first token (%d-token prompt): idle %.1f ms, while %d clients decode %.1f ms\n",
                    a.ttft_prompt, r.ttft_idle, a.ttft_busy, r.ttft_busy);
}

void print_json(const std::vector<Report> &reps) {
    std::printf("{");
    for (size_t i = 0; i < reps.size(); ++i) {
        const Report &r = reps[i];
        std::printf("%s\"%s\": {\"ttft_idle_ms\": %.3f, \"ttft_busy_ms\": %.3f, \"rounds\": [", i ? ", " : "",
                    r.label.c_str(), r.ttft_idle, r.ttft_busy);
        for (size_t k = 0; k < r.rounds.size(); ++k) {
            const Round &x = r.rounds[k];
            std::printf("%s{\"clients\": %d, \"aggregate_tok_s\": %.3f, \"p50_ms\": %.3f, \"p99_ms\": %.3f, "
                        "\"requests_per_step\": %.3f",
                        k ? ", " : "", x.clients, x.agg_tok_s, x.p50_ms, x.p99_ms, x.mean_batch);
            if (x.accept >= 0) std::printf(", \"drafts_accepted\": %.4f, \"tokens_per_trial\": %.3f", x.accept, x.tokens_per_trial);
            std::printf("}");
        }
        std::printf("]}");
    }
    std::printf("}\n");
}

}  // namespace

int main(int argc, char **argv) {
    if (ds4_wants_version(argc, argv)) {
        ds4_print_version("ds4-bench-batch");
        return 0;
    }
    signal(SIGPIPE, SIG_IGN);
    const Args a = parse(argc, argv);
    try {
        std::vector<Report> reps;
        auto own = [&](const std::string &label, int max_batch, bool drafter = false) {
            OwnDaemon d;
            std::vector<std::string> args = {"--model", a.model, "--backend", a.backend, "--threads",
                                             std::to_string(a.threads), "--max-batch", std::to_string(max_batch)};
            if (max_batch > 1) args.insert(args.end(), {"--step-tokens", std::to_string(std::max(512, 2 * max_batch))});
            if (drafter) args.insert(args.end(), {"--drafter", a.drafter});
            if (drafter && a.draft_max) args.insert(args.end(), {"--draft-max", std::to_string(a.draft_max)});
            d.start(a.ds4d, args);
            reps.push_back(bench(label, d.socket, a));
        };
        if (!a.socket.empty()) reps.push_back(bench("daemon", a.socket, a));
        else own("batched (--max-batch " + std::to_string(a.max_batch) + ")", a.max_batch);
        if (a.compare_unbatched && a.socket.empty()) own("unbatched (--max-batch 1)", 1);
        if (!a.drafter.empty() && a.socket.empty())
            own("batched (--max-batch " + std::to_string(a.max_batch) + ") with --drafter", a.max_batch, true);
        if (a.json) print_json(reps);
        else
            for (const Report &r : reps) print(r, a);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "ds4-bench-batch: %s\n", e.what());
        return 1;
    }
    return 0;
}
