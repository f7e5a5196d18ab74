// One generation's answer in the shape of the API that asked: a JSON body, or the SSE
// events of a stream. Fed with the parser's events as generation proceeds, then finished
// with the daemon's figures.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gateway/dsml.h"
#include "gateway/translate.h"

namespace ds4::gateway {

struct Finish {
    enum class Reason { Stop, StopString, Length, Context, Cancelled } reason = Reason::Stop;
    uint32_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
};

// One generated token's log-probability and its alternatives, with the tokens' bytes.
struct TokenLogprobs {
    std::string token;
    float logprob = 0;
    std::vector<std::pair<std::string, float>> top;
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
    // Choice `index` of n (chat/completions, n > 1): the id shared by all; only the last
    // closes the stream (usage, [DONE]).
    void set_choice(int index, std::string id, bool last);
    // The next generated token's log-probabilities (request logprobs): reported with the
    // text that follows, and in full in a non-streamed answer.
    void add_logprobs(TokenLogprobs lp) { lp_pending_.push_back(std::move(lp)); }
    const std::string &id() const { return id_; }
    // The ids of the tool calls made so far, in order.
    std::vector<std::string> call_ids() const {
        std::vector<std::string> ids;
        for (const Call &c : calls_) ids.push_back(c.id);
        return ids;
    }

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
    int choice_ = 0;
    bool last_ = true;
    std::vector<TokenLogprobs> lp_pending_, lp_all_;
    size_t lp_offset_ = 0;   // completions: text_offset of the next token
    Json responses_lp_ = Json::array();
    // The pending entries in the API's shape (moved to lp_all_); null when not asked for.
    Json take_logprobs(bool everything = false);
};

}  // namespace ds4::gateway
