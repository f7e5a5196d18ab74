#include "engine/tokenizer/pretokenize.h"

#include "engine/common/error.h"
#include "engine/tokenizer/unicode.h"

namespace ds4::tok {
namespace {

struct Char {
    uint32_t cp;
    uint32_t off;   // byte offset of the character
    uint8_t cls;
};

bool is_crlf(uint32_t c) { return c == '\r' || c == '\n'; }

bool is_ascii_alpha(uint32_t c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }

// The 32 ASCII punctuation characters of the first alternative.
bool is_ascii_punct(uint32_t c) {
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
           (c >= 0x7B && c <= 0x7E);
}

// The literal ranges of the second Split (CJK Unified Ideographs up to U+9FA5, Hiragana,
// Katakana), exactly as the pattern spells them.
bool is_cjk_kana(uint32_t c) { return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x3040 && c <= 0x30FF); }

class Splitter {
public:
    Splitter(const std::vector<Char> &ch, uint32_t text_size, std::vector<Piece> &out)
        : ch_(ch), size_(text_size), out_(out) {}

    // Split 1: runs of numbers, cut into chunks of at most three.
    void digits(size_t b, size_t e) {
        size_t gap = b, i = b;
        while (i < e) {
            if (!(ch_[i].cls & kClassN)) {
                ++i;
                continue;
            }
            if (gap < i) cjk(gap, i);
            size_t j = i;
            while (j < e && j - i < 3 && (ch_[j].cls & kClassN)) ++j;
            cjk(i, j);
            i = gap = j;
        }
        if (gap < e) cjk(gap, e);
    }

private:
    // Split 2: runs of the CJK / kana ranges.
    void cjk(size_t b, size_t e) {
        size_t gap = b, i = b;
        while (i < e) {
            if (!is_cjk_kana(ch_[i].cp)) {
                ++i;
                continue;
            }
            if (gap < i) main(gap, i);
            size_t j = i;
            while (j < e && is_cjk_kana(ch_[j].cp)) ++j;
            main(i, j);
            i = gap = j;
        }
        if (gap < e) main(gap, e);
    }

    // Split 3: the main pattern; unmatched characters between matches form one piece.
    void main(size_t b, size_t e) {
        size_t gap = b, p = b;
        while (p < e) {
            size_t q = match_main(p, e);
            if (q == p) {
                ++p;
                continue;
            }
            if (gap < p) emit(gap, p);
            emit(p, q);
            p = gap = q;
        }
        if (gap < e) emit(gap, e);
    }

    // End of the match of the main pattern at p, or p when no alternative matches.
    size_t match_main(size_t p, size_t e) const {
        const uint32_t c = ch_[p].cp;
        const uint8_t k = ch_[p].cls;
        constexpr uint8_t LM = kClassL | kClassM, PS = kClassP | kClassS;
        // [!"#...~][A-Za-z]+
        if (is_ascii_punct(c) && p + 1 < e && is_ascii_alpha(ch_[p + 1].cp)) {
            size_t q = p + 2;
            while (q < e && is_ascii_alpha(ch_[q].cp)) ++q;
            return q;
        }
        // [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ : first with the optional lead char, then
        // (backtracking) without it.
        if (!is_crlf(c) && !(k & (kClassL | PS)) && p + 1 < e && (ch_[p + 1].cls & LM)) {
            size_t q = p + 2;
            while (q < e && (ch_[q].cls & LM)) ++q;
            return q;
        }
        if (k & LM) {
            size_t q = p + 1;
            while (q < e && (ch_[q].cls & LM)) ++q;
            return q;
        }
        //  ?[\p{P}\p{S}]+[\r\n]*
        size_t s = p + (c == ' ' ? 1 : 0);
        if (s < e && (ch_[s].cls & PS)) {
            size_t q = s + 1;
            while (q < e && (ch_[q].cls & PS)) ++q;
            while (q < e && is_crlf(ch_[q].cp)) ++q;
            return q;
        }
        if (!(k & kClassSpace)) return p;
        size_t r = p, last_nl = e;
        for (; r < e && (ch_[r].cls & kClassSpace); ++r)
            if (is_crlf(ch_[r].cp)) last_nl = r;
        if (last_nl != e) return last_nl + 1;   // \s*[\r\n]+ (greedy \s* gives back to the last CR/LF)
        if (r == e) return e;                   // \s+(?!\S) at the end of the piece
        if (r - p >= 2) return r - 1;           // \s+(?!\S) leaves the last space to the next token
        return r;                               // \s+
    }

    void emit(size_t b, size_t e) {
        uint32_t end = e < ch_.size() ? ch_[e].off : size_;
        out_.push_back(Piece{ch_[b].off, end});
    }

    const std::vector<Char> &ch_;
    uint32_t size_;
    std::vector<Piece> &out_;
};

}  // namespace

void pretokenize_deepseek_v3(std::string_view text, std::vector<Piece> &out) {
    if (text.size() >= 0xFFFFFFFFu) fail("tokenizer: text of " + std::to_string(text.size()) + " bytes is too large");
    thread_local std::vector<Char> ch;
    ch.clear();
    ch.reserve(text.size());
    const auto *s = reinterpret_cast<const unsigned char *>(text.data());
    for (size_t i = 0; i < text.size();) {
        uint32_t cp;
        int len = utf8_decode(s, text.size(), i, &cp);
        ch.push_back(Char{cp, static_cast<uint32_t>(i), cp == kInvalidCodepoint ? uint8_t(0) : char_class(cp)});
        i += len;
    }
    if (ch.empty()) return;
    Splitter(ch, static_cast<uint32_t>(text.size()), out).digits(0, ch.size());
}

}  // namespace ds4::tok
