// The DeepSeek-V4 chat format, written out by hand from DeepSeek's encoding_dsv4
// (encode_messages, drop_thinking=True); the HF-tokenized conversations are in
// hf_fixture_test.cpp.
#include <gtest/gtest.h>

#include "engine/common/error.h"
#include "engine/tokenizer/chat_template.h"

namespace ds4::tok {
namespace {

const std::string B = "<｜begin▁of▁sentence｜>", E = "<｜end▁of▁sentence｜>", U = "<｜User｜>",
                  A = "<｜Assistant｜>", T = "<think>", ET = "</think>";

ChatMessage sys(std::string c) { return {ChatRole::System, std::move(c), ""}; }
ChatMessage user(std::string c) { return {ChatRole::User, std::move(c), ""}; }
ChatMessage asst(std::string c, std::string r = "") { return {ChatRole::Assistant, std::move(c), std::move(r)}; }

ChatOptions thinking(bool on) {
    ChatOptions o;
    o.thinking = on;
    return o;
}

TEST(ChatTemplate, ThinkingOffClosesEveryReplyMarkerWithEndThink) {
    EXPECT_EQ(render_chat({sys("S"), user("hi")}), B + "S" + U + "hi" + A + ET);
    EXPECT_EQ(render_chat({user("q1"), asst("a1"), user("q2")}), B + U + "q1" + A + ET + "a1" + E + U + "q2" + A + ET);
    // Reasoning is never written with thinking off.
    EXPECT_EQ(render_chat({user("q"), asst("a", "why")}), B + U + "q" + A + ET + "a" + E);
}

TEST(ChatTemplate, ThinkingOnOpensTheLastReplyAndDropsEarlierReasoning) {
    EXPECT_EQ(render_chat({user("q")}, thinking(true)), B + U + "q" + A + T);
    EXPECT_EQ(render_chat({user("q1"), asst("a1", "r1"), user("q2")}, thinking(true)),
              B + U + "q1" + A + ET + "a1" + E + U + "q2" + A + T);
    EXPECT_EQ(render_chat({user("q1"), asst("a1", "r1"), user("q2"), asst("a2", "r2")}, thinking(true)),
              B + U + "q1" + A + ET + "a1" + E + U + "q2" + A + T + "r2" + ET + "a2" + E);
}

TEST(ChatTemplate, ConsecutiveUserTurnsShareOneReplyMarker) {
    EXPECT_EQ(render_chat({user("a"), user("b")}), B + U + "a" + U + "b" + A + ET);
    EXPECT_EQ(render_chat({sys("x"), sys("y")}), B + "xy");
}

TEST(ChatTemplate, BosCanBeLeftOut) {
    ChatOptions o;
    o.add_bos = false;
    EXPECT_EQ(render_chat({user("hi")}, o), U + "hi" + A + ET);
    EXPECT_EQ(render_chat({}, o), "");
}

TEST(ChatTemplate, RolesByName) {
    EXPECT_EQ(chat_role_from_name("system"), ChatRole::System);
    EXPECT_EQ(chat_role_from_name("user"), ChatRole::User);
    EXPECT_EQ(chat_role_from_name("assistant"), ChatRole::Assistant);
    EXPECT_THROW(chat_role_from_name("tool"), ds4::Error);
}

}  // namespace
}  // namespace ds4::tok
