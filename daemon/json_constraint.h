// Constrained decoding for JSON output (Generate.output_format = JsonObject; OpenAI's
// response_format {"type": "json_object"}). A byte-level JSON state machine decides, before
// each token is sampled, which tokens of the vocabulary keep the output a prefix of one JSON
// object: the others get -inf. It works with any vocabulary (a token is its bytes; special
// tokens are never allowed) and ends the request when the top-level object closes.
//
// It also keeps the answer closable within the tokens left (max_tokens, the context): a token
// is allowed only when the fewest bytes that would close the object from the state after it fit
// in the tokens that remain (one byte per token: the vocabulary must have a one-byte token for
// each byte a closing path uses, checked when the vocabulary is built). So a request that runs
// out of tokens still ends with valid JSON, closed by the shortest path.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ds4::daemon {

// The state of a JSON text being written, one byte at a time. Trivially copyable.
class JsonState {
public:
    // Inside a string with nothing pending: a token of plain string bytes (JsonVocab::plain)
    // leaves the state as it is.
    bool in_plain_string() const { return mode_ == Mode::String; }
    // False (state unchanged only in the sense that it must be discarded) when c cannot come next.
    bool feed(unsigned char c);
    bool feed(std::string_view bytes);
    // The top-level object has closed: nothing may follow.
    bool done() const { return mode_ == Mode::Done; }
    // The fewest bytes that complete the document from here (0 once done).
    size_t min_close() const;

private:
    enum class Mode : uint8_t {
        Start,         // before the top-level object (which comes first: no whitespace)
        ObjKeyOrEnd,   // after '{'
        ObjKey,        // after ',' in an object
        Colon,         // after a key
        Value,         // after ':' or ',' in an array
        ArrValueOrEnd, // after '['
        AfterValue,    // after a value inside a container
        String, Escape, Unicode, Utf8,
        Minus, Zero, Int, FracStart, Frac, ExpStart, ExpSign, Exp,
        Literal,
        Done,
    };
    bool value_start(unsigned char c);
    bool after_value(unsigned char c);
    void end_value();
    bool end_number(unsigned char c);   // a byte that ends a number: continue as after a value

    Mode mode_ = Mode::Start;
    bool key_ = false;            // the string being written is an object key
    uint8_t pending_ = 0;         // Unicode: hex digits left; Utf8: continuation bytes left; Literal: bytes left
    uint8_t lo_ = 0x80, hi_ = 0xBF;   // Utf8: the range of the next continuation byte
    const char *literal_ = nullptr;   // Literal: the rest of "true"/"false"/"null"
    uint8_t spaces_ = 0;          // consecutive whitespace outside strings (capped)
    uint8_t digits_ = 0;          // Int: digits so far; Exp: exponent digits so far (both capped,
                                  // so a number stays within a double's range for any parser)
    // The open containers, one bit each (1: an array), so the state is a few trivially copied
    // bytes: the mask copies it once per candidate token.
    uint64_t arrays_[2] = {0, 0};
    uint8_t depth_ = 0;
    static constexpr size_t kMaxDepth = 128;
    void push(char c) {
        const uint64_t bit = uint64_t(1) << (depth_ & 63);
        if (c == '[') arrays_[depth_ >> 6] |= bit;
        else arrays_[depth_ >> 6] &= ~bit;
        ++depth_;
    }
    char top() const { return (arrays_[(depth_ - 1) >> 6] >> ((depth_ - 1) & 63)) & 1 ? '[' : '{'; }
};

// The vocabulary as bytes, grouped by first byte so a state's mask tests only the tokens whose
// first byte can come next. Built once per model.
class JsonVocab {
public:
    // token_bytes[t]: token t's bytes; special[t]: a control/markup token (never allowed).
    // Throws std::runtime_error when a byte that closing needs has no one-byte token.
    JsonVocab(std::vector<std::string> token_bytes, const std::vector<bool> &special);
    size_t size() const { return bytes_.size(); }
    const std::string &bytes(int32_t t) const { return bytes_[size_t(t)]; }

    // Sets row[t] = -inf for every token that cannot follow `state` with `tokens_left` tokens
    // (this one included) to close the document. Returns how many tokens stay allowed.
    size_t mask(const JsonState &state, size_t tokens_left, std::span<float> row) const;

private:
    std::vector<std::string> bytes_;
    std::vector<int32_t> plain_;      // tokens of string content only: no '"', '\\', control bytes; whole UTF-8
    std::vector<int32_t> not_plain_;  // the other allowed-ever tokens
    std::vector<std::vector<int32_t>> by_first_;   // [256]: tokens whose bytes start with that byte
};

}  // namespace ds4::daemon
