// The HTTP APIs' request bodies (OpenAI chat completions, completions, responses;
// Anthropic messages) read into one Request, and the errors each API reports. Pure
// functions of the body: no I/O, so the fuzzer drives them directly.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gateway/dsml.h"

namespace ds4::gateway {

enum class Api { Chat, Completions, Responses, Messages };

// An error answered to the client: HTTP status, the API's error type, a message, and the
// request field it concerns (empty when none).
struct ApiError : std::runtime_error {
    ApiError(int status, std::string type, std::string message, std::string param = {}, std::string code = {})
        : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
          code(std::move(code)) {}
    int status;
    std::string type;
    std::string param;
    std::string code;
};

// 400 invalid_request_error for field `param`.
[[noreturn]] void bad_request(const std::string &param, const std::string &message);
// 400 for a field the daemon cannot serve yet (the error says so and names it).
[[noreturn]] void not_supported(const std::string &param);

struct Request {
    Api api = Api::Chat;
    std::string model;
    bool stream = false;
    bool include_usage = false;     // chat/completions streams: a final usage chunk
    bool raw_prompt = false;        // completions: prompt is plain text, no template
    std::string prompt;             // completions
    std::vector<Message> messages;  // the others
    PromptOptions prompt_options;   // tools (function definitions), thinking
    bool parse_tools = false;       // tools given and tool_choice allows them
    uint32_t max_tokens = 0;        // 0: the front's default
    float temperature = 1.0f;
    float top_p = 1.0f;
    int32_t top_k = 0;
    float min_p = 0.0f;
    std::optional<uint64_t> seed;
    std::vector<std::string> stop;
    bool ignore_eos = false;        // extension (as vLLM): generate through end-of-sentence
    // Repetition controls (ds4.fbs Sampling): OpenAI's frequency/presence penalties, and
    // repetition_penalty (vLLM's name; repeat_penalty as llama.cpp's server) with repeat_last_n.
    float frequency_penalty = 0.0f, presence_penalty = 0.0f;
    float repeat_penalty = 1.0f;
    int32_t repeat_last_n = 64;
    std::vector<std::pair<int32_t, float>> logit_bias;  // token id -> bias
    bool logprobs = false;          // per generated token (chat/responses/completions shapes)
    uint32_t top_logprobs = 0;
    uint32_t n = 1;                 // chat/completions: choices, one daemon request each
    // tool_choice forcing a call: "required" (any tool) or a named function. The prompt then
    // ends with the opening of the DSML call, so the output starts inside it.
    bool force_tool = false;
    std::string forced_tool_name;   // empty: any
    // Extension: a named ds4d session; the request's messages are appended to its
    // conversation (its KV state persists between calls and across daemon restarts).
    std::string session;
    std::string previous_response_id;  // responses: continue the conversation of that response
    bool store = true;              // responses: remember this one for previous_response_id
    // response_format / text.format {"type": "json_object"}: the answer is one JSON object
    // (ds4d's constrained decoding, Generate.output_format).
    bool json_object = false;
};

// Throws ApiError for a body the API would refuse.
Request parse_request(Api api, std::string_view body);

// The error as the API's JSON body.
std::string error_body(Api api, const ApiError &e);

}  // namespace ds4::gateway
