// Continuous batching end to end: ds4d on the trained default model with --max-batch 16
// serves many clients at once, and every greedy stream equals the same prompt run alone
// in this process through the bridge (sync, then argmax/eval). Then a chaos phase:
// clients connecting, cancelling and disconnecting at random while steady clients keep
// checking their streams against the solo output. DS4_E2E_DRAFTER=1 runs them all on a ds4d
// with the trained model's drafter (speculative decoding).
#include <gtest/gtest.h>

#ifndef DS4_E2E
#define DS4_E2E 0
#endif

#if !DS4_E2E
TEST(BatchingE2E, NeedsBridgeAndDaemon) {
    GTEST_SKIP() << "the batching end-to-end tests need the bridge library (ds4lib) and ds4d in this build";
}
#else

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <random>
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
constexpr int kCtx = 512;

class BatchingE2E : public ::testing::Test {
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
        std::vector<std::string> args = {"--max-batch", "16", "--step-tokens", "256", "--prefill-chunk", "64",
                                         "--ctx", std::to_string(kCtx), "--max-connections", "128"};
        // DS4_E2E_DRAFTER=1: the same tests on a ds4d that speculates (every decoding row a trial).
        if (const char *d = std::getenv("DS4_E2E_DRAFTER"); d && *d == '1')
            args.insert(args.end(), {"--drafter", std::string(DS4_SOURCE_DIR) + "/models/ds4-pystd-drafter-q8_0.gguf"});
        const std::string err =
            daemon->start(DS4D_PATH, kModel, dir->path + "/ds4.sock", dir->path + "/ds4d.log", args);
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

    static std::vector<int32_t> generate(Client &c, const std::vector<int32_t> &p, uint32_t max_tokens,
                                         std::function<bool(size_t)> keep_going = {}) {
        GenerateRequest req;
        req.kind = GenerateRequest::Prompt::Tokens;
        req.tokens = p;
        req.max_tokens = max_tokens;
        std::vector<int32_t> got;
        ds4::client::GenerateCallbacks cb;
        cb.on_chunk = [&](const ds4::client::Chunk &ch) {
            got.insert(got.end(), ch.tokens.begin(), ch.tokens.end());
            return keep_going ? keep_going(got.size()) : true;
        };
        c.generate(req, cb);
        return got;
    }
};

TEST_F(BatchingE2E, SixtyFourPromptsSixteenAtATimeEqualEachAlone) {
    constexpr int kPrompts = 64, kClients = 16;
    constexpr uint32_t kTokens = 24;
    std::vector<std::vector<int32_t>> want(kPrompts), got(kPrompts);
    for (int i = 0; i < kPrompts; ++i) want[size_t(i)] = solo(prompt(i), kTokens);
    Client probe(daemon->socket, "probe");
    const auto s0 = probe.stats();
    std::vector<std::string> errors(kClients);
    std::vector<std::thread> th;
    for (int c = 0; c < kClients; ++c)
        th.emplace_back([&, c] {
            try {
                Client cl(daemon->socket, "batch-" + std::to_string(c));
                for (int i = c; i < kPrompts; i += kClients) got[size_t(i)] = generate(cl, prompt(i), kTokens);
            } catch (const std::exception &e) {
                errors[size_t(c)] = e.what();
            }
        });
    for (auto &t : th) t.join();
    for (int c = 0; c < kClients; ++c) ASSERT_EQ(errors[size_t(c)], "") << "client " << c;
    for (int i = 0; i < kPrompts; ++i) EXPECT_EQ(got[size_t(i)], want[size_t(i)]) << "prompt " << i;
    // They really shared steps: on average well over one request per forward step.
    const auto s1 = probe.stats();
    ASSERT_GT(s1.steps, s0.steps);
    const double per_step = double(s1.step_requests - s0.step_requests) / double(s1.steps - s0.steps);
    EXPECT_GT(per_step, 4.0) << "requests per step";
    EXPECT_EQ(s1.max_batch, 16u);
}

