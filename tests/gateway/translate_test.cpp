// Request bodies of the four APIs read into the front's Request, and the errors each API
// expects (status, shape, the field named).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "gateway/api_key.h"
#include "gateway/translate.h"

using namespace ds4::gateway;

namespace {

ApiError error_of(Api api, const std::string &body) {
    try {
        parse_request(api, body);
    } catch (const ApiError &e) {
        return e;
    }
    ADD_FAILURE() << "no error for " << body;
    return ApiError(0, "", "");
}

}  // namespace

TEST(GatewayTranslate, ChatFields) {
    Request r = parse_request(Api::Chat, R"({"model":"m","messages":[{"role":"system","content":"s"},
        {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
        {"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]},
        {"role":"tool","tool_call_id":"c","content":"r"}],
        "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],
        "max_completion_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":40,"min_p":0.1,"seed":3,"stop":"END",
        "stream":true,"stream_options":{"include_usage":true},"reasoning_effort":"high"})");
    ASSERT_EQ(r.messages.size(), 4u);
    EXPECT_EQ(r.messages[1].content, "ab");
    EXPECT_EQ(r.messages[2].tool_calls.at(0).arguments, "{\"x\":1}");
    EXPECT_EQ(r.messages[3].tool_call_id, "c");
    EXPECT_TRUE(r.parse_tools);
    EXPECT_EQ(r.max_tokens, 7u);
    EXPECT_FLOAT_EQ(r.temperature, 0.5f);
    EXPECT_EQ(r.top_k, 40);
    EXPECT_EQ(*r.seed, 3u);
    EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
    EXPECT_TRUE(r.stream && r.include_usage && r.prompt_options.thinking);
    // tool_choice none: no tools in the prompt, none parsed.
    Request n = parse_request(Api::Chat, R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"none",
        "tools":[{"type":"function","function":{"name":"f"}}]})");
    EXPECT_FALSE(n.parse_tools);
    EXPECT_TRUE(n.prompt_options.tools.empty());
}

TEST(GatewayTranslate, AnthropicMessages) {
    Request r = parse_request(Api::Messages, R"({"model":"m","max_tokens":9,"system":[{"type":"text","text":"sys"}],
        "messages":[{"role":"user","content":"hi"},
          {"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":""},{"type":"text","text":"ok"},
                                          {"type":"tool_use","id":"t1","name":"f","input":{"a":1}}]},
          {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"res"},{"type":"text","text":"2"}]},
                                    {"type":"text","text":"more"}]}],
        "tools":[{"name":"f","input_schema":{"type":"object"}}],"stop_sequences":["Z"],"thinking":{"type":"enabled","budget_tokens":100}})");
    ASSERT_EQ(r.messages.size(), 5u);
    EXPECT_EQ(r.messages[0].role, Role::System);
    EXPECT_EQ(r.messages[2].reasoning, "hm");
    EXPECT_EQ(Json::parse(r.messages[2].tool_calls.at(0).arguments), Json::parse(R"({"a":1})"));
    EXPECT_EQ(r.messages[3].role, Role::Tool);
    EXPECT_EQ(r.messages[3].content, "res\n\n2");   // a result's parts, as the reference encoding joins them
    EXPECT_EQ(r.messages[4].content, "more");
    EXPECT_EQ(r.prompt_options.tools[0]["parameters"]["type"], "object");
    EXPECT_TRUE(r.prompt_options.thinking);
    EXPECT_EQ(r.stop, std::vector<std::string>{"Z"});
}

// Anthropic's system as text blocks: joined as a user turn's text blocks are (a blank line
// between blocks, as the reference encoding joins a turn's text parts), not run together.
TEST(GatewayTranslate, AnthropicSystemBlocksJoinAsUserBlocks) {
    Request r = parse_request(Api::Messages, R"({"model":"m","max_tokens":9,
        "system":[{"type":"text","text":"You are terse."},{"type":"text","text":"Answer in French."}],
        "messages":[{"role":"user","content":[{"type":"text","text":"one"},{"type":"text","text":"two"}]}]})");
    ASSERT_EQ(r.messages.size(), 2u);
    ASSERT_EQ(r.messages[0].role, Role::System);
    const std::string user_joined = r.messages[1].content;
    EXPECT_EQ(user_joined, "one\n\ntwo");
    EXPECT_EQ(r.messages[0].content, "You are terse.\n\nAnswer in French.");
    // The same prompt as the system prompt sent as one string with that separator.
    Request s = parse_request(Api::Messages, R"({"model":"m","max_tokens":9,"system":"You are terse.\n\nAnswer in French.",
        "messages":[{"role":"user","content":"one\n\ntwo"}]})");
    EXPECT_EQ(render_prompt(r.messages, r.prompt_options), render_prompt(s.messages, s.prompt_options));
}

