// Session semantics on a converted reference model: prefix reuse, rewind, bad input
// leaving the state untouched, sampling and the payload tail.
#include <gtest/gtest.h>

#include <cstring>

#include "engine/backend/session_state.h"
#include "engine/common/error.h"
#include "engine/model/model.h"
#include "engine/model/session.h"
#include "tests/engine/fixture.h"
#include "tests/engine/mix_model_test.h"

using namespace ds4;
using namespace ds4test;

namespace {

struct SessionTest : MixModelTest<SessionTest> {
    std::span<const int32_t> toks(size_t n) const { return std::span<const int32_t>(fx->tokens).first(n); }
};

std::vector<float> row(const RefFixture &fx, size_t i) {
    return std::vector<float>(fx.logits.begin() + i * fx.vocab, fx.logits.begin() + (i + 1) * fx.vocab);
}

TEST_F(SessionTest, SharedPrefixSyncEqualsFreshSession) {
    Session a(*model, 128), b(*model, 128);
    a.sync(toks(40));
    const uint64_t gen = a.generation();
    a.sync(toks(60));   // extends: reuses the 40-token state
    EXPECT_EQ(a.generation(), gen);
    b.sync(toks(60));
    EXPECT_EQ(a.logits(), b.logits());
    // Diverging suffix: common prefix 50, then other tokens.
    std::vector<int32_t> other(fx->tokens.begin(), fx->tokens.begin() + 50);
    other.push_back(7), other.push_back(9), other.push_back(11);
    a.sync(other);
    Session c(*model, 128);
    c.sync(other);
    EXPECT_EQ(a.logits(), c.logits());
    EXPECT_EQ(a.tokens(), c.tokens());
}

TEST_F(SessionTest, RewindAndReevalReproducesLogitsExactly) {
    Session s(*model, 128);
    s.sync(toks(64));
    const std::vector<float> at64 = s.logits();
    for (int p : {63, 60, 57, 48, 33}) {   // inside a window, right after a window closes, ...
        ASSERT_TRUE(s.can_rewind_in_place(p));
        const uint64_t gen = s.generation();
        s.rewind(p);
        EXPECT_GT(s.generation(), gen);
        EXPECT_FALSE(s.has_logits());
        EXPECT_THROW(s.argmax(), ds4::Error);
        for (int i = p; i < 64; ++i) s.eval(fx->tokens[i]);
        EXPECT_EQ(s.logits(), at64) << "rewind to " << p;
    }
}

TEST_F(SessionTest, RewindBeyondTheRingsRebuilds) {
    // A tiny prefill cap and no slack make the rings short, so deep rewinds must rebuild.
    Session s(*model, 72, 4, 0);
    s.sync(toks(72));
    EXPECT_FALSE(s.can_rewind_in_place(10));
    s.rewind(10);
    EXPECT_EQ(s.pos(), 10);
    EXPECT_TRUE(s.has_logits());   // rebuilt by evaluating the kept prefix
    EXPECT_LE(rel_error(row(*fx, 9), s.logits(), fx->vocab), 1e-4);
    for (int i = 10; i < 72; ++i) s.eval(fx->tokens[i]);
    EXPECT_LE(rel_error(row(*fx, 71), s.logits(), fx->vocab), 1e-4);
}

TEST_F(SessionTest, MiddleChunksWithoutAReaderSkipTheHeadAndChangeNothing) {
    // Chunks of 4: without a progress callback the middle chunks skip the output head; with
    // one (it may save a checkpoint) every chunk ends with logits. Same final bits either way.
    Session a(*model, 64, 4), b(*model, 64, 4);
    a.sync(toks(30));
    int seen = 0;
    b.sync(toks(30), [&](int, int) {
        EXPECT_TRUE(b.has_logits());
        ++seen;
    });
    EXPECT_EQ(seen, 8);
    EXPECT_TRUE(a.has_logits());
    EXPECT_EQ(a.logits(), b.logits());
    EXPECT_LE(rel_error(row(*fx, 29), a.logits(), fx->vocab), 1e-4);
    a.eval(fx->tokens[30]);
    b.eval(fx->tokens[30]);
    EXPECT_EQ(a.logits(), b.logits());
}

TEST_F(SessionTest, LongStepsRunTheirAttentionInRingSizedPieces) {
    // Rings made for 4 rows a step and no slack. Steps of 4 against steps of 32 rows, whose
    // attention the executor runs in pieces of 4 (the rings could not hold 32 rows): the same
    // logits at every position, and the rings no larger.
    const int n = 72;
    Session a(*model, 80, 4, 0), b(*model, 80, 4, 0);
    b.set_prefill_cap(32);
    EXPECT_EQ(b.prefill_cap(), 32);
    EXPECT_EQ(b.ring_rows(), 4);
    EXPECT_EQ(b.memory_bytes(), a.memory_bytes());
    std::vector<float> la, lb;
    a.sync(toks(n), {}, &la);
    b.sync(toks(n), {}, &lb);
    ASSERT_EQ(la.size(), (size_t)n * fx->vocab);
    EXPECT_EQ(la, lb);
    EXPECT_LE(rel_error(row(*fx, n - 1), b.logits(), fx->vocab), 1e-4);
    EXPECT_EQ(b.memory_bytes(), a.memory_bytes());
    // A rewind the rings cannot serve rebuilds in 32-row steps, to the same bits.
    b.rewind(3);
    b.sync(toks(n));
    EXPECT_EQ(b.logits(), a.logits());
    // A trial is journaled ring rows: no longer than the rings hold.
    const std::vector<int32_t> five(toks(n).begin(), toks(n).begin() + 5);
    b.rewind(n - 5);
    EXPECT_THROW(b.trial(five, nullptr), ds4::Error);
    EXPECT_FALSE(b.in_trial());
    EXPECT_EQ(b.pos(), n - 5);
    EXPECT_THROW(b.set_prefill_cap(0), ds4::Error);
    EXPECT_THROW(b.set_prefill_cap(81), ds4::Error);
    EXPECT_EQ(b.prefill_cap(), 32);
    // The CPU's defaults: rings for the backend's chunk, longer steps.
    Session d(*model, 4096);
    EXPECT_EQ(d.ring_rows(), model->backend().prefill_chunk());
    EXPECT_EQ(d.prefill_cap(), model->backend().prefill_step_rows());
    EXPECT_GT(d.prefill_cap(), d.ring_rows());
}

TEST_F(SessionTest, BadInputLeavesStateUnchanged) {
    Session s(*model, 50);
    s.sync(toks(30));
    const auto before = s.logits();
    const uint64_t gen = s.generation();
    std::vector<int32_t> bad(fx->tokens.begin(), fx->tokens.begin() + 31);
    bad[30] = fx->vocab;   // out of range
    EXPECT_THROW(s.sync(bad), ds4::Error);
    bad[30] = -1;
    EXPECT_THROW(s.sync(bad), ds4::Error);
    EXPECT_THROW(s.eval(fx->vocab + 5), ds4::Error);
    EXPECT_THROW(s.sync(toks(51)), ds4::Error);   // overflow
    EXPECT_THROW(s.sync({}), ds4::Error);          // empty
    EXPECT_THROW(s.rewind(31), ds4::Error);
    EXPECT_EQ(s.pos(), 30);
    EXPECT_EQ(s.generation(), gen);
    EXPECT_EQ(s.logits(), before);
    for (int i = 30; i < 50; ++i) s.eval(fx->tokens[i]);
    EXPECT_THROW(s.eval(1), ds4::Error);   // context full
    EXPECT_EQ(s.pos(), 50);
}

TEST_F(SessionTest, SamplingIsDeterministicAndRespectsFilters) {
    Session s(*model, 64);
    s.sync(toks(20));
    EXPECT_EQ(s.sample({0.f, 0, 1.f, 0.f}, nullptr), s.argmax());
    uint64_t r1 = 42, r2 = 42;
    for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample({0.8f, 40, 0.9f, 0.05f}, &r1), s.sample({0.8f, 40, 0.9f, 0.05f}, &r2));
    uint64_t r = 7;
    for (int i = 0; i < 50; ++i) EXPECT_EQ(s.sample({1.5f, 1, 1.f, 0.f}, &r), s.argmax());   // top_k 1 is greedy
    const auto top = s.top_logprobs(5);
    ASSERT_EQ(top.size(), 5u);
    EXPECT_EQ(top[0].first, s.argmax());
    for (size_t i = 1; i < top.size(); ++i) EXPECT_GE(top[i - 1].second, top[i].second);
    EXPECT_LT(top[0].second, 0.f);
}

