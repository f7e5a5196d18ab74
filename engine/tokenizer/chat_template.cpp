#include "engine/tokenizer/chat_template.h"

#include "engine/common/error.h"

namespace ds4::tok {

std::string render_chat(const std::vector<ChatMessage> &msgs, const ChatOptions &opt) {
    int last_user = -1;
    for (size_t i = 0; i < msgs.size(); ++i)
        if (msgs[i].role == ChatRole::User) last_user = static_cast<int>(i);

    std::string out = opt.add_bos ? kChatBos : "";
    for (size_t i = 0; i < msgs.size(); ++i) {
        const ChatMessage &m = msgs[i];
        const int idx = static_cast<int>(i);
        switch (m.role) {
        case ChatRole::System:
            out += m.content;
            break;
        case ChatRole::User:
            out += kChatUser;
            out += m.content;
            break;
        case ChatRole::Assistant:
            if (opt.thinking && idx > last_user) {
                out += m.reasoning;
                out += kChatEndThink;
            }
            out += m.content;
            out += kChatEos;
            break;
        }
        // The reply marker follows a user turn only when an assistant turn comes next
        // or the conversation ends there.
        bool next_is_assistant = i + 1 < msgs.size() && msgs[i + 1].role == ChatRole::Assistant;
        if (m.role == ChatRole::User && (next_is_assistant || i + 1 == msgs.size())) {
            out += kChatAssistant;
            out += opt.thinking && idx >= last_user ? kChatThink : kChatEndThink;
        }
    }
    return out;
}

std::vector<int32_t> render_chat_tokens(const Tokenizer &tok, const std::vector<ChatMessage> &messages,
                                        const ChatOptions &opt) {
    return tok.encode_special(render_chat(messages, opt));
}

ChatRole chat_role_from_name(const std::string &name) {
    if (name == "system") return ChatRole::System;
    if (name == "user") return ChatRole::User;
    if (name == "assistant") return ChatRole::Assistant;
    fail("chat message role '" + name + "' is not system, user or assistant");
}

}  // namespace ds4::tok