// A client's tool_use input with integers beyond 64 bits reaches the prompt with its digits.
TEST(GatewayTranslate, AnthropicToolInputKeepsBigIntegers) {
    Request r = parse_request(Api::Messages, R"({"model":"m","max_tokens":9,"messages":[{"role":"user","content":"q"},
        {"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f",
          "input":{"id":123456789012345678901234567890,"l":[-9223372036854775809]}}]}]})");
    ASSERT_EQ(r.messages.size(), 2u);
    EXPECT_EQ(r.messages[1].tool_calls.at(0).arguments, R"({"id":123456789012345678901234567890,"l":[-9223372036854775809]})");
}

// The ways of asking for maximum reasoning effort (the prompt preamble itself is checked
// against the reference encoding in dsml_test).
TEST(GatewayTranslate, ReasoningEffortMax) {
    const std::string m = R"("messages":[{"role":"user","content":"x"}])";
    const std::pair<Request, bool> cases[] = {
        {parse_request(Api::Chat, "{" + m + R"(,"reasoning_effort":"max"})"), true},
        {parse_request(Api::Chat, "{" + m + R"(,"reasoning_effort":"xhigh"})"), true},
        {parse_request(Api::Chat, "{" + m + R"(,"reasoning_effort":"high"})"), false},
        {parse_request(Api::Chat, "{" + m + R"(,"chat_template_kwargs":{"thinking":true,"reasoning_effort":"max"}})"), true},
        {parse_request(Api::Responses, R"({"input":"x","reasoning":{"effort":"max"}})"), true},
        {parse_request(Api::Responses, R"({"input":"x","reasoning":{"effort":"medium"}})"), false},
    };
    for (size_t i = 0; i < std::size(cases); ++i) {
        EXPECT_EQ(cases[i].first.prompt_options.effort_max, cases[i].second) << i;
        EXPECT_TRUE(cases[i].first.prompt_options.thinking) << i;
    }
    // The preamble belongs to thinking mode: max with thinking turned off renders none.
    Request off = parse_request(Api::Chat, "{" + m + R"(,"reasoning_effort":"max","thinking":{"type":"disabled"}})");
    EXPECT_FALSE(off.prompt_options.thinking);
    EXPECT_EQ(render_prompt(off.messages, off.prompt_options), render_prompt(off.messages, PromptOptions{}));
}

