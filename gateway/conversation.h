// What a conversation's later turns need from its earlier ones, when they are rendered as a
// continuation (a named session, previous_response_id): DeepSeek's encoding of the new turns
// depends on the whole conversation through whether it has tools (then every turn keeps its
// reasoning and developer messages) and on the ids of the calls the first results answer.
// The tool schemas and a json_schema are part of the conversation's first turn, which is
// not rendered again: a later turn may leave them out (the remembered ones count) or send
// the same ones, not different ones. The gateway remembers this for the sessions and
// responses it served since it started; for others the request's own tools decide.
#pragma once
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "gateway/dsml.h"
#include "gateway/translate.h"

namespace ds4::gateway {

struct ConversationState {
    bool header_known = false;     // its first turn was rendered by this gateway
    bool tools = false;            // that turn had tool schemas
    uint64_t tools_digest = 0;     // of those schemas (compared, not rendered again)
    bool format = false;           // that turn had a json_schema response format
    uint64_t format_digest = 0;
    std::vector<std::string> last_calls;   // ids of the calls of its latest assistant turn with calls
};

// The prompt options for `req`; continued: its messages follow the conversation `known`
// (null: one this gateway does not remember), named by `what` in errors. Throws ApiError
// (400) when the request's tools or json_schema differ from the conversation's.
PromptOptions prompt_options_for(const Request &req, bool continued, const ConversationState *known,
                                 const std::string &what);

// The conversation after this request and its reply (the ids of the calls it made).
ConversationState state_after(const Request &req, const PromptOptions &used, const ConversationState *known,
                              const std::vector<std::string> &reply_calls);

// The ids of the calls of the latest assistant message with calls (empty: none).
std::vector<std::string> latest_call_ids(const std::vector<Message> &messages);

// Named sessions' states, each with the session's length after the turn that left it (a
// session found at another length was changed by someone else: its state is not known).
// Least recently used forgotten first beyond `max`.
class SessionStates {
public:
    explicit SessionStates(size_t max = 4096) : max_(max) {}
    std::optional<ConversationState> find(const std::string &session, uint32_t length);
    void put(const std::string &session, ConversationState s, uint32_t length);
    void erase(const std::string &session);

private:
    struct Entry {
        ConversationState state;
        uint32_t length = 0;
        std::list<std::string>::iterator pos;
    };
    const size_t max_;
    std::mutex mu_;
    std::unordered_map<std::string, Entry> map_;
    std::list<std::string> lru_;   // least recently used first
};

}  // namespace ds4::gateway
