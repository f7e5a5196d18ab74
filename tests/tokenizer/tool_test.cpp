// ds4-tokenize, run as a program on a GGUF written like the converter writes it: its one
// line of ids must be HF's for the fixture texts, and --decode must give the text back.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>

#include "tests/tokenizer/tok_test_util.h"

namespace ds4::tok::test {
namespace {

struct ToolRun {
    int status;
    std::string out;
};

ToolRun run_tool(const std::string &args) {
    std::string cmd = std::string(DS4_TOKENIZE_BIN) + " " + args + " 2>/dev/null";
    FILE *p = popen(cmd.c_str(), "r");
    if (!p) return {-1, ""};
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    int st = pclose(p);
    return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

std::string line_of(const std::vector<int32_t> &ids) {
    std::string s;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i) s += ' ';
        s += std::to_string(ids[i]);
    }
    return s + "\n";
}

TEST(Ds4Tokenize, PrintsHfIdsForTheFixtureTexts) {
    TempDir dir;
    gguf::Writer w;
    w.set("general.architecture", gguf::Value::str("deepseek4"));
    write_tokenizer_from_hf_json(w, fixture("a/tokenizer.json"), 4096 + 128);
    const std::string model = dir.file("m.gguf");
    w.write(model);
    auto exp = load_json(fixture("a/expected.json"));
    int n = 0;
    for (const auto &t : exp["texts"]) {
        if (n++ % 20) continue;   // every twentieth: each run is a process
        const std::string text = t["text"].get<std::string>();
        const std::string in = dir.file("in.txt"), ids = dir.file("ids.txt");
        std::ofstream(in, std::ios::binary) << text;
        ToolRun plain = run_tool("-m " + model + " --file " + in);
        ASSERT_EQ(plain.status, 0);
        EXPECT_EQ(plain.out, line_of(ids_of(t["plain"]))) << t["name"];
        ToolRun special = run_tool("-m " + model + " --special --file " + in);
        ASSERT_EQ(special.status, 0);
        EXPECT_EQ(special.out, line_of(ids_of(t["special"]))) << t["name"];
        std::ofstream(ids, std::ios::binary) << special.out;
        ToolRun back = run_tool("-m " + model + " --decode --file " + ids);
        ASSERT_EQ(back.status, 0);
        EXPECT_EQ(back.out, text) << t["name"];
    }
    ToolRun txt = run_tool("--hf-json " + fixture("a/tokenizer.json") + " --text 'Hello world'");
    EXPECT_EQ(txt.status, 0);
    EXPECT_EQ(txt.out, run_tool("-m " + model + " --text 'Hello world'").out);
}

TEST(Ds4Tokenize, FailsCleanly) {
    TempDir dir;
    EXPECT_EQ(run_tool("").status, 2);
    EXPECT_EQ(run_tool("-m x.gguf").status, 2);                             // no input
    EXPECT_EQ(run_tool("-m x.gguf --hf-json y --text a").status, 2);        // two tokenizers
    EXPECT_EQ(run_tool("--bogus").status, 2);
    EXPECT_EQ(run_tool("-m " + dir.file("none.gguf") + " --text a").status, 1);
    EXPECT_EQ(run_tool("--hf-json " + fixture("a/tokenizer.json") + " --decode --text '1 x 2'").status, 1);
    EXPECT_EQ(run_tool("--hf-json " + fixture("a/tokenizer.json") + " --decode --text '99999999'").status, 1);
}

}  // namespace
}  // namespace ds4::tok::test