TEST_F(SessionTest, TailRoundTripIsBitExact) {
    for (int n : {5, 8, 12, 13, 16, 31, 47, 64}) {   // in a window, at window closes, mid-window
        Session a(*model, 72);
        a.sync(toks(n));
        std::vector<uint8_t> tail = a.save_tail();
        EXPECT_EQ(tail.size(), a.tail_bytes());
        Session b(*model, 72);
        b.sync(toks(3));   // some other state first: load must replace it
        b.load_tail(tail.data(), tail.size(), toks(n));
        EXPECT_EQ(b.logits(), a.logits()) << n;
        for (int i = n; i < 72; ++i) {
            a.eval(fx->tokens[i]);
            b.eval(fx->tokens[i]);
            ASSERT_EQ(a.logits(), b.logits()) << "saved at " << n << ", step " << i;
        }
    }
}

TEST_F(SessionTest, CorruptTailIsRejectedWithoutStateChange) {
    Session a(*model, 72);
    a.sync(toks(20));
    std::vector<uint8_t> tail = a.save_tail();
    Session b(*model, 72);
    b.sync(toks(10));
    const auto before = b.logits();
    const uint64_t gen = b.generation();
    EXPECT_THROW(b.load_tail(tail.data(), tail.size() - 1, toks(20)), ds4::Error);   // truncated
    EXPECT_THROW(b.load_tail(tail.data(), tail.size(), toks(19)), ds4::Error);       // wrong token count
    std::vector<uint8_t> bad = tail;
    bad[0] ^= 1;
    EXPECT_THROW(b.load_tail(bad.data(), bad.size(), toks(20)), ds4::Error);          // magic
    bad = tail;
    bad[4] = 99;
    EXPECT_THROW(b.load_tail(bad.data(), bad.size(), toks(20)), ds4::Error);          // version
    bad = tail;
    bad[bad.size() / 2] ^= 0x04;   // a flipped bit inside the cached rows
    EXPECT_THROW(b.load_tail(bad.data(), bad.size(), toks(20)), ds4::Error);
    Session small(*model, 16);
    EXPECT_THROW(small.load_tail(tail.data(), tail.size(), toks(20)), ds4::Error);    // does not fit
    EXPECT_EQ(b.generation(), gen);
    EXPECT_EQ(b.logits(), before);
    EXPECT_EQ(b.pos(), 10);
}

