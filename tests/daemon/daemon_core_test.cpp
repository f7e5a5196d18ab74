// ds4d parts that need no model: text streaming, options, request parsing, socket set-up.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "daemon/listen_socket.h"
#include "daemon/options.h"
#include "daemon/requests.h"
#include "daemon/text_stream.h"
#include "ipc/frame.h"
#include "kvstore/session_name.h"

namespace fb = ds4::ipc::fb;
using namespace ds4::daemon;

// ---------------------------------------------------------------- text streaming

TEST(TextStream, PassesPlainTextStraightThrough) {
    TextStream ts;
    EXPECT_EQ(ts.push("Hello"), "Hello");
    EXPECT_EQ(ts.push(", world"), ", world");
    EXPECT_EQ(ts.flush(), "");
}

TEST(TextStream, HoldsBackSplitUtf8UntilComplete) {
    // "é" = C3 A9, "€" = E2 82 AC, "😀" = F0 9F 98 80, each split across pieces.
    TextStream ts;
    EXPECT_EQ(ts.push("a\xC3"), "a");
    EXPECT_EQ(ts.push("\xA9"), "\xC3\xA9");
    EXPECT_EQ(ts.push("\xE2"), "");
    EXPECT_EQ(ts.push("\x82"), "");
    EXPECT_EQ(ts.push("\xAC!"), "\xE2\x82\xAC!");
    EXPECT_EQ(ts.push("\xF0\x9F\x98"), "");
    EXPECT_EQ(ts.push("\x80"), "\xF0\x9F\x98\x80");
}

TEST(TextStream, InvalidBytesAreNotHeldForever) {
    TextStream ts;
    EXPECT_EQ(ts.push("\xFF"), "\xFF");        // never a lead byte
    EXPECT_EQ(ts.push("\x80\x80"), "\x80\x80"); // stray continuation bytes
    EXPECT_EQ(ts.push("\xC3"), "");             // a real lead byte waits...
    EXPECT_EQ(ts.flush(), "\xC3");              // ...and comes out at the end
}

TEST(TextStream, StopStringEndsTheStreamAndIsNotEmitted) {
    TextStream ts({"STOP"});
    EXPECT_EQ(ts.push("one two "), "one two ");
    EXPECT_FALSE(ts.stopped());
    EXPECT_EQ(ts.push("thr ST"), "thr ");  // "ST" might begin the stop string
    EXPECT_EQ(ts.push("OP and more"), "");
    EXPECT_TRUE(ts.stopped());
    EXPECT_EQ(ts.matched_stop(), "STOP");
    EXPECT_EQ(ts.push("ignored"), "");
    EXPECT_EQ(ts.flush(), "");
}

TEST(TextStream, FalseStartOfAStopStringIsReleased) {
    TextStream ts({"STOP"});
    EXPECT_EQ(ts.push("ST"), "");
    EXPECT_EQ(ts.push("AR"), "STAR");
    EXPECT_FALSE(ts.stopped());
}

TEST(TextStream, OverlappingPrefixesStillMatch) {
    // "aab" inside "aaab": the held-back suffix must be the longest candidate.
    TextStream ts({"aab"});
    std::string out;
    for (char c : std::string("xaaab")) out += ts.push(std::string(1, c));
    EXPECT_TRUE(ts.stopped());
    EXPECT_EQ(out, "xa");
}

TEST(TextStream, EarliestOfSeveralStopStringsWins) {
    TextStream ts({"world", "lo"});
    EXPECT_EQ(ts.push("hello world"), "hel");
    EXPECT_EQ(ts.matched_stop(), "lo");
}

TEST(TextStream, StopStringWithinOnePieceKeepsTextBefore) {
    TextStream ts({"\n\n"});
    EXPECT_EQ(ts.push("line\n"), "line");
    EXPECT_EQ(ts.push("\nnext"), "");
    EXPECT_TRUE(ts.stopped());
}

TEST(TextStream, ConcatenationEqualsInputWithoutStops) {
    std::string input = "mixed \xC3\xA9t\xC3\xA9 \xE2\x82\xAC 100 \xF0\x9F\x98\x80!";
    for (size_t piece = 1; piece <= 5; ++piece) {
        TextStream ts({"zz"});
        std::string out;
        for (size_t i = 0; i < input.size(); i += piece) out += ts.push(input.substr(i, piece));
        out += ts.flush();
        EXPECT_EQ(out, input) << "piece " << piece;
    }
}

