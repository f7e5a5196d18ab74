#include "gateway/conversation.h"

#include <functional>

namespace ds4::gateway {

namespace {

uint64_t digest(const Json &v) { return std::hash<std::string>{}(dump_exact(v)); }

}  // namespace

std::vector<std::string> latest_call_ids(const std::vector<Message> &messages) {
    std::vector<std::string> ids;
    for (const Message &m : messages)
        if (m.role == Role::Assistant && !m.tool_calls.empty()) {
            ids.clear();
            for (const ToolCall &tc : m.tool_calls) ids.push_back(tc.id);
        }
    return ids;
}

PromptOptions prompt_options_for(const Request &req, bool continued, const ConversationState *known,
                                 const std::string &what) {
    PromptOptions po = req.prompt_options;
    po.continued = continued;
    if (!continued) return po;
    const bool tools = !po.tools.empty();
    const bool format = !po.response_format.is_null();
    if (known && known->header_known) {
        if (tools && (!known->tools || digest(po.tools) != known->tools_digest))
            throw ApiError(400, "invalid_request_error",
                           "'tools' differ from the tools " + what + " began with: a conversation's tool schemas are part "
                           "of its first turn, which is not rendered again. Send the same tools or leave them out, or "
                           "send the whole conversation without continuing it to change them", "tools");
        if (format && (!known->format || digest(po.response_format) != known->format_digest)) {
            const std::string param = req.api == Api::Responses ? "text.format" : "response_format";
            throw ApiError(400, "invalid_request_error",
                           "'" + param + "' json_schema differs from the one " + what + " began with (" +
                           (known->format ? "another schema" : "none") + "): the schema is part of the conversation's "
                           "first turn, which is not rendered again. Send the same schema, use json_object, or send the "
                           "whole conversation without continuing it", param);
        }
        po.continued_tools = known->tools;
    } else {
        po.continued_tools = tools;   // not remembered: the request's tools are taken as the conversation's
    }
    if (known) po.prior_calls = known->last_calls;
    return po;
}

ConversationState state_after(const Request &req, const PromptOptions &used, const ConversationState *known,
                              const std::vector<std::string> &reply_calls) {
    ConversationState s;
    if (!used.continued) {
        s.header_known = true;
        s.tools = !used.tools.empty();
        s.tools_digest = s.tools ? digest(used.tools) : 0;
        s.format = !used.response_format.is_null();
        s.format_digest = s.format ? digest(used.response_format) : 0;
    } else if (known) {
        s = *known;
    }
    if (std::vector<std::string> ids = latest_call_ids(req.messages); !ids.empty()) s.last_calls = std::move(ids);
    if (!reply_calls.empty()) s.last_calls = reply_calls;
    return s;
}

std::optional<ConversationState> SessionStates::find(const std::string &session, uint32_t length) {
    std::lock_guard lk(mu_);
    auto it = map_.find(session);
    if (it == map_.end() || it->second.length != length) return std::nullopt;
    lru_.splice(lru_.end(), lru_, it->second.pos);
    return it->second.state;
}

void SessionStates::put(const std::string &session, ConversationState s, uint32_t length) {
    std::lock_guard lk(mu_);
    if (auto it = map_.find(session); it != map_.end()) {
        it->second.state = std::move(s);
        it->second.length = length;
        lru_.splice(lru_.end(), lru_, it->second.pos);
        return;
    }
    lru_.push_back(session);
    map_[session] = Entry{std::move(s), length, std::prev(lru_.end())};
    while (map_.size() > max_) {
        map_.erase(lru_.front());
        lru_.pop_front();
    }
}

void SessionStates::erase(const std::string &session) {
    std::lock_guard lk(mu_);
    if (auto it = map_.find(session); it != map_.end()) {
        lru_.erase(it->second.pos);
        map_.erase(it);
    }
}

}  // namespace ds4::gateway
