// The DSML renderer and the streaming parser of the HTTP front: the chat format against
// the engine's own template and DeepSeek's encoding rules, and the parser against the
// renderer (what the front writes into a prompt, it reads back the same from the model).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "engine/tokenizer/chat_template.h"
#include "gateway/conversation.h"
#include "gateway/dsml.h"
#include "gateway/translate.h"

using namespace ds4::gateway;

namespace {

struct Parsed {
    std::string text, reasoning;
    std::vector<std::string> names, args;
    std::vector<size_t> arg_events;   // ToolArgs events per call
};

Parsed parse(const std::string &s, bool tools, bool thinking, size_t step) {
    DsmlParser p(tools, thinking);
    std::vector<DsmlEvent> evs;
    for (size_t i = 0; i < s.size(); i += step) p.feed(std::string_view(s).substr(i, step), evs);
    p.finish(evs);
    Parsed r;
    for (auto &e : evs) {
        switch (e.kind) {
        case DsmlEvent::Kind::Text: r.text += e.text; break;
        case DsmlEvent::Kind::Reasoning: r.reasoning += e.text; break;
        case DsmlEvent::Kind::ToolStart:
            r.names.push_back(e.text);
            r.args.emplace_back();
            r.arg_events.push_back(0);
            break;
        case DsmlEvent::Kind::ToolArgs:
            r.args.back() += e.text;
            ++r.arg_events.back();
            break;
        case DsmlEvent::Kind::ToolEnd: break;
        }
    }
    return r;
}

// The assistant turn's text as render_prompt writes it, between the generation prompt
// and the end-of-sentence token.
std::string rendered_reply(const Message &assistant) {
    std::vector<Message> conv = {{Role::User, "q", "", {}, ""}, assistant, {Role::User, "next", "", {}, ""}};
    PromptOptions o;
    o.tools = Json::array({Json{{"name", "f"}}});
    const std::string s = render_prompt(conv, o);
    const std::string open = std::string(kAssistant) + kEndThink;
    const size_t a = s.find(open) + open.size();
    return s.substr(a, s.find(kEos, a) - a);
}

}  // namespace

TEST(GatewayDsml, PlainChatMatchesTheEngineTemplate) {
    using ds4::tok::ChatMessage;
    using ds4::tok::ChatRole;
    const std::vector<std::pair<Role, ChatRole>> roles = {
        {Role::System, ChatRole::System}, {Role::User, ChatRole::User}, {Role::Assistant, ChatRole::Assistant},
        {Role::User, ChatRole::User}, {Role::Assistant, ChatRole::Assistant}, {Role::User, ChatRole::User}};
    for (bool thinking : {false, true}) {
        std::vector<Message> mine;
        std::vector<ChatMessage> theirs;
        for (size_t i = 0; i < roles.size(); ++i) {
            const std::string content = "turn " + std::to_string(i) + " <b>é\n";
            const std::string reasoning = roles[i].first == Role::Assistant ? "why " + std::to_string(i) : "";
            mine.push_back({roles[i].first, content, reasoning, {}, ""});
            theirs.push_back({roles[i].second, content, reasoning});
        }
        PromptOptions o;
        o.thinking = thinking;
        ds4::tok::ChatOptions co;
        co.thinking = thinking;
        EXPECT_EQ(render_prompt(mine, o), ds4::tok::render_chat(theirs, co)) << "thinking " << thinking;
    }
}

