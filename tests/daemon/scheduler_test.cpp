// The step planner's fairness rules (daemon/scheduler.h), simulated over many steps the way
// the worker drives it: candidates in round-robin order, those that ran moved to the back.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "daemon/scheduler.h"

using namespace ds4::daemon;

namespace {

struct Req {
    int id;
    bool decoding;
    uint32_t prefill_left;
    uint64_t arrival;
};

// Runs `steps` steps; returns, per request id, the steps in which it ran, and checks the
// per-step invariants on the way.
std::map<int, std::vector<int>> simulate(std::vector<Req> reqs, const StepLimits &lim, int steps, uint32_t cap = 256) {
    std::map<int, std::vector<int>> ran;
    for (int s = 0; s < steps; ++s) {
        std::vector<StepCandidate> c;
        for (const Req &r : reqs) c.push_back({r.decoding, r.prefill_left, cap, r.arrival});
        const auto plan = plan_step(c, lim);
        const bool decoders = std::any_of(reqs.begin(), reqs.end(), [](const Req &r) { return r.decoding; });
        const uint32_t chunk = decoders ? lim.prefill_chunk : (lim.solo_prefill_chunk ? lim.solo_prefill_chunk : cap);
        uint32_t rows = 0;
        std::vector<bool> used(reqs.size(), false);
        for (const PlannedSegment &p : plan) {
            EXPECT_LT(p.candidate, reqs.size());
            EXPECT_FALSE(used[p.candidate]) << "a request twice in one step";
            used[p.candidate] = true;
            const Req &r = reqs[p.candidate];
            if (r.decoding) EXPECT_EQ(p.rows, 1u);
            else {
                EXPECT_GE(p.rows, 1u);
                EXPECT_LE(p.rows, std::min({r.prefill_left, chunk, cap}));
            }
            rows += p.rows;
        }
        EXPECT_LE(plan.size(), lim.max_batch);
        EXPECT_LE(rows, decoders ? lim.step_tokens : std::max(lim.step_tokens, chunk));
        // Apply: prefill advances (and becomes decoding when done); ran ones go to the back.
        std::vector<Req> front, back;
        for (size_t i = 0; i < reqs.size(); ++i) {
            Req r = reqs[i];
            if (used[i]) {
                ran[r.id].push_back(s);
                for (const PlannedSegment &p : plan)
                    if (p.candidate == i && !r.decoding) {
                        r.prefill_left -= p.rows;
                        if (r.prefill_left == 0) r.decoding = true;
                    }
                back.push_back(r);
            } else {
                front.push_back(r);
            }
        }
        front.insert(front.end(), back.begin(), back.end());
        reqs = front;
    }
    return ran;
}

TEST(StepPlanner, NothingReadyPlansNothing) {
    EXPECT_TRUE(plan_step({}, StepLimits{}).empty());
    EXPECT_TRUE(plan_step({{false, 0, 256, 1}}, StepLimits{}).empty());
}

TEST(StepPlanner, AllDecodersShareEachStepUpToMaxBatch) {
    std::vector<Req> reqs;
    for (int i = 0; i < 8; ++i) reqs.push_back({i, true, 0, uint64_t(i)});
    const auto ran = simulate(reqs, StepLimits{16, 512, 256}, 10);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(ran.at(i).size(), 10u) << "decoder " << i << " missed a step";
}

TEST(StepPlanner, BeyondMaxBatchDecodersRotateWithBoundedWait) {
    std::vector<Req> reqs;
    for (int i = 0; i < 40; ++i) reqs.push_back({i, true, 0, uint64_t(i)});
    const StepLimits lim{16, 512, 256};
    const auto ran = simulate(reqs, lim, 60);
    for (int i = 0; i < 40; ++i) {
        const auto &v = ran.at(i);
        ASSERT_FALSE(v.empty());
        EXPECT_LE(v.front(), 2) << "decoder " << i << " waited too long to start";
        for (size_t k = 1; k < v.size(); ++k) EXPECT_LE(v[k] - v[k - 1], 3) << "decoder " << i;
        // Equal shares over the run: 60 steps * 16 rows / 40 decoders = 24 each.
        EXPECT_NEAR(double(v.size()), 24.0, 1.0) << "decoder " << i;
    }
}

TEST(StepPlanner, APromptAdvancesEveryStepWhileAFullBatchDecodes) {
    std::vector<Req> reqs;
    for (int i = 0; i < 16; ++i) reqs.push_back({i, true, 0, uint64_t(i)});
    reqs.push_back({99, false, 1000, 100});
    const StepLimits lim{16, 512, 256};
    const auto ran = simulate(reqs, lim, 6);
    // ceil(1000 / 256) = 4 prefill steps in a row, then it decodes in rotation with the others.
    ASSERT_GE(ran.at(99).size(), 5u);
    for (int s = 0; s < 4; ++s) EXPECT_EQ(ran.at(99)[size_t(s)], s);
    EXPECT_LE(ran.at(99)[4], 5);
    // Decoders keep 15 of 16 slots meanwhile: each still runs at least every other step.
    for (int i = 0; i < 16; ++i) EXPECT_GE(ran.at(i).size(), 3u) << "decoder " << i;
}

TEST(StepPlanner, PrefillsAreOldestFirstWithinTheTokenBudget) {
    std::vector<StepCandidate> c = {{false, 300, 256, 7}, {true, 0, 256, 1}, {false, 50, 256, 3}, {false, 900, 128, 5}};
    const auto plan = plan_step(c, StepLimits{16, 400, 256});
    ASSERT_EQ(plan.size(), 4u);
    EXPECT_EQ(plan[0].candidate, 1u);  // the decode row
    EXPECT_EQ(plan[1].candidate, 2u);  // arrival 3: all 50
    EXPECT_EQ(plan[1].rows, 50u);
    EXPECT_EQ(plan[2].candidate, 3u);  // arrival 5: its cap of 128
    EXPECT_EQ(plan[2].rows, 128u);
    EXPECT_EQ(plan[3].candidate, 0u);  // arrival 7: what the budget leaves, 400 - 1 - 50 - 128
    EXPECT_EQ(plan[3].rows, 221u);
}

TEST(StepPlanner, WithNoDecoderAPromptTakesTheSessionsStepSize) {
    // Alone: the whole cap (1024) in one step, beyond step_tokens; then the next prompt gets
    // what step_tokens leaves, if anything.
    std::vector<StepCandidate> c = {{false, 3000, 1024, 2}, {false, 100, 1024, 1}};
    auto plan = plan_step(c, StepLimits{16, 512, 256});
    ASSERT_EQ(plan.size(), 2u);
    EXPECT_EQ(plan[0].candidate, 1u);   // oldest first: all its 100 tokens
    EXPECT_EQ(plan[0].rows, 100u);
    EXPECT_EQ(plan[1].rows, 412u);      // the rest of step_tokens
    c[1].prefill_left = 0;
    plan = plan_step(c, StepLimits{16, 512, 256});
    ASSERT_EQ(plan.size(), 1u);
    EXPECT_EQ(plan[0].rows, 1024u);
    // A solo chunk given: that, still beyond step_tokens when larger.
    plan = plan_step(c, StepLimits{16, 512, 256, 600});
    EXPECT_EQ(plan[0].rows, 600u);
    plan = plan_step(c, StepLimits{16, 2048, 256, 600});
    EXPECT_EQ(plan[0].rows, 600u);
    // Time slicing alike.
    plan = plan_step(c, StepLimits{1, 512, 256});
    ASSERT_EQ(plan.size(), 1u);
    EXPECT_EQ(plan[0].rows, 1024u);
    // Once someone decodes, back to prefill_chunk within step_tokens.
    c.push_back({true, 0, 1024, 0});
    plan = plan_step(c, StepLimits{16, 512, 256});
    ASSERT_EQ(plan.size(), 2u);
    EXPECT_EQ(plan[0].candidate, 2u);
    EXPECT_EQ(plan[1].rows, 256u);
    plan = plan_step(c, StepLimits{1, 512, 256});
    ASSERT_EQ(plan.size(), 1u);
    EXPECT_EQ(plan[0].rows, 256u);   // the first candidate in round-robin order is the prompt
    // Simulated: a lone 3000-token prompt takes ceil(3000 / 1024) = 3 steps, not 12.
    const auto ran = simulate({{7, false, 3000, 0}}, StepLimits{16, 512, 256}, 4, 1024);
    ASSERT_EQ(ran.at(7).size(), 4u);   // 3 prefill steps, then it decodes
}

TEST(StepPlanner, SpeculatingDecodersGetTheirDraftRowsAfterEveryDecoderHasOne) {
    // Four decoders wanting 1 + 4 rows, one plain, and a waiting prompt, in 12 rows: each
    // decoder first gets its row (5), one row stays for the prompt, the other 6 go to drafts
    // in candidate order (4, then 2), the prompt gets what is left (1).
    std::vector<StepCandidate> c;
    for (int i = 0; i < 4; ++i) c.push_back({true, 0, 256, uint64_t(i), 5});
    c.push_back({true, 0, 256, 4, 1});
    c.push_back({false, 100, 256, 5, 1});
    const auto plan = plan_step(c, StepLimits{16, 12, 256});
    ASSERT_EQ(plan.size(), 6u);
    const uint32_t want[] = {5, 3, 1, 1, 1, 1};
    uint32_t total = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
        EXPECT_EQ(plan[i].candidate, i);
        EXPECT_EQ(plan[i].rows, want[i]) << "segment " << i;
        total += plan[i].rows;
    }
    EXPECT_EQ(total, 12u);
    // Room for everyone: every speculating decoder gets all its rows.
    for (const PlannedSegment &p : plan_step(c, StepLimits{16, 512, 256})) {
        if (p.candidate < 4) { EXPECT_EQ(p.rows, 5u); }
        if (p.candidate == 4) { EXPECT_EQ(p.rows, 1u); }
        if (p.candidate == 5) { EXPECT_EQ(p.rows, 100u); }
    }
    // Time slicing: the one request of the step gets its rows too.
    const auto one = plan_step({{true, 0, 256, 0, 5}}, StepLimits{1, 512, 256});
    ASSERT_EQ(one.size(), 1u);
    EXPECT_EQ(one[0].rows, 5u);
}

TEST(StepPlanner, MaxBatchOneTimeSlicesRoundRobin) {
    std::vector<Req> reqs = {{0, true, 0, 0}, {1, false, 600, 1}, {2, true, 0, 2}};
    const auto ran = simulate(reqs, StepLimits{1, 512, 256}, 9);
    EXPECT_EQ(ran.at(0).size(), 3u);
    EXPECT_EQ(ran.at(1).size(), 3u);
    EXPECT_EQ(ran.at(2).size(), 3u);
}

}  // namespace
