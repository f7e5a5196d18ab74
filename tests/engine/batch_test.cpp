// Batch-first steps: rows of several sessions in one forward_batch give each session the
// logits it gets alone, whether the rows are decode tokens or a prefill chunk mixed in.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/common/error.h"
#include "engine/model/model.h"
#include "engine/model/session.h"
#include "tests/engine/fixture.h"
#include "tests/engine/mix_model_test.h"

using namespace ds4;
using namespace ds4test;

namespace {

struct BatchTest : MixModelTest<BatchTest> {
    // Session i's prompt: a different slice of the fixture's tokens, 3..38 long.
    static std::vector<int32_t> prompt(int i) {
        const int len = 3 + 5 * i, off = (7 * i) % 20;
        return std::vector<int32_t>(fx->tokens.begin() + off, fx->tokens.begin() + off + len);
    }
    // Session i's continuation tokens (fixed, so alone and batched see the same input).
    static int32_t next_token(int i, int step) { return fx->tokens[(11 * i + 3 * step + 1) % fx->tokens.size()]; }
};

double rel(const std::vector<float> &ref, const std::vector<float> &got) {
    EXPECT_EQ(ref.size(), got.size());
    float mx = 0, d = 0;
    for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
        mx = std::max(mx, std::fabs(ref[i]));
        d = std::max(d, std::fabs(ref[i] - got[i]));
    }
    return mx > 0 ? d / mx : d;
}

constexpr int kSessions = 8, kSteps = 12;

TEST_F(BatchTest, EightSessionsDecodingTogetherMatchEachAlone) {
    // Alone: each session prefills its prompt, then decodes kSteps tokens one by one.
    std::vector<std::vector<std::vector<float>>> alone(kSessions);
    for (int i = 0; i < kSessions; ++i) {
        Session s(*model, 96);
        s.sync(prompt(i));
        for (int k = 0; k < kSteps; ++k) {
            s.eval(next_token(i, k));
            alone[i].push_back(s.logits());
        }
    }
    // Together: one shared executor, every decode step is one forward_batch of 8 rows.
    auto ex = model->make_executor(2);
    std::vector<std::unique_ptr<Session>> ss;
    for (int i = 0; i < kSessions; ++i) {
        ss.push_back(std::make_unique<Session>(*model, *ex, 96));
        ss.back()->sync(prompt(i));
    }
    for (int k = 0; k < kSteps; ++k) {
        std::vector<BatchRow> rows;
        for (int i = 0; i < kSessions; ++i) rows.push_back({ss[i].get(), next_token(i, k), ss[i]->pos(), true});
        std::vector<float> out;
        forward_batch(*ex, rows, &out);
        ASSERT_EQ(out.size(), (size_t)kSessions * fx->vocab);
        for (int i = 0; i < kSessions; ++i) {
            EXPECT_LE(rel(alone[i][k], ss[i]->logits()), 1e-6) << "session " << i << " step " << k;
            const std::vector<float> row(out.begin() + (size_t)i * fx->vocab, out.begin() + (size_t)(i + 1) * fx->vocab);
            EXPECT_EQ(row, ss[i]->logits());
        }
    }
}

