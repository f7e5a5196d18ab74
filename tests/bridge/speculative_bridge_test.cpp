// Speculative decoding over the C ABI (ds4_bridge_spec_*): a drafter opened as the model's
// sibling, refused when its vocabulary differs; the daemon-style loop (pending token,
// trial, commit of what the caller keeps) gives the same tokens and the same saved payload
// bytes as plain decoding; bad arguments and calls during a pending trial are errors that
// leave the session as it was; counters add up.
#include <cstring>
#include <memory>
#include <span>

#include "tests/bridge/bridge_test_util.h"

#ifndef DS4_SPEC_MODELS
#error "DS4_SPEC_MODELS must name the folder of the generated drafters (tests/bridge/CMakeLists.txt)"
#endif

namespace bridge_test {
namespace {

using ds4::bridge::BridgeError;
using ds4::bridge::Model;
using ds4::bridge::ModelOptions;
using ds4::bridge::Session;

const std::string kModels = DS4_SPEC_MODELS;
const std::string kPystd = DS4_SOURCE_DIR "/models/ds4-pystd-q8_0.gguf";
const std::string kPystdDrafter = DS4_SOURCE_DIR "/models/ds4-pystd-drafter-q8_0.gguf";

Model open(const std::string &path, const std::string &drafter, int draft_max = 0) {
    ModelOptions o;
    o.model_path = path;
    o.drafter_path = drafter;
    o.draft_max = draft_max;
    o.n_threads = 1;
    return Model(o);
}

std::string open_error(const std::string &path, const std::string &drafter, int draft_max = 0, const char *mtp = nullptr) {
    ds4_bridge_model_open_options opt;
    ds4_bridge_model_open_options_init(&opt);
    opt.model_path = path.c_str();
    opt.drafter_path = drafter.empty() ? nullptr : drafter.c_str();
    opt.mtp_path = mtp;
    opt.draft_max = draft_max;
    opt.n_threads = 1;
    ds4_bridge_model *m = nullptr;
    Err e;
    if (ds4_bridge_model_open(&m, &opt, e.buf, sizeof e.buf) == 0) {
        ds4_bridge_model_free(m);
        return "";
    }
    EXPECT_EQ(m, nullptr);
    return e.str();
}

// A turn the way ds4d decodes it: the first token from the prompt's logits, then each one
// after evaluating the pending one; the last token stays pending and is evaluated at the
// end ("settled") so the payload holds the whole turn.
std::vector<int32_t> plain_turn(Session &s, std::span<const int32_t> prompt, int n) {
    s.sync(prompt);
    std::vector<int32_t> out{s.argmax()};
    while ((int)out.size() < n) {
        s.eval(out.back());
        out.push_back(s.argmax());
    }
    s.eval(out.back());
    return out;
}

// The same turn through ds4_bridge_spec_trial/commit. stop_at >= 0: the caller treats that
// output index as a stop token and keeps nothing after it (a commit inside the accepted run).
std::vector<int32_t> spec_turn(Session &s, std::span<const int32_t> prompt, int n, int stop_at = -1) {
    s.sync(prompt);
    std::vector<int32_t> out{s.argmax()};
    while ((int)out.size() < n && (stop_at < 0 || (int)out.size() <= stop_at)) {
        const ds4::bridge::SpecTrial t = s.spec_trial(out.back(), 0.f, 0, 1.f, 0.f, nullptr, n - (int)out.size());
        if (t.width == 0) {
            s.eval(out.back());
            out.push_back(s.argmax());
            continue;
        }
        EXPECT_EQ(t.tokens[0], out.back());
        int keep = 0;
        while (keep <= t.accepted) {
            out.push_back(t.argmax[keep++]);
            if (stop_at >= 0 && (int)out.size() == stop_at + 1) break;
        }
        s.spec_commit(keep);
    }
    s.eval(out.back());
    return out;
}

TEST(SpecBridge, DrafterIsOpenedPrivatelyAndCountedInMemory) {
    Model plain = open(DS4_TEST_MODEL, "");
    Model m = open(DS4_TEST_MODEL, kModels + "/rand320.gguf", 3);
    EXPECT_FALSE(m.drafter_shared());
    EXPECT_EQ(ds4_bridge_drafter_shared(nullptr), 0);
    const ds4_bridge_spec_counters_t c = m.spec_counters();
    EXPECT_EQ(c.draft_max, 3);
    EXPECT_EQ(c.trials + c.drafted + c.accepted + c.fallbacks + c.committed, 0u);
    EXPECT_EQ(plain.spec_counters().draft_max, 0);
    EXPECT_GT(m.memory().weights_bytes, plain.memory().weights_bytes);
    EXPECT_EQ(open(DS4_TEST_MODEL, kModels + "/rand320.gguf").spec_counters().draft_max, 4);   // the default
}

TEST(SpecBridge, VocabularyMismatchAtOpenIsAClearError) {
    // Another size: the wide fixture has 300 tokens, the mix model 320.
    std::string e = open_error(DS4_TEST_MODEL, DS4_TEST_MODEL_WIDE);
    EXPECT_TRUE(has(e, "vocabulary has 300 tokens, the model's 320")) << e;
    EXPECT_TRUE(has(e, "drafter")) << e;
    // The same size, other token texts: a random model's byte-fallback vocabulary of 8192
    // against the trained tokenizer.
    e = open_error(kPystd, kModels + "/rand8192.gguf");
    EXPECT_TRUE(has(e, "different tokenizer (token ")) << e;
    // Options.
    EXPECT_TRUE(has(open_error(DS4_TEST_MODEL, kModels + "/rand320.gguf", 65), "draft_max"));
    EXPECT_TRUE(has(open_error(DS4_TEST_MODEL, kModels + "/rand320.gguf", -1), "draft_max"));
    EXPECT_TRUE(has(open_error(DS4_TEST_MODEL, "", 3), "no drafter_path"));
    const std::string d = kModels + "/rand320.gguf";
    EXPECT_TRUE(has(open_error(DS4_TEST_MODEL, d, 0, d.c_str()), "not both"));
    EXPECT_TRUE(has(open_error(DS4_TEST_MODEL, "/nonexistent/drafter.gguf"), "/nonexistent/drafter.gguf"));
}

TEST(SpecBridge, GreedyTurnsEqualPlainTurnsTokenForTokenAndByteForByte) {
    Model plain = open(DS4_TEST_MODEL, "");
    for (const char *d : {"/rand320.gguf", "/mix-q8.gguf"}) {
        Model m = open(DS4_TEST_MODEL, kModels + d, 4);
        for (int len : {3, 9, 17}) {
            std::vector<int32_t> prompt(len);
            for (int i = 0; i < len; ++i) prompt[i] = (i * 37 + 11) % 320;
            Session a(plain, 64), b(m, 64);
            const std::vector<int32_t> want = plain_turn(a, prompt, 30);
            EXPECT_EQ(spec_turn(b, prompt, 30), want) << d << " prompt " << len;
            EXPECT_EQ(b.save_payload(), a.save_payload()) << d << " prompt " << len;
            // A second turn on top of the first one.
            std::vector<int32_t> more(prompt);
            more.insert(more.end(), want.begin(), want.end());
            more.push_back(5);
            const std::vector<int32_t> want2 = plain_turn(a, more, 12);
            EXPECT_EQ(spec_turn(b, more, 12), want2) << d << " second turn";
            EXPECT_EQ(b.save_payload(), a.save_payload()) << d << " second turn";
        }
        const ds4_bridge_spec_counters_t c = m.spec_counters();
        EXPECT_GT(c.trials, 0u);
        EXPECT_GE(c.drafted, c.trials);
        EXPECT_LE(c.accepted, c.drafted);
        EXPECT_EQ(c.committed, c.trials + c.accepted) << "greedy turns keep every accepted draft";
    }
}

TEST(SpecBridge, StoppingInsideTheAcceptedRunKeepsOnlyWhatWasUsed) {
    Model plain = open(DS4_TEST_MODEL, "");
    Model m = open(DS4_TEST_MODEL, kModels + "/mix-q8.gguf", 6);   // agrees often: long runs
    const std::vector<int32_t> prompt = {4, 77, 19, 250, 3, 61, 8};
    Session a(plain, 64);
    const std::vector<int32_t> full = plain_turn(a, prompt, 30);
    for (int stop_at : {1, 4, 7, 12, 20}) {
        Session b(m, 64);
        const std::vector<int32_t> got = spec_turn(b, prompt, 30, stop_at);
        ASSERT_EQ((int)got.size(), stop_at + 1);
        EXPECT_TRUE(std::equal(got.begin(), got.end(), full.begin())) << stop_at;
        Session c(plain, 64);
        std::vector<int32_t> held(prompt);
        held.insert(held.end(), got.begin(), got.end());
        c.sync(held);
        EXPECT_EQ(b.pos(), c.pos());
        EXPECT_EQ(b.save_payload(), c.save_payload()) << "stop at " << stop_at;
    }
}

TEST(SpecBridge, TrainedPairPayloadAfterASpeculativeTurnIsByteIdentical) {
    Model plain = open(kPystd, "");
    Model m = open(kPystd, kPystdDrafter, 4);
    const std::vector<int32_t> prompt = plain.tokenize("def read_config(path):\n    \"\"\"Read the file.\"\"\"\n    with open(");
    Session a(plain, 256), b(m, 256);
    const std::vector<int32_t> want = plain_turn(a, prompt, 48);
    EXPECT_EQ(spec_turn(b, prompt, 48), want);
    EXPECT_EQ(b.save_payload(), a.save_payload());
    const ds4_bridge_spec_counters_t c = b.spec_counters();
    EXPECT_GT(c.accepted, 0u) << "the trained drafter agrees with its model often";
}

// What a host reserves for a speculating session: the target's cache plus the drafter
// session's (ds4_bridge_drafter_cache_bytes_for), which is what the session then holds.
TEST(SpecBridge, DrafterCacheBytesCoverWhatASpeculatingSessionHolds) {
    Model plain = open(kPystd, "");
    Model m = open(kPystd, kPystdDrafter, 4);
    const int ctx = 1024, n_turn = 200;
    const std::vector<int32_t> prompt = m.tokenize("import os\nimport sys\n\n\ndef main(argv):\n    ");
    Session s(m, ctx);
    spec_turn(s, prompt, n_turn);
    ASSERT_GT(s.spec_counters().trials, 0u);
    const int held = (int)prompt.size() + n_turn;
    uint64_t target = 0, drafter = 0, session = 0, none = 0;
    Err e;
    ASSERT_EQ(ds4_bridge_cache_bytes_for(m.handle(), ctx, held, &target, e.buf, sizeof e.buf), 0) << e.str();
    ASSERT_EQ(ds4_bridge_drafter_cache_bytes_for(m.handle(), ctx, held + 4, &drafter, e.buf, sizeof e.buf), 0) << e.str();
    ASSERT_EQ(ds4_bridge_session_cache_bytes(s.handle(), &session, e.buf, sizeof e.buf), 0) << e.str();
    EXPECT_GT(drafter, 0u);
    EXPECT_GT(session, target) << "the drafter session holds memory of its own";
    EXPECT_LE(session, target + drafter) << "the reservation falls short of what the session holds";
    // The drafter's size follows its own shape: smaller than the target's for the same tokens.
    EXPECT_LT(drafter, target);
    // Without a drafter, or with bad arguments, it is an error.
    EXPECT_NE(ds4_bridge_drafter_cache_bytes_for(plain.handle(), ctx, held, &none, e.buf, sizeof e.buf), 0);
    EXPECT_TRUE(has(e.str(), "no drafter")) << e.str();
    EXPECT_NE(ds4_bridge_drafter_cache_bytes_for(m.handle(), 0, held, &none, e.buf, sizeof e.buf), 0);
    EXPECT_NE(ds4_bridge_drafter_cache_bytes_for(nullptr, ctx, held, &none, e.buf, sizeof e.buf), 0);
    EXPECT_NE(ds4_bridge_drafter_cache_bytes_for(m.handle(), ctx, held, nullptr, e.buf, sizeof e.buf), 0);
}

TEST(SpecBridge, BadArgumentsAndCallsDuringATrialAreRefused) {
    Model m = open(DS4_TEST_MODEL, kModels + "/rand320.gguf", 3);
    Session s(m, 32);
    std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
    s.sync(prompt);
    const int32_t pending = s.argmax();
    int32_t tok[8], arg[8];
    int acc = -5;
    Err e;
    auto trial = [&](ds4_bridge_session *h, int32_t p, float temp, float top_p, uint64_t *rng, int max_new, int32_t *t, int32_t *a, int cap) {
        e = Err{};
        return ds4_bridge_spec_trial(h, p, temp, 0, top_p, 0.f, rng, max_new, t, a, cap, &acc, e.buf, sizeof e.buf);
    };
    const uint64_t gen = s.generation();
    EXPECT_EQ(trial(nullptr, pending, 0, 1, nullptr, 4, tok, arg, 8), -1);
    EXPECT_TRUE(has(e.str(), "NULL"));
    EXPECT_EQ(trial(s.handle(), pending, 0, 1, nullptr, 4, nullptr, arg, 8), -1);
    EXPECT_TRUE(has(e.str(), "NULL"));
    EXPECT_EQ(trial(s.handle(), pending, 0, 1, nullptr, 4, tok, nullptr, 8), -1);
    EXPECT_EQ(trial(s.handle(), pending, 0, 1, nullptr, 4, tok, arg, 1), -1);
    EXPECT_TRUE(has(e.str(), "cap"));
    EXPECT_EQ(trial(s.handle(), pending, 0, 1, nullptr, 0, tok, arg, 8), -1);
    EXPECT_TRUE(has(e.str(), "max_new"));
    EXPECT_EQ(trial(s.handle(), 320, 0, 1, nullptr, 4, tok, arg, 8), -1);
    EXPECT_TRUE(has(e.str(), "pending token 320 is out of range"));
    EXPECT_EQ(trial(s.handle(), -1, 0, 1, nullptr, 4, tok, arg, 8), -1);
    EXPECT_EQ(trial(s.handle(), pending, 1, 1, nullptr, 4, tok, arg, 8), -1);
    EXPECT_TRUE(has(e.str(), "rng"));
    uint64_t rng = 3;
    EXPECT_EQ(trial(s.handle(), pending, 1, 0, &rng, 4, tok, arg, 8), -1);
    EXPECT_TRUE(has(e.str(), "top_p"));
    Err ce;
    EXPECT_NE(ds4_bridge_spec_commit(s.handle(), 1, ce.buf, sizeof ce.buf), 0);
    EXPECT_TRUE(has(ce.str(), "no speculative trial is pending"));
    EXPECT_NE(ds4_bridge_spec_commit(nullptr, 1, ce.buf, sizeof ce.buf), 0);
    EXPECT_EQ(s.pos(), 8);
    EXPECT_EQ(s.generation(), gen);
    EXPECT_EQ(m.spec_counters().trials, 0u);

    // One token wanted: fall back (session unchanged, counted).
    EXPECT_EQ(trial(s.handle(), pending, 0, 1, nullptr, 1, tok, arg, 8), 0) << e.str();
    EXPECT_EQ(s.pos(), 8);
    EXPECT_EQ(s.spec_counters().fallbacks, 1u);

    // cap bounds the width.
    const int w = trial(s.handle(), pending, 0, 1, nullptr, 10, tok, arg, 3);
    ASSERT_EQ(w, 3) << e.str();
    EXPECT_EQ(tok[0], pending);
    EXPECT_GE(acc, 0);
    EXPECT_LE(acc, 2);
    for (int i = 0; i < acc; ++i) EXPECT_EQ(arg[i], tok[i + 1]);
    if (acc < 2) {
        EXPECT_NE(arg[acc], tok[acc + 1]);
    }
    // While it is pending: no second trial, no other change, no payload.
    EXPECT_EQ(trial(s.handle(), pending, 0, 1, nullptr, 4, tok + 4, arg + 4, 4), -1);
    EXPECT_TRUE(has(e.str(), "pending"));
    EXPECT_NE(ds4_bridge_eval(s.handle(), 1, ce.buf, sizeof ce.buf), 0);
    EXPECT_NE(ds4_bridge_session_rewind(s.handle(), 2, ce.buf, sizeof ce.buf), 0);
    EXPECT_NE(ds4_bridge_session_sync(s.handle(), prompt.data(), 4, ce.buf, sizeof ce.buf), 0);
    uint64_t size = 0;
    EXPECT_NE(ds4_bridge_session_payload_size(s.handle(), &size, ce.buf, sizeof ce.buf), 0);
    EXPECT_TRUE(has(ce.str(), "speculative trial is pending"));
    EXPECT_NE(ds4_bridge_spec_commit(s.handle(), acc + 2, ce.buf, sizeof ce.buf), 0);
    EXPECT_TRUE(has(ce.str(), "0.." + std::to_string(acc + 1)));
    EXPECT_NE(ds4_bridge_spec_commit(s.handle(), -1, ce.buf, sizeof ce.buf), 0);
    ASSERT_EQ(ds4_bridge_spec_commit(s.handle(), acc + 1, ce.buf, sizeof ce.buf), 0) << ce.str();
    EXPECT_EQ(s.pos(), 8 + acc + 1);
    EXPECT_EQ(s.argmax(), arg[acc]) << "the session's logits are the last kept row's";

    // Counters: the session's and the model's totals.
    const ds4_bridge_spec_counters_t sc = s.spec_counters(), mc = m.spec_counters();
    EXPECT_EQ(sc.trials, 1u);
    EXPECT_EQ(sc.drafted, 2u);
    EXPECT_EQ(sc.accepted, (uint64_t)acc);
    EXPECT_EQ(sc.committed, (uint64_t)acc + 1);
    EXPECT_GE(sc.draft_width, 1);
    EXPECT_LE(sc.draft_width, 3);
    EXPECT_EQ(mc.trials, 1u);
    EXPECT_EQ(mc.fallbacks, 1u);
    EXPECT_EQ(mc.committed, sc.committed);
    Session s2(m, 32);
    s2.sync(prompt);
    ASSERT_GT(s2.spec_trial(s2.argmax(), 0.f, 0, 1.f, 0.f, nullptr, 4).width, 0);
    s2.spec_commit(1);
    EXPECT_EQ(m.spec_counters().trials, 2u);
    EXPECT_EQ(m.spec_counters().committed, sc.committed + 1);
    ds4_bridge_spec_counters_t c;
    EXPECT_NE(ds4_bridge_spec_counters(nullptr, &c, ce.buf, sizeof ce.buf), 0);
    EXPECT_NE(ds4_bridge_spec_counters(m.handle(), nullptr, ce.buf, sizeof ce.buf), 0);
    EXPECT_NE(ds4_bridge_session_spec_counters(nullptr, &c, ce.buf, sizeof ce.buf), 0);

    // A model without a drafter: always fall back, nothing counted.
    Model plain = open(DS4_TEST_MODEL, "");
    Session p(plain, 32);
    p.sync(prompt);
    EXPECT_EQ(trial(p.handle(), pending, 0, 1, nullptr, 4, tok, arg, 8), 0);
    EXPECT_EQ(plain.spec_counters().fallbacks, 0u);
}

TEST(SpecBridge, SampledTurnsRunAndStayConsistent) {
    Model m = open(DS4_TEST_MODEL, kModels + "/mix-q8.gguf", 4);
    Session s(m, 96);
    const std::vector<int32_t> prompt = {9, 8, 7, 6, 5};
    s.sync(prompt);
    uint64_t rng = 42;
    std::vector<int32_t> out{s.sample(0.9f, 20, 0.95f, 0.01f, &rng)};
    while (out.size() < 40) {
        const ds4::bridge::SpecTrial t = s.spec_trial(out.back(), 0.9f, 20, 0.95f, 0.01f, &rng, 40 - (int)out.size());
        ASSERT_GT(t.width, 0);
        for (int i = 0; i < t.accepted; ++i) ASSERT_EQ(t.argmax[i], t.tokens[i + 1]);
        for (int i = t.accepted + 1; i < t.width; ++i) EXPECT_EQ(t.argmax[i], -1) << "nothing is drawn past a rejection";
        ASSERT_GE(t.argmax[t.accepted], 0);
        out.insert(out.end(), t.argmax.begin(), t.argmax.begin() + t.accepted + 1);
        s.spec_commit(t.accepted + 1);
    }
    // The session holds exactly the prompt and every token but the pending last one.
    Model plain = open(DS4_TEST_MODEL, "");
    Session r(plain, 96);
    std::vector<int32_t> held(prompt);
    held.insert(held.end(), out.begin(), out.end() - 1);
    r.sync(held);
    EXPECT_EQ(s.pos(), r.pos());
    EXPECT_EQ(s.save_payload(), r.save_payload());
}

// ds4_bridge_batch_eval_spec: several sessions' trials (different widths) and a plain
// prefill segment in one step give each session exactly what ds4_bridge_spec_trial gives it
// alone (widths, drafts, choices, random draws, the state after commit); a session that
// cannot draft (max_new 1) is evaluated as a plain row of the step.
TEST(SpecBridge, BatchedTrialsEqualTrialsAlone) {
    for (const float temp : {0.f, 0.9f}) {
        SCOPED_TRACE(temp > 0 ? "sampled" : "greedy");
        Model m = open(DS4_TEST_MODEL, kModels + "/mix-q8.gguf", 4);
        Model solo_m = open(DS4_TEST_MODEL, kModels + "/mix-q8.gguf", 4);
        constexpr int kN = 3;
        std::vector<std::unique_ptr<Session>> bs, ss;
        std::vector<int32_t> pending(kN);
        std::vector<uint64_t> brng(kN), srng(kN);
        for (int i = 0; i < kN; ++i) {
            const std::vector<int32_t> prompt = {int32_t(3 + i), 8, int32_t(20 + 7 * i), 6, 5};
            bs.push_back(std::make_unique<Session>(m, 128));
            ss.push_back(std::make_unique<Session>(solo_m, 128));
            bs.back()->sync(prompt);
            ss.back()->sync(prompt);
            pending[size_t(i)] = bs.back()->argmax();
            brng[size_t(i)] = srng[size_t(i)] = 1000 + uint64_t(i);
        }
        Session pre(m, 128), pre_ref(solo_m, 128);   // a plain prefill segment in the same steps
        Session one(m, 128), one_ref(solo_m, 128);   // max_new 1: a plain row
        one.sync(std::vector<int32_t>{4, 4, 4});
        one_ref.sync(std::vector<int32_t>{4, 4, 4});
        ds4::bridge::Batch batch(m);
        int widths_seen = 0;
        for (int step = 0; step < 8; ++step) {
            std::vector<ds4_bridge_spec_row> rows(kN + 1);
            std::vector<std::vector<int32_t>> tk(kN + 1, std::vector<int32_t>(8)), am(kN + 1, std::vector<int32_t>(8));
            for (int i = 0; i <= kN; ++i) {
                ds4_bridge_spec_row &r = rows[size_t(i)];
                r = ds4_bridge_spec_row{};
                r.session = i < kN ? bs[size_t(i)]->handle() : one.handle();
                r.pending = i < kN ? pending[size_t(i)] : 9;
                r.temperature = temp;
                r.top_k = 20;
                r.top_p = 0.95f;
                r.rng = i < kN ? &brng[size_t(i)] : nullptr;
                r.max_new = i < kN ? 2 + (step + i) % 4 : 1;   // widths differ across rows and steps
                r.tokens = tk[size_t(i)].data();
                r.argmax = am[size_t(i)].data();
                r.cap = 8;
            }
            if (temp > 0) rows[kN].rng = &brng[0];   // unused: a plain row draws nothing
            const std::vector<int32_t> chunk = {int32_t(11 + step), int32_t(12 + step)};
            ds4_bridge_session *ph = pre.handle();
            const int32_t count = 2;
            batch.eval_spec(std::span<ds4_bridge_session *const>(&ph, 1), std::span<const int32_t>(&count, 1), chunk, rows);
            pre_ref.sync([&] {
                std::vector<int32_t> h(size_t(2 * (step + 1)));
                for (int k = 0; k <= step; ++k) h[size_t(2 * k)] = 11 + k, h[size_t(2 * k + 1)] = 12 + k;
                return h;
            }());
            EXPECT_EQ(pre.logits(m.vocab_size()), pre_ref.logits(solo_m.vocab_size()));
            for (int i = 0; i < kN; ++i) {
                const ds4_bridge_spec_row &r = rows[size_t(i)];
                const ds4::bridge::SpecTrial t =
                    ss[size_t(i)]->spec_trial(pending[size_t(i)], temp, 20, 0.95f, 0.f, &srng[size_t(i)], r.max_new, 8);
                ASSERT_EQ(r.width, t.width) << "row " << i << " step " << step;
                ASSERT_GE(r.width, 2);
                EXPECT_EQ(r.accepted, t.accepted);
                EXPECT_EQ(std::vector<int32_t>(r.tokens, r.tokens + r.width), t.tokens);
                EXPECT_EQ(std::vector<int32_t>(r.argmax, r.argmax + r.width), t.argmax);
                EXPECT_EQ(brng[size_t(i)], srng[size_t(i)]) << "the same random draws";
                widths_seen |= 1 << r.width;
                bs[size_t(i)]->spec_commit(r.accepted + 1);
                ss[size_t(i)]->spec_commit(t.accepted + 1);
                EXPECT_EQ(bs[size_t(i)]->logits(m.vocab_size()), ss[size_t(i)]->logits(solo_m.vocab_size()));
                pending[size_t(i)] = r.argmax[r.accepted];
            }
            EXPECT_EQ(rows[kN].width, 1);
            EXPECT_EQ(rows[kN].tokens[0], 9);
            one_ref.eval(9);
            EXPECT_EQ(one.logits(m.vocab_size()), one_ref.logits(solo_m.vocab_size()));
        }
        EXPECT_GT(__builtin_popcount(widths_seen), 1) << "rows of several widths";
        for (int i = 0; i < kN; ++i) EXPECT_EQ(bs[size_t(i)]->save_payload(), ss[size_t(i)]->save_payload());
    }
}

TEST(SpecBridge, BatchedTrialArgumentsAreCheckedBeforeAnythingRuns) {
    Model m = open(DS4_TEST_MODEL, kModels + "/rand320.gguf", 3);
    Session a(m, 64), b(m, 64);
    a.sync(std::vector<int32_t>{1, 2, 3});
    b.sync(std::vector<int32_t>{1, 2, 3});
    ds4::bridge::Batch batch(m);
    int32_t tk[4], am[4];
    auto row = [&](Session &s) {
        ds4_bridge_spec_row r{};
        r.session = s.handle();
        r.pending = 5;
        r.max_new = 4;
        r.tokens = tk;
        r.argmax = am;
        r.cap = 4;
        return r;
    };
    auto error = [&](std::vector<ds4_bridge_spec_row> rows) {
        Err e;
        if (ds4_bridge_batch_eval_spec(nullptr, nullptr, nullptr, 0, nullptr, rows.data(), int(rows.size()), e.buf,
                                       sizeof e.buf) == 0)
            return std::string("accepted");
        return e.str();
    };
    EXPECT_TRUE(has(error({row(a)}), "batch is NULL"));
    auto err_b = [&](std::vector<ds4_bridge_spec_row> rows) {
        try {
            batch.eval_spec({}, {}, {}, rows);
        } catch (const BridgeError &e) {
            return std::string(e.what());
        }
        return std::string("accepted");
    };
    EXPECT_TRUE(has(err_b({row(a), row(a)}), "appears twice"));
    ds4_bridge_spec_row r = row(a);
    r.cap = 1;
    EXPECT_TRUE(has(err_b({r}), "cap"));
    r = row(a);
    r.pending = 1 << 30;
    EXPECT_TRUE(has(err_b({r}), "out of range"));
    r = row(a);
    r.temperature = 0.5f;
    EXPECT_TRUE(has(err_b({r}), "rng"));
    r = row(a);
    r.tokens = nullptr;
    EXPECT_TRUE(has(err_b({r}), "NULL"));
    EXPECT_TRUE(has(err_b({}), "one of them positive"));
    EXPECT_EQ(a.pos(), 3);   // nothing ran
    // A trial pending on b refuses b in a batch until it is committed.
    const ds4::bridge::SpecTrial t = b.spec_trial(5, 0.f, 0, 1.f, 0.f, nullptr, 4);
    ASSERT_GE(t.width, 2);
    EXPECT_TRUE(has(err_b({row(a), row(b)}), "pending"));
    EXPECT_EQ(a.pos(), 3);
    b.spec_commit(1);
    EXPECT_EQ(err_b({row(a), row(b)}), "accepted");
    EXPECT_GT(a.pos(), 3);
    a.spec_commit(1);
    b.spec_commit(1);
    EXPECT_EQ(a.pos(), 4);
    EXPECT_EQ(b.pos(), 5);
}

}  // namespace
}  // namespace bridge_test
