// End-to-end tests of persistent sessions: real ds4d processes over a state dir, restarted
// cleanly and with SIGKILL, serving the tiny random model. The reference for "resumes
// right" is a ds4d over its own state dir that is never restarted: a resumed conversation
// must continue token for token as that uninterrupted one does.
#include <gtest/gtest.h>
#ifndef DS4_E2E
#define DS4_E2E 0
#endif

#if !DS4_E2E
TEST(PersistE2E, NeedsBridgeDaemonAndModelGenerator) {
    GTEST_SKIP() << "persistence end-to-end tests need ds4lib, ds4d and ds4-make-model in this build";
}
#else

#include <filesystem>
#include <random>

#include "client/ds4client.hpp"
#include "tests/common/tmpfs_mount.h"
#include "tests/daemon/e2e_support.h"

using namespace e2e;
using ds4::client::Client;
using ds4::client::DoneInfo;
using ds4::client::GenerateRequest;
using ds4::client::ServerError;

namespace {

constexpr int kTurns = 60;      // turns of the reference conversation
constexpr uint32_t kGen = 6;    // tokens generated per turn

// The prompt of turn i: a few token ids that depend on i only.
std::vector<int32_t> turn_prompt(int i) {
    std::vector<int32_t> p;
    for (int k = 0; k < 5; ++k) p.push_back(int32_t(1 + (i * 37 + k * 11) % 500));
    return p;
}

struct Turn {
    std::vector<int32_t> out;
    DoneInfo done;
};

Turn run_turn(Client &c, uint64_t session, int i) {
    GenerateRequest req;
    req.session = session;
    req.kind = GenerateRequest::Prompt::Tokens;
    req.tokens = turn_prompt(i);
    req.max_tokens = kGen;
    req.ignore_eos = true;
    Turn t;
    ds4::client::GenerateCallbacks cb;
    cb.on_chunk = [&](const ds4::client::Chunk &ch) {
        t.out.insert(t.out.end(), ch.tokens.begin(), ch.tokens.end());
        return true;
    };
    t.done = c.generate(req, cb);
    return t;
}

class PersistE2E : public ::testing::Test {
protected:
    static inline TempDir *dir = nullptr;
    static inline std::string model_path;
    // Reference: history size before turn i (index i) and the output of turn i.
    static inline std::vector<uint32_t> ref_tokens_before;
    static inline std::vector<std::vector<int32_t>> ref_out;

    static void SetUpTestSuite() {
        dir = new TempDir;
        model_path = dir->path + "/tiny.gguf";
        CmdResult mk = run_cmd({DS4_MAKE_MODEL_PATH, "--preset", "tiny", "--quiet", model_path}, dir->path);
        ASSERT_EQ(mk.rc, 0) << mk.err;
        Daemon d;
        ASSERT_EQ(d.start(DS4D_PATH, model_path, dir->path + "/ref.sock", dir->path + "/ref.log",
                          {"--state-dir", dir->path + "/ref-state"}),
                  "");
        Client c(d.socket, "ref");
        const uint64_t s = c.open_session("conv").id;
        uint32_t n = 0;
        for (int i = 0; i < kTurns; ++i) {
            ref_tokens_before.push_back(n);
            Turn t = run_turn(c, s, i);
            ASSERT_EQ(t.out.size(), kGen);
            ref_out.push_back(t.out);
            n += uint32_t(turn_prompt(i).size() + kGen);
        }
        EXPECT_EQ(d.stop(SIGTERM), 0);
    }
    static void TearDownTestSuite() {
        delete dir;
        dir = nullptr;
    }
    void SetUp() override {
        if (ref_out.size() != size_t(kTurns)) GTEST_SKIP() << "suite set-up failed";
    }

    // Which reference turn comes next for a session holding n tokens; -1 if n is no state
    // the conversation ever had.
    static int turn_for(uint32_t n) {
        for (int i = 0; i < kTurns; ++i)
            if (ref_tokens_before[size_t(i)] == n) return i;
        return -1;
    }