TEST_F(BatchTest, FortyRowsInOneStepMatchEachRowAloneBitForBit) {
    // From 32 rows a step the routed experts run whole on one thread each and their outputs
    // are summed at the end (cpu_moe.cpp); alone, a row's experts split over the pool. The
    // sums keep their order, so the bits are the same.
    constexpr int kRows = 40, kTwoSteps = 2;
    std::vector<std::vector<std::vector<float>>> alone(kRows);
    for (int i = 0; i < kRows; ++i) {
        Session s(*model, 96);
        s.sync(prompt(i % kSessions));
        for (int k = 0; k < kTwoSteps; ++k) {
            s.eval(next_token(i, k));
            alone[i].push_back(s.logits());
        }
    }
    auto ex = model->make_executor(2);
    std::vector<std::unique_ptr<Session>> ss;
    for (int i = 0; i < kRows; ++i) {
        ss.push_back(std::make_unique<Session>(*model, *ex, 96));
        ss.back()->sync(prompt(i % kSessions));
    }
    for (int k = 0; k < kTwoSteps; ++k) {
        std::vector<BatchRow> rows;
        for (int i = 0; i < kRows; ++i) rows.push_back({ss[i].get(), next_token(i, k), ss[i]->pos(), true});
        std::vector<float> out;
        forward_batch(*ex, rows, &out);
        ASSERT_EQ(out.size(), (size_t)kRows * fx->vocab);
        for (int i = 0; i < kRows; ++i) {
            const std::vector<float> row(out.begin() + (size_t)i * fx->vocab, out.begin() + (size_t)(i + 1) * fx->vocab);
            ASSERT_EQ(row, alone[i][k]) << "row " << i << " step " << k;
        }
    }
}

TEST_F(BatchTest, PrefillChunkSharesAStepWithDecodeRows) {
    // Session 0 prefills its whole prompt inside the same steps in which 1..7 decode.
    auto ex = model->make_executor(2);
    std::vector<std::unique_ptr<Session>> ss;
    for (int i = 0; i < kSessions; ++i) ss.push_back(std::make_unique<Session>(*model, *ex, 96));
    for (int i = 1; i < kSessions; ++i) ss[i]->sync(prompt(i));
    const std::vector<int32_t> p0 = prompt(7);   // 38 tokens: chunks of 10 cross windows and ratios
    Session ref0(*model, 96);
    std::vector<float> ref_rows;
    ref0.sync(p0, {}, &ref_rows);
    size_t done = 0;
    for (int k = 0; done < p0.size(); ++k) {
        std::vector<BatchRow> rows;
        const size_t n = std::min<size_t>(10, p0.size() - done);
        for (size_t j = 0; j < n; ++j) rows.push_back({ss[0].get(), p0[done + j], (int64_t)(done + j), true});
        for (int i = 1; i < kSessions; ++i) rows.push_back({ss[i].get(), next_token(i, k), ss[i]->pos(), true});
        std::vector<float> out;
        forward_batch(*ex, rows, &out);
        const std::vector<float> got(out.begin(), out.begin() + n * fx->vocab);
        const std::vector<float> want(ref_rows.begin() + done * fx->vocab, ref_rows.begin() + (done + n) * fx->vocab);
        EXPECT_LE(rel(want, got), 1e-6) << "chunk at " << done;
        done += n;
    }
    EXPECT_EQ(ss[0]->tokens(), p0);
    EXPECT_LE(rel(ref0.logits(), ss[0]->logits()), 1e-6);
    // The decode rows advanced their sessions like evals would.
    for (int i = 1; i < kSessions; ++i) {
        Session s(*model, 96);
        s.sync(prompt(i));
        for (int k = 0; k < ss[i]->pos() - (int)prompt(i).size(); ++k) s.eval(next_token(i, k));
        EXPECT_EQ(s.tokens(), ss[i]->tokens());
        EXPECT_LE(rel(s.logits(), ss[i]->logits()), 1e-6) << "session " << i;
    }
}