TEST(Utf8Tail, CountsOnlyIncompleteSequences) {
    EXPECT_EQ(utf8_incomplete_tail(""), 0u);
    EXPECT_EQ(utf8_incomplete_tail("abc"), 0u);
    EXPECT_EQ(utf8_incomplete_tail("a\xC3"), 1u);
    EXPECT_EQ(utf8_incomplete_tail("\xC3\xA9"), 0u);
    EXPECT_EQ(utf8_incomplete_tail("\xE2\x82"), 2u);
    EXPECT_EQ(utf8_incomplete_tail("\xF0\x9F\x98"), 3u);
    EXPECT_EQ(utf8_incomplete_tail("\xF0\x9F\x98\x80"), 0u);
    EXPECT_EQ(utf8_incomplete_tail("\x80\x80\x80\x80"), 0u);
}

// ---------------------------------------------------------------- options

namespace {
DaemonOptions parse(std::vector<const char *> args) {
    args.insert(args.begin(), "ds4d");
    return parse_daemon_args(int(args.size()), args.data());
}
}  // namespace

TEST(DaemonOptions, ParsesEveryDocumentedFlag) {
    DaemonOptions o = parse({"--model", "m.gguf", "--socket", "/tmp/x.sock", "--state-dir", "/tmp/st", "--ctx", "2048",
                             "--threads", "3", "--backend", "cpu", "--max-sessions", "7", "--prefill-chunk", "32",
                             "--max-frame", "65536", "--queue-bytes", "8192", "--max-inflight", "5",
                             "--shutdown-grace-ms", "10"});
    EXPECT_EQ(o.model_path, "m.gguf");
    EXPECT_EQ(o.socket_path, "/tmp/x.sock");
    EXPECT_EQ(o.state_dir, "/tmp/st");
    EXPECT_EQ(o.ctx, 2048u);
    EXPECT_EQ(o.threads, 3);
    EXPECT_EQ(o.backend, DaemonOptions::Backend::Cpu);
    EXPECT_EQ(o.max_sessions, 7u);
    EXPECT_EQ(o.prefill_chunk, 32u);
    EXPECT_EQ(o.max_frame, 65536u);
    EXPECT_EQ(o.queue_bytes, 8192u);
    EXPECT_EQ(o.max_inflight, 5u);
    EXPECT_EQ(o.shutdown_grace_ms, 10u);
    EXPECT_EQ(o.solo_prefill_chunk, 32u) << "an explicit --prefill-chunk also bounds a lone prompt's steps";
    EXPECT_EQ(parse({"--model", "m"}).solo_prefill_chunk, 0u) << "default: the session's step size";
    EXPECT_EQ(parse({"--model", "m", "--prefill-chunk", "32", "--solo-prefill-chunk", "2048"}).solo_prefill_chunk, 2048u);
    EXPECT_THROW(parse({"--model", "m", "--solo-prefill-chunk", "0"}), UsageError);
}

TEST(DaemonOptions, SsdStreamingFlags) {
    DaemonOptions o = parse({"--model", "m", "--ssd-streaming", "--expert-cache-bytes", "1000000", "--cold"});
    EXPECT_TRUE(o.ssd_streaming);
    EXPECT_TRUE(o.ssd_cold);
    EXPECT_EQ(o.expert_cache_bytes, 1000000u);
    EXPECT_EQ(o.expert_cache_experts, 0u);
    o = parse({"--model", "m", "--ssd-streaming", "--expert-cache-experts", "96"});
    EXPECT_EQ(o.expert_cache_experts, 96u);
    EXPECT_FALSE(o.ssd_cold);
    auto msg = [](std::vector<const char *> a) {
        try {
            parse(a);
        } catch (const UsageError &e) {
            return std::string(e.what());
        }
        return std::string("accepted");
    };
    EXPECT_NE(msg({"--model", "m", "--cold"}).find("need --ssd-streaming"), std::string::npos);
    EXPECT_NE(msg({"--model", "m", "--expert-cache-experts", "8"}).find("need --ssd-streaming"), std::string::npos);
    EXPECT_NE(msg({"--model", "m", "--ssd-streaming", "--expert-cache-experts", "8", "--expert-cache-bytes", "9"})
                  .find("not both"),
              std::string::npos);
    EXPECT_NE(msg({"--model", "m", "--ssd-streaming", "--expert-cache-experts", "0"}).find("--expert-cache-experts"),
              std::string::npos);
}

