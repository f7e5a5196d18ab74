// Pre-tokenizer pieces; the expected splits are what HF tokenizers 0.23.2
// (PreTokenizer.preTokenizeString with the DeepSeek V3 sequence) returns.
#include <gtest/gtest.h>

#include "engine/tokenizer/pretokenize.h"

namespace ds4::tok {
namespace {

std::vector<std::string> pieces(std::string_view text) {
    std::vector<Piece> p;
    pretokenize_deepseek_v3(text, p);
    std::vector<std::string> out;
    uint32_t at = 0;
    for (const Piece &x : p) {
        EXPECT_EQ(x.begin, at);   // contiguous, in order
        EXPECT_LT(x.begin, x.end);
        at = x.end;
        out.emplace_back(text.substr(x.begin, x.end - x.begin));
    }
    EXPECT_EQ(at, text.size());
    return out;
}

using V = std::vector<std::string>;

TEST(PreTokenize, MatchesHfSplits) {
    EXPECT_EQ(pieces("Hello world's 12345 東京へ行く"),
              (V{"Hello", " world", "'s", " ", "123", "45", " ", "東京へ行く"}));
    EXPECT_EQ(pieces("a  \n\n b\t\tc  "), (V{"a", "  \n\n", " b", "\t", "\tc", "  "}));
    EXPECT_EQ(pieces("x\u0301y \u0301 .\u0301a"), (V{"x\u0301y", " \u0301", " .", "\u0301a"}));
    EXPECT_EQ(pieces("👨‍👩‍👧 ok"), (V{"👨", "\u200d", "👩", "\u200d", "👧", " ok"}));
    EXPECT_EQ(pieces("I'm (hello) ...world #include"),
              (V{"I", "'m", " (", "hello", ")", " ...", "world", " #", "include"}));
    EXPECT_EQ(pieces("a\r\n\r\nb \r\n"), (V{"a", "\r\n\r\n", "b", " \r\n"}));
    EXPECT_EQ(pieces("3.14 1,000"), (V{"3", ".", "14", " ", "1", ",", "000"}));
    EXPECT_EQ(pieces("\u00a0\u00a0x a\u3000b"), (V{"\u00a0", "\u00a0x", " a", "\u3000b"}));
    EXPECT_EQ(pieces("<think>x</think>"), (V{"<think", ">x", "</", "think", ">"}));
    EXPECT_EQ(pieces("  ,  b"), (V{" ", " ,", " ", " b"}));
}

TEST(PreTokenize, EmptyTextHasNoPieces) { EXPECT_TRUE(pieces("").empty()); }

TEST(PreTokenize, InvalidBytesAreCoveredLikeUnclassifiedCharacters) {
    auto p = pieces("ab\xFF\xFE cd\x80");
    std::string joined;
    for (auto &s : p) joined += s;
    EXPECT_EQ(joined, "ab\xFF\xFE cd\x80");
    EXPECT_EQ(p.front(), "ab");
}

}  // namespace
}  // namespace ds4::tok
