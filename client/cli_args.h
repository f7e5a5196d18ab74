// Command line of the `ds4` client: parsed into CliArgs, usage errors as UsageError.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ds4::client {

struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct CliArgs {
    enum class Command { Help, Version, Run, Chat, Stats, Tokenize, Sessions };
    Command command = Command::Help;
    std::string socket;             // empty: default path
    // run / chat
    std::string session;
    uint32_t max_tokens = 256;
    float temperature = 0.0f;
    int32_t top_k = 0;
    float top_p = 1.0f;
    float min_p = 0.0f;
    uint64_t seed = 0;
    bool seed_set = false;          // --seed given; otherwise the command picks a random seed
    float repeat_penalty = 1.0f;    // 1: off
    int32_t repeat_last_n = 64;     // 0: off, -1: the whole context
    float frequency_penalty = 0.0f;
    float presence_penalty = 0.0f;
    std::vector<std::pair<int32_t, float>> logit_bias;  // --logit-bias ID=BIAS (repeatable)
    bool ids = false;
    bool json = false;              // run --json: the answer is one JSON object (constrained decoding)
    int32_t logprobs = -1;          // run --logprobs N: per-token JSON lines with N alternatives (-1: off)
    bool ignore_eos = false;        // keep generating past end-of-sequence tokens
    bool no_speculate = false;      // decode without ds4d's drafter
    // run: --raw sends PROMPT as text, --chat wraps it in the chat template; neither: the
    // model decides (chat when its GGUF has a chat template, else plain completion).
    bool raw = false;
    bool chat_template = false;
    bool think = false;
    std::vector<std::string> stops;
    std::string prompt;             // run: the prompt; tokenize: the text ("-": stdin)
    // sessions
    enum class SessionsOp { List, Save, Delete, Pin } sessions_op = SessionsOp::List;
    std::string session_arg;        // sessions save|delete|pin NAME
    bool unpin = false;
};

// argv[0] is the program name. Throws UsageError with a one-line reason.
CliArgs parse_cli(int argc, const char *const *argv);

std::string usage_text();

// The sampling options shared by the command line and chat's /set: KEY is max_tokens (or
// max-tokens), temperature, top_k, top_p, min_p, seed, repeat_penalty, repeat_last_n,
// frequency_penalty, presence_penalty or logit_bias (ID=BIAS, added to the list). Throws UsageError for a bad value.
bool is_sampling_option(const std::string &opt);  // "--max-tokens", ...
void set_sampling_option(CliArgs &a, std::string key, const char *value);

}  // namespace ds4::client
