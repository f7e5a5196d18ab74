// What the gateway remembers of a conversation for its later turns (gateway/conversation.h):
// the tools and json_schema of its first turn, which a later turn may leave out or repeat
// but not change, and the calls the next results answer.
#include <gtest/gtest.h>

#include "gateway/conversation.h"

using namespace ds4::gateway;

namespace {

Request chat(const std::string &fields) {
    return parse_request(Api::Chat, R"({"messages":[{"role":"user","content":"x"}])" + (fields.empty() ? "" : "," + fields) + "}");
}

const std::string kTools = R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}])";
const std::string kOtherTools = R"("tools":[{"type":"function","function":{"name":"g"}}])";
const std::string kSchema = R"("response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{"type":"object"}}})";

ConversationState first_turn(const Request &r, std::vector<std::string> reply_calls = {}) {
    return state_after(r, prompt_options_for(r, false, nullptr, ""), nullptr, reply_calls);
}

int status_of(const Request &r, const ConversationState *known) {
    try {
        prompt_options_for(r, true, known, "session 's'");
    } catch (const ApiError &e) {
        return e.status;
    }
    return 200;
}

}  // namespace

TEST(GatewayConversation, ToolsOfTheFirstTurnCount) {
    const ConversationState with = first_turn(chat(kTools), {"call_1", "call_2"});
    EXPECT_TRUE(with.header_known && with.tools);
    EXPECT_EQ(with.last_calls, (std::vector<std::string>{"call_1", "call_2"}));
    // Left out or sent again: the conversation has tools; the reply's calls come first.
    for (const std::string &f : {std::string(), kTools}) {
        const PromptOptions po = prompt_options_for(chat(f), true, &with, "session 's'");
        EXPECT_TRUE(po.continued && po.continued_tools) << f;
        EXPECT_EQ(po.prior_calls, with.last_calls) << f;
    }
    // Other tools, or tools for a conversation that began without: refused, naming 'tools'.
    EXPECT_EQ(status_of(chat(kOtherTools), &with), 400);
    const ConversationState without = first_turn(chat(""));
    EXPECT_EQ(status_of(chat(kTools), &without), 400);
    try {
        prompt_options_for(chat(kOtherTools), true, &with, "session 's'");
    } catch (const ApiError &e) {
        EXPECT_EQ(e.param, "tools");
        EXPECT_NE(std::string(e.what()).find("session 's'"), std::string::npos) << e.what();
    }
    // A conversation this gateway does not remember: the request's tools are taken as its own.
    EXPECT_TRUE(prompt_options_for(chat(kOtherTools), true, nullptr, "").continued_tools);
    EXPECT_FALSE(prompt_options_for(chat(""), true, nullptr, "").continued_tools);
    // A first turn is no continuation: nothing checked.
    EXPECT_FALSE(prompt_options_for(chat(kOtherTools), false, &with, "").continued);
}

TEST(GatewayConversation, SchemaOfTheFirstTurn) {
    const ConversationState s = first_turn(chat(kSchema));
    EXPECT_TRUE(s.format);
    EXPECT_EQ(status_of(chat(kSchema), &s), 200);
    EXPECT_EQ(status_of(chat(R"("response_format":{"type":"json_object"})"), &s), 200);
    EXPECT_EQ(status_of(chat(R"("response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{"type":"object","properties":{}}}})"), &s),
              400);
    EXPECT_EQ(status_of(chat(kSchema), nullptr), 200);
    const ConversationState none = first_turn(chat(""));
    EXPECT_EQ(status_of(chat(kSchema), &none), 400);
}

TEST(GatewayConversation, CallsTheNextResultsAnswer) {
    ConversationState s = first_turn(chat(kTools), {"a"});
    // A turn whose reply made no calls keeps the earlier ones; calls sent in the request
    // (an assistant message of the client's) replace them, and the reply's replace those.
    Request later = chat(kTools);
    ConversationState s2 = state_after(later, prompt_options_for(later, true, &s, ""), &s, {});
    EXPECT_EQ(s2.last_calls, (std::vector<std::string>{"a"}));
    EXPECT_TRUE(s2.header_known && s2.tools);
    Request with_calls = parse_request(Api::Chat, R"({"messages":[{"role":"assistant","content":null,"tool_calls":[
        {"id":"b","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"b","content":"r"}]})");
    EXPECT_EQ(state_after(with_calls, prompt_options_for(with_calls, true, &s, ""), &s, {}).last_calls,
              (std::vector<std::string>{"b"}));
    EXPECT_EQ(state_after(with_calls, prompt_options_for(with_calls, true, &s, ""), &s, {"c"}).last_calls,
              (std::vector<std::string>{"c"}));
    // Not remembered: still unknown afterwards, but the calls are known.
    ConversationState u = state_after(later, prompt_options_for(later, true, nullptr, ""), nullptr, {"d"});
    EXPECT_FALSE(u.header_known);
    EXPECT_EQ(u.last_calls, (std::vector<std::string>{"d"}));
}

TEST(GatewayConversation, SessionStatesForgetTheLeastRecentlyUsed) {
    SessionStates m(2);
    ConversationState a;
    a.last_calls = {"a"};
    m.put("a", a, 10);
    m.put("b", {}, 5);
    EXPECT_TRUE(m.find("a", 10));   // a is now the most recently used
    m.put("c", {}, 7);
    EXPECT_FALSE(m.find("b", 5));
    EXPECT_EQ(m.find("a", 10)->last_calls, (std::vector<std::string>{"a"}));
    // Found at another length, the session was changed elsewhere: not known.
    EXPECT_FALSE(m.find("a", 11));
    EXPECT_TRUE(m.find("c", 7));
    m.erase("c");
    EXPECT_FALSE(m.find("c", 7));
}
