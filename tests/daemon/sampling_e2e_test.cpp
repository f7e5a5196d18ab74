// Sampling controls end to end (a real ds4d on the tiny model): logit bias, repetition
// penalties and log-probabilities against an independent computation here — the bridge's
// logits of the same prefix in-process, the formulas written out below — plus the neutral
// settings being exactly the plain path, and the refusals of bad values (daemon and CLI). The
// daemon speculates (the model is its own drafter), which requests with controls must bypass.
#include <gtest/gtest.h>

#ifndef DS4_E2E
TEST(SamplingE2E, NeedsBridgeDaemonAndModelGenerator) {
    GTEST_SKIP() << "needs the bridge library, ds4d and ds4-make-model";
}
#else

#include <cmath>
#include <map>
#include <memory>
#include <set>

#include "bridge/ds4.hpp"
#include "client/ds4client.hpp"
#include "tests/daemon/e2e_support.h"

using namespace e2e;
using ds4::client::Client;
using ds4::client::GenerateRequest;
using ds4::client::ServerError;

namespace {

constexpr int kCtx = 4096;

struct Controls {
    float temperature = 0;
    uint64_t seed = 0;
    float repeat_penalty = 1;
    int32_t repeat_last_n = 64;
    float frequency = 0, presence = 0;
    std::map<int32_t, float> bias;
    int top = 0;  // top_logprobs
};

struct Step {
    int32_t token;
    double logprob;
    std::vector<std::pair<int32_t, double>> top;
};

// splitmix64 of the seed: ds4d's initial rng state for a request (daemon/worker_impl.h).
uint64_t initial_rng(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

class SamplingE2E : public ::testing::Test {
protected:
    static inline TempDir *dir = nullptr;
    static inline Daemon *daemon = nullptr;
    static inline ds4::bridge::Model *model = nullptr;
    static inline int32_t next_first = 300;

    static void SetUpTestSuite() {
        dir = new TempDir;
        const std::string path = dir->path + "/tiny.gguf";
        CmdResult mk = run_cmd({DS4_MAKE_MODEL_PATH, "--preset", "tiny", "--quiet", path}, dir->path);
        ASSERT_EQ(mk.rc, 0) << mk.err;
        ds4::bridge::ModelOptions mo;
        mo.model_path = path;
        mo.n_threads = 1;
        model = new ds4::bridge::Model(mo);
        daemon = new Daemon;
        // The model is its own drafter: plain requests speculate, and requests with sampling
        // controls must not (the drafts are checked against the unadjusted distribution).
        ASSERT_EQ(daemon->start(DS4D_PATH, path, dir->path + "/ds4.sock", dir->path + "/ds4d.log",
                                {"--drafter", path, "--draft-max", "3"}),
                  "");
    }
    static void TearDownTestSuite() {
        if (daemon) { EXPECT_EQ(daemon->stop(SIGTERM), 0) << read_file(daemon->log); }
        delete daemon;
        delete model;
        delete dir;
        daemon = nullptr;
        model = nullptr;
        dir = nullptr;
    }
    void SetUp() override {
        if (!daemon || daemon->pid < 0) GTEST_SKIP() << "suite set-up failed";
    }

    // A short prompt with a first token no other prompt has (no pooled prefix is shared)
    // and repeats in it, so the repeat window matters from the first token.
    static std::vector<int32_t> prompt() {
        int32_t first = next_first++;
        while (model->is_stop(first)) first = next_first++;
        return {first, 17, 42, 17, 99, 42, 17, 5};
    }

    // The reference: bridge logits after the same prefix, the formulas applied here.
    static std::vector<Step> reference(const std::vector<int32_t> &p, const Controls &c, uint32_t n) {
        ds4::bridge::Session s(*model, kCtx);
        s.sync(p);
        const int V = model->vocab_size();
        std::vector<int32_t> context = p;
        std::map<int32_t, int> generated;
        uint64_t rng = initial_rng(c.seed);
        std::vector<Step> out;
        for (uint32_t i = 0; i < n; ++i) {
            std::vector<float> l = s.logits(V);
            for (const auto &[t, b] : c.bias) l[size_t(t)] += b;
            if (c.repeat_penalty != 1 && c.repeat_last_n != 0) {
                const size_t w = c.repeat_last_n < 0 ? context.size() : std::min<size_t>(context.size(), size_t(c.repeat_last_n));
                const std::set<int32_t> window(context.end() - ptrdiff_t(w), context.end());
                for (int32_t t : window) l[size_t(t)] = l[size_t(t)] > 0 ? l[size_t(t)] / c.repeat_penalty : l[size_t(t)] * c.repeat_penalty;
            }
            for (const auto &[t, k] : generated) l[size_t(t)] -= float(k) * c.frequency + c.presence;
            int32_t tok = 0;
            if (c.temperature > 0) {
                tok = ds4::bridge::sample_logits(l, c.temperature, 0, 1.0f, 0.0f, &rng);
            } else {
                for (int v = 1; v < V; ++v)
                    if (l[size_t(v)] > l[size_t(tok)]) tok = v;
            }
            // log-softmax of l / T (T = 1 when greedy), in long double.
            const long double inv_t = c.temperature > 0 ? 1.0L / c.temperature : 1.0L;
            long double z = 0;
            for (float v : l) z += std::exp((long double)v * inv_t - (long double)l[size_t(tok)] * inv_t);
            Step st{tok, double(-std::log(z)), {}};
            std::vector<int32_t> order(static_cast<size_t>(V), 0);
            for (int v = 0; v < V; ++v) order[size_t(v)] = v;
            std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[size_t(a)] > l[size_t(b)]; });
            for (int k = 0; k < c.top; ++k)
                st.top.emplace_back(order[size_t(k)], double(st.logprob + ((long double)l[size_t(order[size_t(k)])] - l[size_t(tok)]) * inv_t));
            out.push_back(std::move(st));
            context.push_back(tok);
            ++generated[tok];
            s.eval(tok);
        }
        return out;
    }