    std::string start(Daemon &d, const std::string &state, std::vector<std::string> extra = {}) {
        extra.insert(extra.begin(), {"--state-dir", state});
        static int n = 0;
        const std::string tag = std::to_string(n++);
        return d.start(DS4D_PATH, model_path, dir->path + "/p" + tag + ".sock", dir->path + "/p" + tag + ".log", extra);
    }
};

TEST_F(PersistE2E, RestartAndKill9ResumeExactlyWithoutRePrefill) {
    const std::string state = dir->path + "/resume";
    {
        Daemon d;
        ASSERT_EQ(start(d, state), "");
        Client c(d.socket);
        ds4::client::SessionInfo s = c.open_session("conv");
        EXPECT_TRUE(s.created);
        for (int i = 0; i < 2; ++i) EXPECT_EQ(run_turn(c, s.id, i).out, ref_out[size_t(i)]) << "turn " << i;
        EXPECT_EQ(d.stop(SIGTERM), 0) << read_file(d.log);  // the turn's save is finished on SIGTERM
    }
    {
        Daemon d;
        ASSERT_EQ(start(d, state), "");
        Client c(d.socket);
        ds4::client::SessionInfo s = c.open_session("conv");
        EXPECT_FALSE(s.created);
        ASSERT_EQ(s.n_tokens, ref_tokens_before[2]);
        Turn t = run_turn(c, s.id, 2);
        EXPECT_EQ(t.out, ref_out[2]) << "after a clean restart";
        EXPECT_EQ(t.done.cached_tokens, ref_tokens_before[2]) << "the stored state was not used (re-prefill)";
        Turn t3 = run_turn(c, s.id, 3);
        EXPECT_EQ(t3.out, ref_out[3]);
        // Listing waits for the turn saves queued before it: after it, SIGKILL loses nothing.
        auto list = c.list_sessions();
        ASSERT_EQ(list.size(), 1u);
        EXPECT_EQ(list[0].n_tokens, ref_tokens_before[4]);
        EXPECT_GT(list[0].bytes, 0u);
        EXPECT_TRUE(list[0].live);
        EXPECT_EQ(d.stop(SIGKILL), -1000 - SIGKILL);
    }
    {
        Daemon d;
        ASSERT_EQ(start(d, state), "");
        Client c(d.socket);
        ds4::client::SessionInfo s = c.load_session("conv");
        ASSERT_EQ(s.n_tokens, ref_tokens_before[4]);
        Turn t = run_turn(c, s.id, 4);
        EXPECT_EQ(t.out, ref_out[4]) << "after kill -9";
        EXPECT_EQ(t.done.cached_tokens, ref_tokens_before[4]);
        EXPECT_EQ(d.stop(SIGTERM), 0);
    }
}

TEST_F(PersistE2E, NamedSessionsBeyondMaxSessionsAreReleasedAndReloadedExactly) {
    // Eight conversations through a daemon that holds three live: each turn of each one
    // continues exactly as the uninterrupted reference does, from its stored state.
    const std::string state = dir->path + "/lru";
    Daemon d;
    ASSERT_EQ(start(d, state, {"--max-sessions", "3", "--kv-wait", "1"}), "");   // refusals below wait 1 s, not 120
    Client c(d.socket);
    constexpr int kSessions = 8, kRounds = 3;
    std::vector<uint64_t> ids;
    for (int k = 0; k < kSessions; ++k) {
        ds4::client::SessionInfo si = c.open_session("lru-" + std::to_string(k));
        EXPECT_TRUE(si.created);
        ids.push_back(si.id);
        // Its first turn now: a session may be released only once its turns are stored.
        EXPECT_EQ(run_turn(c, si.id, 0).out, ref_out[0]) << "session " << k;
    }
    for (int i = 1; i < kRounds; ++i)
        for (int k = 0; k < kSessions; ++k) {
            Turn t = run_turn(c, ids[size_t(k)], i);  // by the id from the first open
            EXPECT_EQ(t.out, ref_out[size_t(i)]) << "session " << k << " turn " << i;
            EXPECT_EQ(t.done.cached_tokens, ref_tokens_before[size_t(i)]) << "session " << k << " was re-prefilled";
        }
    // Opening a released session by name gives back its id and its history.
    ds4::client::SessionInfo again = c.open_session("lru-0");
    EXPECT_EQ(again.id, ids[0]);
    EXPECT_FALSE(again.created);
    EXPECT_EQ(again.n_tokens, ref_tokens_before[size_t(kRounds)]);
    auto list = c.list_sessions();
    EXPECT_EQ(list.size(), size_t(kSessions));
    size_t live = 0;
    for (const auto &e : list) live += e.live;
    EXPECT_LE(live, 3u);
    EXPECT_NE(read_file(d.log).find("released from memory"), std::string::npos);
    // Anonymous sessions are never released: with three of them live, a fourth session is
    // refused, with the reason.
    Client other(d.socket);
    for (int k = 0; k < 3; ++k) other.open_session();
    try {
        other.open_session("one-too-many");
        ADD_FAILURE() << "a session beyond --max-sessions was admitted with nothing releasable";
    } catch (const ServerError &e) {
        EXPECT_EQ(e.code, int(ds4::ipc::fb::ErrorCode::SessionLimit));
        EXPECT_NE(std::string(e.what()).find("none can be released"), std::string::npos) << e.what();
    }
    // A released session that cannot come back while the anonymous ones hold every slot is
    // still known: its turn is refused for the limit, not as an unknown session.
    try {
        run_turn(c, ids[1], kRounds);
        ADD_FAILURE() << "a released session was reloaded beyond --max-sessions";
    } catch (const ServerError &e) {
        EXPECT_EQ(e.code, int(ds4::ipc::fb::ErrorCode::SessionLimit)) << e.what();
        EXPECT_NE(std::string(e.what()).find("none can be released"), std::string::npos) << e.what();
    }
    EXPECT_EQ(d.stop(SIGTERM), 0) << read_file(d.log);
}

TEST_F(PersistE2E, SigkillDuringSavesNeverLeavesABadOrWrongSession) {
    const std::string state = dir->path + "/killloop";
    std::mt19937 rng(1234);
    // How long one durable save takes here: kills land uniformly in [0, 2x that].
    uint64_t save_us = 0;
    {
        Daemon d;
        ASSERT_EQ(start(d, dir->path + "/killloop-timing"), "");
        Client c(d.socket);
        const uint64_t s = c.open_session("t").id;
        run_turn(c, s, 0);
        const auto t0 = Clock::now();
        c.save_session("t");
        save_us = uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count());
        EXPECT_EQ(d.stop(SIGTERM), 0);
    }
    const uint64_t window_us = 2 * save_us + 1000;
    int advanced = 0, lost = 0, prev = -1;
    const auto t0 = Clock::now();
    for (int it = 0; it < 50; ++it) {
        Daemon d;
        ASSERT_EQ(start(d, state), "") << "iteration " << it;
        Client c(d.socket);
        ds4::client::SessionInfo s;
        try {
            s = c.open_session("k");
        } catch (const ServerError &e) {
            FAIL() << "iteration " << it << ": the stored session does not load: " << e.what() << "\n" << read_file(d.log);
        }
        const int next = turn_for(s.n_tokens);
        ASSERT_GE(next, 0) << "iteration " << it << ": stored session holds " << s.n_tokens
                           << " tokens, a state the conversation never had";
        ASSERT_LT(next, kTurns);
        // prev: the turn that comes next if the last iteration's save made it. The stored
        // state is that one or the one before it (the kill won).
        if (prev >= 0) {
            ASSERT_TRUE(next == prev || next == prev - 1) << "iteration " << it << ": expected turn " << prev
                                                          << " or " << prev - 1 << ", found " << next;
            (next == prev ? advanced : lost)++;
        }
        RawConn raw(d.socket);
        ASSERT_TRUE(raw.hello());
        Turn t = run_turn(c, s.id, next);
        ASSERT_EQ(t.out, ref_out[size_t(next)]) << "iteration " << it << ": resumed at turn " << next << " wrongly";
        ASSERT_EQ(t.done.cached_tokens, s.n_tokens);
        prev = next + 1;
        // The turn's own save starts as Done is sent; ask for a durable one too, and kill at
        // a random moment in the window either may be writing.
        raw.send(frame([&](auto &fbb) { ds4::ipc::finish_frame(fbb, 9, fb::CreateSaveSessionDirect(fbb, 0, "k")); }));
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % window_us));
        d.stop(SIGKILL);
    }
    std::printf("kill loop: %d kills after the save was durable, %d before (save ~%llu us)\n", advanced, lost,
                static_cast<unsigned long long>(save_us));
    EXPECT_GT(advanced, 5) << "saves hardly ever became durable before the kill (window " << window_us << " us)";
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 120.0);
}

