// The `ds4` command against a real ds4d: the rough edges a new user hit (issue 22), each
// pinned by a test that failed before its fix.
#include <gtest/gtest.h>

#include <cmath>
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

// A model without a chat template (the tiny one; the default model is such a raw model) is
// completed as plain text unless --chat says otherwise; one with a template gets chat.
TEST_F(CliE2E, RunUsesTheChatTemplateOnlyWhenTheModelHasOne) {
    auto ids = [&](std::vector<std::string> args, const std::string &sock) {
        args.insert(args.begin(), {DS4_CLI_PATH, "--socket", sock, "run", "--ids", "--max-tokens", "8"});
        args.push_back("def f(x):");
        CmdResult r = run_cmd(args, dir->path);
        EXPECT_EQ(r.rc, 0) << r.err;
        return r.out;
    };
    const std::string plain = ids({}, daemon->socket), raw = ids({"--raw"}, daemon->socket),
                      chat = ids({"--chat"}, daemon->socket);
    ASSERT_NE(raw, chat) << "the tiny model answers both prompts alike; the test cannot tell them apart";
    EXPECT_EQ(plain, raw) << "a model without a chat template is completed as plain text";
    // --think needs the template: on this model only with --chat.
    CmdResult think = run_cmd(cli({"run", "--think", "--max-tokens", "2", "x"}), dir->path);
    EXPECT_EQ(think.rc, 2);
    EXPECT_NE(think.err.find("no"), std::string::npos) << think.err;
    EXPECT_NE(think.err.find("--chat"), std::string::npos) << think.err;
    EXPECT_EQ(run_cmd(cli({"run", "--chat", "--think", "--max-tokens", "2", "x"}), dir->path).rc, 0);

    // The scripted fixture model has a chat template: chat by default.
    TempDir d;
    const std::string scripted = d.path + "/scripted.gguf";
    ASSERT_EQ(run_cmd({DS4_MAKE_MODEL_PATH, "--preset", "scripted", "--quiet", scripted}, d.path).rc, 0);
    Daemon own;
    ASSERT_EQ(own.start(DS4D_PATH, scripted, d.path + "/ds4.sock", d.path + "/ds4d.log", {}), "");
    const std::string s_plain = ids({}, own.socket), s_raw = ids({"--raw"}, own.socket),
                      s_chat = ids({"--chat"}, own.socket);
    ASSERT_NE(s_raw, s_chat);
    EXPECT_EQ(s_plain, s_chat) << "a model with a chat template gets chat by default";
    // The chat warns that a model without a template was not made for it.
    CmdResult c = run_cmd(cli({"chat", "--max-tokens", "2"}), dir->path, "hi\n");
    EXPECT_NE(c.err.find("no chat template"), std::string::npos) << c.err;
}

