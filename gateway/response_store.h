// The /v1/responses answers this gateway made, for previous_response_id. Each turn keeps its
// parent and the tokens it added to the conversation (its prompt, the generated tokens and the
// stop token: what ds4d's session appended), so the conversation as it stood after any
// remembered turn is the concatenation along its chain. That is what lets a request continue
// from a turn that is not the latest of its session (a fork) or from a stateless response.
// Bounded: least recently used turns go first, and using a turn refreshes its whole chain.
#pragma once
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "gateway/conversation.h"

namespace ds4::gateway {

class ResponseStore {
public:
    struct Turn {
        std::string parent;            // the previous_response_id it continued ("" = none)
        std::vector<int32_t> tokens;   // what this turn appended to the conversation
        bool known_base = true;        // false: it continued a session whose earlier tokens the
                                       // gateway never saw (its history cannot be rebuilt)
        std::string session;           // the named ds4d session it was made in ("" = stateless)
        uint32_t session_len = 0;      // that session's length right after it
        ConversationState conversation;   // what a later turn's rendering needs (conversation.h)
    };

    explicit ResponseStore(size_t max_tokens = size_t(8) << 20, size_t max_turns = 10000)
        : max_tokens_(max_tokens), max_turns_(max_turns) {}

    // Remembers turn `id` (replacing one of that id) and refreshes its ancestors.
    void add(const std::string &id, Turn t);
    // The turn without its tokens (nullopt: unknown or forgotten); refreshes its chain.
    std::optional<Turn> find(const std::string &id);
    // The conversation's tokens after turn id; nullopt when part of the chain is gone
    // (forgotten, or begun in a session the gateway saw only later).
    std::optional<std::vector<int32_t>> history(const std::string &id);

    size_t turns() const;
    size_t tokens() const;

private:
    struct Entry {
        Turn turn;
        std::list<std::string>::iterator pos;   // in lru_
    };
    void touch_chain(const std::string &id);   // mu_ held
    void evict();                               // mu_ held

    const size_t max_tokens_, max_turns_;
    mutable std::mutex mu_;
    std::unordered_map<std::string, Entry> map_;
    std::list<std::string> lru_;   // least recently used first
    size_t tokens_ = 0;
};

}  // namespace ds4::gateway