TEST_F(BatchingE2E, ChaosOfCancelsAndDisconnectsLeavesEveryStreamExact) {
    // Seconds of chaos: DS4_CHAOS_SECONDS (the figure is 60; CI runs 15).
    const char *env = std::getenv("DS4_CHAOS_SECONDS");
    const int seconds = env ? std::max(1, std::atoi(env)) : 15;
    constexpr int kSteady = 8, kChaos = 24;
    constexpr uint32_t kTokens = 40;
    std::vector<std::vector<int32_t>> want(kSteady);
    for (int i = 0; i < kSteady; ++i) want[size_t(i)] = solo(prompt(100 + i), kTokens);
    const auto until = Clock::now() + std::chrono::seconds(seconds);
    std::atomic<int> checked{0}, mismatched{0}, chaos_ops{0};
    std::mutex err_mu;
    std::vector<std::string> errors;
    auto note = [&](const std::string &e) {
        std::lock_guard<std::mutex> lk(err_mu);
        errors.push_back(e);
    };
    std::vector<std::thread> th;
    for (int i = 0; i < kSteady; ++i)
        th.emplace_back([&, i] {
            try {
                Client c(daemon->socket, "steady");
                while (Clock::now() < until) {
                    if (generate(c, prompt(100 + i), kTokens) != want[size_t(i)]) ++mismatched;
                    ++checked;
                }
            } catch (const std::exception &e) {
                note(std::string("steady client: ") + e.what());
            }
        });
    for (int i = 0; i < kChaos; ++i)
        th.emplace_back([&, i] {
            std::mt19937 rng(uint32_t(1234 + i));
            while (Clock::now() < until) {
                const int what = int(rng() % 4);
                const std::vector<int32_t> p = prompt(200 + int(rng() % 64));
                try {
                    if (what == 0) {
                        // Cancel after a few tokens.
                        Client c(daemon->socket, "chaos-cancel");
                        const size_t stop_at = 1 + rng() % 6;
                        generate(c, p, 64, [&](size_t n) { return n < stop_at; });
                    } else if (what == 1) {
                        // Disconnect mid-stream without a word.
                        RawConn r(daemon->socket);
                        if (r.ok() && r.hello()) {
                            r.send(generate_tokens_frame(7, p, 64, true));
                            for (int k = 0; k < int(rng() % 4); ++k) r.next(2000);
                        }
                    } else if (what == 2) {
                        // A named session turn, sometimes cut short.
                        Client c(daemon->socket, "chaos-named");
                        const auto sid = c.open_session("chaos-" + std::to_string(i % 6)).id;
                        GenerateRequest req;
                        req.session = sid;
                        req.kind = GenerateRequest::Prompt::Tokens;
                        req.tokens = p;
                        req.max_tokens = 8;
                        ds4::client::GenerateCallbacks cb;
                        const size_t stop_at = rng() % 10;
                        size_t n = 0;
                        cb.on_chunk = [&](const ds4::client::Chunk &ch) { return (n += ch.tokens.size()) < stop_at; };
                        c.generate(req, cb);
                    } else {
                        // Connect and leave at once.
                        RawConn r(daemon->socket);
                    }
                    ++chaos_ops;
                } catch (const ds4::client::ServerError &) {
                    ++chaos_ops;  // e.g. the named session is busy with another chaos client: fine
                } catch (const std::exception &e) {
                    note(std::string("chaos client: ") + e.what());
                }
            }
        });
    for (auto &t : th) t.join();
    for (const auto &e : errors) ADD_FAILURE() << e;
    EXPECT_GT(checked.load(), kSteady) << "the steady clients completed too few streams";
    EXPECT_EQ(mismatched.load(), 0) << "of " << checked.load() << " steady streams";
    EXPECT_GT(chaos_ops.load(), kChaos);
    // Afterwards the daemon is idle, and a fresh stream is still exact.
    Client c(daemon->socket, "after");
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    auto s = c.stats();
    while (s.active_requests > 0 && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        s = c.stats();
    }
    EXPECT_EQ(s.active_requests, 0u);
    EXPECT_EQ(generate(c, prompt(100), kTokens), want[0]);
    std::printf("chaos: %d s, %d steady streams checked, %d chaos operations\n", seconds, checked.load(),
                chaos_ops.load());
}

}  // namespace

#endif
