// Speculative decoding (engine/model/speculative.h) against plain decoding on the same
// engine: greedy output token-identical and the saved tail byte-identical on the f32
// reference fixtures with drafters of every quality (a random model of the same vocabulary,
// the fixture's own q8_0 export, the model itself); rejected positions restored from the
// journal with no second forward (the executor's step/row counters); and sampled output
// distributed exactly as the target's (chi-square tests on a small-vocabulary pair).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "engine/common/error.h"
#include "engine/model/model.h"
#include "engine/model/session.h"
#include "engine/model/speculative.h"
#include "tests/common/scratch.h"
#include "tests/engine/fixture.h"
#include "tools/make_model/make_model.h"

using namespace ds4;
using namespace ds4test;

namespace {

// A deterministic random tiny model with the given vocabulary, written once per process.
std::string random_model(TempDir &dir, int vocab, int layers, uint64_t seed) {
    const std::string path = dir.file("rand-v" + std::to_string(vocab) + "-l" + std::to_string(layers) + "-s" + std::to_string(seed) + ".gguf");
    if (std::filesystem::exists(path)) return path;
    make_model::MakeModelOptions o;
    o.cfg = make_model::preset_config("tiny", layers);
    o.cfg.n_vocab = vocab;
    o.seed = seed;
    o.threads = 2;
    o.progress = false;
    make_model::make_model(o, path);
    return path;
}

// The daemon's loop without speculation: the first token comes from the prompt's logits;
// each later one after evaluating the previous (pending) one.
std::vector<int32_t> plain_greedy(Session &s, std::span<const int32_t> prompt, int n) {
    s.sync(prompt);
    std::vector<int32_t> out{s.argmax()};
    while ((int)out.size() < n) {
        s.eval(out.back());
        out.push_back(s.argmax());
    }
    return out;
}

std::vector<int32_t> spec_greedy(SpeculativeDecoder &d, std::span<const int32_t> prompt, int n) {
    d.target().sync(prompt);
    std::vector<int32_t> out{d.target().argmax()};
    const SamplingParams greedy;
    while ((int)out.size() < n) d.step(out.back(), greedy, nullptr, n - (int)out.size(), &out);
    return out;
}

struct FixtureModels {
    RefFixture fx;
    std::unique_ptr<Model> target, q8, rand;
    std::map<const Model *, std::unique_ptr<Executor>> ex;   // one per model, shared by its sessions
};

class SpecTest : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir = new TempDir;
        for (const char *name : {"mix", "wide"}) {
            auto &f = fixtures[name];
            f.fx = load_fixture(name);
            f.target = Model::open(converted_gguf(name, "f32"), {1});
            f.q8 = Model::open(converted_gguf(name, "q8_0"), {1});
            f.rand = Model::open(random_model(*dir, f.fx.vocab, 2, 77), {1});
            for (const Model *m : {f.target.get(), f.q8.get(), f.rand.get()}) f.ex[m] = m->make_executor();
        }
    }
    static void TearDownTestSuite() {
        fixtures.clear();
        delete dir;
    }
    inline static TempDir *dir = nullptr;

    inline static std::map<std::string, FixtureModels> fixtures;
};

TEST_F(SpecTest, GreedyOutputAndTailEqualPlainDecodingOnFixtures) {
    const int n = 24;   // crosses the sliding windows and several compression boundaries
    for (auto &[name, f] : fixtures) {
        struct Drafter {
            const char *what;
            const Model *m;
        };
        for (Drafter dr : {Drafter{"random", f.rand.get()}, Drafter{"q8_0", f.q8.get()}, Drafter{"itself", f.target.get()}}) {
            SpecCounters total;
            for (int len : {1, 2, 5, 8, 13, 21, 34}) {
                const std::string what = name + " drafter=" + dr.what + " prompt=" + std::to_string(len);
                const std::span<const int32_t> prompt = std::span<const int32_t>(f.fx.tokens).first(len);
                const int ctx = len + n + 1;
                Session plain(*f.target, *f.ex[f.target.get()], ctx, 0, 8);
                const std::vector<int32_t> want = plain_greedy(plain, prompt, n);
                Session t(*f.target, *f.ex[f.target.get()], ctx, 0, 8), d(*dr.m, *f.ex[dr.m], ctx, 0, 8);
                SpecOptions o;
                o.draft_max = 5;
                SpeculativeDecoder dec(t, d, o);
                EXPECT_EQ(spec_greedy(dec, prompt, n), want) << what;
                // Settle both (evaluate the last pending token): the tails must match byte for byte.
                plain.eval(want.back());
                t.eval(want.back());
                EXPECT_EQ(t.tokens(), plain.tokens()) << what;
                EXPECT_EQ(t.save_tail(), plain.save_tail()) << what;
                total += dec.counters();
            }
            EXPECT_GT(total.trials, 0u) << name << " " << dr.what;
            EXPECT_GT(total.drafted, 0u);
            if (dr.m == f.target.get()) {
                EXPECT_EQ(total.accepted, total.drafted) << name << ": a drafter equal to the target is always right";
            } else if (dr.m == f.rand.get()) {
                EXPECT_LT(total.accepted, total.drafted) << name << ": a random drafter must be rejected somewhere";
            }
        }
    }
}