TEST(DaemonOptions, DefaultSocketFollowsXdgRuntimeDir) {
    const char *old = std::getenv("XDG_RUNTIME_DIR");
    std::string saved = old ? old : "";
    setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
    EXPECT_EQ(parse({"--model", "m"}).socket_path, "/run/user/4242/ds4.sock");
    unsetenv("XDG_RUNTIME_DIR");
    // Without it: a socket in a directory of its own (created 0700 by ds4d), not a file
    // directly in /tmp that another user could create first.
    EXPECT_EQ(parse({"--model", "m"}).socket_path, "/tmp/ds4-" + std::to_string(geteuid()) + "/ds4.sock");
    if (old) setenv("XDG_RUNTIME_DIR", saved.c_str(), 1);
}

TEST(DaemonOptions, RejectsBadInputWithTheFlagNamed) {
    auto msg = [](std::vector<const char *> a) {
        try {
            parse(a);
        } catch (const UsageError &e) {
            return std::string(e.what());
        }
        return std::string("accepted");
    };
    EXPECT_NE(msg({}).find("--model"), std::string::npos);
    EXPECT_NE(msg({"--model", "m", "--ctx", "abc"}).find("--ctx"), std::string::npos);
    EXPECT_NE(msg({"--model", "m", "--ctx", "-5"}).find("--ctx"), std::string::npos);
    EXPECT_NE(msg({"--model", "m", "--backend", "tpu"}).find("--backend"), std::string::npos);
    EXPECT_NE(msg({"--model", "m", "--max-sessions", "0"}).find("--max-sessions"), std::string::npos);
    EXPECT_NE(msg({"--model", "m", "--frobnicate"}).find("--frobnicate"), std::string::npos);
    EXPECT_NE(msg({"--model"}).find("needs a value"), std::string::npos);
    std::string long_path = "/tmp/" + std::string(200, 'x');
    EXPECT_NE(msg({"--model", "m", "--socket", long_path.c_str()}).find("longer than"), std::string::npos);
}

TEST(DaemonOptions, DrafterFromFlagOrEnvironment) {
    const char *old_d = std::getenv("DS4_DRAFTER"), *old_k = std::getenv("DS4_DRAFT_MAX");
    const std::string saved_d = old_d ? old_d : "", saved_k = old_k ? old_k : "";
    unsetenv("DS4_DRAFTER");
    unsetenv("DS4_DRAFT_MAX");
    DaemonOptions o = parse({"--model", "m"});
    EXPECT_EQ(o.drafter_path, "");
    EXPECT_EQ(o.draft_max, 0u);
    o = parse({"--model", "m", "--drafter", "d.gguf", "--draft-max", "6"});
    EXPECT_EQ(o.drafter_path, "d.gguf");
    EXPECT_EQ(o.draft_max, 6u);
    EXPECT_EQ(parse({"--model", "m", "--mtp", "d2.gguf"}).drafter_path, "d2.gguf");  // the older name
    EXPECT_TRUE(o.share_drafter);  // shared by default (drafter_import), --no-share-drafter keeps it private
    EXPECT_FALSE(parse({"--model", "m", "--drafter", "d.gguf", "--no-share-drafter"}).share_drafter);
    setenv("DS4_DRAFTER", "env.gguf", 1);
    setenv("DS4_DRAFT_MAX", "3", 1);
    o = parse({"--model", "m"});
    EXPECT_EQ(o.drafter_path, "env.gguf");
    EXPECT_EQ(o.draft_max, 3u);
    o = parse({"--model", "m", "--drafter", ""});   // "" turns the environment's drafter off
    EXPECT_EQ(o.drafter_path, "");
    EXPECT_EQ(o.draft_max, 0u);
    auto msg = [](std::vector<const char *> a) {
        try {
            parse(a);
        } catch (const UsageError &e) {
            return std::string(e.what());
        }
        return std::string("accepted");
    };
    EXPECT_NE(msg({"--model", "m", "--drafter", "d", "--draft-max", "2"}).find("accepted"), std::string::npos);
    setenv("DS4_DRAFT_MAX", "65", 1);
    EXPECT_NE(msg({"--model", "m"}).find("DS4_DRAFT_MAX"), std::string::npos);
    unsetenv("DS4_DRAFTER");
    unsetenv("DS4_DRAFT_MAX");
    EXPECT_NE(msg({"--model", "m", "--draft-max", "4"}).find("needs a drafter"), std::string::npos);
    EXPECT_NE(msg({"--model", "m", "--drafter", "d", "--draft-max", "0"}).find("--draft-max"), std::string::npos);
    EXPECT_NE(msg({"--model", "m", "--drafter", "d", "--draft-max", "65"}).find("--draft-max"), std::string::npos);
    if (old_d) setenv("DS4_DRAFTER", saved_d.c_str(), 1);
    if (old_k) setenv("DS4_DRAFT_MAX", saved_k.c_str(), 1);
}