TEST(GatewayTranslate, ResponsesItems) {
    Request r = parse_request(Api::Responses, R"({"model":"m","instructions":"be nice","max_output_tokens":5,
        "input":[{"role":"user","content":[{"type":"input_text","text":"q"}]},
                 {"type":"function_call","call_id":"c","name":"f","arguments":"{}"},
                 {"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"out"},{"type":"input_text","text":"2"}]}],
        "tools":[{"type":"function","name":"f","parameters":{"type":"object"}}]})");
    ASSERT_EQ(r.messages.size(), 4u);
    EXPECT_EQ(r.messages[0].content, "be nice");
    EXPECT_EQ(r.messages[2].role, Role::Assistant);
    EXPECT_EQ(r.messages[2].tool_calls.at(0).id, "c");
    EXPECT_EQ(r.messages[3].content, "out\n\n2");
    EXPECT_EQ(r.max_tokens, 5u);
    Request c = parse_request(Api::Completions, R"({"prompt":["abc"]})");
    EXPECT_EQ(c.prompt, "abc");
    EXPECT_EQ(c.max_tokens, 16u);
}

TEST(GatewayTranslate, JsonObjectFormat) {
    const std::string msgs = R"("messages":[{"role":"user","content":"x"}])";
    EXPECT_TRUE(parse_request(Api::Chat, "{" + msgs + R"(,"response_format":{"type":"json_object"}})").json_object);
    EXPECT_FALSE(parse_request(Api::Chat, "{" + msgs + R"(,"response_format":{"type":"text"}})").json_object);
    EXPECT_TRUE(parse_request(Api::Responses, R"({"input":"x","text":{"format":{"type":"json_object"}}})").json_object);
    // JSON is the whole answer: not after reasoning, not instead of a forced call.
    EXPECT_EQ(error_of(Api::Chat, "{" + msgs + R"(,"response_format":{"type":"json_object"},"reasoning_effort":"high"})").param,
              "response_format");
    EXPECT_EQ(error_of(Api::Chat, "{" + msgs + R"(,"response_format":{"type":"json_object"},"tool_choice":"required",
        "tools":[{"type":"function","function":{"name":"f"}}]})").param, "response_format");
    EXPECT_EQ(error_of(Api::Chat, "{" + msgs + R"(,"response_format":{"type":"yaml"}})").param, "response_format.type");
    EXPECT_EQ(error_of(Api::Chat, "{" + msgs + R"(,"response_format":"json"})").param, "response_format");
}

// json_schema: the schema goes into the prompt (dsml_test checks where, against the
// reference encoding) and the answer is constrained to a JSON object, as json_object.
TEST(GatewayTranslate, JsonSchemaFormat) {
    const std::string msgs = R"({"messages":[{"role":"user","content":"x"}],)";
    const std::string schema = R"({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]})";
    Request c = parse_request(Api::Chat, msgs + R"("response_format":{"type":"json_schema","json_schema":{"name":"x",
        "strict":true,"schema":)" + schema + "}}}");
    EXPECT_TRUE(c.json_object);
    EXPECT_EQ(c.prompt_options.response_format, Json::parse(schema));
    Request r = parse_request(Api::Responses, R"({"input":"x","text":{"format":{"type":"json_schema","name":"x","schema":)" +
                                                  schema + "}}}");
    EXPECT_TRUE(r.json_object);
    EXPECT_EQ(r.prompt_options.response_format, Json::parse(schema));
    EXPECT_NE(render_prompt(r.messages, r.prompt_options).find("## Response Format:"), std::string::npos);
    // Refused, naming the field: no schema, a root that is not an object (the answer is
    // constrained to one), and what json_object refuses too (thinking, a forced call).
    const std::pair<std::string, std::string> bad[] = {
        {R"("response_format":{"type":"json_schema","json_schema":{"name":"x"}})", "response_format.json_schema.schema"},
        {R"("response_format":{"type":"json_schema"})", "response_format.json_schema"},
        {R"("response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"array"}}})",
         "response_format.json_schema.schema"},
        {R"("response_format":{"type":"json_schema","json_schema":{"name":"x","schema":[1]}})", "response_format.json_schema.schema"},
        {R"("response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{}}},"reasoning_effort":"high")",
         "response_format"},
    };
    for (const auto &[f, param] : bad) {
        ApiError e = error_of(Api::Chat, msgs + f + "}");
        EXPECT_EQ(e.status, 400) << f;
        EXPECT_EQ(e.param, param) << f << ": " << e.what();
    }
    EXPECT_EQ(error_of(Api::Responses, R"({"input":"x","text":{"format":{"type":"json_schema","name":"x"}}})").param,
              "text.format.schema");
}

TEST(GatewayTranslate, Errors) {
    EXPECT_EQ(error_of(Api::Chat, "{").code, "invalid_json");
    // Nesting is bounded (the JSON writers recurse): a deep body is refused, not a crash.
    EXPECT_EQ(error_of(Api::Chat, R"({"messages":[{"role":"user","content":"x"}],"x":)" + std::string(100000, '[') +
                                      std::string(100000, ']') + "}").code,
              "invalid_json");
    ApiError e = error_of(Api::Chat, R"({"messages":[]})");
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "messages");
    // Sampling controls out of range name their field.
    const std::pair<const char *, const char *> bad[] = {
        {R"("top_logprobs":2)", "top_logprobs"},            // without logprobs
        {R"("logprobs":true,"top_logprobs":21)", "top_logprobs"},
        {R"("logprobs":1)", "logprobs"},
        {R"("frequency_penalty":2.5)", "frequency_penalty"},
        {R"("presence_penalty":-3)", "presence_penalty"},
        {R"("repetition_penalty":0)", "repetition_penalty"},
        {R"("repeat_last_n":-2)", "repeat_last_n"},
        {R"("logit_bias":{"x":1})", "logit_bias"},
        {R"("logit_bias":{"-1":1})", "logit_bias"},
        {R"("logit_bias":{"5":101})", "logit_bias.5"},
        {R"("logit_bias":[1])", "logit_bias"},
        {R"("n":0)", "n"},
        {R"("n":17)", "n"},
        {R"("session":"a/b")", "session"},
        {R"("session":"")", "session"},
        {R"("tool_choice":"required")", "tool_choice"},   // no tools
        {R"("tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}})",
         "tool_choice"},
    };
    for (const auto &[f, param] : bad) {
        ApiError u = error_of(Api::Chat, std::string(R"({"messages":[{"role":"user","content":"x"}],)") + f + "}");
        EXPECT_EQ(u.status, 400) << f;
        EXPECT_EQ(u.param, param) << f;
    }
    EXPECT_EQ(error_of(Api::Completions, R"({"prompt":"x","logprobs":21})").param, "logprobs");
    EXPECT_EQ(error_of(Api::Responses, R"({"input":"x","top_logprobs":21})").param, "top_logprobs");
    EXPECT_EQ(error_of(Api::Responses, R"({"input":"x","previous_response_id":""})").param, "previous_response_id");
    EXPECT_EQ(error_of(Api::Chat, R"({"messages":[{"role":"user","content":"x"}],"temperature":3})").param, "temperature");
    EXPECT_EQ(error_of(Api::Chat, R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})").code,
              "unsupported_content");
    EXPECT_EQ(error_of(Api::Messages, R"({"model":"m","messages":[{"role":"user","content":"x"}]})").param, "max_tokens");
    // Shapes: OpenAI {"error":{message,type,param,code}}, Anthropic {"type":"error","error":{type,message}}.
    const ApiError x(400, "invalid_request_error", "bad", "p", "c");
    Json o = Json::parse(error_body(Api::Chat, x));
    EXPECT_EQ(o["error"]["message"], "bad");
    EXPECT_EQ(o["error"]["param"], "p");
    Json a = Json::parse(error_body(Api::Messages, ApiError(401, "authentication_error", "no key")));
    EXPECT_EQ(a["type"], "error");
    EXPECT_EQ(a["error"]["type"], "authentication_error");
}

