#include "gateway/reply.h"

#include <sys/random.h>

#include <chrono>
#include <cstdio>

namespace ds4::gateway {

namespace {

// Exact: an Anthropic tool_use input may hold integers beyond 64 bits (dsml.h).
std::string dump(const Json &j) { return dump_exact(j); }

Json parse_args(const std::string &a) {
    Json j = parse_exact(a);
    return j.is_discarded() || !j.is_object() ? Json::object() : j;
}

}  // namespace

std::string random_id(const char *prefix) {
    unsigned char b[12];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t n = getrandom(b + got, sizeof b - got, 0);
        if (n > 0) got += size_t(n);
    }
    std::string s = prefix;
    char h[3];
    for (unsigned char c : b) {
        std::snprintf(h, sizeof h, "%02x", c);
        s += h;
    }
    return s;
}

Reply::Reply(const Request &req, std::string model, uint32_t prompt_tokens)
    : req_(req), model_(std::move(model)), prompt_tokens_(prompt_tokens) {
    created_ = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    switch (req.api) {
    case Api::Chat: id_ = random_id("chatcmpl-"); break;
    case Api::Completions: id_ = random_id("cmpl-"); break;
    case Api::Responses: id_ = random_id("resp_"); break;
    case Api::Messages: id_ = random_id("msg_"); break;
    }
}

void Reply::set_choice(int index, std::string id, bool last) {
    choice_ = index;
    id_ = std::move(id);
    last_ = last;
}

namespace {

Json bytes_of(const std::string &s) {
    Json b = Json::array();
    for (unsigned char c : s) b.push_back(int(c));
    return b;
}

}  // namespace

Json Reply::take_logprobs(bool everything) {
    if (!req_.logprobs) return nullptr;
    lp_all_.insert(lp_all_.end(), lp_pending_.begin(), lp_pending_.end());
    const std::vector<TokenLogprobs> &src = everything ? lp_all_ : lp_pending_;
    Json out;
    if (req_.api == Api::Completions) {
        out = {{"tokens", Json::array()}, {"token_logprobs", Json::array()}, {"top_logprobs", Json::array()},
               {"text_offset", Json::array()}};
        size_t off = everything ? 0 : lp_offset_;
        for (const TokenLogprobs &t : src) {
            out["tokens"].push_back(t.token);
            out["token_logprobs"].push_back(t.logprob);
            Json top = Json::object();
            for (const auto &[tok, v] : t.top) top[tok] = v;
            out["top_logprobs"].push_back(top);
            out["text_offset"].push_back(off);
            off += t.token.size();
        }
        if (!everything) lp_offset_ = off;
    } else {
        out = Json::array();
        for (const TokenLogprobs &t : src) {
            Json top = Json::array();
            for (const auto &[tok, v] : t.top) top.push_back({{"token", tok}, {"logprob", v}, {"bytes", bytes_of(tok)}});
            out.push_back({{"token", t.token}, {"logprob", t.logprob}, {"bytes", bytes_of(t.token)}, {"top_logprobs", top}});
        }
    }
    lp_pending_.clear();
    return out;
}

std::string Reply::sse(const Json &data, const char *event) {
    std::string s;
    if (event) {
        s += "event: ";
        s += event;
        s += '\n';
    }
    s += "data: ";
    s += dump(data);
    s += "\n\n";
    return s;
}

std::string Reply::chat_chunk(const Json &delta, const Json &finish_reason) {
    Json c = {{"id", id_}, {"object", "chat.completion.chunk"}, {"created", created_}, {"model", model_}};
    // Log-probabilities travel with the text they produced (and the rest with the last chunk).
    Json lp = nullptr;
    if (req_.logprobs && (delta.contains("content") || !finish_reason.is_null()) && !lp_pending_.empty())
        lp = {{"content", take_logprobs()}, {"refusal", nullptr}};
    c["choices"] = Json::array({Json{{"index", choice_}, {"delta", delta}, {"logprobs", lp}, {"finish_reason", finish_reason}}});
    if (req_.include_usage) c["usage"] = nullptr;
    return sse(c);
}