TEST(GatewayDsml, ToolsFollowTheReferenceEncoding) {
    // encode_messages of DeepSeek's encoding_dsv4 for this conversation, written out from
    // its templates: tools after the system prompt, the call as a DSML block after "\n\n",
    // the result merged into the next user turn, thinking kept because tools are present.
    Json fn = {{"name", "get_weather"}, {"description", "Weather"},
               {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}};
    std::vector<Message> conv = {
        {Role::System, "Be brief.", "", {}, ""},
        {Role::User, "Weather in Paris?", "", {}, ""},
        {Role::Assistant, "", "need data", {{"c1", "get_weather", R"({"city":"Paris","days":3,"opts":{"u":"C"}})"}}, ""},
        {Role::Tool, "sunny", "", {}, "c1"},
    };
    PromptOptions o;
    o.thinking = true;
    o.tools = Json::array({fn});
    const std::string want =
        std::string(kBos) + "Be brief.\n\n" + render_tools(o.tools) + kUser + "Weather in Paris?" + kAssistant + kThink +
        "need data" + kEndThink + "\n\n" + kToolCallsOpen + "\n" + kInvokeOpen + "get_weather\">\n" +
        "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
        "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
        "<｜DSML｜parameter name=\"opts\" string=\"false\">{\"u\": \"C\"}</｜DSML｜parameter>\n" +
        kInvokeClose + "\n" + kToolCallsClose + kEos + kUser + "<tool_result>sunny</tool_result>" + kAssistant + kThink;
    EXPECT_EQ(render_prompt(conv, o), want);
    const std::string tools = render_tools(o.tools);
    EXPECT_EQ(tools.find("## Tools\n\n"), 0u);
    EXPECT_NE(tools.find("### Available Tool Schemas\n\n{\"name\": \"get_weather\", \"description\": \"Weather\", "
                         "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}\n\n"
                         "You MUST strictly follow"),
              std::string::npos);
}

TEST(GatewayDsml, ResultsTakeTheOrderOfTheCallsAndNoSystemGetsAnEmptyOne) {
    std::vector<Message> conv = {
        {Role::User, "go", "", {}, ""},
        {Role::Assistant, "", "", {{"a", "f", "{}"}, {"b", "g", "{}"}}, ""},
        {Role::Tool, "B", "", {}, "b"},
        {Role::Tool, "A", "", {}, "a"},
        {Role::User, "and?", "", {}, ""},
    };
    PromptOptions o;
    o.tools = Json::array({Json{{"name", "f"}}, Json{{"name", "g"}}});
    const std::string s = render_prompt(conv, o);
    EXPECT_EQ(s.find(std::string(kBos) + "\n\n## Tools"), 0u);
    EXPECT_NE(s.find(std::string(kUser) + "<tool_result>A</tool_result>\n\n<tool_result>B</tool_result>\n\nand?" + kAssistant +
                     kEndThink),
              std::string::npos)
        << s;
    EXPECT_NE(s.find(std::string(kInvokeOpen) + "f\">\n\n" + kInvokeClose + "\n" + kInvokeOpen + "g\">"), std::string::npos);
}

TEST(GatewayDsml, ParserReadsBackWhatTheRendererWrites) {
    Message a{Role::Assistant, "Let me check.", "", {}, ""};
    a.tool_calls = {{"1", "lookup", R"({"q":"a \"quoted\" <b> value\nline 2 ✓","n":-2.5,"flags":[true,null],"o":{"k":"v"}})"},
                    {"2", "noargs", "{}"}};
    const std::string reply = rendered_reply(a);
    for (size_t step : {1, 2, 3, 7, 64, 4096}) {
        Parsed p = parse(reply, true, false, step);
        EXPECT_EQ(p.text, "Let me check.") << step;
        ASSERT_EQ(p.names.size(), 2u) << step;
        EXPECT_EQ(p.names[0], "lookup");
        EXPECT_EQ(p.names[1], "noargs");
        EXPECT_EQ(Json::parse(p.args[0]), Json::parse(a.tool_calls[0].arguments)) << p.args[0];
        EXPECT_EQ(p.args[1], "{}");
    }
    // Byte by byte, a string value streams while it is generated, not only when it closes.
    EXPECT_GT(parse(reply, true, false, 1).arg_events[0], 10u);
}

TEST(GatewayDsml, ReasoningTextAndPassThrough) {
    Parsed p = parse("first I think</think>then I answer", true, true, 3);
    EXPECT_EQ(p.reasoning, "first I think");
    EXPECT_EQ(p.text, "then I answer");
    // Without tools the DSML markup is plain text.
    const std::string dsml = std::string("x\n\n") + kToolCallsOpen + "\n" + kInvokeOpen + "f\">\n" + kInvokeClose + "\n" + kToolCallsClose;
    Parsed q = parse(dsml, false, false, 5);
    EXPECT_EQ(q.text, dsml);
    EXPECT_TRUE(q.names.empty());
    // Trailing whitespace that no block follows is part of the answer.
    EXPECT_EQ(parse("answer \n", true, false, 1).text, "answer \n");
}

