// Byte-level BPE tokenizer with the DeepSeek V3/V4 pre-tokenizer, exact against HF
// tokenizers: text -> pieces (pretokenize.h) -> bytes in GPT-2 byte-level form -> BPE
// merges by rank (lowest first, leftmost on ties).
//
// Two encode paths:
//  - encode(): plain text; special tokens are ordinary characters, so user text can never
//    produce a control token.
//  - encode_special(): rendered text (a chat template); control and user-defined tokens
//    are matched first (leftmost, longest), the text between them goes through encode().
// Neither adds BOS/EOS by itself: the chat template writes BOS into the rendered text.
//
// A Tokenizer is cheap to copy (shared, immutable vocabulary) and safe to use from
// several threads at once.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/vocab.h"

namespace ds4::gguf {
class Reader;
}

namespace ds4::tok {

class Tokenizer {
public:
    static Tokenizer from_vocab(Vocab v);
    static Tokenizer from_gguf(const gguf::Reader &r);
    static Tokenizer from_hf_json(const std::string &tokenizer_json_path);
    static Tokenizer byte_fallback(int n_vocab);

    std::vector<int32_t> encode(std::string_view text) const;
    std::vector<int32_t> encode_special(std::string_view rendered) const;
    // Appending forms (no allocation of a fresh vector per call).
    void encode(std::string_view text, std::vector<int32_t> &out) const;
    void encode_special(std::string_view rendered, std::vector<int32_t> &out) const;

    // Raw bytes of the ids (possibly not valid UTF-8 when cut inside a character).
    // Throws ds4::Error for an id outside the vocabulary.
    std::string decode(std::span<const int32_t> ids) const;
    // Decoded bytes of one token (its text for control and user-defined tokens).
    const std::string &token_bytes(int32_t id) const;
    // The token as the vocabulary stores it (byte-level form for normal tokens).
    const std::string &token_text(int32_t id) const;
    TokenType token_type(int32_t id) const;
    // Id of the token whose stored text is exactly `text`, or -1.
    int32_t find_token(std::string_view text) const;

    int32_t bos() const;
    int32_t eos() const;
    bool is_stop(int32_t id) const;
    const std::vector<int32_t> &stop_tokens() const;
    int32_t vocab_size() const;
    const Vocab &vocab() const;

private:
    struct Impl;
    explicit Tokenizer(std::shared_ptr<const Impl> impl);
    std::shared_ptr<const Impl> impl_;
};

}  // namespace ds4::tok
