// The `ds4` command line (client/cli_args): defects a new user hit, each pinned here.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "client/cli_args.h"

using ds4::client::CliArgs;
using ds4::client::parse_cli;
using ds4::client::UsageError;
using ds4::client::usage_text;

namespace {

CliArgs parse(std::vector<std::string> args) {
    args.insert(args.begin(), "ds4");
    std::vector<const char *> av;
    for (const auto &a : args) av.push_back(a.c_str());
    return parse_cli(int(av.size()), av.data());
}

std::string usage_error(std::vector<std::string> args) {
    try {
        parse(std::move(args));
    } catch (const UsageError &e) {
        return e.what();
    }
    return "(accepted)";
}

}  // namespace

TEST(CliArgs, SessionsWithoutSubcommandLists) {
    CliArgs a = parse({"sessions"});
    EXPECT_EQ(a.command, CliArgs::Command::Sessions);
    EXPECT_EQ(a.sessions_op, CliArgs::SessionsOp::List);
    EXPECT_NE(usage_error({"sessions", "save"}).find("needs a NAME"), std::string::npos);
    EXPECT_NE(usage_error({"sessions", "--unpin"}).find("--unpin"), std::string::npos);
}

TEST(CliArgs, RawWithThinkIsRefused) {
    EXPECT_NE(usage_error({"run", "--raw", "--think", "x"}).find("--think"), std::string::npos);
    EXPECT_NE(usage_error({"run", "--raw", "--chat", "x"}).find("--chat"), std::string::npos);
    EXPECT_NO_THROW(parse({"run", "--think", "x"}));
}

TEST(CliArgs, RangeMessagesPrintPlainNumbers) {
    const std::string e = usage_error({"run", "--temperature", "500", "x"});
    EXPECT_NE(e.find("[0, 100]"), std::string::npos) << e;
    EXPECT_EQ(e.find("000000"), std::string::npos) << e;
    const std::string p = usage_error({"run", "--top-p", "2", "x"});
    EXPECT_NE(p.find("[0, 1]"), std::string::npos) << p;
}

TEST(CliArgs, SeedIsRandomUnlessGiven) {
    EXPECT_FALSE(parse({"run", "x"}).seed_set);
    CliArgs a = parse({"run", "--seed", "42", "x"});
    EXPECT_TRUE(a.seed_set);
    EXPECT_EQ(a.seed, 42u);
}

TEST(CliArgs, TokenizeDashMeansStdin) {
    EXPECT_EQ(parse({"tokenize", "-"}).prompt, "-");
}

TEST(CliArgs, VersionAndHelp) {
    EXPECT_EQ(parse({"--version"}).command, CliArgs::Command::Version);
    EXPECT_EQ(parse({"run", "--version"}).command, CliArgs::Command::Version);
    EXPECT_EQ(parse({"--help"}).command, CliArgs::Command::Help);
    const std::string u = ds4::client::usage_text();
    for (const char *w : {"--version", "--chat", "DS4_SOCKET", "130", "/set"}) EXPECT_NE(u.find(w), std::string::npos) << w;
}

TEST(CliArgs, ChatSetUsesTheCommandLineRules) {
    CliArgs a;
    ds4::client::set_sampling_option(a, "temperature", "0.5");
    EXPECT_FLOAT_EQ(a.temperature, 0.5f);
    ds4::client::set_sampling_option(a, "max_tokens", "7");
    EXPECT_EQ(a.max_tokens, 7u);
    ds4::client::set_sampling_option(a, "top-k", "3");
    EXPECT_EQ(a.top_k, 3);
    EXPECT_THROW(ds4::client::set_sampling_option(a, "temperature", "-1"), UsageError);
    EXPECT_THROW(ds4::client::set_sampling_option(a, "colour", "1"), UsageError);
    EXPECT_FLOAT_EQ(a.temperature, 0.5f) << "a refused value changes nothing";
}