TEST(DaemonOptions, KvBudgetTakesSizesWithUnits) {
    EXPECT_EQ(parse({"--model", "m", "--kv-budget", "512MiB"}).kv_budget, 512ull << 20);
    EXPECT_EQ(parse({"--model", "m", "--kv-budget", "8GiB"}).kv_budget, 8ull << 30);
    EXPECT_EQ(parse({"--model", "m", "--kv-budget", "1.5GiB"}).kv_budget, 3ull << 29);
    EXPECT_EQ(parse({"--model", "m", "--kv-budget", "1000000"}).kv_budget, 1000000u);
    EXPECT_EQ(parse({"--model", "m", "--kv-budget", "2GB"}).kv_budget, 2000000000u);
    EXPECT_EQ(parse({"--model", "m", "--kv-wait", "0"}).kv_wait_s, 0u);
    EXPECT_EQ(parse({"--model", "m"}).kv_budget, 0u) << "0: the default, half of physical memory";
    EXPECT_GT(default_kv_budget(), 0u);
    for (const char *bad : {"", "MiB", "12XB", "-1GiB", "1.5", "0", "99999999999TiB"}) {
        try {
            parse({"--model", "m", "--kv-budget", bad});
            ADD_FAILURE() << "accepted --kv-budget \"" << bad << "\"";
        } catch (const UsageError &e) {
            EXPECT_NE(std::string(e.what()).find("--kv-budget"), std::string::npos) << e.what();
        }
    }
}

TEST(DaemonOptions, HelpNamesEveryFlag) {
    const std::string u = daemon_usage();
    for (const char *f : {"--model", "--socket", "--state-dir", "--ctx", "--threads", "--backend", "--max-sessions",
                          "--prefill-chunk", "--solo-prefill-chunk", "--max-frame", "--queue-bytes", "--max-inflight", "--shutdown-grace-ms",
                          "--drafter", "--draft-max", "--kv-budget", "--kv-wait"})
        EXPECT_NE(u.find(f), std::string::npos) << f;
    EXPECT_TRUE(parse({"--help"}).help);
}

// ---------------------------------------------------------------- request parsing

namespace {

struct Built {
    std::vector<uint8_t> bytes;
    ds4::ipc::FrameDecoder dec;
    const fb::Envelope *env() {
        dec.feed(bytes.data(), bytes.size());
        EXPECT_EQ(dec.next(), ds4::ipc::FrameDecoder::Status::Frame) << dec.error_message();
        return dec.envelope();
    }
};

template <class F> ParseResult parse_built(F build) {
    flatbuffers::FlatBufferBuilder fbb;
    build(fbb);
    Built b;
    b.bytes = ds4::ipc::frame_bytes(fbb);
    return parse_request(b.env());
}

}  // namespace

