// One generation's answer in the shape of the API that asked: a JSON body, or the SSE
// events of a stream. Fed with the parser's events as generation proceeds, then finished
// with the daemon's figures.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "gateway/dsml.h"
#include "gateway/translate.h"

namespace ds4::gateway {

struct Finish {
    enum class Reason { Stop, StopString, Length, Context, Cancelled } reason = Reason::Stop;
    uint32_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
};

// A fresh id for responses, tool calls and items: prefix + 24 random hex digits.
std::string random_id(const char *prefix);

class Reply {
public:
    Reply(const Request &req, std::string model, uint32_t prompt_tokens);

    // Stream: the opening events. Non-stream: "".
    std::string begin();
    // Stream: the events for ev. Non-stream: accumulates, returns "".
    std::string event(const DsmlEvent &ev);
    // Stream: the closing events. Non-stream: the whole JSON body.
    std::string finish(const Finish &f);
    // Stream: an error event in the API's shape (the stream then ends).
    std::string stream_error(const ApiError &e);

private:
    enum class Block { None, Text, Reasoning, Tool };
    std::string open(Block b, const DsmlEvent *ev);
    std::string close();
    std::string sse(const Json &data, const char *event = nullptr);
    std::string chat_chunk(const Json &delta, const Json &finish_reason = nullptr);
    Json usage_json(const Finish &f) const;
    Json responses_object(const char *status, const Finish *f) const;
    std::string finish_reason(const Finish &f) const;

    struct Call {
        std::string id, item_id, name, arguments;
    };
    struct Item {   // responses/messages output, in order
        Block kind;
        std::string text;   // text or reasoning
        int call = -1;
        std::string id;
    };

    const Request &req_;
    std::string model_, id_;
    int64_t created_;
    uint32_t prompt_tokens_;
    Block open_ = Block::None;
    std::vector<Item> items_;
    std::vector<Call> calls_;
    std::string text_, reasoning_;
    uint64_t seq_ = 0;   // responses: sequence_number
};

}  // namespace ds4::gateway
