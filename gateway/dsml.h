// DeepSeek V4's chat format with tools, both ways (ARCHITECTURE.md §8):
//
//  - render_prompt(): a conversation (system/developer/user/assistant/tool messages, tool
//    schemas, assistant tool calls) as the text DeepSeek's encoding_dsv4 encode_messages
//    produces: tool schemas appended to the system prompt under "## Tools", assistant
//    calls as a <｜DSML｜tool_calls> block, tool results merged into the following user
//    turn as <tool_result>…</tool_result> (in the order of the calls they answer).
//  - DsmlParser: the model's output text, fed incrementally as it streams, split into
//    visible text, reasoning (thinking mode) and tool calls whose JSON arguments are
//    produced as deltas while the parameters are still being generated.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ds4::gateway {

using Json = nlohmann::ordered_json;

inline constexpr const char *kBos = "<｜begin▁of▁sentence｜>";
inline constexpr const char *kEos = "<｜end▁of▁sentence｜>";
inline constexpr const char *kUser = "<｜User｜>";
inline constexpr const char *kAssistant = "<｜Assistant｜>";
inline constexpr const char *kThink = "<think>";
inline constexpr const char *kEndThink = "</think>";
inline constexpr const char *kToolCallsOpen = "<｜DSML｜tool_calls>";
inline constexpr const char *kToolCallsClose = "</｜DSML｜tool_calls>";
inline constexpr const char *kInvokeOpen = "<｜DSML｜invoke name=\"";
inline constexpr const char *kInvokeClose = "</｜DSML｜invoke>";
inline constexpr const char *kParamOpen = "<｜DSML｜parameter name=\"";
inline constexpr const char *kParamClose = "</｜DSML｜parameter>";

struct ToolCall {
    std::string id;
    std::string name;
    std::string arguments;   // a JSON object as text (as OpenAI carries it)
};

enum class Role { System, Developer, User, Assistant, Tool };

struct Message {
    Role role = Role::User;
    std::string content;
    std::string reasoning;             // assistant: thinking text, without the tags
    std::vector<ToolCall> tool_calls;  // assistant
    std::string tool_call_id;          // tool: the call it answers
};

struct PromptOptions {
    bool thinking = false;
    // reasoning_effort "max": in thinking mode the prompt opens with DeepSeek's
    // maximum-effort instruction (before the first turn).
    bool effort_max = false;
    // Function definitions ({name, description, parameters}); empty: no tools section.
    Json tools = Json::array();
    // A json_schema response format's schema (null: none), rendered after the tools as the
    // encoding's "## Response Format" section.
    Json response_format = nullptr;
    // The messages continue a conversation already in the context (a named session, a
    // previous response), rendered as they are at the end of the whole conversation: no
    // BOS and no first-turn header (tool schemas, response format, effort preamble: the
    // first turn has them). `tools` and `response_format` are then not used; these are:
    bool continued = false;
    bool continued_tools = false;          // the conversation has tools
    std::vector<std::string> prior_calls;  // ids of the calls of its latest assistant turn with calls
};

// JSON with integers beyond 64 bits kept exactly (tool arguments, schemas: Python's json,
// which DeepSeek's encoding uses, keeps them; nlohmann reads them as doubles). parse_exact
// keeps such a literal's digits as a binary value of subtype kBigInteger (JSON text never
// yields a binary value); dump_exact and python_json write the digits back. An invalid text
// gives a discarded value, as Json::parse(text, nullptr, false), and so does one nested
// deeper than kMaxJsonDepth.
inline constexpr uint64_t kBigInteger = 0xD54B1;
inline constexpr size_t kMaxJsonDepth = 1000;
Json parse_exact(std::string_view text);
bool is_big_integer(const Json &v);
// v.dump(-1, ' ', false, replace) with big integers as their digits.
std::string dump_exact(const Json &v);

// json.dumps(value, ensure_ascii=False): ", " and ": " separators, non-ASCII kept.
std::string python_json(const Json &v);

// The "## Tools" system-prompt section for these function definitions.
std::string render_tools(const Json &functions);

// The conversation as prompt text with special tokens written out (BOS included). A
// trailing assistant message is left open (no end-of-sentence) so generation continues it.
std::string render_prompt(const std::vector<Message> &messages, const PromptOptions &opt);

struct DsmlEvent {
    enum class Kind { Text, Reasoning, ToolStart, ToolArgs, ToolEnd } kind;
    int index = 0;       // tool call index (ToolStart/ToolArgs/ToolEnd)
    std::string text;    // Text/Reasoning/ToolArgs: the delta; ToolStart: the tool name
};

// Incremental splitter of generated text. Text that may be the start of a marker is held
// back until the next feed() decides it. With tools off, DSML passes through as text.
class DsmlParser {
public:
    DsmlParser(bool tools, bool thinking);
    void feed(std::string_view text, std::vector<DsmlEvent> &out);
    // End of generation: releases held-back text; closes an unfinished call.
    void finish(std::vector<DsmlEvent> &out);
    int tool_calls() const { return calls_; }

private:
    enum class State { Reasoning, Content, Block, InvokeName, Invoke, ParamHead, ParamValue, After };
    void run(std::vector<DsmlEvent> &out, bool final);
    void emit_text(std::string_view s, std::vector<DsmlEvent> &out);
    void end_param(std::vector<DsmlEvent> &out);
    void abandon(std::vector<DsmlEvent> &out);

    bool tools_;
    State st_;
    std::string buf_;        // unprocessed input
    std::string ws_;         // content whitespace held back (dropped before a tool block)
    std::string raw_block_;  // the DSML consumed since the block opened (re-emitted if malformed)
    int calls_ = 0;
    int params_ = 0;         // parameters written in the current call
    bool param_string_ = true;
    std::string param_value_;  // a non-string value, emitted whole when it closes
};

}  // namespace ds4::gateway