    static GenerateRequest request(const std::vector<int32_t> &p, const Controls &c, uint32_t n, bool logprobs) {
        GenerateRequest r;
        r.kind = GenerateRequest::Prompt::Tokens;
        r.tokens = p;
        r.max_tokens = n;
        r.ignore_eos = true;
        r.temperature = c.temperature;
        r.seed = c.seed;
        r.repeat_penalty = c.repeat_penalty;
        r.repeat_last_n = c.repeat_last_n;
        r.frequency_penalty = c.frequency;
        r.presence_penalty = c.presence;
        for (const auto &b : c.bias) r.logit_bias.push_back(b);
        r.logprobs = logprobs;
        r.top_logprobs = uint32_t(c.top);
        return r;
    }

    static std::vector<Step> run(const GenerateRequest &r) {
        Client cl(daemon->socket);
        std::vector<Step> out;
        ds4::client::GenerateCallbacks cb;
        cb.on_chunk = [&](const ds4::client::Chunk &ch) {
            if (r.logprobs) { EXPECT_EQ(ch.logprobs.size(), ch.tokens.size()); }
            for (size_t i = 0; i < ch.tokens.size(); ++i) {
                Step s{ch.tokens[i], 0, {}};
                if (i < ch.logprobs.size()) {
                    s.logprob = ch.logprobs[i].logprob;
                    for (const auto &[t, v] : ch.logprobs[i].top) s.top.emplace_back(t, v);
                }
                out.push_back(std::move(s));
            }
            return true;
        };
        cl.generate(r, cb);
        return out;
    }