TEST_F(BatchTest, APrefillSegmentLongerThanItsRingsSharesAStep) {
    // Session 0's rings hold 4 rows a step; its 38-token prompt goes in segments of 12 (the
    // attention in pieces of 4) beside one decode row each of two sessions whose rings are
    // the default's. Every row as its session alone.
    auto ex = model->make_executor(2);
    Session s0(*model, *ex, 96, 4, 0), s1(*model, *ex, 96), s2(*model, *ex, 96);
    s0.set_prefill_cap(12);
    s1.sync(prompt(1));
    s2.sync(prompt(2));
    const std::vector<int32_t> p0 = prompt(7);
    Session ref0(*model, 96);
    std::vector<float> ref_rows;
    ref0.sync(p0, {}, &ref_rows);
    Session ref1(*model, 96), ref2(*model, 96);
    ref1.sync(prompt(1));
    ref2.sync(prompt(2));
    size_t done = 0;
    for (int k = 0; done < p0.size(); ++k) {
        std::vector<BatchRow> rows;
        rows.push_back({&s1, next_token(1, k), s1.pos(), true});
        const size_t n = std::min<size_t>(12, p0.size() - done);
        for (size_t j = 0; j < n; ++j) rows.push_back({&s0, p0[done + j], (int64_t)(done + j), true});
        rows.push_back({&s2, next_token(2, k), s2.pos(), true});
        std::vector<float> out;
        forward_batch(*ex, rows, &out);
        const std::vector<float> got(out.begin() + fx->vocab, out.begin() + (1 + n) * fx->vocab);
        const std::vector<float> want(ref_rows.begin() + done * fx->vocab, ref_rows.begin() + (done + n) * fx->vocab);
        EXPECT_LE(rel(want, got), 1e-6) << "segment at " << done;
        ref1.eval(next_token(1, k));
        ref2.eval(next_token(2, k));
        EXPECT_LE(rel(ref1.logits(), std::vector<float>(out.begin(), out.begin() + fx->vocab)), 1e-6) << "step " << k;
        EXPECT_LE(rel(ref2.logits(), std::vector<float>(out.end() - fx->vocab, out.end())), 1e-6) << "step " << k;
        done += n;
    }
    EXPECT_EQ(s0.tokens(), p0);
    // More rows of one session than its prefill cap, or a trial longer than its rings: refused.
    std::vector<BatchRow> over;
    for (int j = 0; j < 13; ++j) over.push_back({&s0, 1, s0.pos() + j, true});
    EXPECT_THROW(forward_batch(*ex, over, nullptr), Error);
    std::vector<BatchRow> trial;
    for (int j = 0; j < 5; ++j) trial.push_back({&s0, 1, s0.pos() + j, true, true});
    EXPECT_THROW(forward_batch(*ex, trial, nullptr), Error);
    EXPECT_EQ(s0.tokens(), p0);
    EXPECT_FALSE(s0.in_trial());
}

TEST_F(BatchTest, BadRowsAreRejectedBeforeAnythingRuns) {
    auto ex = model->make_executor(2);
    Session a(*model, *ex, 32), b(*model, *ex, 32);
    a.sync(prompt(1));
    b.sync(prompt(2));
    const auto ta = a.tokens(), tb = b.tokens();
    const auto la = a.logits();
    const uint64_t ga = a.generation();
    auto expect_rejected = [&](std::vector<BatchRow> rows, const char *why) {
        EXPECT_THROW(forward_batch(*ex, rows, nullptr), Error) << why;
        EXPECT_EQ(a.tokens(), ta) << why;
        EXPECT_EQ(b.tokens(), tb) << why;
        EXPECT_EQ(a.logits(), la) << why;
        EXPECT_EQ(a.generation(), ga) << why;
    };
    expect_rejected({{&a, 1, a.pos(), true}, {&b, 1, b.pos(), true}, {&a, 2, a.pos() + 1, true}}, "split session");
    expect_rejected({{&a, 1, a.pos() + 1, true}}, "wrong position");
    expect_rejected({{&a, 1, a.pos(), true}, {&a, 2, a.pos() + 2, true}}, "gap");
    expect_rejected({{&a, 1, a.pos(), false}}, "last row without logits");
    expect_rejected({{&a, fx->vocab, a.pos(), true}}, "token out of range");
    expect_rejected({{&a, 1, a.pos(), true}, {&b, -1, b.pos(), true}}, "bad token in another session");
    expect_rejected({}, "empty");
}

}  // namespace