// draft() + trial rows in forward_batch (next to another session's plain rows) + verify()
// equals trial(): the same drafts, choices, random draws and, after commit, the same state.
TEST_F(SpecTest, BatchedTrialRowsEqualATrialAlone) {
    FixtureModels &f = fixtures["mix"];
    const std::span<const int32_t> prompt = std::span<const int32_t>(f.fx.tokens).first(6);
    Executor &tx = *f.ex[f.target.get()], &qx = *f.ex[f.q8.get()];
    for (const float temp : {0.f, 0.8f}) {
        Session a(*f.target, tx, 64), ad(*f.q8, qx, 64), b(*f.target, tx, 64), bd(*f.q8, qx, 64);
        Session other(*f.target, tx, 64), other_ref(*f.target, tx, 64);
        SpecOptions o;
        o.draft_max = 4;
        SpeculativeDecoder alone(a, ad, o), batched(b, bd, o);
        a.sync(prompt);
        b.sync(prompt);
        int32_t pa = a.argmax(), pb = b.argmax();
        uint64_t ra = 5, rb = 5;
        const SamplingParams p{temp, 0, 1.f, 0.f};
        for (int step = 0; step < 6; ++step) {
            const int w = alone.trial(pa, p, &ra, 8);
            const int wb = batched.draft(pb, p, &rb, 8);
            ASSERT_EQ(w, wb);
            ASSERT_GE(w, 2);
            std::vector<BatchRow> rows = {{&other, int32_t(10 + step), other.pos(), true}};
            for (int i = 0; i < wb; ++i) rows.push_back({&b, batched.tokens()[size_t(i)], b.pos() + i, true, true});
            forward_batch(tx, rows, nullptr);
            other_ref.eval(10 + step);
            EXPECT_EQ(other.logits(), other_ref.logits());
            ASSERT_TRUE(b.in_trial());
            batched.verify(b.trial_logits(), p, &rb);
            EXPECT_EQ(std::vector<int32_t>(batched.tokens().begin(), batched.tokens().end()),
                      std::vector<int32_t>(alone.tokens().begin(), alone.tokens().end()));
            EXPECT_EQ(std::vector<int32_t>(batched.next().begin(), batched.next().end()),
                      std::vector<int32_t>(alone.next().begin(), alone.next().end()));
            EXPECT_EQ(batched.accepted(), alone.accepted());
            EXPECT_EQ(ra, rb);
            const int keep = alone.accepted() + 1;
            pa = alone.next()[size_t(keep - 1)];
            pb = batched.next()[size_t(keep - 1)];
            alone.commit(keep);
            batched.commit(keep);
            EXPECT_EQ(a.tokens(), b.tokens());
            EXPECT_EQ(a.logits(), b.logits());
        }
        EXPECT_EQ(a.save_tail(), b.save_tail());
        // Trial rows must all want logits and cover the session's whole segment.
        const int32_t t0 = 3;
        std::vector<BatchRow> bad = {{&b, t0, b.pos(), false, true}, {&b, t0, b.pos() + 1, true, true}};
        EXPECT_THROW(forward_batch(tx, bad, nullptr), Error);
        bad = {{&b, t0, b.pos(), true, true}, {&b, t0, b.pos() + 1, true, false}};
        EXPECT_THROW(forward_batch(tx, bad, nullptr), Error);
        EXPECT_FALSE(b.in_trial());
    }
}

