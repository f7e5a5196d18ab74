// End-to-end: ds4d's session-cache budget (--kv-budget) and waiting for memory or a session
// slot (--max-sessions, --kv-wait). Real ds4d processes on the tiny model (context limit
// raised to 1M); the expected cache sizes come from the bridge (ds4_bridge_cache_bytes_for),
// which the engine tests tie to what a session really allocates.
#include <gtest/gtest.h>

#ifndef DS4_E2E
#define DS4_E2E 0
#endif

#if !DS4_E2E
TEST(KvBudgetE2E, NeedsBridgeDaemonAndModelGenerator) {
    GTEST_SKIP() << "budget end-to-end tests need ds4lib, ds4d and ds4-make-model in this build";
}
#else

#include <atomic>
#include <memory>
#include <mutex>

#include "bridge/ds4.hpp"
#include "client/ds4client.hpp"
#include "tests/daemon/e2e_support.h"

using namespace e2e;
using ds4::client::Client;
using ds4::client::GenerateRequest;
using ds4::client::ServerError;

namespace {

bool contains(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

constexpr uint32_t kBigCtx = 1u << 20;

class KvBudgetE2E : public ::testing::Test {
protected:
    static inline TempDir *dir = nullptr;
    static inline std::string model_path;
    static inline ds4::bridge::Model *model = nullptr;

    static void SetUpTestSuite() {
        dir = new TempDir;
        model_path = dir->path + "/tiny.gguf";
        CmdResult mk = run_cmd({DS4_MAKE_MODEL_PATH, "--preset", "tiny", "--ctx", std::to_string(kBigCtx), "--quiet",
                                model_path},
                               dir->path);
        ASSERT_EQ(mk.rc, 0) << mk.err;
        ds4::bridge::ModelOptions mo;
        mo.model_path = model_path;
        mo.n_threads = 1;
        model = new ds4::bridge::Model(mo);
    }
    static void TearDownTestSuite() {
        delete model;
        delete dir;
        model = nullptr;
        dir = nullptr;
    }
    void SetUp() override {
        if (!model) GTEST_SKIP() << "suite set-up failed";
    }
    // Cache bytes of a session of ctx once it has held n tokens.
    static uint64_t bytes_for(uint32_t ctx, uint32_t n) {
        uint64_t b = 0;
        char err[256];
        EXPECT_EQ(ds4_bridge_cache_bytes_for(model->handle(), int(ctx), int(n), &b, err, sizeof err), 0) << err;
        return b;
    }
    std::string start(Daemon &d, std::vector<std::string> extra) {
        static int n = 0;
        const std::string tag = std::to_string(n++);
        return d.start(DS4D_PATH, model_path, dir->path + "/k" + tag + ".sock", dir->path + "/k" + tag + ".log", extra);
    }
    static GenerateRequest one_shot(uint32_t max_tokens, uint64_t session = 0) {
        GenerateRequest g;
        g.session = session;
        g.kind = GenerateRequest::Prompt::Tokens;
        g.tokens = {1, 2, 3, 4, 5, 6, 7, 8};
        g.max_tokens = max_tokens;
        g.ignore_eos = true;
        return g;
    }
};

// A budget that holds about three requests at a time: 32 concurrent one-shot clients are all
// served (they wait their turn), none is refused, and the memory held never exceeds it.
TEST_F(KvBudgetE2E, ConcurrentRequestsBeyondTheBudgetWaitAndAllAreServed) {
    const uint32_t ctx = 4096, max_tokens = 24;
    const uint64_t need = bytes_for(ctx, 8 + max_tokens);
    const uint64_t budget = need * 3 + need / 2;
    Daemon d;
    ASSERT_EQ(start(d, {"--ctx", std::to_string(ctx), "--kv-budget", std::to_string(budget), "--max-sessions", "16"}),
              "");
    std::atomic<int> served{0}, refused{0};
    std::atomic<bool> done{false};
    std::atomic<uint64_t> peak{0};
    std::atomic<uint32_t> most_waiting{0};
    std::mutex mu;
    std::string first_error;
    std::thread watch([&] {
        Client c(d.socket);
        while (!done) {
            const auto s = c.stats();
            peak = std::max<uint64_t>(peak, s.kv_in_use);
            most_waiting = std::max(most_waiting.load(), s.kv_waiting);
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
    });
    std::vector<std::thread> clients;
    for (int i = 0; i < 32; ++i)
        clients.emplace_back([&] {
            try {
                Client c(d.socket);
                const auto r = c.generate(one_shot(max_tokens));
                if (r.generated_tokens == max_tokens) ++served;
            } catch (const std::exception &e) {
                ++refused;
                std::lock_guard<std::mutex> lk(mu);
                if (first_error.empty()) first_error = e.what();
            }
        });
    for (auto &t : clients) t.join();
    done = true;
    watch.join();
    EXPECT_EQ(served.load(), 32) << first_error;
    EXPECT_EQ(refused.load(), 0) << first_error;
    EXPECT_LE(peak.load(), budget) << "memory held beyond --kv-budget";
    EXPECT_GT(most_waiting.load(), 0u) << "no request ever waited: the budget did not bind";
    Client c(d.socket);
    const auto s = c.stats();
    EXPECT_EQ(s.kv_budget, budget);
    EXPECT_EQ(s.kv_refused, 0u);
    EXPECT_EQ(s.kv_waiting, 0u);
    EXPECT_EQ(d.stop(SIGTERM), 0);
}

// Opens beyond --max-sessions with nothing to release wait for a slot instead of failing at
// once: 16 sessions held open, 16 more opens all wait (stats say so) and each is served as
// soon as a holder closes its session; then 32 clients opening, using and closing sessions
// at once are all served.
TEST_F(KvBudgetE2E, OpensBeyondMaxSessionsWaitForASlot) {
    Daemon d;
    ASSERT_EQ(start(d, {"--max-sessions", "16"}), "");
    Client holder(d.socket);
    std::vector<uint64_t> held;
    for (int i = 0; i < 16; ++i) held.push_back(holder.open_session({}, 256).id);
    std::atomic<int> ok{0};
    std::mutex mu;
    std::string first_error;
    auto use_one = [&] {
        try {
            Client c(d.socket);
            const auto info = c.open_session({}, 256);
            c.generate(one_shot(16, info.id));
            c.close_session(info.id);
            ++ok;
        } catch (const std::exception &e) {
            std::lock_guard<std::mutex> lk(mu);
            if (first_error.empty()) first_error = e.what();
        }
    };
    std::vector<std::thread> waiting;
    for (int i = 0; i < 16; ++i) waiting.emplace_back(use_one);
    uint32_t seen = 0;
    for (int i = 0; i < 1000 && seen < 16; ++i) {
        seen = holder.stats().slot_waiting;
        if (seen < 16) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(seen, 16u) << "opens beyond --max-sessions did not wait: " << first_error;
    EXPECT_EQ(ok.load(), 0);
    for (uint64_t id : held) holder.close_session(id);
    for (auto &t : waiting) t.join();
    EXPECT_EQ(ok.load(), 16) << first_error;
    std::vector<std::thread> clients;
    for (int i = 0; i < 32; ++i) clients.emplace_back(use_one);
    for (auto &t : clients) t.join();
    EXPECT_EQ(ok.load(), 48) << first_error;
    EXPECT_EQ(holder.stats().kv_refused, 0u);
    EXPECT_EQ(d.stop(SIGTERM), 0);
}

// A request that can never fit (more than the whole budget) is refused at once with a message
// naming the numbers and the option; one that could fit but stays blocked past --kv-wait is
// refused with a message saying it waited; an open beyond --max-sessions likewise.
TEST_F(KvBudgetE2E, NeverFittingAndTimedOutRequestsAreRefusedClearly) {
    const uint64_t one = bytes_for(4096, 8 + 16);
    const uint64_t budget = one + one / 2;   // one request at a time
    Daemon d;
    ASSERT_EQ(start(d, {"--ctx", "4096", "--kv-budget", std::to_string(budget), "--kv-wait", "1", "--max-sessions", "2"}),
              "");
    Client c(d.socket);
    const auto big = c.open_session({}, kBigCtx);
    const auto t0 = std::chrono::steady_clock::now();
    try {
        c.generate(one_shot(kBigCtx - 16, big.id));
        ADD_FAILURE() << "a request larger than the budget ran";
    } catch (const ServerError &e) {
        EXPECT_EQ(e.code_name, "SessionLimit") << e.what();
        EXPECT_TRUE(contains(e.server_message, "--kv-budget") && contains(e.server_message, "more than the whole"))
            << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(900)) << "it was not refused at once";
    // An anonymous session that holds memory cannot be released: a second one waits, then is
    // refused after --kv-wait.
    const auto a = c.open_session({}, 4096);
    c.generate(one_shot(16, a.id));
    Client other(d.socket);
    try {
        other.generate(one_shot(16));
        ADD_FAILURE() << "a request beyond the budget ran while the memory was held";
    } catch (const ServerError &e) {
        EXPECT_EQ(e.code_name, "SessionLimit") << e.what();
        EXPECT_TRUE(contains(e.server_message, "waited 1 s (--kv-wait)")) << e.what();
    }
    // Once the holder closes its session, the same request runs.
    c.close_session(a.id);
    EXPECT_EQ(other.generate(one_shot(16)).generated_tokens, 16u);
    // Slots: two anonymous sessions are live (big and b); a third open waits, then fails.
    const auto b = c.open_session({}, 256);
    try {
        other.open_session({}, 256);
        ADD_FAILURE() << "a third session opened at --max-sessions 2";
    } catch (const ServerError &e) {
        EXPECT_EQ(e.code_name, "SessionLimit") << e.what();
        EXPECT_TRUE(contains(e.server_message, "waited 1 s") && contains(e.server_message, "--max-sessions 2"))
            << e.what();
    }
    c.close_session(b.id);
    EXPECT_GT(other.open_session({}, 256).id, 0u);
    EXPECT_EQ(c.stats().kv_refused, 3u);
    EXPECT_EQ(d.stop(SIGTERM), 0);
}

// With --drafter a speculating request reserves the drafter session's cache as well as the
// target's (both from the bridge): a budget that holds the target's alone serves the request
// without speculation and refuses it at once with it.
TEST_F(KvBudgetE2E, ASpeculatingRequestReservesTheDrafterSessionToo) {
    const std::string pystd = DS4_SOURCE_DIR "/models/ds4-pystd-q8_0.gguf";
    const std::string drafter = DS4_SOURCE_DIR "/models/ds4-pystd-drafter-q8_0.gguf";
    ds4::bridge::ModelOptions mo;
    mo.model_path = pystd;
    mo.drafter_path = drafter;
    mo.draft_max = 4;
    mo.n_threads = 1;
    ds4::bridge::Model pair(mo);
    constexpr uint32_t ctx = 4096, max_tokens = 64, most = 8 + max_tokens;
    uint64_t target = 0, draft = 0;
    char err[256];
    ASSERT_EQ(ds4_bridge_cache_bytes_for(pair.handle(), ctx, most, &target, err, sizeof err), 0) << err;
    ASSERT_EQ(ds4_bridge_drafter_cache_bytes_for(pair.handle(), ctx, most + 4, &draft, err, sizeof err), 0) << err;
    ASSERT_GT(draft, 0u);
    const uint64_t budget = target + draft / 2;
    Daemon d;
    ASSERT_EQ(d.start(DS4D_PATH, pystd, dir->path + "/spec.sock", dir->path + "/spec.log",
                      {"--drafter", drafter, "--draft-max", "4", "--ctx", std::to_string(ctx), "--kv-budget",
                       std::to_string(budget), "--kv-wait", "1"}),
              "");
    Client c(d.socket);
    GenerateRequest g = one_shot(max_tokens);
    g.speculate = true;
    try {
        c.generate(g);
        ADD_FAILURE() << "a speculating request ran on a budget below its target + drafter caches";
    } catch (const ServerError &e) {
        EXPECT_EQ(e.code_name, "SessionLimit") << e.what();
        EXPECT_TRUE(contains(e.server_message, "more than the whole")) << e.what();
    }
    g.speculate = false;
    EXPECT_EQ(c.generate(g).generated_tokens, max_tokens);
    EXPECT_EQ(c.stats().kv_refused, 1u);
    EXPECT_EQ(d.stop(SIGTERM), 0) << read_file(d.log);
}

// A session of 1M context holds cache memory for the tokens it has seen, not for its
// context: the budget's accounting (and the engine's own) grows by the bytes the bridge
// predicts for those tokens, a tiny fraction of the full context's.
TEST_F(KvBudgetE2E, AMillionTokenContextHoldsMemoryForItsTokensOnly) {
    Daemon d;
    ASSERT_EQ(start(d, {"--kv-budget", "4GiB"}), "");
    Client c(d.socket);
    const auto before = c.stats();
    EXPECT_EQ(before.kv_in_use, before.memory.cache_bytes) << "the warm-up context in the pool";
    const auto s = c.open_session({}, kBigCtx);
    EXPECT_EQ(c.stats().kv_in_use, before.kv_in_use) << "an open allocates nothing yet";
    const auto r = c.generate(one_shot(40, s.id));
    ASSERT_EQ(r.generated_tokens, 40u);
    const auto after = c.stats();
    // 8 prompt tokens and 39 generated ones evaluated (the last sampled token is not).
    const uint64_t held = after.kv_in_use - before.kv_in_use;
    EXPECT_EQ(held, bytes_for(kBigCtx, 8 + 39));
    EXPECT_EQ(after.kv_in_use, after.memory.cache_bytes) << "idle: the accounting is what the engine holds";
    EXPECT_LT(held * 100, bytes_for(kBigCtx, kBigCtx)) << "memory follows the tokens, not the 1M context";
    EXPECT_EQ(d.stop(SIGTERM), 0);
}

}  // namespace

#endif