TEST(GatewayDsml, MalformedOrCutOffCallsEndCleanly) {
    // Garbage inside the block: the call so far is closed, the rest is text.
    const std::string bad = std::string(kToolCallsOpen) + kInvokeOpen + "f\">" + kParamOpen +
                            "a\" string=\"true\">x" + "</｜DSML｜parameter>oops";
    Parsed p = parse(bad, true, false, 4);
    ASSERT_EQ(p.names.size(), 1u);
    EXPECT_EQ(Json::parse(p.args[0]), Json::parse(R"({"a":"x"})"));
    EXPECT_EQ(p.text, "oops");
    // Cut off by max_tokens inside a value: arguments are still a JSON object.
    const std::string cut = std::string(kToolCallsOpen) + kInvokeOpen + "f\">" + kParamOpen + "n\" string=\"false\">[1, 2";
    Parsed c = parse(cut, true, false, 2);
    ASSERT_EQ(c.names.size(), 1u);
    EXPECT_EQ(Json::parse(c.args[0]), Json::parse(R"({"n":"[1, 2"})"));
}

// Integers beyond 64 bits in a generated call's arguments: the model's digits, not a double.
TEST(GatewayDsml, IntegersBeyond64BitsPassThroughExactly) {
    const std::string out = std::string(kToolCallsOpen) + "\n" + kInvokeOpen + "lookup\">\n" + kParamOpen +
                            "id\" string=\"false\">123456789012345678901234567890" + kParamClose + "\n" + kParamOpen +
                            "ids\" string=\"false\">[18446744073709551616, -9223372036854775809, 7]" + kParamClose + "\n" +
                            kParamOpen + "meta\" string=\"false\">{\"n\": -98765432109876543210987654321}" + kParamClose +
                            "\n" + kInvokeClose + "\n" + kToolCallsClose;
    for (size_t step : {1, 5, 4096}) {
        Parsed p = parse(out, true, false, step);
        ASSERT_EQ(p.names.size(), 1u) << step;
        EXPECT_EQ(p.args[0], "{\"id\": 123456789012345678901234567890, \"ids\": [18446744073709551616, "
                             "-9223372036854775809, 7], \"meta\": {\"n\": -98765432109876543210987654321}}")
            << step;
    }
}

TEST(GatewayDsml, PythonJsonSpacing) {
    EXPECT_EQ(python_json(Json::parse(R"({"a":[1,2.5,"x\u0001é"],"b":{}})")), "{\"a\": [1, 2.5, \"x\\u0001é\"], \"b\": {}}");
}

namespace {

// The fixture's cases (tests/fixtures/gateway/dsv4_encoding.json), read exactly: they hold
// integers beyond 64 bits, which the requests must carry as written.
Json fixture_cases() {
    std::ifstream f(DS4_GATEWAY_FIXTURES "/dsv4_encoding.json");
    EXPECT_TRUE(f) << "missing fixture";
    return parse_exact(std::string(std::istreambuf_iterator<char>(f), {}))["cases"];
}

// A case's messages as the chat request the fixture says it is; without_header: a later
// turn's request that leaves out the conversation's tools and response format.
Request case_request(const Json &c, const Json &messages, bool without_header = false) {
    Json body = {{"messages", messages}, {"thinking", c.value("thinking", false)}};
    for (const char *k : {"tools", "reasoning_effort", "response_format"})
        if (c.contains(k) && !(without_header && std::string(k) != "reasoning_effort")) body[k] = c[k];
    return parse_request(Api::Chat, dump_exact(body));
}

// The later turns `later` of a conversation whose earlier turns were the request `first`
// (its last assistant message standing for the reply), rendered as the server renders a
// continuation: options from what it remembers of the conversation.
std::string continuation(const Request &first, const Request &later) {
    const PromptOptions used = prompt_options_for(first, false, nullptr, "");
    const ConversationState known = state_after(first, used, nullptr, {});
    return render_prompt(later.messages, prompt_options_for(later, true, &known, "the conversation"));
}

Json slice(const Json &a, size_t from, size_t to) {
    Json out = Json::array();
    for (size_t i = from; i < to; ++i) out.push_back(a[i]);
    return out;
}

// Where two prompts part, with some context either side: the whole prompts are long.
std::string where_they_differ(const std::string &got, const std::string &want) {
    const size_t at =
        std::mismatch(got.begin(), got.begin() + std::min(got.size(), want.size()), want.begin()).first - got.begin();
    const size_t from = at > 80 ? at - 80 : 0;
    return "differs at byte " + std::to_string(at) + "\n  got:  ..." + got.substr(from, 200) + "\n  want: ..." +
           want.substr(from, 200);
}

}  // namespace

// Conversations with the prompt text DeepSeek's encoding_dsv4 gives for them (fixture,
// made by running the script: tools/reference/gateway_encoding_fixture.py).
TEST(GatewayDsml, MatchesTheReferenceEncodingFixture) {
    const Json cases = fixture_cases();
    ASSERT_GE(cases.size(), 37u);
    for (size_t i = 0; i < cases.size(); ++i) {
        const Json &c = cases[i];
        if (c.contains("context")) continue;   // continuations: ContinuationsMatchTheReferenceEncoding
        Request r = case_request(c, c["messages"]);
        const std::string got = render_prompt(r.messages, r.prompt_options);
        const std::string want = c["expected"].get<std::string>();
        if (got != want) ADD_FAILURE() << "case " << i << " (" << c.value("name", "") << ") " << where_they_differ(got, want);
    }
}

// Later turns of a conversation already in the context (a session, a previous response):
// the fixture's expected text is the script's encode_messages(messages, context=...).
TEST(GatewayDsml, ContinuationsMatchTheReferenceEncoding) {
    const Json cases = fixture_cases();
    int n = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
        const Json &c = cases[i];
        if (!c.contains("context")) continue;
        ++n;
        const Request ctx = case_request(c, c["context"]);
        const std::string want = c["expected"].get<std::string>();
        // The later request sends the conversation's tools again, or leaves them out.
        for (bool without : {false, true}) {
            const std::string got = continuation(ctx, case_request(c, c["messages"], without));
            if (got != want)
                ADD_FAILURE() << "case " << i << " (" << c.value("name", "") << ")" << (without ? ", tools left out," : "")
                              << " " << where_they_differ(got, want);
        }
    }
    EXPECT_GE(n, 4);
}