TEST_F(SpecTest, RejectedPositionsAreRestoredWithoutAnotherForward) {
    FixtureModels &f = fixtures["mix"];
    const std::span<const int32_t> prompt = std::span<const int32_t>(f.fx.tokens).first(6);
    const int n = 40, ctx = 64;
    Session plain(*f.target, ctx, 0, 0);
    const std::vector<int32_t> want = plain_greedy(plain, prompt, n);
    // No ring slack on the target: only the journal can bring back what rejected rows overwrote.
    Session t(*f.target, ctx, 8, 0), d(*f.rand, ctx);   // step cap 8, no slack: rings hold little more than the window
    SpecOptions o;
    o.draft_max = 4;
    o.min_gain = 1e-6f;   // always draft 4: many rejections
    SpeculativeDecoder dec(t, d, o);
    t.sync(prompt);
    const ExecutorStats before = t.executor().stats();
    std::vector<int32_t> out{t.argmax()};
    uint64_t rows = 0, steps = 0, rejected_rows = 0;
    while ((int)out.size() < n) {
        const int w = dec.trial(out.back(), {}, nullptr, n - (int)out.size());
        if (w == 0) {
            t.eval(out.back());
            out.push_back(t.argmax());
            rows += 1, steps += 1;
            continue;
        }
        const int keep = dec.accepted() + 1;
        out.insert(out.end(), dec.next().begin(), dec.next().begin() + keep);
        dec.commit(keep);
        rows += w, steps += 1, rejected_rows += w - keep;
    }
    EXPECT_EQ(out, want);
    EXPECT_GT(rejected_rows, 10u) << "the random drafter should have been rejected often";
    const ExecutorStats &after = t.executor().stats();
    // One target step per trial, each row evaluated once: nothing was re-run for the
    // rejected rows, yet the continuation equals plain decoding.
    EXPECT_EQ(after.steps - before.steps, steps);
    EXPECT_EQ(after.rows - before.rows, rows);
    t.eval(out.back());
    plain.eval(out.back());
    EXPECT_EQ(t.save_tail(), plain.save_tail());
}

TEST_F(SpecTest, MisuseIsRefusedAndLeavesTheTrialIntact) {
    FixtureModels &f = fixtures["mix"];
    const std::span<const int32_t> prompt = std::span<const int32_t>(f.fx.tokens).first(10);
    Session t(*f.target, 32), d(*f.rand, 32);
    SpecOptions o;
    o.min_gain = 1e-6f;
    SpeculativeDecoder dec(t, d, o);
    t.sync(prompt);
    const int32_t pending = t.argmax();
    EXPECT_THROW(dec.commit(1), Error);   // nothing pending
    EXPECT_THROW(dec.trial(-1, {}, nullptr, 4), Error);
    EXPECT_THROW(dec.trial(f.fx.vocab, {}, nullptr, 4), Error);
    EXPECT_THROW(dec.trial(pending, {}, nullptr, 0), Error);
    EXPECT_THROW(dec.trial(pending, {1.f, 0, 1.f, 0.f}, nullptr, 4), Error);   // no rng
    uint64_t rng = 1;
    EXPECT_THROW(dec.trial(pending, {1.f, 0, 1.5f, 0.f}, &rng, 4), Error);     // top_p
    EXPECT_EQ(t.pos(), 10);
    EXPECT_EQ(dec.counters().trials, 0u);
    // One token wanted: nothing to draft, fall back.
    EXPECT_EQ(dec.trial(pending, {}, nullptr, 1), 0);
    EXPECT_EQ(dec.counters().fallbacks, 1u);
    EXPECT_EQ(t.pos(), 10);
    const int w = dec.trial(pending, {}, nullptr, 8);
    ASSERT_EQ(w, o.draft_max + 1);
    EXPECT_TRUE(dec.in_trial());
    EXPECT_THROW(dec.trial(pending, {}, nullptr, 8), Error);
    EXPECT_THROW(dec.commit(dec.accepted() + 2), Error);
    EXPECT_THROW(dec.commit(-1), Error);
    EXPECT_THROW(t.eval(1), Error);
    EXPECT_TRUE(dec.in_trial());
    dec.commit(0);   // drop it all
    EXPECT_EQ(t.pos(), 10);
    EXPECT_FALSE(dec.in_trial());
    // Near the end of the context there is no room for drafts plus the next pending token.
    std::vector<int32_t> fill(f.fx.tokens.begin(), f.fx.tokens.begin() + 31);
    t.sync(fill);
    EXPECT_EQ(dec.trial(pending, {}, nullptr, 8), 0);
    EXPECT_EQ(t.pos(), 31);
}

TEST_F(SpecTest, VocabularyMismatchIsRefused) {
    FixtureModels &mix = fixtures["mix"], &wide = fixtures["wide"];
    Session t(*mix.target, 16), d(*wide.target, 16), small(*mix.rand, 8);
    try {
        SpeculativeDecoder dec(t, d);
        FAIL() << "accepted a drafter of another vocabulary";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("vocabulary"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("300"), std::string::npos) << e.what();
    }
    EXPECT_THROW(SpeculativeDecoder(t, t), Error);
    EXPECT_THROW(SpeculativeDecoder(t, small), Error);   // drafter context too small
    SpecOptions o;
    o.draft_max = 0;
    Session d2(*mix.rand, 16);
    EXPECT_THROW(SpeculativeDecoder(t, d2, o), Error);
}