Json Reply::usage_json(const Finish &f) const {
    const uint32_t prompt = f.prompt_tokens ? f.prompt_tokens : prompt_tokens_;
    switch (req_.api) {
    case Api::Messages:
        return {{"input_tokens", prompt - std::min(prompt, f.cached_tokens)},
                {"output_tokens", f.completion_tokens},
                {"cache_read_input_tokens", f.cached_tokens},
                {"cache_creation_input_tokens", 0}};
    case Api::Responses:
        return {{"input_tokens", prompt},
                {"input_tokens_details", {{"cached_tokens", f.cached_tokens}}},
                {"output_tokens", f.completion_tokens},
                {"output_tokens_details", {{"reasoning_tokens", 0}}},
                {"total_tokens", prompt + f.completion_tokens}};
    default:
        return {{"prompt_tokens", prompt},
                {"completion_tokens", f.completion_tokens},
                {"total_tokens", prompt + f.completion_tokens},
                {"prompt_tokens_details", {{"cached_tokens", f.cached_tokens}}}};
    }
}

std::string Reply::finish_reason(const Finish &f) const {
    const bool length = f.reason == Finish::Reason::Length || f.reason == Finish::Reason::Context;
    if (req_.api == Api::Messages) {
        if (length) return "max_tokens";
        if (!calls_.empty()) return "tool_use";
        return f.reason == Finish::Reason::StopString ? "stop_sequence" : "end_turn";
    }
    if (length) return "length";
    if (!calls_.empty() && req_.api == Api::Chat) return "tool_calls";
    return "stop";
}

Json Reply::responses_object(const char *status, const Finish *f) const {
    Json r = {{"id", id_},         {"object", "response"}, {"created_at", created_}, {"status", status},
              {"model", model_},   {"output", Json::array()}, {"parallel_tool_calls", true},
              {"tool_choice", "auto"}, {"tools", Json::array()}, {"error", nullptr}, {"incomplete_details", nullptr},
              {"instructions", nullptr}, {"metadata", Json::object()}, {"temperature", req_.temperature},
              {"top_p", req_.top_p}, {"max_output_tokens", req_.max_tokens ? Json(req_.max_tokens) : Json(nullptr)},
              {"text", {{"format", {{"type", "text"}}}}}, {"usage", nullptr}};
    if (!f) return r;
    bool first_text = true;
    for (const Item &it : items_) {
        if (it.kind == Block::Text) {
            Json part = {{"type", "output_text"}, {"text", it.text}, {"annotations", Json::array()}};
            // Every generated token's log-probabilities, with the first text part.
            if (req_.logprobs) part["logprobs"] = first_text ? responses_lp_ : Json::array();
            first_text = false;
            r["output"].push_back({{"type", "message"}, {"id", it.id}, {"status", "completed"}, {"role", "assistant"},
                                   {"content", Json::array({part})}});
        } else if (it.kind == Block::Reasoning) {
            r["output"].push_back({{"type", "reasoning"}, {"id", it.id}, {"summary", Json::array()},
                                   {"content", Json::array({Json{{"type", "reasoning_text"}, {"text", it.text}}})}});
        } else {
            const Call &c = calls_[size_t(it.call)];
            r["output"].push_back({{"type", "function_call"}, {"id", c.item_id}, {"call_id", c.id}, {"name", c.name},
                                   {"arguments", c.arguments}, {"status", "completed"}});
        }
    }
    if (f->reason == Finish::Reason::Length || f->reason == Finish::Reason::Context) {
        r["status"] = "incomplete";
        r["incomplete_details"] = {{"reason", "max_output_tokens"}};
    }
    r["usage"] = usage_json(*f);
    return r;
}