TEST_F(CliE2E, RunLogprobsPrintsOneJsonLinePerToken) {
    CmdResult ids = run_cmd(cli({"run", "--raw", "--ids", "--max-tokens", "6", "Hello"}), dir->path);
    CmdResult lp = run_cmd(cli({"run", "--raw", "--logprobs", "3", "--max-tokens", "6", "Hello"}), dir->path);
    ASSERT_EQ(ids.rc, 0) << ids.err;
    ASSERT_EQ(lp.rc, 0) << lp.err;
    std::vector<std::string> want;
    for (size_t i = 0; i < ids.out.size();) {
        const size_t j = ids.out.find_first_of(" \n", i);
        if (j > i) want.push_back(ids.out.substr(i, j - i));
        if (j == std::string::npos) break;
        i = j + 1;
    }
    // {"token":ID,"text":"...","logprob":X,"top":[{"token":ID,"text":"...","logprob":X},...]}
    std::vector<std::string> lines;
    for (size_t i = 0; i < lp.out.size();) {
        const size_t j = lp.out.find('\n', i);
        lines.push_back(lp.out.substr(i, j - i));
        if (j == std::string::npos) break;
        i = j + 1;
    }
    while (!lines.empty() && lines.back().empty()) lines.pop_back();
    ASSERT_EQ(lines.size(), want.size()) << lp.out;
    auto number_after = [](const std::string &l, const std::string &key, size_t from) {
        const size_t k = l.find("\"" + key + "\":", from);
        return k == std::string::npos ? std::string() : l.substr(k + key.size() + 3, l.find_first_of(",}]", k + key.size() + 3) - (k + key.size() + 3));
    };
    for (size_t i = 0; i < lines.size(); ++i) {
        const std::string &l = lines[i];
        EXPECT_EQ(number_after(l, "token", 0), want[i]) << l;
        const double p = std::stod(number_after(l, "logprob", 0));
        const size_t top = l.find("\"top\":[");
        ASSERT_NE(top, std::string::npos) << l;
        // Three alternatives, most likely first; greedy took the first.
        std::vector<double> tops;
        std::vector<std::string> top_ids;
        for (size_t k = top; (k = l.find("\"token\":", k + 1)) != std::string::npos;) {
            top_ids.push_back(number_after(l, "token", k));
            tops.push_back(std::stod(number_after(l, "logprob", k)));
        }
        ASSERT_EQ(tops.size(), 3u) << l;
        EXPECT_EQ(top_ids[0], want[i]) << l;
        EXPECT_DOUBLE_EQ(tops[0], p) << l;
        EXPECT_LE(p, 0.0);
        EXPECT_GE(tops[0], tops[1]);
        EXPECT_GE(tops[1], tops[2]);
        EXPECT_LE(std::exp(tops[0]) + std::exp(tops[1]) + std::exp(tops[2]), 1.0 + 1e-5) << l;
        EXPECT_NE(l.find("\"text\":\""), std::string::npos) << l;
    }
    EXPECT_EQ(run_cmd(cli({"run", "--logprobs", "21", "x"}), dir->path).rc, 2);
    EXPECT_EQ(run_cmd(cli({"run", "--logprobs", "2", "--ids", "x"}), dir->path).rc, 2);
}

// During a long prefill the request is running, not waiting, and the prefill rate is
// already measured (both read "1 queued" and "0.0 tok/s" before: the rates counted a request's
// time only once it finished).
TEST_F(CliE2E, StatsDuringPrefillShowTheRequestRunning) {
    TempDir d;
    Daemon own;
    ASSERT_EQ(own.start(DS4D_PATH, model_path, d.path + "/ds4.sock", d.path + "/ds4d.log",
                        {"--ctx", "4096", "--prefill-chunk", "8", "--max-batch", "1", "--step-tokens", "9"}),
              "");
    std::string prompt;
    for (int i = 0; i < 800; ++i) prompt.append("w").append(std::to_string(i % 97)).append(" ");   // ~3,400 tokens
    pid_t pid = spawn({DS4_CLI_PATH, "--socket", own.socket, "run", "--raw", "--max-tokens", "1", prompt},
                      d.path + "/run.out", d.path + "/run.err");
    ASSERT_GT(pid, 0);
    std::string seen;
    int rc = -1;
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < deadline) {
        CmdResult st = run_cmd({DS4_CLI_PATH, "--socket", own.socket, "stats"}, d.path);
        ASSERT_EQ(st.rc, 0) << st.err;
        // A stream line "request N (one-shot) prefill DONE/TOTAL tokens" with DONE > 0.
        const size_t line = st.out.find("(one-shot)");
        const size_t p = line == std::string::npos ? line : st.out.find("prefill ", line);
        if (p != std::string::npos && st.out.compare(p + 8, 2, "0/") != 0) {
            seen = st.out;
            break;
        }
        if ((rc = wait_exit(pid, 0)) != -1) break;   // finished before a poll caught it
    }
    if (rc == -1) rc = wait_exit(pid, 60000);
    EXPECT_EQ(rc, 0) << read_file(d.path + "/run.err");
    if (seen.empty()) GTEST_SKIP() << "the prefill finished before ds4 stats saw it";
    EXPECT_NE(seen.find("now 1 running (1 in prefill), 0 waiting"), std::string::npos) << seen;
    EXPECT_EQ(seen.find("prefill 0.0 tok/s"), std::string::npos) << seen;
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