// ---- sampling: the output distribution is the target's --------------------------------

// Upper tail of the chi-square distribution (Wilson-Hilferty: accurate to a few percent of
// p for the tens-to-hundreds of degrees of freedom here).
double chi2_p(double x, int df) {
    const double v = 2.0 / (9.0 * df);
    const double z = (std::cbrt(x / df) - (1 - v)) / std::sqrt(v);
    return 0.5 * std::erfc(z / std::sqrt(2.0));
}

struct Chi2 {
    double stat = 0, p = 1;
    int df = 0;
};

// Cells with fewer than 5 expected samples are pooled into one.
Chi2 goodness_of_fit(const std::vector<double> &prob, const std::vector<uint64_t> &count, uint64_t n) {
    Chi2 r;
    double pool_e = 0, pool_o = 0;
    int cells = 0;
    for (size_t i = 0; i < prob.size(); ++i) {
        const double e = prob[i] * n;
        if (e < 5) {
            pool_e += e, pool_o += count[i];
            continue;
        }
        r.stat += (count[i] - e) * (count[i] - e) / e;
        ++cells;
    }
    if (pool_e > 0) r.stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e, ++cells;
    r.df = cells - 1;
    r.p = chi2_p(r.stat, r.df);
    return r;
}

// Two samples of equal size: sum (a - b)^2 / (a + b) over cells (pooled as above).
Chi2 homogeneity(const std::vector<double> &prob, const std::vector<uint64_t> &a, const std::vector<uint64_t> &b, uint64_t n) {
    Chi2 r;
    double pa = 0, pb = 0;
    int cells = 0;
    for (size_t i = 0; i < prob.size(); ++i) {
        if (prob[i] * n < 5) {
            pa += a[i], pb += b[i];
            continue;
        }
        if (a[i] + b[i] == 0) continue;
        r.stat += ((double)a[i] - (double)b[i]) * ((double)a[i] - (double)b[i]) / (double)(a[i] + b[i]);
        ++cells;
    }
    if (pa + pb > 0) r.stat += (pa - pb) * (pa - pb) / (pa + pb), ++cells;
    r.df = cells - 1;
    r.p = chi2_p(r.stat, r.df);
    return r;
}

class SpecSamplingTest : public ::testing::Test {
protected:
    static constexpr int V = 16;
    static void SetUpTestSuite() {
        dir = new TempDir;
        target = Model::open(random_model(*dir, V, 1, 5), {1}).release();
        drafter = Model::open(random_model(*dir, V, 1, 6), {1}).release();
    }
    static void TearDownTestSuite() {
        delete target;
        delete drafter;
        delete dir;
    }
    // The exact joint distribution of the two tokens after prefix + pending.
    static std::vector<double> exact(Session &s, const std::vector<int32_t> &prefix, int32_t pending, const SamplingParams &p) {
        s.sync(prefix);
        s.eval(pending);
        std::vector<double> p1, p2, joint(V * V, 0.0);
        sampling_probs(s.logits(), p, &p1);
        for (int a = 0; a < V; ++a) {
            if (p1[a] == 0) continue;
            s.eval(a);
            sampling_probs(s.logits(), p, &p2);
            for (int b = 0; b < V; ++b) joint[a * V + b] = p1[a] * p2[b];
            s.rewind((int)prefix.size() + 1);
        }
        s.rewind((int)prefix.size());
        return joint;
    }
    inline static TempDir *dir = nullptr;
    inline static Model *target = nullptr, *drafter = nullptr;
};

