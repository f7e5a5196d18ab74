// End-to-end: a real ds4d on a temporary socket serving a tiny random model, checked
// against the same model driven in-process through the bridge.
#include <gtest/gtest.h>

#ifndef DS4_E2E
#define DS4_E2E 0
#endif

#if !DS4_E2E

TEST(DaemonE2E, NeedsBridgeDaemonAndModelGenerator) {
    GTEST_SKIP() << "ds4d end-to-end tests need the bridge library (target ds4lib), ds4d and ds4-make-model "
                    "(tools/make_model); one of them is not part of this build yet";
}

#else

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <random>

#include "bridge/ds4.hpp"
#include "client/ds4client.hpp"
#include "tests/daemon/e2e_support.h"

using namespace e2e;
using ds4::client::Client;
using ds4::client::DoneInfo;
using ds4::client::FinishReason;
using ds4::client::GenerateRequest;

namespace {

constexpr int kChunk = 32;       // --prefill-chunk of the test daemons
constexpr int kCtx = 4096;       // the tiny model's limit, ds4d's default context

struct Ref {
    std::unique_ptr<ds4::bridge::Session> s;
    std::vector<int32_t> evaluated, history;
};

struct RefOut {
    std::vector<int32_t> tokens;
    FinishReason reason = FinishReason::Stop;
    int32_t stop_token = -1;
    uint32_t cached = 0;
};

struct Got {
    std::vector<int32_t> tokens;
    std::string text;
    DoneInfo done;
    size_t text_only_chunks_before_last = 0;  // text-only chunks must only come last
};

class DaemonE2E : public ::testing::Test {
protected:
    static inline TempDir *dir = nullptr;
    static inline std::string model_path;
    static inline Daemon *daemon = nullptr;
    static inline ds4::bridge::Model *model = nullptr;
    static inline std::atomic<int> next_first{0};
    static inline std::vector<int32_t> reserved;  // first tokens of text prompts used anywhere

    static void SetUpTestSuite() {
        dir = new TempDir;
        model_path = dir->path + "/tiny.gguf";
        CmdResult mk = run_cmd({DS4_MAKE_MODEL_PATH, "--preset", "tiny", "--quiet", model_path}, dir->path);
        ASSERT_EQ(mk.rc, 0) << mk.err;
        ds4::bridge::ModelOptions mo;
        mo.model_path = model_path;
        mo.n_threads = 1;
        model = new ds4::bridge::Model(mo);
        for (const char *t : {"Hello", "A short text prompt", "Bees", "Zebras", "hi", "Nul"}) reserved.push_back(model->tokenize(t)[0]);
        reserved.push_back(model->render_chat({{"user", "x"}})[0]);
        daemon = new Daemon;
        std::string err = daemon->start(DS4D_PATH, model_path, dir->path + "/ds4.sock", dir->path + "/ds4d.log",
                                        {"--prefill-chunk", std::to_string(kChunk)});
        ASSERT_EQ(err, "");
    }

    static void TearDownTestSuite() {
        if (daemon) {
            const int rc = daemon->stop(SIGTERM);
            EXPECT_EQ(rc, 0) << read_file(daemon->log);
            EXPECT_FALSE(std::filesystem::exists(daemon->socket)) << "SIGTERM left the socket file behind";
        }
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

    static const std::string &sock() { return daemon->socket; }

    // A prompt whose first token no other prompt starts with, so a pooled bridge session
    // never shares a prefix with it and the daemon's calls match a fresh session's.
    static std::vector<int32_t> unique_prompt(size_t len, uint64_t seed) {
        int32_t first;
        do first = 256 + next_first.fetch_add(1);
        while (std::find(reserved.begin(), reserved.end(), first) != reserved.end() || model->is_stop(first));
        EXPECT_LT(first, model->vocab_size()) << "ran out of unique first tokens";
        std::vector<int32_t> p{first};
        std::mt19937_64 rng(seed);
        while (p.size() < len) p.push_back(int32_t(rng() % 256));
        return p;
    }

    static Ref fresh() {
        Ref r;
        r.s = std::make_unique<ds4::bridge::Session>(*model, kCtx);
        return r;
    }

    // The daemon's schedule for one request: prefill in kChunk-token growing prefixes from
    // the reusable prefix, then sample / stream / evaluate one token per step.
    static RefOut ref_generate(Ref &r, const std::vector<int32_t> &prompt, uint32_t max_tokens, bool ignore_eos) {
        RefOut out;
        std::vector<int32_t> full = r.history;
        full.insert(full.end(), prompt.begin(), prompt.end());
        size_t common = 0;
        while (common < r.evaluated.size() && common < full.size() && r.evaluated[common] == full[common]) ++common;
        // The engine re-evaluates the last prompt token unless it holds exactly the prompt.
        const size_t cached =
            (common == full.size() && r.evaluated.size() == full.size()) ? common : std::min(common, full.size() - 1);
        out.cached = uint32_t(cached);
        size_t synced = cached;
        do {
            const size_t target = std::min(full.size(), synced + kChunk);
            r.s->sync(std::span<const int32_t>(full.data(), target));
            synced = target;
        } while (synced < full.size());
        r.evaluated = full;
        r.history = full;
        int32_t pending = -1;
        for (;;) {
            if (out.tokens.size() >= max_tokens) {
                out.reason = FinishReason::Length;
                return out;
            }
            if (pending >= 0) {
                r.s->eval(pending);
                r.evaluated.push_back(pending);
            }
            const int32_t t = r.s->argmax();
            r.history.push_back(t);
            if (!ignore_eos && model->is_stop(t)) {
                out.reason = FinishReason::Stop;
                out.stop_token = t;
                return out;
            }
            out.tokens.push_back(t);
            if (out.tokens.size() >= max_tokens) {
                out.reason = FinishReason::Length;
                return out;
            }
            pending = t;
        }
    }

    static Got collect(Client &c, const GenerateRequest &req, std::function<bool(size_t)> keep_going = {}) {
        Got g;
        bool text_only_seen = false;
        ds4::client::GenerateCallbacks cb;
        cb.on_chunk = [&](const ds4::client::Chunk &ch) {
            if (ch.tokens.empty()) text_only_seen = true;
            else if (text_only_seen) ++g.text_only_chunks_before_last;
            g.tokens.insert(g.tokens.end(), ch.tokens.begin(), ch.tokens.end());
            g.text.append(ch.text);
            return keep_going ? keep_going(g.tokens.size()) : true;
        };
        g.done = c.generate(req, cb);
        return g;
    }

    static GenerateRequest token_request(const std::vector<int32_t> &prompt, uint32_t max_tokens, bool ignore_eos,
                                         uint64_t session = 0) {
        GenerateRequest req;
        req.session = session;
        req.kind = GenerateRequest::Prompt::Tokens;
        req.tokens = prompt;
        req.max_tokens = max_tokens;
        req.ignore_eos = ignore_eos;
        return req;
    }

    static void expect_matches(const Got &g, const RefOut &want, size_t prompt_len, const std::string &what) {
        EXPECT_EQ(g.tokens, want.tokens) << what;
        EXPECT_EQ(g.done.reason, want.reason) << what;
        EXPECT_EQ(g.done.generated_tokens, want.tokens.size()) << what;
        EXPECT_EQ(g.done.prompt_tokens, prompt_len) << what;
        EXPECT_EQ(g.done.cached_tokens, want.cached) << what;
        EXPECT_EQ(g.done.stop_token, want.stop_token) << what;
        EXPECT_EQ(g.text, model->detokenize(want.tokens)) << what;
        EXPECT_EQ(g.text_only_chunks_before_last, 0u) << what;
    }

    // Polls Stats until pred holds (bounded; the daemon frees work asynchronously).
    static ds4::client::Stats wait_stats(Client &c, const std::function<bool(const ds4::client::Stats &)> &pred) {
        const auto deadline = Clock::now() + std::chrono::seconds(20);
        ds4::client::Stats s = c.stats();
        while (!pred(s) && Clock::now() < deadline) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            s = c.stats();
        }
        return s;
    }