TEST(CliArgs, RepetitionControlsAndLogitBias) {
    CliArgs a = parse({"run", "--repeat-penalty", "1.3", "--repeat-last-n", "-1", "--frequency-penalty", "-0.5",
                       "--presence-penalty", "2", "--logit-bias", "7=-100", "--logit-bias", "12=2.5", "x"});
    EXPECT_FLOAT_EQ(a.repeat_penalty, 1.3f);
    EXPECT_EQ(a.repeat_last_n, -1);
    EXPECT_FLOAT_EQ(a.frequency_penalty, -0.5f);
    EXPECT_FLOAT_EQ(a.presence_penalty, 2.0f);
    const std::vector<std::pair<int32_t, float>> bias = {{7, -100.0f}, {12, 2.5f}};
    EXPECT_EQ(a.logit_bias, bias);
    CliArgs d = parse({"run", "x"});
    EXPECT_FLOAT_EQ(d.repeat_penalty, 1.0f);
    EXPECT_EQ(d.repeat_last_n, 64);
    EXPECT_TRUE(d.logit_bias.empty());
    EXPECT_NE(usage_error({"run", "--repeat-penalty", "0", "x"}).find("--repeat-penalty"), std::string::npos);
    EXPECT_NE(usage_error({"run", "--repeat-last-n", "-2", "x"}).find("--repeat-last-n"), std::string::npos);
    EXPECT_NE(usage_error({"run", "--frequency-penalty", "2.1", "x"}).find("[-2, 2]"), std::string::npos);
    EXPECT_NE(usage_error({"run", "--logit-bias", "7", "x"}).find("TOKEN_ID=BIAS"), std::string::npos);
    EXPECT_NE(usage_error({"run", "--logit-bias", "7=1", "--logit-bias", "7=2", "x"}).find("twice"), std::string::npos);
    EXPECT_NE(usage_error({"run", "--logit-bias", "7=1e9", "x"}).find("bias"), std::string::npos);
    // chat's /set takes the same keys and rules.
    CliArgs c;
    ds4::client::set_sampling_option(c, "repeat_penalty", "1.1");
    ds4::client::set_sampling_option(c, "logit_bias", "3=1");
    EXPECT_FLOAT_EQ(c.repeat_penalty, 1.1f);
    EXPECT_EQ(c.logit_bias.size(), 1u);
    EXPECT_THROW(ds4::client::set_sampling_option(c, "presence_penalty", "9"), UsageError);
}

TEST(CliArgs, LogprobsAndTheTemplateChoice) {
    EXPECT_EQ(parse({"run", "x"}).logprobs, -1);
    EXPECT_EQ(parse({"run", "--logprobs", "0", "x"}).logprobs, 0);
    EXPECT_EQ(parse({"run", "--logprobs", "20", "x"}).logprobs, 20);
    EXPECT_NE(usage_error({"run", "--logprobs", "21", "x"}).find("--logprobs"), std::string::npos);
    EXPECT_NE(usage_error({"run", "--logprobs", "-1", "x"}).find("--logprobs"), std::string::npos);
    EXPECT_NE(usage_error({"run", "--logprobs", "1", "--ids", "x"}).find("--ids"), std::string::npos);
    EXPECT_NE(usage_error({"chat", "--logprobs", "1"}).find("--logprobs"), std::string::npos);
    EXPECT_TRUE(parse({"run", "--json", "x"}).json);
    EXPECT_NE(usage_error({"run", "--json", "--think", "x"}).find("--json"), std::string::npos);
    EXPECT_NE(usage_error({"run", "--json", "--max-tokens", "1", "x"}).find("--max-tokens"), std::string::npos);
    EXPECT_NE(usage_error({"chat", "--json"}).find("--json"), std::string::npos);
    // Neither --raw nor --chat: the model decides at run time.
    const CliArgs a = parse({"run", "x"});
    EXPECT_FALSE(a.raw);
    EXPECT_FALSE(a.chat_template);
    EXPECT_TRUE(parse({"run", "--chat", "x"}).chat_template);
    // --help documents both and the model-dependent default.
    const std::string help = usage_text();
    for (const char *w : {"--raw", "--chat", "--logprobs N", "chat template"})
        EXPECT_NE(help.find(w), std::string::npos) << w;
}
