// ds4_bridge_batch_eval: one step over several sessions gives each the state and logits it
// gets evaluating its tokens alone; rejected calls change nothing.
#include <cmath>

#include "tests/bridge/bridge_test_util.h"

namespace bridge_test {
namespace {

using ds4::bridge::Batch;
using ds4::bridge::BridgeError;
using ds4::bridge::Session;

class BatchEval : public BridgeTest {};

float rel(const std::vector<float> &a, const std::vector<float> &b) {
    float mx = 0, d = 0;
    for (size_t i = 0; i < a.size(); ++i) mx = std::max(mx, std::fabs(a[i])), d = std::max(d, std::fabs(a[i] - b[i]));
    return mx > 0 ? d / mx : d;
}

TEST_F(BatchEval, MixedPrefillAndDecodeRowsMatchEachSessionAlone) {
    const int V = model->vocab_size();
    constexpr int kSessions = 4;
    std::vector<std::unique_ptr<Session>> ss, alone;
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < kSessions; ++i) {
        prompts.push_back(tokens(size_t(5 + 7 * i), uint32_t(11 + i)));
        ss.push_back(std::make_unique<Session>(*model, 96));
        alone.push_back(std::make_unique<Session>(*model, 96));
    }
    // Sessions 1..3 start decoding; session 0 prefills its prompt in chunks of 3 meanwhile.
    for (int i = 1; i < kSessions; ++i) ss[i]->sync(prompts[i]), alone[i]->sync(prompts[i]);
    Batch batch(*model);
    size_t done0 = 0;
    for (int step = 0; step < 6; ++step) {
        std::vector<ds4_bridge_session *> hs;
        std::vector<int32_t> counts, toks;
        if (done0 < prompts[0].size()) {
            const size_t n = std::min<size_t>(3, prompts[0].size() - done0);
            hs.push_back(ss[0]->handle());
            counts.push_back(int32_t(n));
            toks.insert(toks.end(), prompts[0].begin() + long(done0), prompts[0].begin() + long(done0 + n));
            done0 += n;
        }
        for (int i = 1; i < kSessions; ++i) {
            const int32_t t = tokens(1, uint32_t(100 * i + step))[0];
            hs.push_back(ss[i]->handle());
            counts.push_back(1);
            toks.push_back(t);
            alone[i]->eval(t);
        }
        batch.eval(hs, counts, toks);
        for (int i = 1; i < kSessions; ++i) {
            EXPECT_EQ(ss[i]->pos(), alone[i]->pos());
            EXPECT_LE(rel(alone[i]->logits(V), ss[i]->logits(V)), 1e-6) << "session " << i << " step " << step; EXPECT_EQ(alone[i]->logits(V), ss[i]->logits(V)) << "bitwise";
            EXPECT_EQ(ss[i]->argmax(), alone[i]->argmax()) << "session " << i << " step " << step;
        }
    }
    alone[0]->sync(prompts[0]);
    EXPECT_EQ(ss[0]->pos(), int(prompts[0].size()));
    EXPECT_LE(rel(alone[0]->logits(V), ss[0]->logits(V)), 1e-6);
    const ds4_bridge_batch_stats_t st = batch.stats();
    EXPECT_EQ(st.steps, 6u);
    EXPECT_EQ(st.rows, prompts[0].size() + 6 * (kSessions - 1));
    EXPECT_EQ(st.failed, 0u);
}

TEST_F(BatchEval, RejectedCallsNameTheProblemAndChangeNothing) {
    Session a(*model, 32), b(*model, 32);
    a.sync(tokens(10));
    b.sync(tokens(4, 3));
    const auto la = a.logits(model->vocab_size());
    const uint64_t ga = a.generation(), gb = b.generation();
    Batch batch(*model);
    struct Case {
        std::vector<ds4_bridge_session *> s;
        std::vector<int32_t> counts, toks;
        const char *why;
    };
    const int cap = a.prefill_cap();
    std::vector<Case> cases = {
        {{a.handle(), a.handle()}, {1, 1}, {1, 2}, "twice"},
        {{a.handle(), nullptr}, {1, 1}, {1, 2}, "NULL"},
        {{a.handle(), b.handle()}, {1, 0}, {1}, "outside [1,"},
        {{a.handle()}, {cap + 1}, std::vector<int32_t>(size_t(cap + 1), 1), "prefill cap"},
        {{a.handle(), b.handle()}, {1, 1}, {1, model->vocab_size()}, "vocab"},
        {{a.handle(), b.handle()}, {1, 1}, {-3, 1}, ""},
        {{b.handle()}, {29}, std::vector<int32_t>(29, 1), "context"},
    };
    for (const Case &c : cases) {
        Err e;
        EXPECT_NE(ds4_bridge_batch_eval(nullptr, c.s.data(), c.counts.data(), int(c.s.size()), c.toks.data(), e.buf,
                                        sizeof e.buf),
                  0);
        try {
            batch.eval(c.s, c.counts, c.toks);
            ADD_FAILURE() << "accepted: " << c.why;
        } catch (const BridgeError &x) {
            EXPECT_TRUE(has(x.what(), c.why)) << x.what() << " (wanted " << c.why << ")";
        }
        EXPECT_EQ(a.pos(), 10) << c.why;
        EXPECT_EQ(b.pos(), 4) << c.why;
        EXPECT_EQ(a.generation(), ga) << c.why;
        EXPECT_EQ(b.generation(), gb) << c.why;
        EXPECT_EQ(a.logits(model->vocab_size()), la) << c.why;
    }
    // A session of another model is refused.
    ds4::bridge::ModelOptions o;
    o.model_path = DS4_TEST_MODEL;
    o.n_threads = 1;
    ds4::bridge::Model other(o);
    Session c(other, 32);
    std::vector<ds4_bridge_session *> hs = {a.handle(), c.handle()};
    std::vector<int32_t> counts = {1, 1}, toks = {1, 1};
    EXPECT_THROW(batch.eval(hs, counts, toks), BridgeError);
    EXPECT_EQ(a.pos(), 10);
    EXPECT_EQ(batch.stats().steps, 0u);
}

}  // namespace
}  // namespace bridge_test