TEST(RequestParse, GenerateCarriesEveryField) {
    ParseResult r = parse_built([](auto &fbb) {
        auto s = fb::CreateSampling(fbb, 0.5f, 10, 0.9f, 0.1f, 77);
        std::vector<flatbuffers::Offset<flatbuffers::String>> stops = {fbb.CreateString("END")};
        std::vector<int32_t> st = {5, 3};
        std::vector<int32_t> toks = {1, 2, 3};
        ds4::ipc::finish_frame(fbb, 9, fb::CreateGenerateDirect(fbb, 4, nullptr, &toks, nullptr, true, true, s, 17, &stops, &st, true, true));
    });
    ASSERT_EQ(r.kind, ParseResult::Kind::Request) << r.message;
    auto &g = std::get<GenerateParams>(r.body);
    EXPECT_EQ(g.session, 4u);
    EXPECT_EQ(g.kind, GenerateParams::Prompt::Tokens);
    EXPECT_EQ(g.tokens, (std::vector<int32_t>{1, 2, 3}));
    EXPECT_TRUE(g.thinking);
    EXPECT_FLOAT_EQ(g.temperature, 0.5f);
    EXPECT_EQ(g.top_k, 10);
    EXPECT_FLOAT_EQ(g.top_p, 0.9f);
    EXPECT_FLOAT_EQ(g.min_p, 0.1f);
    EXPECT_EQ(g.seed, 77u);
    EXPECT_EQ(g.max_tokens, 17u);
    EXPECT_EQ(g.stop_strings, (std::vector<std::string>{"END"}));
    EXPECT_EQ(g.stop_tokens, (std::vector<int32_t>{5, 3}));
    EXPECT_TRUE(g.ignore_eos);
    EXPECT_TRUE(g.progress);
}

TEST(RequestParse, GenerateRejectsInvalidArguments) {
    auto gen_with = [](float temp, int top_k, float top_p, float min_p) {
        return parse_built([&](auto &fbb) {
            auto s = fb::CreateSampling(fbb, temp, top_k, top_p, min_p, 0);
            ds4::ipc::finish_frame(fbb, 1, fb::CreateGenerateDirect(fbb, 0, "x", nullptr, nullptr, true, false, s));
        });
    };
    EXPECT_EQ(gen_with(0, 0, 1, 0).kind, ParseResult::Kind::Request);
    for (auto r : {gen_with(-1, 0, 1, 0), gen_with(NAN, 0, 1, 0), gen_with(INFINITY, 0, 1, 0), gen_with(0, -3, 1, 0),
                   gen_with(0, 0, 1.5f, 0), gen_with(0, 0, 1, -0.1f)}) {
        EXPECT_EQ(r.kind, ParseResult::Kind::Reject);
        EXPECT_EQ(r.code, fb::ErrorCode::BadRequest);
    }
    // The bad value as it was given, not std::to_string's six decimals.
    EXPECT_NE(gen_with(150, 0, 1, 0).message.find("got 150"), std::string::npos) << gen_with(150, 0, 1, 0).message;
    EXPECT_EQ(gen_with(150, 0, 1, 0).message.find("150.000000"), std::string::npos) << gen_with(150, 0, 1, 0).message;
    EXPECT_NE(gen_with(0, 0, 1.5f, 0).message.find("got 1.5"), std::string::npos) << gen_with(0, 0, 1.5f, 0).message;
    ParseResult two = parse_built([](auto &fbb) {
        std::vector<int32_t> toks = {1};
        ds4::ipc::finish_frame(fbb, 1, fb::CreateGenerateDirect(fbb, 0, "x", &toks));
    });
    EXPECT_EQ(two.code, fb::ErrorCode::BadRequest);
    EXPECT_NE(two.message.find("one of"), std::string::npos);
    ParseResult neg = parse_built([](auto &fbb) {
        std::vector<int32_t> toks = {1, -2};
        ds4::ipc::finish_frame(fbb, 1, fb::CreateGenerateDirect(fbb, 0, nullptr, &toks));
    });
    EXPECT_EQ(neg.code, fb::ErrorCode::BadRequest);
    ParseResult empty_stop = parse_built([](auto &fbb) {
        std::vector<flatbuffers::Offset<flatbuffers::String>> stops = {fbb.CreateString("")};
        ds4::ipc::finish_frame(fbb, 1, fb::CreateGenerateDirect(fbb, 0, "x", nullptr, nullptr, true, false, 0, 5, &stops));
    });
    EXPECT_EQ(empty_stop.code, fb::ErrorCode::BadRequest);
}