TEST_F(SpecSamplingTest, NextTwoTokensFollowTheTargetsDistribution) {
    const std::vector<int32_t> prefix = {1, 7, 3, 12, 5, 9};
    const int32_t pending = 4;
    const uint64_t N = 20000;
    struct Case {
        const char *what;
        SamplingParams p;
        int draft_max;
    };
    const Case cases[] = {
        {"T=1, one draft (bonus token)", {1.f, 0, 1.f, 0.f}, 1},
        {"T=1, two drafts", {1.f, 0, 1.f, 0.f}, 2},
        {"T=0.8 top_k=10 top_p=0.95 min_p=0.02, two drafts", {0.8f, 10, 0.95f, 0.02f}, 2},
    };
    std::map<std::tuple<float, int, float, float>, std::vector<uint64_t>> plain_by_params;
    for (const Case &c : cases) {
        Session t(*target, 32), d(*drafter, 32);
        const std::vector<double> want = exact(t, prefix, pending, c.p);
        double mass_top = 0;
        for (double v : want) mass_top = std::max(mass_top, v);
        ASSERT_LT(mass_top, 0.5) << c.what << ": too peaked to test anything";
        // Without speculation (the same parameters give the same sample again: reuse it).
        std::vector<uint64_t> &plain = plain_by_params[{c.p.temperature, c.p.top_k, c.p.top_p, c.p.min_p}];
        std::vector<uint64_t> spec(V * V, 0);
        uint64_t rng = 12345;
        const bool sample_plain = plain.empty();
        if (sample_plain) plain.assign(V * V, 0);
        for (uint64_t i = 0; sample_plain && i < N; ++i) {
            t.eval(pending);
            const int a = t.sample(c.p, &rng);
            t.eval(a);
            const int b = t.sample(c.p, &rng);
            ++plain[a * V + b];
            t.rewind((int)prefix.size());
        }
        // With speculation: the drafts cover both tokens when accepted.
        SpecOptions o;
        o.draft_max = c.draft_max;
        o.min_gain = 1e-6f;
        SpeculativeDecoder dec(t, d, o);
        uint64_t all_accepted = 0, rejected = 0;
        for (uint64_t i = 0; i < N; ++i) {
            std::vector<int32_t> out;
            int32_t pend = pending;
            while (out.size() < 2) {
                const int w = dec.trial(pend, c.p, &rng, c.draft_max + 1);
                ASSERT_EQ(w, c.draft_max + 1);
                const int j = dec.accepted();
                (j == w - 1 ? all_accepted : rejected) += 1;
                out.insert(out.end(), dec.next().begin(), dec.next().begin() + j + 1);
                dec.commit(j + 1);
                pend = out.back();
            }
            ++spec[out[0] * V + out[1]];
            t.rewind((int)prefix.size());
        }
        const double rate = (double)dec.counters().accepted / dec.counters().drafted;
        EXPECT_GT(rate, 0.1) << c.what;
        EXPECT_LT(rate, 0.95) << c.what << ": the drafter should disagree sometimes";
        EXPECT_GT(all_accepted, N / 20) << c.what << ": bonus path";
        EXPECT_GT(rejected, N / 20) << c.what << ": residual path";
        const Chi2 fit_spec = goodness_of_fit(want, spec, N), fit_plain = goodness_of_fit(want, plain, N);
        const Chi2 same = homogeneity(want, spec, plain, N);
        EXPECT_GT(fit_spec.p, 0.01) << c.what << ": speculative vs exact chi2 " << fit_spec.stat << " df " << fit_spec.df;
        EXPECT_GT(fit_plain.p, 0.01) << c.what << ": plain vs exact chi2 " << fit_plain.stat << " df " << fit_plain.df;
        EXPECT_GT(same.p, 0.01) << c.what << ": speculative vs plain chi2 " << same.stat << " df " << same.df;
        EXPECT_GE(fit_spec.df, 20) << c.what;
        std::printf("[ sampling ] %s: acceptance %.3f; chi2 spec/exact %.1f (df %d, p %.3f), plain/exact %.1f (p %.3f), spec/plain %.1f (p %.3f)\n",
                    c.what, rate, fit_spec.stat, fit_spec.df, fit_spec.p, fit_plain.stat, fit_plain.p, same.stat, same.p);
    }
}

// The statistic has the power to tell the two models apart: what a sampler that trusted the
// drafts unconditionally would give (the drafter's own distribution) fails it.
TEST_F(SpecSamplingTest, TheTestRejectsTheDraftersDistribution) {
    const std::vector<int32_t> prefix = {1, 7, 3, 12, 5, 9};
    const int32_t pending = 4;
    const SamplingParams p{1.f, 0, 1.f, 0.f};
    Session t(*target, 32), d(*drafter, 32);
    const std::vector<double> want = exact(t, prefix, pending, p);
    std::vector<uint64_t> biased(V * V, 0);
    uint64_t rng = 999;
    const uint64_t N = 5000;
    for (uint64_t i = 0; i < N; ++i) {
        d.sync(prefix);
        d.eval(pending);
        const int a = d.sample(p, &rng);
        d.eval(a);
        const int b = d.sample(p, &rng);
        ++biased[a * V + b];
    }
    EXPECT_LT(goodness_of_fit(want, biased, N).p, 1e-6);
}

}  // namespace
