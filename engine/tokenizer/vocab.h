// The tokenizer vocabulary as GGUF stores it (`tokenizer.ggml.*`, llama.cpp's layout),
// and the ways to obtain one: from a GGUF, from an HF tokenizer.json, or the byte-level
// fallback for models shipped without a tokenizer.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ds4::gguf {
class Reader;
class Writer;
}

namespace ds4::tok {

// llama.cpp token types (tokenizer.ggml.token_type).
enum class TokenType : int32_t {
    Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6,
};

struct Vocab {
    std::string model = "gpt2";           // tokenizer.ggml.model
    std::string pre = "deepseek-v3";      // tokenizer.ggml.pre
    std::vector<std::string> tokens;      // byte-level form for normal tokens, raw text for added ones
    std::vector<int32_t> types;           // TokenType per token
    std::vector<std::string> merges;      // "left right", in rank order
    int32_t bos = -1, eos = -1, pad = -1; // -1: absent
    int32_t eot = -1;                     // tokenizer.ggml.eot_token_id (extra stop token)
    std::string chat_template;            // tokenizer.chat_template (optional)
};

// Reads and validates tokenizer.ggml.* (model must be "gpt2", pre "deepseek-v3"/"deepseek-v4").
Vocab read_vocab(const gguf::Reader &r);
// Writes tokenizer.ggml.* (and tokenizer.chat_template when set).
void write_vocab(gguf::Writer &w, const Vocab &v);

// Byte-level fallback for n_vocab >= 259: ids 0..2 are <｜begin▁of▁sentence｜>,
// <｜end▁of▁sentence｜>, <｜▁pad▁｜> (control); ids 3..258 the 256 byte tokens in GPT-2
// byte-to-unicode form (normal) in byte order; the rest <|reserved_ID|> (unused); no merges.
Vocab fallback_vocab(int n_vocab);
void write_fallback_vocab(gguf::Writer &w, int n_vocab);

// Reads an HF tokenizer.json (a BPE model with the DeepSeek V3 pre-tokenizer; anything
// else is rejected with the field that differs). BOS/EOS come from tokenizer_config.json
// next to it when present, else from the DeepSeek token names. n_vocab > 0 pads the
// vocabulary with <|reserved_ID|> (unused) up to the model's embedding size and rejects
// token ids >= n_vocab; n_vocab == 0 keeps the tokenizer's own size.
Vocab read_vocab_hf_json(const std::string &tokenizer_json_path, int n_vocab = 0);
void write_tokenizer_from_hf_json(gguf::Writer &w, const std::string &tokenizer_json_path, int n_vocab);

}  // namespace ds4::tok