// Every conversation of the fixture, cut after each assistant turn but the last: the later
// turns rendered as a continuation are the end of the whole conversation's prompt, and
// (where the encoding leaves earlier turns as they were: tools present, or no thinking)
// what precedes them is the earlier turns' prompt and the reply's end-of-sentence.
TEST(GatewayDsml, ContinuationIsTheSuffixOfTheFullConversation) {
    const Json cases = fixture_cases();
    int cuts = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
        const Json &c = cases[i];
        if (c.contains("context")) continue;
        const Json &msgs = c["messages"];
        const Request r = case_request(c, msgs);
        const std::string full = render_prompt(r.messages, r.prompt_options);
        for (size_t k = 0; k + 1 < msgs.size(); ++k) {
            if (msgs[k]["role"] != "assistant") continue;
            ++cuts;
            const Request ctx = case_request(c, slice(msgs, 0, k + 1));
            for (bool without : {false, true}) {
                const std::string cont = continuation(ctx, case_request(c, slice(msgs, k + 1, msgs.size()), without));
                const std::string what = "case " + std::to_string(i) + " (" + c.value("name", "") + ") cut after message " +
                                         std::to_string(k) + (without ? ", tools left out" : "");
                ASSERT_LE(cont.size(), full.size()) << what;
                EXPECT_EQ(full.substr(full.size() - cont.size()), cont)
                    << what << ": not the end of the full prompt; " << where_they_differ(cont, full.substr(full.size() - cont.size()));
                if (!r.prompt_options.thinking || !r.prompt_options.tools.empty()) {
                    EXPECT_EQ(full, render_prompt(ctx.messages, ctx.prompt_options) + kEos + cont) << what;
                }
            }
        }
    }
    EXPECT_GE(cuts, 20);
}
