// Speculative decoding through ds4d (--drafter) on the trained default model and its drafter:
// greedy streams equal the plain bridge's token for token (alone, 8 clients at once with
// batching, and 8 at once with every step a trial); stop tokens, stop strings, length limits
// and cancels inside a trial's accepted run leave the session exact (the next turn equals a
// session that never speculated, and the stored payload is byte-identical to one saved after
// the same turn without speculation); a sampled request is reproducible from its seed, alone
// or among others; the stats count the drafts; a drafter of another vocabulary stops ds4d.
#include <gtest/gtest.h>

#ifndef DS4_E2E
#define DS4_E2E 0
#endif

#if !DS4_E2E
TEST(SpeculationE2E, NeedsBridgeAndDaemon) {
    GTEST_SKIP() << "the speculation end-to-end tests need the bridge library (ds4lib) and ds4d in this build";
}
#else

#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include "bridge/ds4.hpp"
#include "client/ds4client.hpp"
#include "tests/daemon/bridge_reference.h"
#include "tests/daemon/e2e_support.h"

using namespace e2e;
using ds4::client::Client;
using ds4::client::GenerateRequest;

namespace {

const std::string kModel = std::string(DS4_SOURCE_DIR) + "/models/ds4-pystd-q8_0.gguf";
const std::string kDrafter = std::string(DS4_SOURCE_DIR) + "/models/ds4-pystd-drafter-q8_0.gguf";
constexpr int kCtx = 512;

struct Output {
    std::vector<int32_t> tokens;
    std::string text;
    ds4::client::DoneInfo done;
};

class SpeculationE2E : public ::testing::Test {
protected:
    static inline TempDir *dir = nullptr;
    static inline Daemon *daemon = nullptr;
    static inline ds4::bridge::Model *model = nullptr;