TEST(GatewayTranslate, SamplingControlsSessionsAndForcedTools) {
    Request r = parse_request(Api::Chat, R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":4,
        "frequency_penalty":0.5,"presence_penalty":-1,"repetition_penalty":1.2,"repeat_last_n":-1,
        "logit_bias":{"7":-100,"12":2.5},"n":3,"session":"my.chat-1",
        "tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"g"}}],
        "tool_choice":{"type":"function","function":{"name":"g"}}})");
    EXPECT_TRUE(r.logprobs);
    EXPECT_EQ(r.top_logprobs, 4u);
    EXPECT_FLOAT_EQ(r.frequency_penalty, 0.5f);
    EXPECT_FLOAT_EQ(r.presence_penalty, -1.0f);
    EXPECT_FLOAT_EQ(r.repeat_penalty, 1.2f);
    EXPECT_EQ(r.repeat_last_n, -1);
    const std::vector<std::pair<int32_t, float>> bias = {{7, -100.0f}, {12, 2.5f}};
    EXPECT_EQ(r.logit_bias, bias);
    EXPECT_EQ(r.n, 3u);
    EXPECT_EQ(r.session, "my.chat-1");
    EXPECT_TRUE(r.force_tool);
    EXPECT_EQ(r.forced_tool_name, "g");
    r = parse_request(Api::Chat, R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],
        "tool_choice":"required"})");
    EXPECT_TRUE(r.force_tool);
    EXPECT_EQ(r.forced_tool_name, "");
    r = parse_request(Api::Messages, R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f"}],
        "tool_choice":{"type":"tool","name":"f"}})");
    EXPECT_EQ(r.forced_tool_name, "f");
    r = parse_request(Api::Messages, R"({"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f"}],
        "tool_choice":{"type":"any"}})");
    EXPECT_TRUE(r.force_tool);
    r = parse_request(Api::Completions, R"({"prompt":"x","logprobs":2})");
    EXPECT_TRUE(r.logprobs);
    EXPECT_EQ(r.top_logprobs, 2u);
    r = parse_request(Api::Responses, R"({"input":"x","include":["message.output_text.logprobs"],"previous_response_id":"resp_1",
        "tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"f"}})");
    EXPECT_TRUE(r.logprobs);
    EXPECT_EQ(r.top_logprobs, 0u);
    EXPECT_EQ(r.previous_response_id, "resp_1");
    EXPECT_EQ(r.forced_tool_name, "f");
    // Defaults: nothing changes the logits.
    r = parse_request(Api::Chat, R"({"messages":[{"role":"user","content":"x"}]})");
    EXPECT_FALSE(r.logprobs);
    EXPECT_FLOAT_EQ(r.repeat_penalty, 1.0f);
    EXPECT_TRUE(r.logit_bias.empty());
    EXPECT_EQ(r.n, 1u);
    EXPECT_FALSE(r.force_tool);
}

TEST(GatewayKey, CreatedPrivateAndStable) {
    const std::string dir = std::filesystem::temp_directory_path() / ("ds4-gw-key-" + std::to_string(getpid()));
    std::filesystem::remove_all(dir);
    const std::string path = dir + "/sub/http-key";
    const std::string k = load_or_create_key(path);
    EXPECT_GE(k.size(), 32u);
    struct stat st;
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(load_or_create_key(path), k);
    EXPECT_TRUE(same_secret(k, k));
    EXPECT_FALSE(same_secret(k, k + "x"));
    chmod(path.c_str(), 0644);
    EXPECT_THROW(load_or_create_key(path), std::runtime_error);
    std::filesystem::remove_all(dir);
}
