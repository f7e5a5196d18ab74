// The `ds4` command against a real ds4d: the rough edges a new user hit (issue 22), each
// pinned by a test that failed before its fix.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "bridge/ds4.hpp"
#include "tests/daemon/e2e_support.h"

using namespace e2e;

namespace {

constexpr int kCtx = 64;

class CliE2E : public ::testing::Test {
protected:
    static inline TempDir *dir = nullptr;
    static inline std::string model_path;
    static inline Daemon *daemon = nullptr;

    static void SetUpTestSuite() {
        dir = new TempDir;
        model_path = dir->path + "/tiny.gguf";
        CmdResult mk = run_cmd({DS4_MAKE_MODEL_PATH, "--preset", "tiny", "--quiet", model_path}, dir->path);
        ASSERT_EQ(mk.rc, 0) << mk.err;
        daemon = new Daemon;
        ASSERT_EQ(daemon->start(DS4D_PATH, model_path, dir->path + "/ds4.sock", dir->path + "/ds4d.log",
                                {"--ctx", std::to_string(kCtx), "--state-dir", dir->path + "/state"}),
                  "");
    }
    static void TearDownTestSuite() {
        if (daemon) {
            EXPECT_EQ(daemon->stop(SIGTERM), 0);
        }
        delete daemon;
        delete dir;
        daemon = nullptr;
        dir = nullptr;
    }
    void SetUp() override {
        if (!daemon || daemon->pid < 0) GTEST_SKIP() << "suite set-up failed";
    }
    static std::vector<std::string> cli(std::vector<std::string> args) {
        args.insert(args.begin(), {DS4_CLI_PATH, "--socket", daemon->socket});
        return args;
    }
};

TEST_F(CliE2E, SessionsWithoutSubcommandLists) {
    CmdResult r = run_cmd(cli({"sessions"}), dir->path);
    EXPECT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.out.find("NAME"), std::string::npos) << r.out;
}

TEST_F(CliE2E, TokenizeDashReadsStdin) {
    const std::string text = "Hello there";
    CmdResult direct = run_cmd(cli({"tokenize", text}), dir->path);
    CmdResult piped = run_cmd(cli({"tokenize", "-"}), dir->path, text);
    ASSERT_EQ(direct.rc, 0) << direct.err;
    ASSERT_EQ(piped.rc, 0) << piped.err;
    EXPECT_EQ(piped.out, direct.out);
    EXPECT_GT(direct.out.size(), 2u);
}

TEST_F(CliE2E, RunCutAtTheContextLimitSaysSoAndExitsNonZero) {
    CmdResult r = run_cmd(cli({"run", "--raw", "--ids", "--ignore-eos", "--max-tokens", "1000", "x"}), dir->path);
    EXPECT_EQ(r.rc, 6) << r.err;
    EXPECT_NE(r.err.find("context is full"), std::string::npos) << r.err;
    // The answer itself is printed in full up to the limit: prompt + answer == the context.
    size_t ids = 0;
    for (size_t i = 0; i < r.out.size(); ++i) ids += r.out[i] != ' ' && r.out[i] != '\n' && (i == 0 || r.out[i - 1] == ' ');
    EXPECT_EQ(ids + 1, size_t(kCtx)) << r.out;
    // A limit the user set (--max-tokens) is not a cut: exit 0.
    CmdResult ok = run_cmd(cli({"run", "--raw", "--max-tokens", "3", "x"}), dir->path);
    EXPECT_EQ(ok.rc, 0) << ok.err;
}

TEST_F(CliE2E, SamplingSeedIsRandomUnlessGiven) {
    auto run = [&](std::vector<std::string> extra) {
        std::vector<std::string> a = {"run", "--raw", "--ids", "--temperature", "1", "--max-tokens", "24"};
        a.insert(a.end(), extra.begin(), extra.end());
        a.push_back("Zebras");
        CmdResult r = run_cmd(cli(a), dir->path);
        EXPECT_EQ(r.rc, 0) << r.err;
        return r.out;
    };
    const std::string s1 = run({"--seed", "5"}), s2 = run({"--seed", "5"});
    EXPECT_EQ(s1, s2) << "--seed makes sampling repeatable";
    const std::string r1 = run({}), r2 = run({}), r3 = run({});
    EXPECT_FALSE(r1 == r2 && r2 == r3) << "three unseeded runs sampled the same 24 tokens: " << r1;
}

TEST_F(CliE2E, RawWithThinkIsAUsageError) {
    CmdResult r = run_cmd(cli({"run", "--raw", "--think", "x"}), dir->path);
    EXPECT_EQ(r.rc, 2);
    EXPECT_NE(r.err.find("--think"), std::string::npos) << r.err;
}

