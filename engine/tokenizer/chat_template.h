// The DeepSeek-V4 chat format (DeepSeek's encoding_dsv4 encode_messages with
// drop_thinking, without tools):
//
//   <｜begin▁of▁sentence｜>{system}<｜User｜>{user}<｜Assistant｜></think>{answer}<｜end▁of▁sentence｜>...
//
// - system content is written as is, where it stands;
// - a user turn followed by an assistant turn (or ending the conversation) is closed
//   with <｜Assistant｜> and then <think> when thinking is on and this is the last user
//   turn, else </think> (thinking off, or an earlier turn whose reasoning is dropped);
// - an assistant turn after the last user turn carries its reasoning when thinking is
//   on: {reasoning}</think>{answer}; earlier assistant turns keep only the answer;
//   every assistant turn ends with <｜end▁of▁sentence｜>.
// Rendered text goes through Tokenizer::encode_special; generation stops at the
// tokenizer's stop tokens (<｜end▁of▁sentence｜>).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/tokenizer/tokenizer.h"

namespace ds4::tok {

enum class ChatRole { System, User, Assistant };

struct ChatMessage {
    ChatRole role = ChatRole::User;
    std::string content;
    std::string reasoning;   // assistant only: the thinking text, without the tags
};

struct ChatOptions {
    bool thinking = false;   // thinking mode: the reply starts inside <think>
    bool add_bos = true;
};

inline constexpr const char *kChatBos = "<｜begin▁of▁sentence｜>";
inline constexpr const char *kChatEos = "<｜end▁of▁sentence｜>";
inline constexpr const char *kChatUser = "<｜User｜>";
inline constexpr const char *kChatAssistant = "<｜Assistant｜>";
inline constexpr const char *kChatThink = "<think>";
inline constexpr const char *kChatEndThink = "</think>";

// The conversation as text (special tokens written out).
std::string render_chat(const std::vector<ChatMessage> &messages, const ChatOptions &opt = {});
// Rendered and encoded on the special path.
std::vector<int32_t> render_chat_tokens(const Tokenizer &tok, const std::vector<ChatMessage> &messages,
                                        const ChatOptions &opt = {});

// "system" / "user" / "assistant"; throws ds4::Error for anything else.
ChatRole chat_role_from_name(const std::string &name);

}  // namespace ds4::tok
