// Incremental detokenizer for generated tokens. A token can end inside a UTF-8
// character (byte tokens, partial merges); push() holds such a tail back until the
// character is complete, so a character is never split across output chunks and, for
// valid text, every chunk is valid UTF-8.
//
// Raw mode (default): bytes that can never become valid UTF-8 are passed through as
// they are, so the concatenated output equals Tokenizer::decode of all the ids.
// Replace mode: every invalid sequence (and a tail left incomplete at flush) becomes
// U+FFFD, so every chunk is valid UTF-8.
#pragma once
#include <cstdint>
#include <string>

#include "engine/tokenizer/tokenizer.h"

namespace ds4::tok {

class StreamDecoder {
public:
    explicit StreamDecoder(const Tokenizer &tok, bool replace_invalid = false);

    // Text that is ready after this token (may be empty). Throws for an id outside
    // the vocabulary, leaving the decoder unchanged.
    std::string push(int32_t id);
    // Whatever is still held back; the decoder is empty afterwards.
    std::string flush();
    // Bytes currently held back (0..3).
    size_t pending() const { return pending_.size(); }

private:
    std::string take(size_t n);
    Tokenizer tok_;
    bool replace_;
    std::string pending_;
};

// Replaces every ill-formed subsequence of s with U+FFFD (one per maximal invalid part,
// as the Unicode standard recommends).
std::string utf8_sanitize(std::string_view s);

}  // namespace ds4::tok