TEST_F(CliE2E, RefusedConnectionSaysHowToStartDs4d) {
    CmdResult r = run_cmd({DS4_CLI_PATH, "--socket", dir->path + "/nobody.sock", "stats"}, dir->path);
    EXPECT_EQ(r.rc, 3);
    EXPECT_NE(r.err.find("ds4d --model"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("systemctl --user start ds4d.socket"), std::string::npos) << r.err;
}

TEST_F(CliE2E, SocketFromTheEnvironment) {
    ::setenv("DS4_SOCKET", daemon->socket.c_str(), 1);
    CmdResult r = run_cmd({DS4_CLI_PATH, "stats"}, dir->path);
    ::unsetenv("DS4_SOCKET");
    EXPECT_EQ(r.rc, 0) << r.err;
}

TEST_F(CliE2E, ChatSlashCommands) {
    ds4::bridge::ModelOptions mo;
    mo.model_path = model_path;
    mo.n_threads = 1;
    ds4::bridge::Model model(mo);
    const size_t joined = model.render_chat({{"user", "one\ntwo"}}).size();
    const std::string in =
        "/set max_tokens 3\n/set\none\\\ntwo\n/save chat-one\n/reset\n/load chat-one\n/set temperature 500\n"
        "/bogus\n/help\n/load no-such-session\n/exit\nnot sent\n";
    CmdResult r = run_cmd(cli({"chat"}), dir->path, in);
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_NE(r.out.find("[max_tokens = 3]"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("max_tokens 3, seed random"), std::string::npos) << r.out;
    // The backslash joined two lines into one user turn: the saved session holds that one
    // turn (rendered) and an answer of at most 3 tokens.
    const size_t at = r.out.find("[saved chat-one: ");
    ASSERT_NE(at, std::string::npos) << r.out;
    const size_t n = std::strtoul(r.out.c_str() + at + 17, nullptr, 10);
    EXPECT_GE(n, joined) << r.out;
    EXPECT_LE(n, joined + 3) << r.out;
    EXPECT_NE(r.out.find("[new conversation]"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("[loaded chat-one: " + std::to_string(n) + " tokens]"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("needs a number in [0, 100]"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("unknown or incomplete command /bogus"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("/reset"), std::string::npos) << "help lists the commands";
    EXPECT_NE(r.out.find("no-such-session"), std::string::npos) << "a failed /load is reported, chat goes on";
    CmdResult list = run_cmd(cli({"sessions"}), dir->path);
    EXPECT_NE(list.out.find("chat-one"), std::string::npos) << list.out;
}

TEST_F(CliE2E, RunCancelledByDaemonShutdownExitsNonZero) {
    // A daemon of its own (this one is stopped): a long generation, then SIGTERM with no grace.
    TempDir d;
    Daemon own;
    ASSERT_EQ(own.start(DS4D_PATH, model_path, d.path + "/ds4.sock", d.path + "/ds4d.log",
                        {"--shutdown-grace-ms", "0"}),
              "");
    const std::string out = d.path + "/run.out", err = d.path + "/run.err";
    pid_t pid = spawn({DS4_CLI_PATH, "--socket", own.socket, "run", "--raw", "--ids", "--ignore-eos", "--max-tokens", "100000", "x"},
                      out, err);
    ASSERT_GT(pid, 0);
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (read_file(out).empty() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(own.stop(SIGTERM), 0);
    const int rc = wait_exit(pid, 30000);
    if (rc == 0) GTEST_SKIP() << "the generation finished before the shutdown reached it";
    EXPECT_EQ(rc, 6) << read_file(err);
    EXPECT_NE(read_file(err).find("cancelled by ds4d"), std::string::npos) << read_file(err);
}

TEST_F(CliE2E, RunInterruptedByCtrlCExits130) {
    TempDir d;
    const std::string out = d.path + "/run.out", err = d.path + "/run.err";
    // Its own session context (the suite's is 64 tokens): long enough to be interrupted.
    Daemon own;
    ASSERT_EQ(own.start(DS4D_PATH, model_path, d.path + "/ds4.sock", d.path + "/ds4d.log", {}), "");
    pid_t pid = spawn({DS4_CLI_PATH, "--socket", own.socket, "run", "--raw", "--ids", "--ignore-eos", "--max-tokens",
                       "100000", "x"},
                      out, err);
    ASSERT_GT(pid, 0);
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (read_file(out).empty() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    kill(pid, SIGINT);
    const int rc = wait_exit(pid, 30000);
    if (rc == 6 && read_file(err).find("context is full") != std::string::npos)
        GTEST_SKIP() << "the generation filled the context before the interrupt reached it";
    EXPECT_EQ(rc, 130) << read_file(err);
    EXPECT_EQ(read_file(err).find("cancelled by ds4d"), std::string::npos) << read_file(err);
}

TEST(Tools, HelpExitsZeroAndVersionWorks) {
    for (const char *exe : {DS4_BENCH_QUANT_PATH, DS4_CLI_PATH, DS4D_PATH, DS4_MAKE_MODEL_PATH}) {
        TempDir d;
        CmdResult h = run_cmd({exe, "--help"}, d.path);
        EXPECT_EQ(h.rc, 0) << exe << ": " << h.err;
        EXPECT_NE(h.out.find("usage"), std::string::npos) << exe;
        CmdResult v = run_cmd({exe, "--version"}, d.path);
        EXPECT_EQ(v.rc, 0) << exe;
        EXPECT_NE(v.out.find("git"), std::string::npos) << exe << ": " << v.out;
        CmdResult bad = run_cmd({exe, "--no-such-option"}, d.path);
        EXPECT_EQ(bad.rc, 2) << exe << ": usage errors exit 2";
    }
}

}  // namespace
