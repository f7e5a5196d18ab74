// Speculative trial/commit: evaluating k tokens and keeping j < k of them leaves the
// session exactly as if it had only seen those j, without re-running the forward: same
// logits next, same saved payload, at window and compression-ratio boundaries.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/common/error.h"
#include "engine/model/model.h"
#include "engine/model/session.h"
#include "tests/engine/fixture.h"
#include "tests/engine/mix_model_test.h"

using namespace ds4;
using namespace ds4test;

namespace {

struct TrialTest : MixModelTest<TrialTest> {};

double rel(const float *ref, const float *got, size_t n) {
    float mx = 0, d = 0;
    for (size_t i = 0; i < n; ++i) {
        mx = std::max(mx, std::fabs(ref[i]));
        d = std::max(d, std::fabs(ref[i] - got[i]));
    }
    return mx > 0 ? d / mx : d;
}

// Tails hold a fixed header, then f32 rows, then a checksum: headers equal, floats close.
void expect_same_tail(const std::vector<uint8_t> &a, const std::vector<uint8_t> &b, const std::string &what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    const size_t head = 4 * 5 + 8 + 4;
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), head)) << what;
    const size_t nf = (a.size() - head - 8) / 4;
    std::vector<float> fa(nf), fb(nf);
    std::memcpy(fa.data(), a.data() + head, nf * 4);
    std::memcpy(fb.data(), b.data() + head, nf * 4);
    EXPECT_LE(rel(fa.data(), fb.data(), nf), 1e-6) << what;
}

// Every row the rings hold for the last n positions (more than the tail saves: the rows a
// rejected trial overwrote must be back, not only the ones the math needs next).
void expect_same_rings(const Session &a, const Session &b, const std::string &what) {
    const CacheGeometry &g = a.state().geometry();
    const int64_t n = a.pos();
    std::vector<float> ra, rb;
    for (size_t l = 0; l < g.layers.size(); ++l) {
        const LayerGeometry &L = g.layers[l];
        auto cmp = [&](Cache which, int cap, int width) {
            const int64_t first = std::max<int64_t>(0, n - cap);
            ra.resize((size_t)(n - first) * width);
            rb.resize(ra.size());
            a.state().read((int)l, which, first, n - first, ra.data());
            b.state().read((int)l, which, first, n - first, rb.data());
            EXPECT_LE(rel(rb.data(), ra.data(), ra.size()), 1e-6) << what << " layer " << l << " cache " << (int)which;
        };
        cmp(Cache::Kv, L.cap_kv, g.head_dim);
        if (L.comp.present()) cmp(Cache::CompKv, L.comp.cap, L.comp.width), cmp(Cache::CompGate, L.comp.cap, L.comp.width);
        if (L.icomp.present()) cmp(Cache::IcompKv, L.icomp.cap, L.icomp.width), cmp(Cache::IcompGate, L.icomp.cap, L.icomp.width);
    }
}

TEST_F(TrialTest, CommitOfAPrefixEqualsASessionThatOnlySawIt) {
    const int V = fx->vocab, k = 6;
    // The mix model has an 8-row window, CSA ratio 4 and an HCA layer: starts 0..21 put the
    // trial across every kind of boundary.
    for (int n0 : {0, 1, 3, 4, 6, 7, 8, 11, 13, 16, 21}) {
        for (int j : {0, 1, 2, 3, 5, 6}) {
            const std::string what = "n0=" + std::to_string(n0) + " j=" + std::to_string(j);
            const std::span<const int32_t> all(fx->tokens);
            // Session T: prefix, trial of k tokens, commit j, then 5 other tokens.
            Session t(*model, 64, 8, 0);   // no slack: the journal alone must restore the rings
            if (n0) t.sync(all.first(n0));
            std::vector<float> trial_rows;
            t.trial(all.subspan(n0, k), &trial_rows);
            ASSERT_EQ(trial_rows.size(), (size_t)k * V);
            t.commit(j);
            ASSERT_EQ(t.pos(), n0 + j) << what;
            // Session R only ever saw n0 + j tokens.
            Session r(*model, 64, 8, 0);
            if (n0 + j) r.sync(all.first(n0 + j));
            EXPECT_EQ(t.tokens(), r.tokens()) << what;
            EXPECT_EQ(t.has_logits(), r.has_logits()) << what;
            if (r.has_logits()) {
                EXPECT_LE(rel(r.logits().data(), t.logits().data(), V), 1e-6) << what;
            }
            expect_same_tail(r.save_tail(), t.save_tail(), what);
            expect_same_rings(t, r, what);
            for (int s = 0; s < 5; ++s) {
                const int32_t tok = fx->tokens[(40 + 3 * s + j) % fx->tokens.size()];
                t.eval(tok);
                r.eval(tok);
                EXPECT_LE(rel(r.logits().data(), t.logits().data(), V), 1e-6) << what << " continue " << s;
            }
            expect_same_tail(r.save_tail(), t.save_tail(), what + " after continuing");
        }
    }
}

TEST_F(TrialTest, TrialRowsAreTheLogitsOfEachPosition) {
    const int V = fx->vocab, n0 = 9, k = 5;
    const std::span<const int32_t> all(fx->tokens);
    Session t(*model, 64);
    t.sync(all.first(n0));
    std::vector<float> rows;
    t.trial(all.subspan(n0, k), &rows);
    t.commit(k);
    Session r(*model, 64);
    std::vector<float> want;
    r.sync(all.first(n0 + k), {}, &want);
    // want holds rows for positions 0..n0+k-1; the trial's are the last k of them.
    EXPECT_LE(rel(want.data() + (size_t)n0 * V, rows.data(), (size_t)k * V), 1e-6);
    EXPECT_EQ(t.tokens(), r.tokens());
}

TEST_F(TrialTest, PendingTrialBlocksOtherChangesAndBadCommitsFail) {
    const std::span<const int32_t> all(fx->tokens);
    Session t(*model, 64);
    t.sync(all.first(10));
    EXPECT_THROW(t.commit(0), Error);   // nothing pending
    t.trial(all.subspan(10, 3), nullptr);
    EXPECT_TRUE(t.in_trial());
    EXPECT_THROW(t.eval(1), Error);
    EXPECT_THROW(t.sync(all.first(20)), Error);
    EXPECT_THROW(t.rewind(5), Error);
    EXPECT_THROW(t.trial(all.subspan(13, 2), nullptr), Error);
    EXPECT_THROW(t.commit(4), Error);
    EXPECT_THROW(t.commit(-1), Error);
    EXPECT_TRUE(t.in_trial());
    t.commit(2);
    EXPECT_FALSE(t.in_trial());
    EXPECT_EQ(t.pos(), 12);
    // A trial longer than one step is refused up front.
    std::vector<int32_t> many(t.prefill_cap() + 1, 1);
    EXPECT_THROW(t.trial(many, nullptr), Error);
    EXPECT_EQ(t.pos(), 12);
}

}  // namespace
