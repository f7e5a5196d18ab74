// The session and model calls that used to return void or a bare sentinel report failures
// as int + message, and a rejected call leaves the session as it was.
#include <cstring>

#include "tests/bridge/bridge_test_util.h"

namespace bridge_test {
namespace {

using ds4::bridge::BridgeError;
using ds4::bridge::Session;

class SessionStatus : public BridgeTest {};

TEST_F(SessionStatus, RewindOutOfRangeIsAnErrorAndChangesNothing) {
    Session s(*model, 64);
    const auto toks = tokens(20);
    s.sync(toks);
    const uint64_t gen = s.generation();
    const std::vector<float> before = s.logits(model->vocab_size());
    for (int bad : {21, 100, -1}) {
        Err e;
        EXPECT_NE(ds4_bridge_session_rewind(s.handle(), bad, e.buf, sizeof e.buf), 0) << bad;
        EXPECT_TRUE(has(e.str(), "rewind to " + std::to_string(bad))) << bad;
        EXPECT_TRUE(has(e.str(), "0..20")) << bad;
        EXPECT_EQ(s.pos(), 20);
        EXPECT_EQ(s.generation(), gen);
        EXPECT_EQ(s.logits(model->vocab_size()), before) << "a rejected rewind kept the logits";
    }
    try {
        s.rewind(21);
        ADD_FAILURE() << "rewind past the end did not throw";
    } catch (const BridgeError &e) {
        EXPECT_TRUE(has(std::string(e.what()), "0..20"));
    }
    Err e;
    EXPECT_NE(ds4_bridge_session_rewind(nullptr, 0, e.buf, sizeof e.buf), 0);
    EXPECT_TRUE(has(e.str(), "NULL"));
    // In range still works, and rewinding to the current position is a no-op.
    EXPECT_EQ(ds4_bridge_session_rewind(s.handle(), 20, nullptr, 0), 0);
    EXPECT_EQ(s.generation(), gen);
    EXPECT_EQ(ds4_bridge_session_rewind(s.handle(), 12, e.buf, sizeof e.buf), 0) << e.str();
    EXPECT_EQ(s.pos(), 12);
    EXPECT_EQ(ds4_bridge_session_rewind(s.handle(), 0, e.buf, sizeof e.buf), 0) << e.str();
    EXPECT_EQ(s.pos(), 0);
}

TEST_F(SessionStatus, SampleReturnsTheTokenThroughAnOutParameterAndExplainsFailures) {
    Session s(*model, 64);
    int32_t t = -7;
    Err e;
    EXPECT_NE(ds4_bridge_session_sample(s.handle(), 0.f, 0, 1.f, 0.f, nullptr, &t, e.buf, sizeof e.buf), 0);
    EXPECT_TRUE(has(e.str(), "no logits"));
    EXPECT_EQ(t, -7) << "a failed sample wrote the token";
    s.sync(tokens(9));
    EXPECT_EQ(ds4_bridge_session_sample(s.handle(), 0.f, 0, 1.f, 0.f, nullptr, &t, e.buf, sizeof e.buf), 0) << e.str();
    EXPECT_EQ(t, s.argmax());
    uint64_t r1 = 5, r2 = 5;
    int32_t a = -1, b = -2;
    ASSERT_EQ(ds4_bridge_session_sample(s.handle(), 0.8f, 10, 0.9f, 0.f, &r1, &a, e.buf, sizeof e.buf), 0) << e.str();
    ASSERT_EQ(ds4_bridge_session_sample(s.handle(), 0.8f, 10, 0.9f, 0.f, &r2, &b, e.buf, sizeof e.buf), 0) << e.str();
    EXPECT_EQ(a, b);
    EXPECT_NE(r1, 5u) << "the rng state advances";
    EXPECT_GE(a, 0);
    EXPECT_LT(a, model->vocab_size());
    struct Case {
        float temperature, top_p, min_p;
        int top_k;
        uint64_t *rng;
        int32_t *out;
        const char *why;
    } cases[] = {{0.8f, 1.f, 0.f, 0, nullptr, &t, "rng"},   {0.8f, 0.f, 0.f, 0, &r1, &t, "top_p"},
                 {0.8f, 1.f, 0.f, -1, &r1, &t, "top_k"},    {0.8f, 1.f, 2.f, 0, &r1, &t, "min_p"},
                 {0.f, 1.f, 0.f, 0, nullptr, nullptr, "token_out"}};
    for (const Case &c : cases) {
        Err ce;
        EXPECT_NE(ds4_bridge_session_sample(s.handle(), c.temperature, c.top_k, c.top_p, c.min_p, c.rng, c.out, ce.buf,
                                            sizeof ce.buf),
                  0)
            << c.why;
        EXPECT_TRUE(has(ce.str(), c.why));
    }
    EXPECT_NE(ds4_bridge_session_sample(nullptr, 0.f, 0, 1.f, 0.f, nullptr, &t, e.buf, sizeof e.buf), 0);
    EXPECT_TRUE(has(e.str(), "NULL"));
    try {
        s.sample(0.8f, 0, 0.f, 0.f, &r1);
        ADD_FAILURE() << "bad top_p did not throw";
    } catch (const BridgeError &x) {
        EXPECT_TRUE(has(std::string(x.what()), "top_p"));
    }
}

TEST_F(SessionStatus, ArgmaxInvalidateAndMemoryStatsExplainFailures) {
    Session s(*model, 64);
    int32_t t = -7;
    Err e;
    EXPECT_NE(ds4_bridge_session_argmax(s.handle(), &t, e.buf, sizeof e.buf), 0);
    EXPECT_TRUE(has(e.str(), "no logits"));
    EXPECT_EQ(t, -7);
    s.sync(tokens(9));
    EXPECT_EQ(ds4_bridge_session_argmax(s.handle(), &t, e.buf, sizeof e.buf), 0) << e.str();
    const std::vector<float> l = s.logits(model->vocab_size());
    for (float x : l) EXPECT_LE(x, l[size_t(t)]);
    EXPECT_NE(ds4_bridge_session_argmax(s.handle(), nullptr, e.buf, sizeof e.buf), 0);
    EXPECT_TRUE(has(e.str(), "token_out"));
    EXPECT_NE(ds4_bridge_session_argmax(nullptr, &t, e.buf, sizeof e.buf), 0);

    const uint64_t gen = s.generation();
    EXPECT_EQ(ds4_bridge_session_invalidate(s.handle(), e.buf, sizeof e.buf), 0) << e.str();
    EXPECT_EQ(s.pos(), 0);
    EXPECT_GT(s.generation(), gen);
    EXPECT_NE(ds4_bridge_session_invalidate(nullptr, e.buf, sizeof e.buf), 0);
    EXPECT_TRUE(has(e.str(), "NULL"));

    ds4_bridge_memory_t mem;
    EXPECT_EQ(ds4_bridge_memory_stats(model->handle(), &mem, e.buf, sizeof e.buf), 0) << e.str();
    EXPECT_GT(mem.weights_bytes, 0u);
    EXPECT_NE(ds4_bridge_memory_stats(nullptr, &mem, e.buf, sizeof e.buf), 0);
    EXPECT_TRUE(has(e.str(), "NULL"));
}

// Rewind and invalidate from inside the session's own progress callback are re-entry: an
// error with a message (invalidate used to ignore it silently), and nothing changes.
TEST_F(SessionStatus, RewindAndInvalidateFromTheProgressCallbackAreErrors) {
    struct State {
        ds4_bridge_session *s = nullptr;
        int calls = 0;
        std::vector<std::string> errors;
    } st;
    Session s(*model, 64);
    st.s = s.handle();
    auto cb = [](void *ud, int32_t current, int32_t) {
        auto *st = static_cast<State *>(ud);
        ++st->calls;
        char e[256] = {0};
        if (ds4_bridge_session_rewind(st->s, current - 1, e, sizeof e) != 0) st->errors.push_back(e);
        if (ds4_bridge_session_invalidate(st->s, e, sizeof e) != 0) st->errors.push_back(e);
        if (ds4_bridge_session_pos(st->s) != current) st->errors.push_back("the session changed");
    };
    const auto toks = tokens(20);
    Err e;
    ASSERT_EQ(ds4_bridge_session_sync_cb(s.handle(), toks.data(), int(toks.size()), cb, &st, e.buf, sizeof e.buf), 0) << e.str();
    ASSERT_GE(st.calls, 1);
    ASSERT_EQ(st.errors.size(), size_t(2 * st.calls));
    for (const std::string &x : st.errors) EXPECT_TRUE(has(x, "re-entered"));
    EXPECT_EQ(s.pos(), 20);
}

TEST_F(SessionStatus, BootPrewarmReportsItsStatus) {
    ds4::bridge::ModelOptions o;
    o.model_path = DS4_TEST_MODEL;
    o.n_threads = 1;
    o.defer_boot_prewarm = true;
    ds4::bridge::Model m(o);
    Err e;
    EXPECT_EQ(ds4_bridge_model_boot_prewarm(m.handle(), e.buf, sizeof e.buf), 0) << e.str();
    EXPECT_NO_THROW(m.boot_prewarm());
    EXPECT_NE(ds4_bridge_model_boot_prewarm(nullptr, e.buf, sizeof e.buf), 0);
    EXPECT_TRUE(has(e.str(), "NULL"));
}

}  // namespace
}  // namespace bridge_test