    static std::vector<std::string> cli(std::vector<std::string> args) {
        args.insert(args.begin(), DS4_CLI_PATH);
        return args;
    }
};

TEST_F(DaemonE2E, HelloReportsTheModel) {
    Client c(sock(), "e2e");
    const auto &info = c.server_info();
    const ds4_bridge_model_info_t mi = model->info();
    EXPECT_EQ(info.protocol_version, ds4::ipc::kProtocolVersion);
    EXPECT_EQ(info.model.family, std::string(mi.family));
    EXPECT_EQ(info.model.name, std::string(mi.name));
    EXPECT_EQ(info.model.n_vocab, uint32_t(model->vocab_size()));
    EXPECT_EQ(info.model.n_layer, uint32_t(mi.n_layer));
    EXPECT_EQ(info.model.n_embd, uint32_t(mi.n_embd));
    EXPECT_EQ(info.model.n_ctx_max, uint32_t(mi.n_ctx_max));
    EXPECT_EQ(info.default_ctx, uint32_t(kCtx));
    EXPECT_EQ(info.model.backend, "cpu");
    EXPECT_EQ(c.hello().model.name, info.model.name);  // Hello may be repeated
}

TEST_F(DaemonE2E, SixteenConcurrentClientsGetTheInProcessTokens) {
    constexpr int kClients = 16, kRequests = 3;
    struct Case {
        std::vector<int32_t> prompt;
        uint32_t max_tokens;
        bool ignore_eos;
        RefOut want;
    };
    std::vector<std::vector<Case>> cases(kClients);
    for (int i = 0; i < kClients; ++i)
        for (int j = 0; j < kRequests; ++j) {
            Case c;
            c.prompt = unique_prompt(3 + size_t((i * 7 + j * 13) % 70), uint64_t(i * 100 + j));
            c.max_tokens = 6 + uint32_t((i + 3 * j) % 11);
            c.ignore_eos = (i + j) % 2 == 0;
            Ref r = fresh();
            c.want = ref_generate(r, c.prompt, c.max_tokens, c.ignore_eos);
            cases[i].push_back(std::move(c));
        }
    std::vector<std::vector<Got>> got(kClients);
    std::vector<std::string> errors(kClients);
    std::vector<std::thread> threads;
    for (int i = 0; i < kClients; ++i)
        threads.emplace_back([&, i] {
            try {
                Client c(sock(), "e2e-" + std::to_string(i));
                for (auto &cs : cases[i]) got[i].push_back(collect(c, token_request(cs.prompt, cs.max_tokens, cs.ignore_eos)));
            } catch (const std::exception &e) {
                errors[i] = e.what();
            }
        });
    for (auto &t : threads) t.join();
    for (int i = 0; i < kClients; ++i) {
        ASSERT_EQ(errors[i], "") << "client " << i;
        ASSERT_EQ(got[i].size(), size_t(kRequests));
        for (int j = 0; j < kRequests; ++j)
            expect_matches(got[i][j], cases[i][j].want, cases[i][j].prompt.size(),
                           "client " + std::to_string(i) + " request " + std::to_string(j));
    }
}

TEST_F(DaemonE2E, TextPromptIsTokenizedLikeTheEngine) {
    const std::string text = "Zebras are striped";
    const std::vector<int32_t> toks = model->tokenize(text);
    Ref r = fresh();
    RefOut want = ref_generate(r, toks, 10, true);
    Client c(sock());
    GenerateRequest req;
    req.kind = GenerateRequest::Prompt::Text;
    req.text = text;
    req.max_tokens = 10;
    req.ignore_eos = true;
    Got g = collect(c, req);
    EXPECT_EQ(g.tokens, want.tokens);
    EXPECT_EQ(g.done.prompt_tokens, toks.size());
    EXPECT_EQ(c.tokenize(text), toks);
    EXPECT_EQ(c.detokenize(want.tokens), model->detokenize(want.tokens));
}

// Text is length-delimited from the client to the engine: a NUL byte is text, and what
// follows it is neither dropped nor cut (it used to be: "import os\0import sys" was
// "import os" and a 100 KB tail after a NUL vanished).
TEST_F(DaemonE2E, TextWithNulBytesReachesTheModelWhole) {
    using namespace std::string_literals;
    const std::string text = "Nul\0import sys"s;
    const std::vector<int32_t> toks = model->tokenize(text);
    ASSERT_GT(toks.size(), model->tokenize("Nul").size() + 1) << "the reference tokenizer cut the text";
    Client c(sock());
    EXPECT_EQ(c.tokenize(text), toks);
    EXPECT_EQ(c.detokenize(c.tokenize(text)), text);
    std::string tail;
    while (tail.size() < 100 * 1024) tail += "a line of the tail " + std::to_string(tail.size()) + "\n";
    const std::vector<int32_t> big = c.tokenize("Nul\0"s + tail);
    EXPECT_GT(big.size(), tail.size() / 8);
    EXPECT_TRUE(big == model->tokenize("Nul\0"s + tail));  // not EXPECT_EQ: 100 KB in a message
    EXPECT_TRUE(c.detokenize(big) == "Nul\0"s + tail) << "the 100 KB after the NUL did not arrive whole";

    // A text prompt: generated from all of it.
    Ref r = fresh();
    RefOut want = ref_generate(r, toks, 6, true);
    GenerateRequest req;
    req.kind = GenerateRequest::Prompt::Text;
    req.text = text;
    req.max_tokens = 6;
    req.ignore_eos = true;
    Got g = collect(c, req);
    EXPECT_EQ(g.done.prompt_tokens, toks.size());
    EXPECT_EQ(g.tokens, want.tokens);

    // A chat message's content.
    const std::string content = "Nul\0and then the rest of the question"s;
    const std::vector<int32_t> chat = model->render_chat({{"user", content}});
    ASSERT_GT(chat.size(), model->render_chat({{"user", "Nul"}}).size() + 1);
    Ref rc = fresh();
    RefOut want_chat = ref_generate(rc, chat, 4, true);
    GenerateRequest creq;
    creq.kind = GenerateRequest::Prompt::Chat;
    creq.messages.push_back({"user", content});
    creq.max_tokens = 4;
    creq.ignore_eos = true;
    Got gc = collect(c, creq);
    EXPECT_EQ(gc.done.prompt_tokens, chat.size());
    EXPECT_EQ(gc.tokens, want_chat.tokens);

    // The ds4 command with the prompt on stdin.
    Ref rr = fresh();
    RefOut want_run = ref_generate(rr, toks, 6, false);
    CmdResult run = run_cmd(cli({"--socket", sock(), "run", "--raw", "--ids", "--max-tokens", "6", "-"}), dir->path, text);
    ASSERT_EQ(run.rc, 0) << run.err;
    std::string ids;
    for (size_t i = 0; i < want_run.tokens.size(); ++i) ids += (i ? " " : "") + std::to_string(want_run.tokens[i]);
    EXPECT_EQ(run.out, ids + "\n");
}

TEST_F(DaemonE2E, NamedSessionContinuesFromItsKvState) {
    // Two chat turns on a named session, the second from a different connection.
    Ref r = fresh();
    const auto turn1 = model->render_chat({{"user", "first question"}});
    RefOut want1 = ref_generate(r, turn1, 7, true);
    auto turn2 = model->render_chat({{"user", "second question"}});
    const auto opening = model->render_chat({});
    ASSERT_TRUE(std::equal(opening.begin(), opening.end(), turn2.begin()));
    turn2.erase(turn2.begin(), turn2.begin() + ptrdiff_t(opening.size()));
    const size_t history_before = r.history.size();
    RefOut want2 = ref_generate(r, turn2, 9, true);

    GenerateRequest req;
    req.kind = GenerateRequest::Prompt::Chat;
    req.ignore_eos = true;
    {
        Client a(sock());
        auto s = a.open_session("conversation-a");
        EXPECT_TRUE(s.created);
        EXPECT_EQ(s.n_tokens, 0u);
        req.session = s.id;
        req.messages = {{"user", "first question"}};
        req.max_tokens = 7;
        Got g1 = collect(a, req);
        expect_matches(g1, want1, turn1.size(), "turn 1");
    }
    Client b(sock());
    auto s = b.open_session("conversation-a");
    EXPECT_FALSE(s.created);
    EXPECT_EQ(s.n_tokens, history_before);
    req.session = s.id;
    req.messages = {{"user", "second question"}};
    req.max_tokens = 9;
    Got g2 = collect(b, req);
    EXPECT_EQ(g2.tokens, want2.tokens);
    EXPECT_EQ(g2.done.prompt_tokens, turn2.size());
    // Everything but the last (never evaluated) token of turn 1 came from the KV state.
    EXPECT_EQ(g2.done.cached_tokens, history_before - 1);
    EXPECT_EQ(g2.done.cached_tokens, want2.cached);
}

TEST_F(DaemonE2E, AnonymousSessionsArePrivateToTheirConnection) {
    Client a(sock()), b(sock());
    auto s = a.open_session();
    auto prompt = unique_prompt(5, 1);
    try {
        b.generate(token_request(prompt, 2, true, s.id));
        FAIL() << "another connection used an anonymous session";
    } catch (const ds4::client::ServerError &e) {
        EXPECT_EQ(e.code, int(fb::ErrorCode::UnknownSession));
    }
    EXPECT_EQ(a.generate(token_request(prompt, 2, true, s.id)).generated_tokens, 2u);
    a.close_session(s.id);
    EXPECT_THROW(a.generate(token_request(prompt, 2, true, s.id)), ds4::client::ServerError);
}

TEST_F(DaemonE2E, GenerationStopsWhenTheSessionContextIsFull) {
    Client c(sock());
    auto s = c.open_session("", 64);
    EXPECT_EQ(s.ctx, 64u);
    auto prompt = unique_prompt(10, 30);
    Got g = collect(c, token_request(prompt, 1000, true, s.id));
    EXPECT_EQ(g.done.reason, FinishReason::Context);
    // Prompt and answer fill the context exactly: no token is sampled that the session
    // could not hold (and a stored session could not reload).
    EXPECT_EQ(g.tokens.size(), 64u - 10u);
    Ref r = fresh();
    EXPECT_EQ(g.tokens, ref_generate(r, prompt, uint32_t(g.tokens.size()), true).tokens);
    try {
        c.generate(token_request({1, 2, 3}, 5, true, s.id));
        FAIL() << "a full session accepted more tokens";
    } catch (const ds4::client::ServerError &e) {
        EXPECT_EQ(e.code, int(fb::ErrorCode::ContextOverflow));
        EXPECT_NE(std::string(e.what()).find("context of 64 tokens is full"), std::string::npos) << e.what();
    }
    EXPECT_THROW(c.open_session("", 8), ds4::client::ServerError) << "context below 16";
}

TEST_F(DaemonE2E, CancelEndsTheRequestAndTheConnectionKeepsWorking) {
    Client c(sock());
    auto prompt = unique_prompt(8, 2);
    // Cancel from the chunk callback after 3 tokens.
    Got g = collect(c, token_request(prompt, 3000, true), [](size_t n) { return n < 3; });
    EXPECT_EQ(g.done.reason, FinishReason::Cancelled);
    EXPECT_GE(g.tokens.size(), 3u);
    EXPECT_LT(g.tokens.size(), 3000u);
    Ref r = fresh();
    RefOut want = ref_generate(r, prompt, uint32_t(g.tokens.size()), true);
    EXPECT_EQ(g.tokens, want.tokens) << "tokens before the cancel are still the engine's";

    // Cancel from another thread, by request id.
    std::atomic<uint64_t> rid{0};
    std::atomic<size_t> seen{0};
    std::thread canceller([&] {
        while (seen.load() < 5) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        c.cancel(rid.load());
    });
    ds4::client::GenerateCallbacks cb;
    cb.on_start = [&](uint64_t id) { rid = id; };
    cb.on_chunk = [&](const ds4::client::Chunk &ch) {
        seen += ch.tokens.size();
        return true;
    };
    DoneInfo d = c.generate(token_request(unique_prompt(6, 3), 3000, true), cb);
    canceller.join();
    EXPECT_EQ(d.reason, FinishReason::Cancelled);
    EXPECT_LT(d.generated_tokens, 3000u);

    auto p2 = unique_prompt(9, 4);
    Ref r2 = fresh();
    RefOut want2 = ref_generate(r2, p2, 5, true);
    Got after = collect(c, token_request(p2, 5, true));
    expect_matches(after, want2, p2.size(), "request after two cancels");
    auto st = wait_stats(c, [](const auto &s) { return s.active_requests == 0; });
    EXPECT_EQ(st.active_requests, 0u);
}

TEST_F(DaemonE2E, KilledClientMidStreamFreesItsSessionAndWork) {
    Client watcher(sock());
    const uint32_t sessions_before = watcher.stats().sessions;
    {
        RawConn raw(sock());
        ASSERT_TRUE(raw.ok());
        ASSERT_TRUE(raw.hello());
        ASSERT_TRUE(raw.send(frame([](auto &fbb) { ds4::ipc::finish_frame(fbb, 2, fb::CreateOpenSessionDirect(fbb, "", 0)); })));
        const fb::Envelope *e = raw.next();
        ASSERT_TRUE(e && e->body_type() == fb::Message::SessionOpened);
        const uint64_t sid = e->body_as_SessionOpened()->session();
        ASSERT_TRUE(raw.send(generate_tokens_frame(3, unique_prompt(10, 5), 3500, true, sid)));
        for (int i = 0; i < 4; ++i) {
            e = raw.next();
            ASSERT_TRUE(e && e->body_type() == fb::Message::TokenChunk);
        }
        EXPECT_EQ(watcher.stats().sessions, sessions_before + 1);
        // Abort the connection (RST), as a killed process's socket would be torn down.
        linger lg{1, 0};
        setsockopt(raw.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    auto st = wait_stats(watcher, [&](const auto &s) { return s.active_requests == 0 && s.sessions == sessions_before; });
    EXPECT_EQ(st.active_requests, 0u);
    EXPECT_EQ(st.sessions, sessions_before);
    EXPECT_LT(st.tokens_out, 1000000u);
    auto p = unique_prompt(4, 6);
    Ref r = fresh();
    expect_matches(collect(watcher, token_request(p, 6, true)), ref_generate(r, p, 6, true), p.size(), "after the kill");
}

TEST_F(DaemonE2E, MalformedAndWrongFramesGetErrorsWithoutDisturbingOthers) {
    // A long stream runs on another connection throughout; it must come out exact.
    auto prompt = unique_prompt(12, 7);
    Ref r = fresh();
    RefOut want = ref_generate(r, prompt, 400, true);
    Got streamed;
    std::string stream_error;
    std::thread streamer([&] {
        try {
            Client c(sock());
            streamed = collect(c, token_request(prompt, 400, true));
        } catch (const std::exception &e) {
            stream_error = e.what();
        }
    });

    auto expect_error_then_close = [&](const std::vector<uint8_t> &bytes, fb::ErrorCode code, const char *what) {
        RawConn c(sock());
        ASSERT_TRUE(c.ok());
        c.send(bytes);
        const fb::Envelope *e = c.next();
        ASSERT_TRUE(e) << what << ": no reply";
        ASSERT_EQ(e->body_type(), fb::Message::Error) << what;
        EXPECT_EQ(e->body_as_Error()->code(), code) << what << ": " << e->body_as_Error()->message()->str();
        EXPECT_TRUE(c.closed_by_peer()) << what << ": connection left open";
    };
    std::mt19937 rng(99);
    for (int i = 0; i < 20; ++i) {
        std::vector<uint8_t> junk(64 + rng() % 200);
        for (auto &b : junk) b = uint8_t(rng());
        junk[0] = uint8_t(junk.size() - 4);  // a plausible length, so the body is judged
        junk[1] = junk[2] = junk[3] = 0;
        expect_error_then_close(junk, fb::ErrorCode::BadFrame, "random bytes");
    }
    expect_error_then_close({0xff, 0xff, 0xff, 0x7f}, fb::ErrorCode::FrameTooLarge, "oversized length");
    {
        auto f = hello_frame();
        std::memcpy(f.data() + 8, "XXXX", 4);
        expect_error_then_close(f, fb::ErrorCode::BadFrame, "wrong identifier");
    }
    {
        auto f = frame([](auto &fbb) {
            fb::EnvelopeBuilder eb(fbb);
            eb.add_request_id(5);
            eb.add_body_type(fb::Message::Generate);
            fb::FinishSizePrefixedEnvelopeBuffer(fbb, eb.Finish());
        });
        expect_error_then_close(f, fb::ErrorCode::BadFrame, "union type without a body");
    }
    expect_error_then_close(hello_frame(1, 999), fb::ErrorCode::VersionMismatch, "wrong protocol version");
    {
        // Truncated frame, then the client goes away: nothing to answer, nothing breaks.
        RawConn c(sock());
        auto f = generate_tokens_frame(9, prompt, 5, true);
        c.send(f.data(), f.size() / 2);
    }

    // Valid frames that are wrong here: an error each, the connection stays usable.
    RawConn c(sock());
    ASSERT_TRUE(c.ok());
    auto expect_error = [&](const std::vector<uint8_t> &bytes, uint64_t rid, fb::ErrorCode code, const char *what) {
        c.send(bytes);
        const fb::Envelope *e = c.next();
        while (e && (e->body_type() == fb::Message::TokenChunk || e->body_type() == fb::Message::Progress))
            e = c.next();  // output of a request still running on this connection
        ASSERT_TRUE(e) << what;
        ASSERT_EQ(e->body_type(), fb::Message::Error) << what;
        EXPECT_EQ(e->body_as_Error()->code(), code) << what << ": " << e->body_as_Error()->message()->str();
        EXPECT_EQ(e->request_id(), rid) << what;
        EXPECT_EQ(e->body_as_Error()->request_id(), rid) << what;
    };
    expect_error(stats_frame(11), 11, fb::ErrorCode::Protocol, "request before Hello");
    ASSERT_TRUE(c.hello());
    expect_error(frame([](auto &fbb) {
                     std::vector<int32_t> t = {1};
                     ds4::ipc::finish_frame(fbb, 12, fb::CreateTokenChunkDirect(fbb, &t, "x"));
                 }),
                 12, fb::ErrorCode::Protocol, "a reply sent as a request");
    expect_error(generate_tokens_frame(13, prompt, 5, true, 987654), 13, fb::ErrorCode::UnknownSession, "unknown session");
    expect_error(generate_tokens_frame(14, {1, 2, model->vocab_size() + 5}, 5, true), 14, fb::ErrorCode::BadRequest,
                 "token outside the vocabulary");
    expect_error(generate_tokens_frame(15, std::vector<int32_t>(kCtx + 10, 7), 5, true), 15,
                 fb::ErrorCode::ContextOverflow, "prompt longer than the context");
    expect_error(generate_tokens_frame(0, prompt, 5, true), 0, fb::ErrorCode::Protocol, "request id 0");
    expect_error(frame([](auto &fbb) { ds4::ipc::finish_frame(fbb, 16, fb::CreateSaveSessionDirect(fbb, 1, "x")); }), 16,
                 fb::ErrorCode::NoStore, "SaveSession on a daemon run with --no-store");
    expect_error(frame([](auto &fbb) { ds4::ipc::finish_frame(fbb, 17, fb::CreateOpenSessionDirect(fbb, "../evil", 0)); }),
                 17, fb::ErrorCode::BadRequest, "session name with a path");
    expect_error(frame([](auto &fbb) {
                     auto s = fb::CreateSampling(fbb, -1.0f);
                     std::vector<int32_t> t = {300};
                     ds4::ipc::finish_frame(fbb, 18, fb::CreateGenerateDirect(fbb, 0, nullptr, &t, nullptr, true, false, s));
                 }),
                 18, fb::ErrorCode::BadRequest, "negative temperature");
    // A duplicate id while the first request with it still runs.
    c.send(generate_tokens_frame(19, unique_prompt(5, 8), 3000, true));
    expect_error(generate_tokens_frame(19, unique_prompt(5, 9), 3, true), 19, fb::ErrorCode::BadRequest,
                 "duplicate request id");
    c.send(frame([](auto &fbb) { ds4::ipc::finish_frame(fbb, 20, fb::CreateCancel(fbb, 19)); }));
    bool done = false;
    while (const fb::Envelope *e = c.next()) {
        if (e->request_id() == 19 && e->body_type() == fb::Message::Done) {
            EXPECT_EQ(e->body_as_Done()->reason(), fb::FinishReason::Cancelled);
            done = true;
            break;
        }
    }
    EXPECT_TRUE(done);
    c.send(stats_frame(21));
    const fb::Envelope *e = c.next();
    ASSERT_TRUE(e);
    EXPECT_EQ(e->body_type(), fb::Message::StatsResult) << "connection unusable after the errors";

    streamer.join();
    ASSERT_EQ(stream_error, "");
    expect_matches(streamed, want, prompt.size(), "the stream running beside the bad clients");
}

TEST_F(DaemonE2E, DecodeStepsOfConcurrentRequestsInterleave) {
    std::atomic<uint64_t> clock{0};
    struct Trace {
        uint64_t first = UINT64_MAX, last = 0;
        std::vector<uint64_t> progress, chunks;
        size_t tokens = 0;
    };
    auto run = [&](std::vector<int32_t> prompt, uint32_t max_tokens, Trace &tr) {
        Client c(sock());
        GenerateRequest req = token_request(prompt, max_tokens, true);
        req.progress = true;
        ds4::client::GenerateCallbacks cb;
        cb.on_progress = [&](uint32_t, uint32_t) { tr.progress.push_back(clock++); };
        cb.on_chunk = [&](const ds4::client::Chunk &ch) {
            const uint64_t t = clock++;
            tr.first = std::min(tr.first, t);
            tr.last = t;
            tr.chunks.push_back(t);
            tr.tokens += ch.tokens.size();
            return true;
        };
        c.generate(req, cb);
    };
    Trace a, b, longp;
    std::thread ta([&] { run(unique_prompt(5, 10), 300, a); });
    std::thread tb([&] { run(unique_prompt(5, 11), 300, b); });
    // Once both stream, a long prompt arrives: its prefill is chunked, the streams go on.
    while (clock.load() < 20) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const size_t long_len = 40 * kChunk + 7;
    std::thread tl([&] { run(unique_prompt(long_len, 12), 2, longp); });
    ta.join();
    tb.join();
    tl.join();
    EXPECT_EQ(a.tokens, 300u);
    EXPECT_EQ(b.tokens, 300u);
    EXPECT_LT(a.first, b.last) << "request a did not stream while b did";
    EXPECT_LT(b.first, a.last) << "request b did not stream while a did";
    ASSERT_EQ(longp.progress.size(), (long_len + kChunk - 1) / kChunk) << "prefill was not chunked";
    // Round-robin puts a decode step of each stream between two prefill chunks (~2 tokens per
    // chunk); a prefill done in one go would leave (nearly) none inside its progress span.
    const uint64_t p0 = longp.progress.front(), p1 = longp.progress.back();
    size_t inside = 0;
    for (const Trace *t : {&a, &b})
        for (uint64_t c : t->chunks) inside += c > p0 && c < p1;
    EXPECT_GE(inside, longp.progress.size() / 2) << "the streams stalled while the long prompt was prefilled";
}

TEST_F(DaemonE2E, StopStringsStopTokensAndSeededSampling) {
    auto prompt = unique_prompt(7, 20);
    Ref r = fresh();
    RefOut free_run = ref_generate(r, prompt, 12, true);
    ASSERT_EQ(free_run.tokens.size(), 12u);
    Client c(sock());

    // A stop string: the text of a later token. Streaming stops at the token that completes
    // it, and the text ends right before it.
    size_t k = 3;
    while (k < free_run.tokens.size() && model->token_text(free_run.tokens[k]).empty()) ++k;
    ASSERT_LT(k, free_run.tokens.size());
    const std::string stop = model->token_text(free_run.tokens[k]);
    size_t j = 0;
    std::string upto;
    for (; j < free_run.tokens.size(); ++j) {
        upto = model->detokenize(std::span<const int32_t>(free_run.tokens.data(), j + 1));
        if (upto.find(stop) != std::string::npos) break;
    }
    GenerateRequest req = token_request(prompt, 12, true);
    req.stop_strings = {stop};
    Got g = collect(c, req);
    EXPECT_EQ(g.done.reason, FinishReason::StopString);
    EXPECT_EQ(g.tokens, std::vector<int32_t>(free_run.tokens.begin(), free_run.tokens.begin() + ptrdiff_t(j + 1)));
    EXPECT_EQ(g.text, upto.substr(0, upto.find(stop)));

    // A stop token: not streamed, reported in Done.
    const int32_t st = free_run.tokens[4];
    const size_t first = size_t(std::find(free_run.tokens.begin(), free_run.tokens.end(), st) - free_run.tokens.begin());
    req = token_request(prompt, 12, true);
    req.stop_tokens = {st};
    g = collect(c, req);
    EXPECT_EQ(g.done.reason, FinishReason::Stop);
    EXPECT_EQ(g.done.stop_token, st);
    EXPECT_EQ(g.tokens, std::vector<int32_t>(free_run.tokens.begin(), free_run.tokens.begin() + ptrdiff_t(first)));

    // Sampling with a seed is reproducible, across connections too.
    req = token_request(unique_prompt(7, 21), 16, true);
    req.temperature = 0.9f;
    req.top_k = 40;
    req.seed = 1234;
    Got s1 = collect(c, req);
    Client other(sock());
    Got s2 = collect(other, req);
    EXPECT_EQ(s1.tokens, s2.tokens);
    EXPECT_EQ(s1.tokens.size(), 16u);
}

TEST_F(DaemonE2E, StatsCountTheWork) {
    Client c(sock());
    auto before = c.stats();
    auto p = unique_prompt(20, 13);
    DoneInfo d = c.generate(token_request(p, 8, true));
    auto after = c.stats();
    EXPECT_EQ(after.requests_total, before.requests_total + 1);
    EXPECT_EQ(after.tokens_in, before.tokens_in + 20);
    EXPECT_EQ(after.tokens_out, before.tokens_out + d.generated_tokens);
    EXPECT_GE(after.connections, 1u);
    EXPECT_GT(after.uptime_s, 0.0);
    EXPECT_GT(after.decode_tok_s, 0.0);
    EXPECT_GT(after.memory.weights_bytes, 0u);
    EXPECT_EQ(after.model.name, c.server_info().model.name);
}

TEST_F(DaemonE2E, CliRunTokenizeStatsAndExitCodes) {
    const std::string text = "A short text prompt";
    Ref r = fresh();
    RefOut want = ref_generate(r, model->tokenize(text), 8, false);
    CmdResult run = run_cmd(cli({"--socket", sock(), "run", "--raw", "--ids", "--max-tokens", "8", text}), dir->path);
    ASSERT_EQ(run.rc, 0) << run.err;
    std::string ids;
    for (size_t i = 0; i < want.tokens.size(); ++i) ids += (i ? " " : "") + std::to_string(want.tokens[i]);
    EXPECT_EQ(run.out, ids + "\n");
    EXPECT_EQ(run.err, "") << "stderr is not a terminal: no progress, no summary";

    // A second text (other first byte): no prefix shared with the run above.
    const std::string text2 = "Bees buzz around";
    Ref r2 = fresh();
    RefOut want2 = ref_generate(r2, model->tokenize(text2), 8, false);
    CmdResult run_text = run_cmd(cli({"--socket", sock(), "run", "--raw", "--max-tokens", "8", text2}), dir->path);
    ASSERT_EQ(run_text.rc, 0) << run_text.err;
    EXPECT_EQ(run_text.out, model->detokenize(want2.tokens));

    CmdResult tok = run_cmd(cli({"--socket", sock(), "tokenize", text}), dir->path);
    ASSERT_EQ(tok.rc, 0) << tok.err;
    std::string tok_ids;
    for (int32_t t : model->tokenize(text)) tok_ids += (tok_ids.empty() ? "" : " ") + std::to_string(t);
    EXPECT_EQ(tok.out, tok_ids + "\n");

    CmdResult st = run_cmd(cli({"--socket", sock(), "stats"}), dir->path);
    ASSERT_EQ(st.rc, 0) << st.err;
    EXPECT_NE(st.out.find("model"), std::string::npos);
    EXPECT_NE(st.out.find(std::string(model->info().name)), std::string::npos);

    // The chat path: the prompt rendered as a user turn (--chat: the tiny model has no chat
    // template, so run's default for it is plain completion).
    Ref rc = fresh();
    RefOut want_chat = ref_generate(rc, model->render_chat({{"user", "hi"}}), 6, false);
    CmdResult chat_run = run_cmd(cli({"--socket", sock(), "run", "--chat", "--max-tokens", "6", "hi"}), dir->path);
    ASSERT_EQ(chat_run.rc, 0) << chat_run.err;
    EXPECT_EQ(chat_run.out, model->detokenize(want_chat.tokens));
    CmdResult chat = run_cmd(cli({"--socket", sock(), "chat", "--max-tokens", "6"}), dir->path, "hi\n/exit\n");
    ASSERT_EQ(chat.rc, 0) << chat.err;
    const std::string answer = model->detokenize(want_chat.tokens);
    EXPECT_EQ(chat.out, answer + (!answer.empty() && answer.back() == '\n' ? "" : "\n"));

    CmdResult usage = run_cmd(cli({"run"}), dir->path);
    EXPECT_EQ(usage.rc, 2);
    EXPECT_NE(usage.err.find("PROMPT"), std::string::npos);
    CmdResult noconn = run_cmd(cli({"--socket", dir->path + "/nobody.sock", "stats"}), dir->path);
    EXPECT_EQ(noconn.rc, 3);
    EXPECT_NE(noconn.err.find("cannot connect"), std::string::npos);
    CmdResult server_err = run_cmd(cli({"--socket", sock(), "run", "--session", "bad/name", "x"}), dir->path);
    EXPECT_EQ(server_err.rc, 4);
    EXPECT_NE(server_err.err.find("BadRequest"), std::string::npos) << server_err.err;
    CmdResult help = run_cmd(cli({"--help"}), dir->path);
    EXPECT_EQ(help.rc, 0);
    for (const char *w : {"run", "chat", "stats", "tokenize", "--socket", "--session", "--max-tokens", "--temperature",
                          "--seed", "--ids"})
        EXPECT_NE(help.out.find(w), std::string::npos) << w;
}

TEST_F(DaemonE2E, CliRunWithSessionAppendsToTheConversation) {
    const auto t1 = model->render_chat({{"user", "one"}});
    auto t2 = model->render_chat({{"user", "two"}});
    t2.erase(t2.begin(), t2.begin() + ptrdiff_t(model->render_chat({}).size()));
    Ref r = fresh();
    RefOut w1 = ref_generate(r, t1, 5, false);
    RefOut w2 = ref_generate(r, t2, 5, false);
    auto ids = [](const std::vector<int32_t> &v) {
        std::string s;
        for (size_t i = 0; i < v.size(); ++i) s.append(i ? " " : "").append(std::to_string(v[i]));
        return s + "\n";
    };
    CmdResult a = run_cmd(cli({"--socket", sock(), "run", "--chat", "--session", "cli-conv", "--ids", "--max-tokens", "5", "one"}), dir->path);
    ASSERT_EQ(a.rc, 0) << a.err;
    EXPECT_EQ(a.out, ids(w1.tokens));
    CmdResult b = run_cmd(cli({"--socket", sock(), "run", "--chat", "--session", "cli-conv", "--ids", "--max-tokens", "5", "two"}), dir->path);
    ASSERT_EQ(b.rc, 0) << b.err;
    EXPECT_EQ(b.out, ids(w2.tokens));
}

TEST_F(DaemonE2E, CClientAbi) {
    CmdResult r = run_cmd({DS4_C_CLIENT_TEST_PATH, sock()}, dir->path);
    EXPECT_EQ(r.rc, 0) << r.out << r.err;
}

TEST_F(DaemonE2E, SecondDaemonOnTheSameSocketFailsClearly) {
    CmdResult second = run_cmd({DS4D_PATH, "--model", model_path, "--socket", sock(), "--backend", "cpu"}, dir->path,
                               "", 20000);
    EXPECT_EQ(second.rc, 1) << "a second ds4d on a live socket: " << second.err;
    EXPECT_NE(second.err.find("another ds4d"), std::string::npos) << second.err;
    Client c(sock());
    EXPECT_GE(c.stats().connections, 1u) << "the first daemon stopped serving";
}

// Daemons of their own: start-up over a stale socket, back-pressure, SIGTERM mid-stream,
// and a client of another uid.
TEST_F(DaemonE2E, StaleSocketIsReplacedAndSigtermMidStreamExitsCleanly) {
    const std::string path = dir->path + "/stale.sock";
    {
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        sockaddr_un a{};
        a.sun_family = AF_UNIX;
        std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
        ASSERT_EQ(bind(s, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
        close(s);  // the file stays: a dead daemon's socket
    }
    Daemon d;
    ASSERT_EQ(d.start(DS4D_PATH, model_path, path, dir->path + "/stale.log", {"--shutdown-grace-ms", "100"}), "");
    struct stat st {};
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);

    Client c(path);
    std::atomic<bool> streaming{false};
    DoneInfo done;
    std::string error;
    std::thread t([&] {
        try {
            ds4::client::GenerateCallbacks cb;
            cb.on_chunk = [&](const ds4::client::Chunk &) {
                streaming = true;
                return true;
            };
            done = c.generate(token_request(unique_prompt(6, 14), 3500, true), cb);
        } catch (const std::exception &e) {
            error = e.what();
        }
    });
    while (!streaming.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const int rc = d.stop(SIGTERM, 15000);
    t.join();
    EXPECT_EQ(rc, 0) << read_file(d.log);
    EXPECT_EQ(error, "") << "the request should end with Done, not a dropped connection";
    EXPECT_EQ(done.reason, FinishReason::Cancelled);
    EXPECT_FALSE(std::filesystem::exists(path));
    EXPECT_NE(read_file(d.log).find("SIGTERM"), std::string::npos);
}

// Greets on c, shrinks its receive buffer to 4 KB (so an unread stream fills the socket
// soon) and asks for n tokens of prompt (request id 2).
bool start_unread_stream(RawConn &c, const std::vector<int32_t> &prompt, uint32_t n) {
    if (!c.hello()) return false;
    int small = 4096;
    setsockopt(c.fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    return c.send(generate_tokens_frame(2, prompt, n, true));
}

TEST_F(DaemonE2E, SlowReaderIsPausedNotBuffered) {
    Daemon d;
    const std::string path = dir->path + "/bp.sock";
    ASSERT_EQ(d.start(DS4D_PATH, model_path, path, dir->path + "/bp.log", {"--queue-bytes", "4096", "--max-sessions", "2", "--kv-wait", "1"}), "");
    {
        // The session limit, on the same private daemon.
        Client c(path);
        c.open_session("one");
        c.open_session("two");
        EXPECT_EQ(c.open_session("one").created, false) << "reopening is not a new session";
        try {
            c.open_session("three");   // waits --kv-wait (1 s) for a slot, then is refused
            FAIL() << "--max-sessions 2 let a third session in";
        } catch (const ds4::client::ServerError &e) {
            EXPECT_EQ(e.code, int(fb::ErrorCode::SessionLimit));
        }
        RawConn raw(path);
        ASSERT_TRUE(raw.hello());
        raw.send(frame([](auto &fbb) { ds4::ipc::finish_frame(fbb, 5, fb::CreateDeleteSessionDirect(fbb, "two")); }));
        const fb::Envelope *e = raw.next();
        ASSERT_TRUE(e);
        EXPECT_EQ(e->body_type(), fb::Message::Ok);
        EXPECT_TRUE(c.open_session("three").created);
        c.close_session(c.open_session("three").id);  // named: Close keeps it
        EXPECT_FALSE(c.open_session("three").created);
        raw.send(frame([](auto &fbb) { ds4::ipc::finish_frame(fbb, 6, fb::CreateDeleteSessionDirect(fbb, "one")); }));
        raw.send(frame([](auto &fbb) { ds4::ipc::finish_frame(fbb, 7, fb::CreateDeleteSessionDirect(fbb, "three")); }));
        for (int i = 0; i < 2; ++i) {
            e = raw.next();
            ASSERT_TRUE(e);
            EXPECT_EQ(e->body_type(), fb::Message::Ok);
        }
        EXPECT_EQ(c.stats().sessions, 0u);
    }
    RawConn slow(path);
    const uint32_t n = 3000;
    ASSERT_TRUE(start_unread_stream(slow, unique_prompt(5, 15), n));
    Client watcher(path);
    // Generation must stall well short of n while nothing is read.
    uint64_t last = UINT64_MAX;
    ds4::client::Stats s;
    for (int i = 0; i < 200; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        s = watcher.stats();
        if (s.tokens_out == last && s.tokens_out > 0) break;
        last = s.tokens_out;
    }
    EXPECT_EQ(s.tokens_out, last) << "generation never paused";
    EXPECT_LT(s.tokens_out, n) << "the whole answer was produced for a client that reads nothing";
    EXPECT_EQ(s.active_requests, 1u);
    // Reading resumes it; every token arrives, in order, then Done.
    size_t tokens = 0;
    const fb::Envelope *e;
    while ((e = slow.next()) && e->body_type() == fb::Message::TokenChunk)
        tokens += e->body_as_TokenChunk()->tokens() ? e->body_as_TokenChunk()->tokens()->size() : 0;
    ASSERT_TRUE(e);
    ASSERT_EQ(e->body_type(), fb::Message::Done);
    EXPECT_EQ(e->body_as_Done()->reason(), fb::FinishReason::Length);
    EXPECT_EQ(tokens, n);
    EXPECT_EQ(d.stop(SIGTERM), 0);
}

// The worker writes a connection's frames to the socket itself while the loop holds
// nothing of it; once the socket fills, the rest of a frame and everything after it goes
// through the loop. Replies the loop makes itself (here: to requests with the reserved id
// 0, sent while the stream is stuck) must never land inside a frame: every frame decodes,
// every token arrives in order with Done last, and every loop reply arrives.
TEST_F(DaemonE2E, LoopRepliesNeverSplitAFrameTheWorkerWrote) {
    Daemon d;
    const std::string path = dir->path + "/mix.sock";
    ASSERT_EQ(d.start(DS4D_PATH, model_path, path, dir->path + "/mix.log"), "");
    RawConn slow(path);
    const uint32_t n = 3000;
    ASSERT_TRUE(start_unread_stream(slow, unique_prompt(5, 16), n));
    const int kLoopReplies = 40;
    for (int i = 0; i < kLoopReplies; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
        ASSERT_TRUE(slow.send(stats_frame(0)));
    }
    size_t tokens = 0;
    int loop_replies = 0;
    bool done = false;
    while (const fb::Envelope *e = slow.next()) {
        if (e->request_id() == 0) {
            ASSERT_EQ(e->body_type(), fb::Message::Error);
            ++loop_replies;
            continue;
        }
        ASSERT_EQ(e->request_id(), 2u);
        ASSERT_FALSE(done) << "a frame of the request after its Done";
        if (e->body_type() == fb::Message::TokenChunk) {
            tokens += e->body_as_TokenChunk()->tokens() ? e->body_as_TokenChunk()->tokens()->size() : 0;
        } else {
            ASSERT_EQ(e->body_type(), fb::Message::Done);
            EXPECT_EQ(e->body_as_Done()->reason(), fb::FinishReason::Length);
            done = true;
        }
        if (done && loop_replies == kLoopReplies) break;
    }
    EXPECT_TRUE(done) << "the stream broke off (a frame that did not decode?)";
    EXPECT_EQ(tokens, n);
    EXPECT_EQ(loop_replies, kLoopReplies);
    EXPECT_EQ(d.stop(SIGTERM), 0);
}

TEST_F(DaemonE2E, ClientOfAnotherUidIsRefused) {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
    Daemon d;
    const std::string path = dir->path + "/uid.sock";
    ASSERT_EQ(d.start(DS4D_PATH, model_path, path, dir->path + "/uid.log"), "");
    // Open the file mode so that only the SO_PEERCRED check stands in the way.
    ASSERT_EQ(chmod(path.c_str(), 0777), 0);
    ASSERT_EQ(chmod(dir->path.c_str(), 0755), 0);
    const std::vector<uint8_t> hello = hello_frame();
    int pipefd[2];
    ASSERT_EQ(pipe(pipefd), 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
    pid_t pid = fork();
    if (pid == 0) {
        // Only async-signal-safe calls from here on.
        close(pipefd[0]);
        signal(SIGPIPE, SIG_IGN);  // the daemon may close before our Hello is written
        if (setgid(65534) != 0 || setuid(65534) != 0) _exit(10);
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        if (connect(s, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) _exit(11);
        (void)!write(s, hello.data(), hello.size());
        char buf[4096];
        ssize_t r;
        while ((r = read(s, buf, sizeof buf)) > 0)
            if (write(pipefd[1], buf, size_t(r)) != r) _exit(13);
        _exit(0);
    }
    close(pipefd[1]);
    std::vector<uint8_t> got;
    char buf[4096];
    ssize_t r;
    while ((r = read(pipefd[0], buf, sizeof buf)) > 0) got.insert(got.end(), buf, buf + r);
    close(pipefd[0]);
    EXPECT_EQ(wait_exit(pid, 10000), 0);
    ds4::ipc::FrameDecoder dec;
    dec.feed(got.data(), got.size());
    ASSERT_EQ(dec.next(), ds4::ipc::FrameDecoder::Status::Frame) << got.size() << " bytes from the daemon";
    ASSERT_EQ(dec.envelope()->body_type(), fb::Message::Error);
    EXPECT_EQ(dec.envelope()->body_as_Error()->code(), fb::ErrorCode::PermissionDenied);
    EXPECT_EQ(d.stop(SIGTERM), 0);
}

// ds4d --ssd-streaming: `ds4 stats` shows the expert counters (hits, misses, bytes read, read
// GB/s, the prefetch's hidden share); a restarted ds4d reads the experts the first one stored;
// ds4-expert-store lists the store, refuses to compact it under a running ds4d and compacts
// it once ds4d has stopped.
TEST(DaemonStreaming, StatsShowExpertCountersAndTheStoreCompactsWhenIdle) {
    TempDir d;
    const std::string model = d.path + "/tiny.gguf", state = d.path + "/state";
    ASSERT_EQ(run_cmd({DS4_MAKE_MODEL_PATH, "--preset", "tiny", "--quiet", model}, d.path).rc, 0);
    ds4_bridge_model_info_t info;
    {
        ds4::bridge::ModelOptions mo;
        mo.model_path = model;
        mo.n_threads = 1;
        info = ds4::bridge::Model(mo).info();
    }
    ASSERT_GT(info.n_expert, info.n_expert_used + 1) << "the tiny model needs routed experts for this test";
    const uint32_t cache = uint32_t(info.n_expert_used + 1);  // evicts on every layer
    const std::vector<std::string> flags = {"--state-dir", state, "--ssd-streaming", "--expert-cache-experts",
                                            std::to_string(cache)};
    auto decode = [&](const std::string &sock) {
        Client c(sock, "streaming");
        GenerateRequest req;
        req.kind = GenerateRequest::Prompt::Tokens;
        req.tokens = {5, 17, 99, 3, 250, 41, 7, 300};
        req.max_tokens = 24;
        req.ignore_eos = true;
        const DoneInfo done = c.generate(req);
        EXPECT_EQ(done.generated_tokens, 24u);
        return c.stats();
    };
    char fp[32];
    std::snprintf(fp, sizeof fp, "%016llx", (unsigned long long)info.fingerprint);
    {
        Daemon dd;
        ASSERT_EQ(dd.start(DS4D_PATH, model, d.path + "/s.sock", d.path + "/s.log", flags), "");
        const ds4::client::Stats st = decode(dd.socket);
        ASSERT_TRUE(st.streaming);
        const ds4::client::ExpertStats &e = st.experts;
        EXPECT_GE(e.acquired, 32u * uint64_t(info.n_expert_used)) << "at least one layer's experts per token";
        EXPECT_GT(e.misses, 0u);
        EXPECT_LE(e.misses, e.acquired);
        EXPECT_LE(e.late, e.acquired - e.misses);
        EXPECT_GT(e.bytes_read, 0u);
        EXPECT_GT(e.io_busy_s, 0.0);
        EXPECT_GT(e.read_gb_s(), 0.0);
        EXPECT_GE(e.hidden(), 0.0);
        EXPECT_LE(e.hidden(), 1.0);
        EXPECT_EQ(e.capacity, cache);
        EXPECT_LE(e.resident, cache);
        EXPECT_EQ(e.store_corrupt, 0u);
        const CmdResult cli = run_cmd({DS4_CLI_PATH, "--socket", dd.socket, "stats"}, d.path);
        EXPECT_EQ(cli.rc, 0) << cli.err;
        EXPECT_NE(cli.out.find("% hits ("), std::string::npos) << cli.out;
        EXPECT_NE(cli.out.find("GB/s while reading"), std::string::npos) << cli.out;
        EXPECT_NE(cli.out.find("of read time hidden"), std::string::npos) << cli.out;

        const CmdResult busy = run_cmd({DS4_EXPERT_STORE_PATH, "--state-dir", state, "compact"}, d.path);
        EXPECT_EQ(busy.rc, 1);
        EXPECT_NE(busy.err.find("in use"), std::string::npos) << busy.err;
        const CmdResult list = run_cmd({DS4_EXPERT_STORE_PATH, "--state-dir", state, "list"}, d.path);
        EXPECT_EQ(list.rc, 0) << list.err;
        EXPECT_NE(list.out.find(std::string(fp) + "  "), std::string::npos) << list.out;
        EXPECT_NE(list.out.find(model + " (present)"), std::string::npos) << list.out;
        EXPECT_EQ(dd.stop(SIGTERM), 0) << read_file(dd.log);
    }
    {
        Daemon dd;
        ASSERT_EQ(dd.start(DS4D_PATH, model, d.path + "/s.sock", d.path + "/s2.log", flags), "");
        const ds4::client::Stats st = decode(dd.socket);
        EXPECT_GT(st.experts.store_reads, 0u) << "the restarted ds4d reads the stored records";
        EXPECT_EQ(st.experts.store_corrupt, 0u);
        EXPECT_EQ(dd.stop(SIGTERM), 0) << read_file(dd.log);
    }
    const CmdResult done = run_cmd({DS4_EXPERT_STORE_PATH, "--state-dir", state, "compact"}, d.path);
    EXPECT_EQ(done.rc, 0) << done.err;
    EXPECT_NE(done.out.find("1 models kept"), std::string::npos) << done.out;
    EXPECT_NE(done.out.find("0 removed"), std::string::npos) << done.out;
}

}  // namespace

#endif  // DS4_E2E