TEST(RequestParse, OutputFormat) {
    auto gen = [](fb::OutputFormat f, uint32_t max_tokens) {
        return parse_built([&](auto &fbb) {
            fb::GenerateBuilder g(fbb);
            g.add_max_tokens(max_tokens);
            g.add_output_format(f);
            g.add_speculate(true);
            auto body = g.Finish();
            ds4::ipc::finish_frame(fbb, 1, body);
        });
    };
    ParseResult json = gen(fb::OutputFormat::JsonObject, 16);
    ASSERT_EQ(json.kind, ParseResult::Kind::Request) << json.message;
    EXPECT_TRUE(std::get<GenerateParams>(json.body).json_object);
    EXPECT_FALSE(std::get<GenerateParams>(json.body).speculate) << "constrained requests decode plainly";
    EXPECT_FALSE(std::get<GenerateParams>(gen(fb::OutputFormat::Text, 16).body).json_object);
    EXPECT_EQ(gen(fb::OutputFormat::JsonObject, 1).code, fb::ErrorCode::BadRequest);   // "{}" needs 2 tokens
    EXPECT_EQ(gen(fb::OutputFormat(7), 16).code, fb::ErrorCode::BadRequest);
}

TEST(RequestParse, RepliesSentAsRequestsAreProtocolErrors) {
    ParseResult r = parse_built([](auto &fbb) {
        std::vector<int32_t> toks = {1};
        ds4::ipc::finish_frame(fbb, 3, fb::CreateTokenChunkDirect(fbb, &toks, "x"));
    });
    EXPECT_EQ(r.kind, ParseResult::Kind::Reject);
    EXPECT_EQ(r.code, fb::ErrorCode::Protocol);
    EXPECT_NE(r.message.find("TokenChunk"), std::string::npos);
}

TEST(RequestParse, EmptyAndUnknownBodies) {
    ParseResult none = parse_built([](auto &fbb) {
        fb::EnvelopeBuilder eb(fbb);
        eb.add_request_id(1);
        fb::FinishSizePrefixedEnvelopeBuffer(fbb, eb.Finish());
    });
    EXPECT_EQ(none.code, fb::ErrorCode::Protocol);
    ParseResult unknown = parse_built([](auto &fbb) {
        auto body = fb::CreateStats(fbb);
        fb::FinishSizePrefixedEnvelopeBuffer(fbb, fb::CreateEnvelope(fbb, 1, static_cast<fb::Message>(250), body.Union()));
    });
    EXPECT_EQ(unknown.code, fb::ErrorCode::Protocol);
    EXPECT_NE(unknown.message.find("250"), std::string::npos);
}

TEST(RequestParse, StoreMessages) {
    ParseResult r = parse_built([](auto &fbb) { ds4::ipc::finish_frame(fbb, 2, fb::CreateSaveSessionDirect(fbb, 1, "a")); });
    ASSERT_EQ(r.kind, ParseResult::Kind::Request);
    auto &save = std::get<SaveSessionParams>(r.body);
    EXPECT_EQ(save.session, 1u);
    EXPECT_EQ(save.name, "a");
    ParseResult none = parse_built([](auto &fbb) { ds4::ipc::finish_frame(fbb, 2, fb::CreateSaveSessionDirect(fbb, 0, "")); });
    EXPECT_EQ(none.code, fb::ErrorCode::BadRequest);
    ParseResult pin = parse_built([](auto &fbb) { ds4::ipc::finish_frame(fbb, 3, fb::CreatePinSessionDirect(fbb, "p", false)); });
    ASSERT_EQ(pin.kind, ParseResult::Kind::Request);
    EXPECT_FALSE(std::get<PinSessionParams>(pin.body).pinned);
    ParseResult bad = parse_built([](auto &fbb) { ds4::ipc::finish_frame(fbb, 4, fb::CreateLoadSessionDirect(fbb, "a/b", 0)); });
    EXPECT_EQ(bad.code, fb::ErrorCode::BadRequest);
}