TEST_F(SessionTest, CachesGrowWithTheTokensHeldNotTheContext) {
    // A 1M-token context costs what its tokens need: the entry arrays grow as entries close
    // (several growth steps here), and the result is the same however the tokens arrive.
    const int big = 1 << 20;
    std::vector<int32_t> t;
    while (t.size() < 700) t.insert(t.end(), fx->tokens.begin(), fx->tokens.end());
    t.resize(700);
    const uint64_t empty = Session::cache_bytes_for(*model, big, 0);
    Session a(*model, big), b(*model, big);
    EXPECT_EQ(a.memory_bytes(), empty) << "nothing is allocated for tokens not yet held";
    const uint64_t full = CacheGeometry::make(model->config(), big, model->backend().prefill_chunk(),
                                              Session::kDefaultRewindSlack).bytes();
    a.sync(t);                              // one prefill
    for (int32_t x : t) b.eval(x);          // one token at a time: the arrays grow mid-step
    EXPECT_EQ(a.logits(), b.logits());
    EXPECT_EQ(a.memory_bytes(), Session::cache_bytes_for(*model, big, 700));
    EXPECT_EQ(b.memory_bytes(), a.memory_bytes());
    EXPECT_GT(a.memory_bytes(), empty);
    EXPECT_LT(a.memory_bytes() - empty, (full - empty) / 100) << "700 of 1M tokens";
    // A context of exactly the tokens: same logits as the big one.
    Session c(*model, 701);
    c.sync(t);
    EXPECT_EQ(c.logits(), a.logits());
    // The tail carries the entries into a fresh session, which grows to hold them.
    std::vector<uint8_t> tail = a.save_tail();
    Session d(*model, big);
    d.load_tail(tail.data(), tail.size(), t);
    EXPECT_EQ(d.memory_bytes(), a.memory_bytes());
    a.eval(5), d.eval(5);
    EXPECT_EQ(a.logits(), d.logits());
}

TEST(EntryCapacity, FollowsUseWithinAnEighth) {
    EXPECT_EQ(entry_capacity(0, 1000), 0);
    EXPECT_EQ(entry_capacity(1, 1000), 64);
    EXPECT_EQ(entry_capacity(64, 1000), 64);
    EXPECT_EQ(entry_capacity(65, 1000), 128);
    EXPECT_EQ(entry_capacity(999, 1000), 1000);   // capped
    int prev = 0, steps = 0;
    for (int n = 1; n <= 1 << 18; ++n) {
        const int c = entry_capacity(n, 1 << 20);
        ASSERT_GE(c, n);
        ASSERT_LE(c, std::max(n + 63, n + n / 8));   // a step is 64 rows or an eighth
        ASSERT_GE(c, prev);
        steps += c != prev;
        prev = c;
    }
    EXPECT_LT(steps, 8 * 18 + 8) << "growth steps per doubling are bounded";
}

}  // namespace