    static void expect_same(const std::vector<Step> &got, const std::vector<Step> &want, bool logprobs) {
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_EQ(got[i].token, want[i].token) << "token " << i;
            if (!logprobs) continue;
            EXPECT_NEAR(got[i].logprob, want[i].logprob, 1e-4) << "token " << i;
            ASSERT_EQ(got[i].top.size(), want[i].top.size()) << "token " << i;
            for (size_t k = 0; k < got[i].top.size(); ++k) {
                EXPECT_EQ(got[i].top[k].first, want[i].top[k].first) << "token " << i << " top " << k;
                EXPECT_NEAR(got[i].top[k].second, want[i].top[k].second, 1e-4) << "token " << i << " top " << k;
            }
        }
    }
};

TEST_F(SamplingE2E, GreedyPenaltiesBiasAndLogprobsMatchTheFormulas) {
    const auto p = prompt();
    Controls plain;
    plain.top = 5;
    const std::vector<Step> base = reference(p, plain, 24);
    Controls c;
    c.repeat_penalty = 1.7f;
    c.repeat_last_n = 6;
    c.frequency = 0.8f;
    c.presence = 0.5f;
    // Push the plain run's favourite down and another token up.
    c.bias = {{base[0].token, -3.5f}, {base[0].top[1].first, 1.25f}, {7, 0.5f}};
    c.top = 5;
    const std::vector<Step> want = reference(p, c, 24);
    // The controls change the output (else this test would prove nothing).
    std::vector<int32_t> a, b;
    for (const Step &s : base) a.push_back(s.token);
    for (const Step &s : want) b.push_back(s.token);
    ASSERT_NE(a, b);
    expect_same(run(request(p, c, 24, true)), want, true);
    // Whole-context window, penalties alone, no logprobs.
    Controls w = c;
    w.repeat_last_n = -1;
    w.bias.clear();
    w.top = 0;
    const auto p2 = prompt();
    expect_same(run(request(p2, w, 24, false)), reference(p2, w, 24), false);
}

TEST_F(SamplingE2E, SeededSamplingWithPenaltiesMatchesTheFormulas) {
    const auto p = prompt();
    Controls c;
    c.temperature = 0.8f;
    c.seed = 99;
    c.frequency = 1.5f;
    c.presence = -0.5f;
    c.repeat_penalty = 1.3f;
    c.top = 3;
    expect_same(run(request(p, c, 20, true)), reference(p, c, 20), true);
}

TEST_F(SamplingE2E, NeutralControlsAndLogprobsLeaveTheOutputAsIs) {
    // Greedy: penalty 1.0, zero penalties and logprobs (the daemon's own row path) give the
    // tokens of a request without them (the engine's path).
    const auto p = prompt();
    Controls none;
    GenerateRequest plain = request(p, none, 24, false);
    Controls neutral;
    neutral.repeat_penalty = 1.0f;
    neutral.repeat_last_n = -1;
    GenerateRequest with = request(p, neutral, 24, true);
    with.frequency_penalty = 0.0f;
    with.presence_penalty = 0.0f;
    std::vector<int32_t> a, b;
    for (const Step &s : run(plain)) a.push_back(s.token);
    for (const Step &s : run(with)) b.push_back(s.token);
    EXPECT_EQ(a, b);
    EXPECT_EQ(a.size(), 24u);
    // Seeded sampling: the same draws through either path (the plain one without speculation,
    // whose draws are distributed alike but not the same).
    plain.speculate = false;
    plain.temperature = with.temperature = 1.1f;
    plain.seed = with.seed = 4242;
    plain.top_k = with.top_k = 30;
    plain.top_p = with.top_p = 0.9f;
    a.clear();
    b.clear();
    for (const Step &s : run(plain)) a.push_back(s.token);
    for (const Step &s : run(with)) b.push_back(s.token);
    EXPECT_EQ(a, b);
}

