// Answers in each API's shape, fed with the DSML parser's events for a generated text.
#include <gtest/gtest.h>

#include "gateway/dsml.h"
#include "gateway/reply.h"
#include "gateway/translate.h"

using namespace ds4::gateway;

namespace {

// The non-streamed body for `generated` (the model's text, DSML calls included).
std::string answer(const Request &req, const std::string &generated) {
    Reply reply(req, "m", 3);
    (void)reply.begin();
    DsmlParser parser(true, false);
    std::vector<DsmlEvent> evs;
    parser.feed(generated, evs);
    parser.finish(evs);
    for (const DsmlEvent &e : evs) (void)reply.event(e);
    return reply.finish(Finish{Finish::Reason::Stop, 3, 0, 5});
}

const std::string kBigCall = std::string(kToolCallsOpen) + "\n" + kInvokeOpen + "lookup\">\n" + kParamOpen +
                             "id\" string=\"false\">123456789012345678901234567890" + kParamClose + "\n" + kParamOpen +
                             "ids\" string=\"false\">[18446744073709551616, -9223372036854775809]" + kParamClose + "\n" +
                             kInvokeClose + "\n" + kToolCallsClose;

}  // namespace

// Integers beyond 64 bits in generated arguments keep their digits in every API's answer:
// chat/responses carry arguments as a string, Anthropic as the JSON `input` object.
TEST(GatewayReply, BigIntegersInToolArgumentsStayExact) {
    const std::string tools = R"("tools":[{"type":"function","function":{"name":"lookup"}}])";
    Request chat = parse_request(Api::Chat, R"({"messages":[{"role":"user","content":"x"}],)" + tools + "}");
    Json c = Json::parse(answer(chat, kBigCall));
    EXPECT_EQ(c["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
              "{\"id\": 123456789012345678901234567890, \"ids\": [18446744073709551616, -9223372036854775809]}");
    Request msgs = parse_request(Api::Messages, R"({"model":"m","max_tokens":9,"messages":[{"role":"user","content":"x"}],
        "tools":[{"name":"lookup"}]})");
    const std::string body = answer(msgs, kBigCall);
    EXPECT_NE(body.find(R"("input":{"id":123456789012345678901234567890,"ids":[18446744073709551616,-9223372036854775809]})"),
              std::string::npos)
        << body;
}
