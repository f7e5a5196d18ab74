// Command line of the `ds4` client: parsed into CliArgs, usage errors as UsageError.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ds4::client {

struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct CliArgs {
    enum class Command { Help, Run, Chat, Stats, Tokenize, Sessions };
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
    bool ids = false;
    bool raw = false;
    bool think = false;
    std::vector<std::string> stops;
    std::string prompt;             // run: the prompt; tokenize: the text
    // sessions
    enum class SessionsOp { List, Save, Delete, Pin } sessions_op = SessionsOp::List;
    std::string session_arg;        // sessions save|delete|pin NAME
    bool unpin = false;
};

// argv[0] is the program name. Throws UsageError with a one-line reason.
CliArgs parse_cli(int argc, const char *const *argv);

std::string usage_text();

}  // namespace ds4::client