TEST_F(SamplingE2E, BadValuesAreRefusedWithTheirName) {
    const auto p = prompt();
    Client cl(daemon->socket);
    auto refused = [&](GenerateRequest r, const std::string &needle) {
        try {
            cl.generate(r);
            ADD_FAILURE() << "accepted; wanted an error naming " << needle;
        } catch (const ServerError &e) {
            EXPECT_EQ(e.code_name, "BadRequest") << e.what();
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    Controls c;
    GenerateRequest r = request(p, c, 4, false);
    r.logit_bias = {{model->vocab_size(), 1.0f}};
    refused(r, "outside the vocabulary");
    r.logit_bias = {{3, 1.0f}, {3, 2.0f}};
    refused(r, "twice");
    r.logit_bias = {{3, 101.0f}};
    refused(r, "logit_bias");
    r.logit_bias.assign(301, {0, 0.0f});
    for (int i = 0; i < 301; ++i) r.logit_bias[size_t(i)].first = i;
    refused(r, "at most 300");
    r = request(p, c, 4, true);
    r.top_logprobs = 21;
    refused(r, "top_logprobs");
    r = request(p, c, 4, false);
    r.top_logprobs = 3;
    refused(r, "needs logprobs");
    r = request(p, c, 4, false);
    r.repeat_penalty = 0;
    refused(r, "repeat_penalty");
    r = request(p, c, 4, false);
    r.repeat_last_n = -2;
    refused(r, "repeat_last_n");
    r = request(p, c, 4, false);
    r.frequency_penalty = 2.5f;
    refused(r, "frequency_penalty");
    r = request(p, c, 4, false);
    r.presence_penalty = -3;
    refused(r, "presence_penalty");
    // The connection still works.
    r = request(p, c, 4, false);
    EXPECT_EQ(cl.generate(r).generated_tokens, 4u);
}

TEST_F(SamplingE2E, CliPenaltyFlagsAreValidatedAndApplied) {
    for (const std::vector<std::string> &bad :
         {std::vector<std::string>{"--repeat-penalty", "0"}, {"--repeat-penalty", "11"}, {"--repeat-penalty", "x"},
          {"--repeat-last-n", "-2"}, {"--frequency-penalty", "2.5"}, {"--presence-penalty", "-3"},
          {"--logit-bias", "5"}, {"--logit-bias", "5=200"}, {"--logit-bias", "-1=2"}}) {
        std::vector<std::string> argv = {DS4_CLI_PATH, "--socket", daemon->socket, "run", "--raw"};
        argv.insert(argv.end(), bad.begin(), bad.end());
        argv.push_back("hi");
        CmdResult r = run_cmd(argv, dir->path);
        EXPECT_EQ(r.rc, 2) << bad[0] << " " << bad[1] << ": " << r.err;
        EXPECT_NE(r.err.find(bad[0]), std::string::npos) << r.err;
    }
    // Applied: the CLI's --ids output is the reference's greedy run with the same controls.
    const std::string text = "Quokkas eat leaves, quokkas eat leaves";
    const std::vector<int32_t> p2 = model->tokenize(text);
    Controls c;
    c.repeat_penalty = 1.5f;
    c.repeat_last_n = 16;
    c.frequency = 0.7f;
    c.presence = 0.2f;
    c.bias = {{p2.back(), 2.0f}};
    std::string want;
    for (const Step &s : reference(p2, c, 12)) want += (want.empty() ? "" : " ") + std::to_string(s.token);
    CmdResult r = run_cmd({DS4_CLI_PATH, "--socket", daemon->socket, "run", "--raw", "--ids", "--ignore-eos", "--max-tokens",
                           "12", "--repeat-penalty", "1.5", "--repeat-last-n", "16", "--frequency-penalty", "0.7",
                           "--presence-penalty", "0.2", "--logit-bias", std::to_string(p2.back()) + "=2", text},
                          dir->path);
    ASSERT_EQ(r.rc, 0) << r.err;
    std::string got = r.out;
    while (!got.empty() && (got.back() == '\n' || got.back() == ' ')) got.pop_back();
    EXPECT_EQ(got, want);
}

}  // namespace
#endif