TEST_F(PersistE2E, CorruptPayloadIsQuarantinedAndNeverServed) {
    const std::string state = dir->path + "/corrupt";
    {
        Daemon d;
        ASSERT_EQ(start(d, state), "");
        CmdResult r = run_cmd({DS4_CLI_PATH, "--socket", d.socket, "run", "--session", "x", "--max-tokens", "4", "--ids", "hi"},
                              dir->path);
        ASSERT_EQ(r.rc, 0) << r.err;
        EXPECT_EQ(d.stop(SIGTERM), 0);
    }
    int flipped = 0;
    for (const auto &e : std::filesystem::directory_iterator(state + "/payloads")) {
        std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
        const auto size = std::filesystem::file_size(e.path());
        for (uint64_t off : {size / 2, size - 3}) {
            f.seekg(std::streamoff(off));
            char b = 0;
            f.read(&b, 1);
            b = char(b ^ 0x5a);
            f.seekp(std::streamoff(off));
            f.write(&b, 1);
        }
        ++flipped;
    }
    ASSERT_EQ(flipped, 1);
    Daemon d;
    ASSERT_EQ(start(d, state), "");
    EXPECT_NE(read_file(d.log).find("quarantined"), std::string::npos) << read_file(d.log);
    EXPECT_FALSE(std::filesystem::is_empty(state + "/quarantine"));
    CmdResult r = run_cmd({DS4_CLI_PATH, "--socket", d.socket, "run", "--session", "x", "--max-tokens", "4", "hi"}, dir->path);
    EXPECT_EQ(r.rc, 4) << "a quarantined session was served or silently restarted: " << r.out;
    EXPECT_NE(r.err.find("SessionCorrupt"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("quarantined"), std::string::npos) << r.err;
    // Deleting it is the way to start over.
    EXPECT_EQ(run_cmd({DS4_CLI_PATH, "--socket", d.socket, "sessions", "delete", "x"}, dir->path).rc, 0);
    Client c(d.socket);
    EXPECT_TRUE(c.open_session("x").created);
    EXPECT_EQ(d.stop(SIGTERM), 0);
}

TEST_F(PersistE2E, StoredPrefixesAreReusedAndReportedAsCached) {
    const std::string state = dir->path + "/prefix";
    const std::vector<std::string> opts = {"--prefill-chunk", "32", "--checkpoint-every", "64", "--prefix-min", "32"};
    std::vector<int32_t> long_prompt;
    for (int i = 0; i < 300; ++i) long_prompt.push_back(int32_t(3 + (i * 7919) % 480));
    std::vector<int32_t> conv_prompt;
    for (int i = 0; i < 100; ++i) conv_prompt.push_back(int32_t(5 + (i * 104729) % 470));
    std::vector<int32_t> conv_out;
    {
        Daemon d;
        ASSERT_EQ(start(d, state, opts), "");
        Client c(d.socket);
        GenerateRequest req;
        req.kind = GenerateRequest::Prompt::Tokens;
        req.tokens = long_prompt;
        req.max_tokens = 2;
        req.ignore_eos = true;
        EXPECT_EQ(c.generate(req).cached_tokens, 0u);
        // Another conversation, stored under a name.
        const uint64_t s = c.open_session("other").id;
        req.session = s;
        req.tokens = conv_prompt;
        ds4::client::GenerateCallbacks cb;
        cb.on_chunk = [&](const ds4::client::Chunk &ch) {
            conv_out.insert(conv_out.end(), ch.tokens.begin(), ch.tokens.end());
            return true;
        };
        c.generate(req, cb);
        ASSERT_EQ(conv_out.size(), 2u);
        (void)c.list_sessions();  // waits for the queued checkpoints and the save
        EXPECT_EQ(d.stop(SIGKILL), -1000 - SIGKILL);
    }
    Daemon d;
    ASSERT_EQ(start(d, state, opts), "");
    Client c(d.socket);
    GenerateRequest req;
    req.kind = GenerateRequest::Prompt::Tokens;
    req.max_tokens = 2;
    req.ignore_eos = true;
    req.tokens = long_prompt;
    req.tokens.insert(req.tokens.end(), {9, 8, 7, 6, 5, 4, 3, 2, 1, 9, 8, 7, 6, 5, 4, 3, 2, 1, 11, 12});
    DoneInfo a = c.generate(req);
    // Checkpoints were taken every 64 tokens at the 32-token chunk frontiers: 256 is the longest.
    EXPECT_EQ(a.cached_tokens, 256u) << read_file(d.log);
    // The named session's save (prompt + its first generated token evaluated) is a prefix too.
    req.tokens = conv_prompt;
    req.tokens.insert(req.tokens.end(), conv_out.begin(), conv_out.end());
    req.tokens.insert(req.tokens.end(), 40, 17);
    DoneInfo b = c.generate(req);
    EXPECT_EQ(b.cached_tokens, conv_prompt.size() + conv_out.size());
    // Below --prefix-min uncached tokens nothing is looked up.
    req.tokens = {long_prompt.begin(), long_prompt.begin() + 20};
    EXPECT_EQ(c.generate(req).cached_tokens, 0u);
    EXPECT_EQ(d.stop(SIGTERM), 0);
}

TEST_F(PersistE2E, CliListsSavesPinsAndDeletes) {
    const std::string state = dir->path + "/cli";
    Daemon d;
    ASSERT_EQ(start(d, state), "");
    auto ds4 = [&](std::vector<std::string> args) {
        args.insert(args.begin(), {DS4_CLI_PATH, "--socket", d.socket});
        return run_cmd(args, dir->path);
    };
    ASSERT_EQ(ds4({"run", "--session", "alpha", "--max-tokens", "3", "hello"}).rc, 0);
    ASSERT_EQ(ds4({"run", "--session", "beta", "--max-tokens", "3", "hello"}).rc, 0);
    CmdResult saved = ds4({"sessions", "save", "alpha"});
    ASSERT_EQ(saved.rc, 0) << saved.err;
    EXPECT_NE(saved.out.find("saved alpha"), std::string::npos) << saved.out;
    EXPECT_EQ(ds4({"sessions", "pin", "alpha"}).rc, 0);
    CmdResult list = ds4({"sessions", "list"});
    ASSERT_EQ(list.rc, 0) << list.err;
    auto row = [&](const std::string &out, const std::string &name) {
        std::istringstream in(out);
        std::string line;
        while (std::getline(in, line))
            if (line.rfind(name + " ", 0) == 0) return line;
        return std::string();
    };
    EXPECT_NE(row(list.out, "alpha").find(" yes "), std::string::npos) << list.out;  // pinned
    EXPECT_NE(row(list.out, "beta").find(" no "), std::string::npos) << list.out;
    EXPECT_EQ(ds4({"sessions", "pin", "alpha", "--unpin"}).rc, 0);
    EXPECT_EQ(row(ds4({"sessions", "list"}).out, "alpha").find(" yes  "), std::string::npos);
    EXPECT_EQ(ds4({"sessions", "delete", "beta"}).rc, 0);
    list = ds4({"sessions", "list"});
    EXPECT_EQ(row(list.out, "beta"), "") << list.out;
    EXPECT_NE(row(list.out, "alpha"), "");
    CmdResult again = ds4({"sessions", "delete", "beta"});
    EXPECT_EQ(again.rc, 4);
    EXPECT_NE(again.err.find("UnknownSession"), std::string::npos) << again.err;
    EXPECT_EQ(ds4({"sessions", "pin", "nosuch"}).rc, 4);
    EXPECT_EQ(ds4({"sessions", "frobnicate"}).rc, 2);
    CmdResult help = ds4({"--help"});
    EXPECT_NE(help.out.find("sessions pin NAME [--unpin]"), std::string::npos);
    // beta stays deleted across a restart; alpha is there.
    EXPECT_EQ(d.stop(SIGTERM), 0);
    Daemon d2;
    ASSERT_EQ(start(d2, state), "");
    Client c(d2.socket);
    auto v = c.list_sessions();
    ASSERT_EQ(v.size(), 1u);
    EXPECT_EQ(v[0].name, "alpha");
    EXPECT_FALSE(v[0].live);
    EXPECT_EQ(d2.stop(SIGTERM), 0);
}

TEST_F(PersistE2E, AFailedSaveIsReportedAndKeepsThePreviousVersion) {
    const std::string state = dir->path + "/budget";
    uint64_t first_bytes = 0;
    uint32_t first_tokens = 0;
    {
        Daemon d;
        ASSERT_EQ(start(d, state), "");
        Client c(d.socket);
        const uint64_t s = c.open_session("b").id;
        run_turn(c, s, 0);
        auto saved = c.save_session("b");
        first_bytes = saved.bytes;
        first_tokens = saved.n_tokens;
        EXPECT_EQ(d.stop(SIGTERM), 0);
    }
    // A budget the next, longer state cannot fit.
    Daemon d;
    ASSERT_EQ(start(d, state, {"--store-budget", std::to_string(first_bytes + 16)}), "");
    Client c(d.socket);
    ds4::client::SessionInfo s = c.open_session("b");
    ASSERT_EQ(s.n_tokens, first_tokens);
    for (int i = 1; i < 8; ++i) run_turn(c, s.id, i);
    try {
        c.save_session("b");
        FAIL() << "a save over the budget succeeded";
    } catch (const ServerError &e) {
        EXPECT_NE(std::string(e.what()).find("Store"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("previous stored version is kept"), std::string::npos) << e.what();
    }
    EXPECT_NE(read_file(d.log).find("saving session 'b' failed"), std::string::npos);
    EXPECT_EQ(d.stop(SIGKILL), -1000 - SIGKILL);
    Daemon d2;
    ASSERT_EQ(start(d2, state), "");
    Client c2(d2.socket);
    EXPECT_EQ(c2.open_session("b").n_tokens, first_tokens) << "the previous version was not kept";
    EXPECT_EQ(d2.stop(SIGTERM), 0);
}

// `ds4 run --session` prints the answer but exits 5 when its turn could not be stored (here:
// a store budget no session fits), so a script cannot mistake it for a saved turn; without
// --session, and with a store that works, it exits 0.
TEST_F(PersistE2E, RunExitsNonZeroWhenItsTurnWasNotStored) {
    Daemon d;
    ASSERT_EQ(start(d, dir->path + "/tiny-budget", {"--store-budget", "1"}), "");
    auto ds4 = [&](std::vector<std::string> args) {
        args.insert(args.begin(), {DS4_CLI_PATH, "--socket", d.socket});
        return run_cmd(args, dir->path);
    };
    CmdResult r = ds4({"run", "--session", "kept", "--ids", "--max-tokens", "3", "hi"});
    EXPECT_EQ(r.rc, 5) << r.err;
    EXPECT_NE(r.out.find_first_of("0123456789"), std::string::npos) << "the answer was not printed: " << r.out;
    EXPECT_NE(r.err.find("warning: saving session kept failed"), std::string::npos) << r.err;
    EXPECT_EQ(ds4({"run", "--ids", "--max-tokens", "3", "hi"}).rc, 0) << "a one-shot run stores nothing";
    EXPECT_NE(ds4({"--help"}).out.find("5 run --session generated the answer but could not store the turn"),
              std::string::npos);
    EXPECT_EQ(d.stop(SIGTERM), 0);
    Daemon ok;
    ASSERT_EQ(start(ok, dir->path + "/roomy"), "");
    CmdResult stored = run_cmd({DS4_CLI_PATH, "--socket", ok.socket, "run", "--session", "kept", "--ids", "--max-tokens", "3", "hi"},
                               dir->path);
    EXPECT_EQ(stored.rc, 0) << stored.err;
    EXPECT_EQ(ok.stop(SIGTERM), 0);
}

// The state dir on a small tmpfs that really fills up: saves fail with the kernel's ENOSPC,
// clients are told (the explicit save's error, SessionOpened, ListSessions, Stats, the ds4
// command's warning), generation goes on, and after kill -9 the previous stored version
// resumes exactly. Once there is space again, saving works without a restart.
TEST_F(PersistE2E, ARealFullDiskIsReportedAndKeepsThePreviousVersion) {
    const std::string mnt = dir->path + "/smallfs";
    std::filesystem::create_directories(mnt);
    ds4test::TmpfsMount fs(mnt, "size=4m,mode=0700");
    if (!fs.ok()) GTEST_SKIP() << "cannot mount a tmpfs here (" << strerror(fs.error()) << ")";
    const std::string state = mnt + "/state", filler = mnt + "/filler";
    auto find = [](const std::vector<ds4::client::StoredSession> &v, const std::string &name) {
        for (const auto &e : v)
            if (e.name == name) return e;
        return ds4::client::StoredSession{};
    };
    {
        Daemon d;
        ASSERT_EQ(start(d, state), "");
        Client c(d.socket);
        const uint64_t s = c.open_session("conv").id;
        for (int i = 0; i < 2; ++i) ASSERT_EQ(run_turn(c, s, i).out, ref_out[size_t(i)]);
        auto before = find(c.list_sessions(), "conv");
        ASSERT_EQ(before.stored_tokens, ref_tokens_before[2]);
        EXPECT_EQ(before.save_error, "");

        const long long filled = ds4test::fill_file_system(filler);
        ASSERT_GT(filled, 0) << strerror(int(-filled));
        // Generation is not affected by the store being full.
        EXPECT_EQ(run_turn(c, s, 2).out, ref_out[2]);
        auto after = find(c.list_sessions(), "conv");  // waits for that turn's (failed) save
        EXPECT_EQ(after.n_tokens, ref_tokens_before[3]);
        EXPECT_EQ(after.stored_tokens, ref_tokens_before[2]) << "the stored version changed";
        EXPECT_NE(after.save_error.find("No space left"), std::string::npos) << after.save_error;
        try {
            c.save_session("conv");
            ADD_FAILURE() << "a save on a full file system succeeded";
        } catch (const ServerError &e) {
            EXPECT_EQ(e.code_name, "Store");
            EXPECT_NE(std::string(e.what()).find("previous stored version is kept"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("No space left"), std::string::npos) << e.what();
        }
        Client other(d.socket);
        EXPECT_NE(other.open_session("conv").save_error, "") << "a second client is not told";
        EXPECT_GE(other.stats().saves_failed, 2u);
        // The command-line client says so after its turn, and the list shows it.
        CmdResult cli = run_cmd({DS4_CLI_PATH, "--socket", d.socket, "run", "--session", "cli", "--max-tokens", "2", "hi"},
                                dir->path);
        EXPECT_EQ(cli.rc, 5) << "a turn that was not stored must not exit 0: " << cli.err;
        EXPECT_NE(cli.err.find("warning: saving session cli failed"), std::string::npos) << cli.err;
        CmdResult list = run_cmd({DS4_CLI_PATH, "--socket", d.socket, "sessions", "list"}, dir->path);
        EXPECT_NE(list.out.find("latest save failed; stored version has " + std::to_string(ref_tokens_before[2]) +
                                " tokens"),
                  std::string::npos)
            << list.out;
        EXPECT_EQ(d.stop(SIGKILL), -1000 - SIGKILL);
    }
    ASSERT_EQ(::unlink(filler.c_str()), 0);
    Daemon d;
    ASSERT_EQ(start(d, state), "");
    Client c(d.socket);
    ds4::client::SessionInfo s = c.open_session("conv");
    ASSERT_EQ(s.n_tokens, ref_tokens_before[2]) << "the previous version was not kept";
    EXPECT_EQ(s.save_error, "");
    Turn t = run_turn(c, s.id, 2);
    EXPECT_EQ(t.out, ref_out[2]) << "the kept version does not resume exactly";
    EXPECT_EQ(t.done.cached_tokens, ref_tokens_before[2]);
    auto now = find(c.list_sessions(), "conv");
    EXPECT_EQ(now.stored_tokens, ref_tokens_before[3]) << "saving does not work again with space";
    EXPECT_EQ(now.save_error, "");
    EXPECT_EQ(d.stop(SIGTERM), 0);
}

// A conversation that reaches its context limit stops with the Context finish reason (not an
// error) and never holds more tokens than its context, so the stored session reopens after a
// restart: as it is (a further turn is refused with a clear ContextOverflow), with a larger
// context (where it goes on), and with a context too small for it (a clear error).
TEST_F(PersistE2E, ASessionThatFilledItsContextReopensAfterARestart) {
    const std::string state = dir->path + "/full";
    constexpr uint32_t kCtx = 64;
    const std::vector<std::string> ctx_arg = {"--ctx", std::to_string(kCtx)};
    std::vector<int32_t> prompt;
    for (int i = 0; i < 40; ++i) prompt.push_back(int32_t(1 + (i * 7) % 500));
    auto turn = [](Client &c, uint64_t session, std::vector<int32_t> toks, uint32_t max_tokens, size_t *streamed) {
        GenerateRequest req;
        req.session = session;
        req.kind = GenerateRequest::Prompt::Tokens;
        req.tokens = std::move(toks);
        req.max_tokens = max_tokens;
        req.ignore_eos = true;
        ds4::client::GenerateCallbacks cb;
        cb.on_chunk = [&](const ds4::client::Chunk &ch) {
            *streamed += ch.tokens.size();
            return true;
        };
        return c.generate(req, cb);
    };
    auto expect_full = [&](Client &c, uint64_t session) {
        size_t n = 0;
        try {
            turn(c, session, {7}, 4, &n);
            ADD_FAILURE() << "a turn on a full session was accepted";
        } catch (const ServerError &e) {
            EXPECT_EQ(e.code_name, "ContextOverflow");
            EXPECT_NE(std::string(e.what()).find("context of " + std::to_string(kCtx) + " tokens is full"),
                      std::string::npos)
                << e.what();
        }
    };
    {
        Daemon d;
        ASSERT_EQ(start(d, state, ctx_arg), "");
        Client c(d.socket);
        const uint64_t s = c.open_session("full").id;
        size_t streamed = 0;
        DoneInfo done = turn(c, s, prompt, 1000, &streamed);
        EXPECT_EQ(done.reason, ds4::client::FinishReason::Context);
        EXPECT_EQ(done.generated_tokens, kCtx - prompt.size());
        EXPECT_EQ(streamed, kCtx - prompt.size());
        auto list = c.list_sessions();
        ASSERT_EQ(list.size(), 1u);
        EXPECT_EQ(list[0].n_tokens, kCtx) << "the live history holds more than its context";
        EXPECT_EQ(list[0].stored_tokens, kCtx);
        EXPECT_EQ(list[0].save_error, "");
        expect_full(c, s);
        // The ds4 command says why an answer stopped short, and exits 6 (cut short, issue 22).
        CmdResult cli = run_cmd({DS4_CLI_PATH, "--socket", d.socket, "run", "--ids", "--max-tokens", "1000", "hello"},
                                dir->path);
        EXPECT_EQ(cli.rc, 6) << cli.err;
        EXPECT_NE(cli.err.find("ds4: the answer stopped because the context is full"), std::string::npos) << cli.err;
        EXPECT_EQ(d.stop(SIGTERM), 0);
    }
    {
        Daemon d;
        ASSERT_EQ(start(d, state, ctx_arg), "");
        Client c(d.socket);
        ds4::client::SessionInfo s;
        try {
            s = c.open_session("full");
        } catch (const ServerError &e) {
            FAIL() << "the full session does not reopen: " << e.what();
        }
        EXPECT_FALSE(s.created);
        EXPECT_EQ(s.n_tokens, kCtx);
        EXPECT_EQ(s.ctx, kCtx);
        expect_full(c, s.id);
        // Asking for a larger context enlarges the live session; it goes on from its state.
        ds4::client::SessionInfo big = c.open_session("full", 2 * kCtx);
        EXPECT_EQ(big.id, s.id);
        EXPECT_EQ(big.ctx, 2 * kCtx);
        size_t streamed = 0;
        DoneInfo done = turn(c, s.id, {5, 6, 7}, 3, &streamed);
        EXPECT_EQ(done.reason, ds4::client::FinishReason::Length);
        EXPECT_EQ(done.cached_tokens, kCtx) << "the stored state was not used";
        EXPECT_EQ(c.list_sessions().at(0).stored_tokens, kCtx + 6);
        EXPECT_EQ(d.stop(SIGTERM), 0);
    }
    Daemon d;
    ASSERT_EQ(start(d, state, ctx_arg), "");
    Client c(d.socket);
    try {
        c.open_session("full", 32);
        ADD_FAILURE() << "a session of " << kCtx + 6 << " tokens opened in a context of 32";
    } catch (const ServerError &e) {
        EXPECT_EQ(e.code_name, "ContextOverflow");
        EXPECT_NE(std::string(e.what()).find("holds " + std::to_string(kCtx + 6) + " tokens"), std::string::npos)
            << e.what();
    }
    ds4::client::SessionInfo s = c.open_session("full");
    EXPECT_EQ(s.ctx, 2 * kCtx) << "a stored session reopens in the context it was saved with";
    EXPECT_EQ(s.n_tokens, kCtx + 6);
    EXPECT_EQ(d.stop(SIGTERM), 0);
}

// When the store's budget evicts a named session, a client that reopens the name is told
// (SessionOpened.evicted, LoadSession's error, the ds4 command's warning, the list of
// recently evicted names), across restarts, until the name is stored again.
TEST_F(PersistE2E, ReopeningASessionTheBudgetEvictedSaysSo) {
    const std::string state = dir->path + "/evict";
    uint64_t bytes = 0;
    {
        Daemon d;
        ASSERT_EQ(start(d, state), "");
        Client c(d.socket);
        // Four turns: about as long as the ds4 command's turn below (payloads grow with tokens).
        const uint64_t s = c.open_session("a").id;
        for (int i = 0; i < 4; ++i) run_turn(c, s, i);
        bytes = c.save_session("a").bytes;
        EXPECT_EQ(d.stop(SIGTERM), 0);
    }
    const std::vector<std::string> budget = {"--store-budget", std::to_string(bytes + bytes / 2)};  // room for one
    {
        Daemon d;
        ASSERT_EQ(start(d, state, budget), "");
        Client c(d.socket);
        const uint64_t s = c.open_session("b").id;
        for (int i = 0; i < 4; ++i) run_turn(c, s, i);  // the first save evicts a, not live here
        std::vector<ds4::client::EvictedSession> evicted;
        auto list = c.list_sessions(&evicted);
        ASSERT_EQ(list.size(), 1u);
        EXPECT_EQ(list[0].name, "b");
        ASSERT_EQ(evicted.size(), 1u);
        EXPECT_EQ(evicted[0].name, "a");
        EXPECT_GT(evicted[0].evicted_unix, 0u);
        EXPECT_NE(evicted[0].reason.find("while saving session 'b'"), std::string::npos) << evicted[0].reason;
        try {
            c.load_session("a");
            ADD_FAILURE() << "an evicted session loaded";
        } catch (const ServerError &e) {
            EXPECT_EQ(e.code_name, "UnknownSession");
            EXPECT_NE(std::string(e.what()).find("was evicted"), std::string::npos) << e.what();
        }
        ds4::client::SessionInfo a = c.open_session("a");
        EXPECT_TRUE(a.created);
        EXPECT_EQ(a.n_tokens, 0u);
        EXPECT_NE(a.evicted.find("stored session 'a' was evicted on "), std::string::npos) << a.evicted;
        EXPECT_NE(a.evicted.find("budget of " + budget[1] + " bytes"), std::string::npos) << a.evicted;
        EXPECT_EQ(c.open_session("b").evicted, "");
        EXPECT_EQ(d.stop(SIGTERM), 0);
    }
    // After a restart (a was opened but never stored again) the ds4 command warns; its turn
    // stores a again, which evicts b.
    Daemon d;
    ASSERT_EQ(start(d, state, budget), "");
    auto ds4 = [&](std::vector<std::string> args) {
        args.insert(args.begin(), {DS4_CLI_PATH, "--socket", d.socket});
        return run_cmd(args, dir->path);
    };
    // --chat: the turn's size (the chat template around "hi") is what makes storing a evict b.
    CmdResult r = ds4({"run", "--chat", "--session", "a", "--max-tokens", "2", "hi"});
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.err.find("ds4: warning: stored session 'a' was evicted on "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("session a starts again, empty"), std::string::npos) << r.err;
    Client c(d.socket);
    EXPECT_EQ(c.open_session("a").evicted, "") << "a is stored again";
    CmdResult list = ds4({"sessions", "list"});
    ASSERT_EQ(list.rc, 0) << list.err;
    const size_t at = list.out.find("recently evicted");
    ASSERT_NE(at, std::string::npos) << list.out;
    EXPECT_NE(list.out.find("\nb ", at), std::string::npos) << list.out;
    EXPECT_NE(list.out.find("while saving session 'a'", at), std::string::npos) << list.out;
    EXPECT_EQ(d.stop(SIGTERM), 0);
}

}  // namespace

#endif