std::string Reply::begin() {
    if (!req_.stream) return {};
    switch (req_.api) {
    case Api::Chat: return chat_chunk({{"role", "assistant"}, {"content", ""}});
    case Api::Completions: return {};
    case Api::Messages: {
        Json m = {{"id", id_},         {"type", "message"}, {"role", "assistant"}, {"model", model_},
                  {"content", Json::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                  {"usage", {{"input_tokens", prompt_tokens_}, {"output_tokens", 0}}}};
        return sse({{"type", "message_start"}, {"message", m}}, "message_start");
    }
    case Api::Responses: {
        std::string s = sse({{"type", "response.created"}, {"sequence_number", seq_++}, {"response", responses_object("in_progress", nullptr)}},
                            "response.created");
        s += sse({{"type", "response.in_progress"}, {"sequence_number", seq_++}, {"response", responses_object("in_progress", nullptr)}},
                 "response.in_progress");
        return s;
    }
    }
    return {};
}

// Opens a block (text, reasoning, tool call) in the API's stream shape.
std::string Reply::open(Block b, const DsmlEvent *ev) {
    std::string s = close();
    Item it{b, {}, -1, {}};
    if (b == Block::Tool) {
        Call c{req_.api == Api::Messages ? random_id("toolu_") : random_id("call_"), random_id("fc_"), ev->text, {}};
        calls_.push_back(c);
        it.call = int(calls_.size() - 1);
    }
    it.id = b == Block::Text ? random_id("msg_") : random_id("rs_");
    items_.push_back(it);
    open_ = b;
    if (!req_.stream) return s;
    const int idx = int(items_.size() - 1);
    if (req_.api == Api::Messages) {
        Json cb;
        if (b == Block::Text) cb = {{"type", "text"}, {"text", ""}};
        else if (b == Block::Reasoning) cb = {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}};
        else cb = {{"type", "tool_use"}, {"id", calls_.back().id}, {"name", calls_.back().name}, {"input", Json::object()}};
        s += sse({{"type", "content_block_start"}, {"index", idx}, {"content_block", cb}}, "content_block_start");
    } else if (req_.api == Api::Responses) {
        Json item;
        if (b == Block::Text) item = {{"type", "message"}, {"id", it.id}, {"status", "in_progress"}, {"role", "assistant"}, {"content", Json::array()}};
        else if (b == Block::Reasoning) item = {{"type", "reasoning"}, {"id", it.id}, {"summary", Json::array()}};
        else item = {{"type", "function_call"}, {"id", calls_.back().item_id}, {"call_id", calls_.back().id}, {"name", calls_.back().name}, {"arguments", ""}, {"status", "in_progress"}};
        s += sse({{"type", "response.output_item.added"}, {"sequence_number", seq_++}, {"output_index", idx}, {"item", item}},
                 "response.output_item.added");
        if (b == Block::Text)
            s += sse({{"type", "response.content_part.added"}, {"sequence_number", seq_++}, {"item_id", it.id}, {"output_index", idx},
                      {"content_index", 0}, {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", Json::array()}}}},
                     "response.content_part.added");
    } else if (req_.api == Api::Chat && b == Block::Tool) {
        const Call &c = calls_.back();
        s += chat_chunk({{"tool_calls", Json::array({Json{{"index", it.call}, {"id", c.id}, {"type", "function"},
                                                          {"function", {{"name", c.name}, {"arguments", ""}}}}})}});
    }
    return s;
}

std::string Reply::close() {
    if (open_ == Block::None) return {};
    const Block b = open_;
    open_ = Block::None;
    if (!req_.stream) return {};
    const int idx = int(items_.size() - 1);
    const Item &it = items_.back();
    std::string s;
    if (req_.api == Api::Messages) {
        s += sse({{"type", "content_block_stop"}, {"index", idx}}, "content_block_stop");
    } else if (req_.api == Api::Responses) {
        Json item;
        if (b == Block::Text) {
            Json part = {{"type", "output_text"}, {"text", it.text}, {"annotations", Json::array()}};
            s += sse({{"type", "response.output_text.done"}, {"sequence_number", seq_++}, {"item_id", it.id}, {"output_index", idx},
                      {"content_index", 0}, {"text", it.text}}, "response.output_text.done");
            s += sse({{"type", "response.content_part.done"}, {"sequence_number", seq_++}, {"item_id", it.id}, {"output_index", idx},
                      {"content_index", 0}, {"part", part}}, "response.content_part.done");
            item = {{"type", "message"}, {"id", it.id}, {"status", "completed"}, {"role", "assistant"}, {"content", Json::array({part})}};
        } else if (b == Block::Reasoning) {
            item = {{"type", "reasoning"}, {"id", it.id}, {"summary", Json::array()},
                    {"content", Json::array({Json{{"type", "reasoning_text"}, {"text", it.text}}})}};
        } else {
            const Call &c = calls_[size_t(it.call)];
            s += sse({{"type", "response.function_call_arguments.done"}, {"sequence_number", seq_++}, {"item_id", c.item_id},
                      {"output_index", idx}, {"arguments", c.arguments}}, "response.function_call_arguments.done");
            item = {{"type", "function_call"}, {"id", c.item_id}, {"call_id", c.id}, {"name", c.name}, {"arguments", c.arguments}, {"status", "completed"}};
        }
        s += sse({{"type", "response.output_item.done"}, {"sequence_number", seq_++}, {"output_index", idx}, {"item", item}},
                 "response.output_item.done");
    }
    return s;
}

std::string Reply::event(const DsmlEvent &ev) {
    using K = DsmlEvent::Kind;
    std::string s;
    switch (ev.kind) {
    case K::Text:
    case K::Reasoning: {
        const Block b = ev.kind == K::Text ? Block::Text : Block::Reasoning;
        if (ev.text.empty()) return {};
        if (open_ != b) s += open(b, &ev);
        items_.back().text += ev.text;
        (b == Block::Text ? text_ : reasoning_) += ev.text;
        if (!req_.stream) return s;
        const int idx = int(items_.size() - 1);
        switch (req_.api) {
        case Api::Chat: s += chat_chunk({{b == Block::Text ? "content" : "reasoning_content", ev.text}}); break;
        case Api::Completions: {
            Json c = {{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", model_},
                      {"choices", Json::array({Json{{"text", ev.text}, {"index", choice_}, {"logprobs", take_logprobs()}, {"finish_reason", nullptr}}})}};
            s += sse(c);
            break;
        }
        case Api::Messages:
            s += sse({{"type", "content_block_delta"}, {"index", idx},
                      {"delta", b == Block::Text ? Json{{"type", "text_delta"}, {"text", ev.text}} : Json{{"type", "thinking_delta"}, {"thinking", ev.text}}}},
                     "content_block_delta");
            break;
        case Api::Responses:
            if (b == Block::Text)
            {
                Json d = {{"type", "response.output_text.delta"}, {"sequence_number", seq_++}, {"item_id", items_.back().id},
                          {"output_index", idx}, {"content_index", 0}, {"delta", ev.text}};
                if (req_.logprobs) d["logprobs"] = take_logprobs();
                s += sse(d, "response.output_text.delta");
            }
            else
                s += sse({{"type", "response.reasoning_text.delta"}, {"sequence_number", seq_++}, {"item_id", items_.back().id},
                          {"output_index", idx}, {"content_index", 0}, {"delta", ev.text}}, "response.reasoning_text.delta");
            break;
        }
        return s;
    }
    case K::ToolStart: return open(Block::Tool, &ev);
    case K::ToolArgs: {
        if (open_ != Block::Tool || calls_.empty()) return {};
        Call &c = calls_.back();
        c.arguments += ev.text;
        if (!req_.stream) return {};
        const int idx = int(items_.size() - 1);
        switch (req_.api) {
        case Api::Chat:
            return chat_chunk({{"tool_calls", Json::array({Json{{"index", items_.back().call}, {"function", {{"arguments", ev.text}}}}})}});
        case Api::Messages:
            return sse({{"type", "content_block_delta"}, {"index", idx}, {"delta", {{"type", "input_json_delta"}, {"partial_json", ev.text}}}},
                       "content_block_delta");
        case Api::Responses:
            return sse({{"type", "response.function_call_arguments.delta"}, {"sequence_number", seq_++}, {"item_id", c.item_id},
                        {"output_index", idx}, {"delta", ev.text}}, "response.function_call_arguments.delta");
        case Api::Completions: return {};
        }
        return {};
    }
    case K::ToolEnd: return close();
    }
    return s;
}

std::string Reply::finish(const Finish &f) {
    std::string s = close();
    const std::string fr = finish_reason(f);
    if (req_.stream) {
        switch (req_.api) {
        case Api::Chat:
            s += chat_chunk(Json::object(), fr);
            if (!last_) break;
            if (req_.include_usage) {
                Json c = {{"id", id_}, {"object", "chat.completion.chunk"}, {"created", created_}, {"model", model_},
                          {"choices", Json::array()}, {"usage", usage_json(f)}};
                s += sse(c);
            }
            s += "data: [DONE]\n\n";
            break;
        case Api::Completions: {
            Json c = {{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", model_},
                      {"choices", Json::array({Json{{"text", ""}, {"index", choice_}, {"logprobs", take_logprobs()}, {"finish_reason", fr}}})}};
            s += sse(c);
            if (!last_) break;
            if (req_.include_usage) {
                Json u = {{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", model_},
                          {"choices", Json::array()}, {"usage", usage_json(f)}};
                s += sse(u);
            }
            s += "data: [DONE]\n\n";
            break;
        }
        case Api::Messages:
            s += sse({{"type", "message_delta"}, {"delta", {{"stop_reason", fr}, {"stop_sequence", nullptr}}}, {"usage", usage_json(f)}},
                     "message_delta");
            s += sse({{"type", "message_stop"}}, "message_stop");
            break;
        case Api::Responses: {
            responses_lp_ = take_logprobs(true);
            Json r = responses_object("completed", &f);
            const std::string type = r["status"] == "completed" ? "response.completed" : "response.incomplete";
            s += sse({{"type", type}, {"sequence_number", seq_++}, {"response", r}}, type.c_str());
            break;
        }
        }
        return s;
    }
    Json j;
    switch (req_.api) {
    case Api::Chat: {
        Json msg = {{"role", "assistant"}, {"content", text_.empty() && !calls_.empty() ? Json(nullptr) : Json(text_)}};
        if (!reasoning_.empty()) msg["reasoning_content"] = reasoning_;
        if (!calls_.empty()) {
            msg["tool_calls"] = Json::array();
            for (const Call &c : calls_)
                msg["tool_calls"].push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
        }
        j = {{"id", id_}, {"object", "chat.completion"}, {"created", created_}, {"model", model_},
             {"choices", Json::array({Json{{"index", choice_}, {"message", msg},
                                           {"logprobs", req_.logprobs ? Json{{"content", take_logprobs(true)}, {"refusal", nullptr}} : Json(nullptr)},
                                           {"finish_reason", fr}}})},
             {"usage", usage_json(f)}};
        break;
    }
    case Api::Completions:
        j = {{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", model_},
             {"choices", Json::array({Json{{"text", text_}, {"index", choice_}, {"logprobs", take_logprobs(true)}, {"finish_reason", fr}}})},
             {"usage", usage_json(f)}};
        break;
    case Api::Messages: {
        Json content = Json::array();
        for (const Item &it : items_) {
            if (it.kind == Block::Text) content.push_back({{"type", "text"}, {"text", it.text}});
            else if (it.kind == Block::Reasoning) content.push_back({{"type", "thinking"}, {"thinking", it.text}, {"signature", ""}});
            else {
                const Call &c = calls_[size_t(it.call)];
                content.push_back({{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", parse_args(c.arguments)}});
            }
        }
        j = {{"id", id_},         {"type", "message"}, {"role", "assistant"},    {"model", model_},
             {"content", content}, {"stop_reason", fr}, {"stop_sequence", nullptr}, {"usage", usage_json(f)}};
        break;
    }
    case Api::Responses:
        responses_lp_ = take_logprobs(true);
        j = responses_object("completed", &f);
        break;
    }
    return dump(j);
}

std::string Reply::stream_error(const ApiError &e) {
    if (req_.api == Api::Messages)
        return sse(Json::parse(error_body(Api::Messages, e)), "error");
    if (req_.api == Api::Responses)
        return sse({{"type", "error"}, {"sequence_number", seq_++}, {"code", e.code.empty() ? Json(nullptr) : Json(e.code)},
                    {"message", e.what()}, {"param", e.param.empty() ? Json(nullptr) : Json(e.param)}}, "error");
    return "data: " + error_body(req_.api, e) + "\n\n";
}

}  // namespace ds4::gateway