    static void SetUpTestSuite() {
        dir = new TempDir;
        ds4::bridge::ModelOptions mo;
        mo.model_path = kModel;
        mo.n_threads = 1;
        model = new ds4::bridge::Model(mo);
        daemon = new Daemon;
        const std::string err =
            daemon->start(DS4D_PATH, kModel, dir->path + "/ds4.sock", dir->path + "/ds4d.log",
                          {"--drafter", kDrafter, "--draft-max", "4", "--max-batch", "16", "--step-tokens", "256",
                           "--prefill-chunk", "64", "--ctx", std::to_string(kCtx), "--state-dir", dir->path + "/state"});
        ASSERT_EQ(err, "");
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

    static std::vector<int32_t> prompt(int i) { return model->tokenize(python_like_prompt(i)); }
    // The reference: the prompt alone in a fresh session without a drafter, greedy, through EOS.
    static std::vector<int32_t> solo(const std::vector<int32_t> &p, uint32_t max_tokens) {
        return greedy_alone(*model, kCtx, p, max_tokens);
    }

    static Output generate(Client &c, GenerateRequest req, std::function<bool(size_t)> keep_going = {}) {
        Output r;
        ds4::client::GenerateCallbacks cb;
        cb.on_chunk = [&](const ds4::client::Chunk &ch) {
            r.tokens.insert(r.tokens.end(), ch.tokens.begin(), ch.tokens.end());
            r.text += ch.text;
            return keep_going ? keep_going(r.tokens.size()) : true;
        };
        r.done = c.generate(req, cb);
        return r;
    }

    static GenerateRequest tokens_req(const std::vector<int32_t> &p, uint32_t max_tokens, uint64_t session = 0) {
        GenerateRequest req;
        req.session = session;
        req.kind = GenerateRequest::Prompt::Tokens;
        req.tokens = p;
        req.max_tokens = max_tokens;
        return req;
    }

    // The stored payload of session `name`: <file id>-<name>.dsv4, the newest (highest id).
    static std::string stored_payload(const std::string &name) {
        std::string best;
        for (const auto &e : std::filesystem::recursive_directory_iterator(dir->path + "/state")) {
            const std::string f = e.path().filename().string();
            if (f.size() == 16 + name.size() + 6 && f.ends_with("-" + name + ".dsv4") &&
                (best.empty() || e.path().string() > best))
                best = e.path().string();
        }
        return best.empty() ? std::string() : read_file(best);
    }
};

TEST_F(SpeculationE2E, GreedyAloneEqualsPlainDecoding) {
    constexpr int kPrompts = 60;
    constexpr uint32_t kTokens = 32;
    Client c(daemon->socket, "alone");
    const auto s0 = c.stats();
    ASSERT_EQ(s0.draft_max, 4u);
    for (int i = 0; i < kPrompts; ++i) {
        const std::vector<int32_t> p = prompt(i);
        const Output r = generate(c, tokens_req(p, kTokens));
        EXPECT_EQ(r.tokens, solo(p, kTokens)) << "prompt " << i;
    }
    const auto s1 = c.stats();
    // Speculation really ran, and the drafter mostly agrees with the model on its own data.
    const uint64_t trials = s1.spec_trials - s0.spec_trials, drafted = s1.spec_drafted - s0.spec_drafted,
                   accepted = s1.spec_accepted - s0.spec_accepted;
    EXPECT_GT(trials, uint64_t(kPrompts));
    EXPECT_GE(drafted, trials);
    EXPECT_LE(drafted, trials * 4);
    EXPECT_GT(accepted, drafted / 4) << accepted << " of " << drafted;
    EXPECT_GT(s1.spec_tokens - s0.spec_tokens, trials);   // more than one token per trial
    EXPECT_GT(s1.solo_steps, s0.solo_steps);             // the baseline steps
}

TEST_F(SpeculationE2E, GreedyEightAtATimeEqualsPlainDecoding) {
    constexpr int kPrompts = 32, kClients = 8;
    constexpr uint32_t kTokens = 24;
    std::vector<std::vector<int32_t>> want(kPrompts), got(kPrompts);
    for (int i = 0; i < kPrompts; ++i) want[size_t(i)] = solo(prompt(40 + i), kTokens);
    Client probe(daemon->socket, "probe");
    const auto s0 = probe.stats();
    std::vector<std::string> errors(kClients);
    std::vector<std::thread> th;
    for (int c = 0; c < kClients; ++c)
        th.emplace_back([&, c] {
            try {
                Client cl(daemon->socket, "eight-" + std::to_string(c));
                for (int i = c; i < kPrompts; i += kClients) got[size_t(i)] = generate(cl, tokens_req(prompt(40 + i), kTokens)).tokens;
            } catch (const std::exception &e) {
                errors[size_t(c)] = e.what();
            }
        });
    for (auto &t : th) t.join();
    for (int c = 0; c < kClients; ++c) ASSERT_EQ(errors[size_t(c)], "") << "client " << c;
    for (int i = 0; i < kPrompts; ++i) EXPECT_EQ(got[size_t(i)], want[size_t(i)]) << "prompt " << i;
    // Trials ran inside shared steps: several requests per step, and more rows than requests.
    const auto s1 = probe.stats();
    const double steps = double(s1.steps - s0.steps);
    ASSERT_GT(steps, 0);
    EXPECT_GT(double(s1.step_requests - s0.step_requests) / steps, 2.0);
    EXPECT_GT(s1.step_rows - s0.step_rows, 2 * (s1.step_requests - s0.step_requests));
    EXPECT_GT(s1.spec_trials - s0.spec_trials, uint64_t(kPrompts) * 3);
}

// --max-batch 1: every decode step of every request is a trial, eight sessions interleaved.
TEST_F(SpeculationE2E, EveryStepATrialEightInterleavedEqualsPlainDecoding) {
    TempDir d2;
    Daemon solo_daemon;
    ASSERT_EQ(solo_daemon.start(DS4D_PATH, kModel, d2.path + "/ds4.sock", d2.path + "/ds4d.log",
                                {"--drafter", kDrafter, "--max-batch", "1", "--ctx", std::to_string(kCtx)}),
              "");
    constexpr int kPrompts = 16, kClients = 8;
    constexpr uint32_t kTokens = 24;
    std::vector<std::vector<int32_t>> want(kPrompts), got(kPrompts);
    for (int i = 0; i < kPrompts; ++i) want[size_t(i)] = solo(prompt(80 + i), kTokens);
    std::vector<std::string> errors(kClients);
    std::vector<std::thread> th;
    for (int c = 0; c < kClients; ++c)
        th.emplace_back([&, c] {
            try {
                Client cl(solo_daemon.socket, "interleaved-" + std::to_string(c));
                for (int i = c; i < kPrompts; i += kClients) got[size_t(i)] = generate(cl, tokens_req(prompt(80 + i), kTokens)).tokens;
            } catch (const std::exception &e) {
                errors[size_t(c)] = e.what();
            }
        });
    for (auto &t : th) t.join();
    for (int c = 0; c < kClients; ++c) ASSERT_EQ(errors[size_t(c)], "") << "client " << c;
    for (int i = 0; i < kPrompts; ++i) EXPECT_EQ(got[size_t(i)], want[size_t(i)]) << "prompt " << i;
    Client probe(solo_daemon.socket, "probe");
    EXPECT_GT(probe.stats().spec_trials, uint64_t(kPrompts));
    EXPECT_EQ(solo_daemon.stop(SIGTERM), 0) << read_file(solo_daemon.log);
}

// Each way of ending inside a trial's accepted run: the turn's output equals the same turn
// with speculation off, the stored payloads are byte-identical, and the next turn (which
// starts from the committed session) equals too.
TEST_F(SpeculationE2E, EndingInsideATrialLeavesTheSessionExact) {
    Client c(daemon->socket, "ends");
    const std::vector<int32_t> p = prompt(7);
    const std::vector<int32_t> ref = solo(p, 40);
    ASSERT_GE(ref.size(), 12u);
    const std::string stop_string = model->detokenize(std::span<const int32_t>(ref.data() + 6, 2));
    struct Case {
        const char *name;
        std::function<void(GenerateRequest &)> set;
        std::function<bool(size_t)> keep_going;
    };
    const std::vector<Case> cases = {
        {"length", [](GenerateRequest &r) { r.max_tokens = 5; }, {}},
        {"stoptoken", [&](GenerateRequest &r) { r.stop_tokens = {ref[9]}; }, {}},
        {"stopstring", [&](GenerateRequest &r) { r.stop_strings = {stop_string}; }, {}},
    };
    for (const Case &k : cases) {
        SCOPED_TRACE(k.name);
        Output turn[2], next[2];
        std::string stored[2];
        for (int spec = 0; spec < 2; ++spec) {
            const std::string name = std::string(k.name) + (spec ? "-spec" : "-plain");
            const uint64_t sid = c.open_session(name).id;
            GenerateRequest req = tokens_req(p, 40, sid);
            req.speculate = spec == 1;
            k.set(req);
            turn[spec] = generate(c, req, k.keep_going);
            c.save_session(name, sid);
            stored[spec] = stored_payload(name);
            GenerateRequest req2 = tokens_req(model->tokenize("\n# next"), 16, sid);
            req2.speculate = spec == 1;
            next[spec] = generate(c, req2);
        }
        EXPECT_EQ(turn[1].tokens, turn[0].tokens);
        EXPECT_EQ(turn[1].text, turn[0].text);
        EXPECT_EQ(turn[1].done.reason, turn[0].done.reason);
        EXPECT_EQ(next[1].tokens, next[0].tokens);
        EXPECT_FALSE(stored[0].empty());
        EXPECT_TRUE(stored[0] == stored[1]) << "stored payloads differ (" << stored[0].size() << " vs " << stored[1].size()
                                            << " bytes)";
    }
}

// A cancel lands between steps, so where it cuts depends on how many tokens a step yields;
// whatever was streamed is the session's history, held exactly: the stored payload equals
// the bridge's after syncing that history, and the next turn continues as the bridge does.
// (With speculation off too: the comparison itself holds for plain decoding.)
TEST_F(SpeculationE2E, CancelledTurnLeavesTheSessionExact) {
    Client c(daemon->socket, "cancel");
    // A prompt whose greedy answer runs past the cut (some end at once with EOS).
    int pi = 11;
    while (pi < 40 && solo(prompt(pi), 8).size() < 8) ++pi;
    ASSERT_LT(pi, 40) << "no prompt with an answer of 8+ tokens";
    const std::vector<int32_t> p = prompt(pi);
    for (int spec = 1; spec >= 0; --spec) {
        SCOPED_TRACE(spec ? "speculating" : "plain");
        const std::string name = spec ? "cancelled-spec" : "cancelled-plain";
        const uint64_t sid = c.open_session(name).id;
        GenerateRequest req = tokens_req(p, 40, sid);
        req.speculate = spec == 1;
        const Output turn = generate(c, req, [](size_t n) { return n < 3; });
        EXPECT_EQ(turn.done.reason, ds4::client::FinishReason::Cancelled);
        ASSERT_GE(turn.tokens.size(), 3u);
        c.save_session(name, sid);
        std::vector<int32_t> history = p;
        history.insert(history.end(), turn.tokens.begin(), turn.tokens.end());
        ds4::bridge::Session ref(*model, kCtx);
        ref.sync(history);
        const std::vector<uint8_t> want = ref.save_payload();
        const std::string got = stored_payload(name);
        EXPECT_TRUE(got.size() == want.size() && std::memcmp(got.data(), want.data(), want.size()) == 0)
            << "stored " << got.size() << " bytes, the bridge " << want.size();
        const std::vector<int32_t> more = model->tokenize("\n# next");
        const Output next = generate(c, tokens_req(more, 16, sid));
        history.insert(history.end(), more.begin(), more.end());
        EXPECT_EQ(next.tokens, solo(history, 16));
    }
}

// Every decoding row speculates, alone or batched, and a request's draft widths and random
// draws depend only on it: the same seed gives the same tokens alone and among 7 others.
TEST_F(SpeculationE2E, SampledRequestIsReproducibleFromItsSeed) {
    Client c(daemon->socket, "sampled");
    const auto s0 = c.stats();
    auto sampled = [&](Client &cl, int i, uint64_t seed) {
        GenerateRequest req = tokens_req(prompt(i), 40);
        req.temperature = 0.8f;
        req.top_k = 40;
        req.seed = seed;
        return generate(cl, req).tokens;
    };
    const std::vector<int32_t> a = sampled(c, 3, 1234), b = sampled(c, 3, 1234), other = sampled(c, 3, 99);
    EXPECT_EQ(a, b);
    EXPECT_EQ(a.size(), 40u);
    EXPECT_NE(a, other);   // the seed matters (40 tokens at temperature 0.8)
    std::vector<std::vector<int32_t>> crowd(8);
    std::vector<std::string> errors(8);
    std::vector<std::thread> th;
    for (int k = 0; k < 8; ++k)
        th.emplace_back([&, k] {
            try {
                Client cl(daemon->socket, "crowd");
                crowd[size_t(k)] = sampled(cl, k == 0 ? 3 : 120 + k, k == 0 ? 1234 : uint64_t(k));
            } catch (const std::exception &e) {
                errors[size_t(k)] = e.what();
            }
        });
    for (auto &t : th) t.join();
    for (const std::string &e : errors) ASSERT_EQ(e, "");
    EXPECT_EQ(crowd[0], a) << "the same seed among other requests";
    EXPECT_GT(c.stats().spec_trials, s0.spec_trials);
}

TEST(SpeculationStartup, DrafterOfAnotherVocabularyStopsTheDaemon) {
    TempDir d;
    const std::string other = d.path + "/tiny.gguf";
    ASSERT_EQ(run_cmd({DS4_MAKE_MODEL_PATH, "--preset", "tiny", other}, d.path).rc, 0);
    Daemon dd;
    const std::string err = dd.start(DS4D_PATH, kModel, d.path + "/ds4.sock", d.path + "/ds4d.log", {"--drafter", other});
    EXPECT_NE(err.find("exited during start-up"), std::string::npos) << err;
    EXPECT_NE(err.find("does not fit the model"), std::string::npos) << err;
}

}  // namespace

#endif