TEST(RequestParse, HelloCancelAndSessionNames) {
    ParseResult h = parse_built([](auto &fbb) { ds4::ipc::finish_frame(fbb, 1, fb::CreateHelloDirect(fbb, 7, "t")); });
    EXPECT_EQ(h.kind, ParseResult::Kind::Hello);
    EXPECT_EQ(h.hello_version, 7u);
    ParseResult c = parse_built([](auto &fbb) { ds4::ipc::finish_frame(fbb, 1, fb::CreateCancel(fbb, 55)); });
    EXPECT_EQ(c.kind, ParseResult::Kind::Cancel);
    EXPECT_EQ(c.cancel_target, 55u);
    ParseResult good = parse_built([](auto &fbb) { ds4::ipc::finish_frame(fbb, 1, fb::CreateOpenSessionDirect(fbb, "chat-1.a_b", 0)); });
    EXPECT_EQ(good.kind, ParseResult::Kind::Request);
    // The store's rule (kvstore/session_name.h) is the daemon's: what the store would refuse
    // is a bad request up front, never a Store error later.
    const std::string long_name(200, 'a');
    for (const std::string &bad : std::vector<std::string>{"../etc", "a/b", "a..b", "a\\b", " lead", "trail ", "tab\there", long_name}) {
        ParseResult r = parse_built([&](auto &fbb) { ds4::ipc::finish_frame(fbb, 1, fb::CreateOpenSessionDirect(fbb, bad.c_str(), 0)); });
        EXPECT_EQ(r.kind, ParseResult::Kind::Reject) << bad;
        EXPECT_EQ(r.code, fb::ErrorCode::BadRequest) << bad;
        EXPECT_EQ(ds4::kvstore::validate_session_name(bad).code(), ds4::kvstore::Code::kInvalidArgument) << bad;
        for (auto make : {+[](flatbuffers::FlatBufferBuilder &fbb, const char *n) { ds4::ipc::finish_frame(fbb, 1, fb::CreateLoadSessionDirect(fbb, n, 0)); },
                          +[](flatbuffers::FlatBufferBuilder &fbb, const char *n) { ds4::ipc::finish_frame(fbb, 1, fb::CreateDeleteSessionDirect(fbb, n)); },
                          +[](flatbuffers::FlatBufferBuilder &fbb, const char *n) { ds4::ipc::finish_frame(fbb, 1, fb::CreatePinSessionDirect(fbb, n, true)); },
                          +[](flatbuffers::FlatBufferBuilder &fbb, const char *n) { ds4::ipc::finish_frame(fbb, 1, fb::CreateSaveSessionDirect(fbb, 0, n)); }}) {
            ParseResult o = parse_built([&](auto &fbb) { make(fbb, bad.c_str()); });
            EXPECT_EQ(o.code, fb::ErrorCode::BadRequest) << bad;
        }
    }
    ParseResult longer = parse_built([&](auto &fbb) { ds4::ipc::finish_frame(fbb, 1, fb::CreateOpenSessionDirect(fbb, long_name.c_str(), 0)); });
    EXPECT_NE(longer.message.find("128"), std::string::npos) << longer.message;
    for (const char *good : {"chat-1.a_b", "notes v2", ".dot"}) {
        ParseResult r = parse_built([&](auto &fbb) { ds4::ipc::finish_frame(fbb, 1, fb::CreateOpenSessionDirect(fbb, good, 0)); });
        EXPECT_EQ(r.kind, ParseResult::Kind::Request) << good;
        EXPECT_TRUE(ds4::kvstore::validate_session_name(good)) << good;
    }
}

TEST(RequestParse, UnknownChatRoleIsABadRequestAndItsBytesAreEscaped) {
    for (const std::string &role : {std::string("tool"), std::string("\xff\xfe<b>\n")}) {
        ParseResult r = parse_built([&](auto &fbb) {
            std::vector<flatbuffers::Offset<fb::ChatMessage>> m{fb::CreateChatMessage(fbb, fbb.CreateString(role), fbb.CreateString("hi"))};
            auto msgs = fbb.CreateVector(m);
            ds4::ipc::finish_frame(fbb, 1, fb::CreateGenerate(fbb, 0, 0, 0, msgs));
        });
        ASSERT_EQ(r.kind, ParseResult::Kind::Reject) << role;
        EXPECT_EQ(r.code, fb::ErrorCode::BadRequest) << role;
        EXPECT_NE(r.message.find("not system, user or assistant"), std::string::npos) << r.message;
        for (unsigned char c : r.message) EXPECT_TRUE(c >= 0x20 && c < 0x7F) << "byte " << int(c) << " in " << r.message;
    }
    ParseResult bytes = parse_built([&](auto &fbb) {
        std::vector<flatbuffers::Offset<fb::ChatMessage>> m{fb::CreateChatMessage(fbb, fbb.CreateString("\xff\n"), fbb.CreateString("hi"))};
        ds4::ipc::finish_frame(fbb, 1, fb::CreateGenerate(fbb, 0, 0, 0, fbb.CreateVector(m)));
    });
    EXPECT_NE(bytes.message.find("\"\\xff\\x0a\""), std::string::npos) << bytes.message;
    for (const char *role : {"system", "user", "assistant"}) {
        ParseResult ok = parse_built([&](auto &fbb) {
            std::vector<flatbuffers::Offset<fb::ChatMessage>> m{fb::CreateChatMessage(fbb, fbb.CreateString(role), fbb.CreateString("hi"))};
            ds4::ipc::finish_frame(fbb, 1, fb::CreateGenerate(fbb, 0, 0, 0, fbb.CreateVector(m)));
        });
        EXPECT_EQ(ok.kind, ParseResult::Kind::Request) << role;
    }
}

