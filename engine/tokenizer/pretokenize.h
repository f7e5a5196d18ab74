// The DeepSeek V3/V4 pre-tokenizer: HF tokenizers' Sequence of three isolating Splits
//   1. \p{N}{1,3}
//   2. [\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+
//   3. [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+ | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
//      |  ?[\p{P}\p{S}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
// Each Split runs on every piece the previous one produced (so a lookahead never sees
// past its piece), and text between matches becomes a piece of its own. Matching follows
// the leftmost-first, backtracking semantics of Oniguruma, which HF uses.
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

namespace ds4::tok {

struct Piece {
    uint32_t begin, end;   // byte offsets into the text
};

// Appends the pieces of text to out, in order; together they cover the whole text.
// Bytes that are not valid UTF-8 are single characters without a class.
void pretokenize_deepseek_v3(std::string_view text, std::vector<Piece> &out);

}  // namespace ds4::tok