// ---------------------------------------------------------------- socket set-up

namespace {

struct TempDir {
    std::string path;
    TempDir() {
        char tmpl[] = "/tmp/ds4d-core-XXXXXX";
        path = mkdtemp(tmpl);
    }
    ~TempDir() { std::filesystem::remove_all(path); }
};

bool can_connect(const std::string &path) {
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
    bool ok = connect(s, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0;
    close(s);
    return ok;
}

}  // namespace

TEST(ListenSocket, CreatedWithMode0600AndRemovedOnDestruction) {
    TempDir d;
    const std::string p = d.path + "/s.sock";
    {
        ListenSocket ls(p, 4);
        struct stat st {};
        ASSERT_EQ(stat(p.c_str(), &st), 0);
        EXPECT_TRUE(S_ISSOCK(st.st_mode));
        EXPECT_EQ(st.st_mode & 0777, 0600u);
        EXPECT_TRUE(can_connect(p));
    }
    EXPECT_FALSE(std::filesystem::exists(p));
}

TEST(ListenSocket, DoesNotRemoveAFileThatReplacedIt) {
    TempDir d;
    const std::string p = d.path + "/s.sock";
    ListenSocket ls(p, 4);
    std::filesystem::remove(p);
    { ListenSocket other(p, 4); ls.remove_file(); EXPECT_TRUE(std::filesystem::exists(p)); }
}

TEST(ListenSocket, LiveSocketIsNotStolen) {
    TempDir d;
    const std::string p = d.path + "/s.sock";
    ListenSocket live(p, 4);
    try {
        clear_stale_socket(p);
        FAIL() << "a live socket was treated as stale";
    } catch (const StartupError &e) {
        EXPECT_NE(std::string(e.what()).find("already listening"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(can_connect(p));
}

TEST(ListenSocket, StaleSocketIsReplaced) {
    TempDir d;
    const std::string p = d.path + "/s.sock";
    {
        // A socket file left by a dead process: bound, then closed without unlinking.
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        sockaddr_un a{};
        a.sun_family = AF_UNIX;
        std::strncpy(a.sun_path, p.c_str(), sizeof a.sun_path - 1);
        ASSERT_EQ(bind(s, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
        close(s);
    }
    ASSERT_TRUE(std::filesystem::exists(p));
    clear_stale_socket(p);
    EXPECT_FALSE(std::filesystem::exists(p));
    ListenSocket ls(p, 4);
    EXPECT_TRUE(can_connect(p));
}

TEST(ListenSocket, NonSocketPathIsRefused) {
    TempDir d;
    const std::string p = d.path + "/plain";
    { FILE *f = fopen(p.c_str(), "w"); fputs("data", f); fclose(f); }
    EXPECT_THROW(clear_stale_socket(p), StartupError);
    EXPECT_TRUE(std::filesystem::exists(p));
}

TEST(SocketLock, SecondHolderIsRefusedUntilTheFirstGoes) {
    TempDir d;
    const std::string p = d.path + "/s.sock";
    {
        SocketLock first(p);
        // flock is per open file description: a second open in this process conflicts too.
        try {
            SocketLock second(p);
            FAIL() << "second lock succeeded";
        } catch (const StartupError &e) {
            EXPECT_NE(std::string(e.what()).find("another ds4d"), std::string::npos) << e.what();
        }
    }
    EXPECT_NO_THROW(SocketLock again(p));
}
