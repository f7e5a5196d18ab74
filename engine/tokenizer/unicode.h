// Unicode pieces the tokenizer needs: UTF-8 decoding that never fails, the character
// classes of the DeepSeek pre-tokenizer, and the GPT-2 byte <-> unicode mapping.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ds4::tok {

// Class bits (generated from the Unicode Character Database, see unicode_tables.inc).
enum : uint8_t {
    kClassL = 1,        // letters (Lu Ll Lt Lm Lo)
    kClassM = 2,        // marks (Mn Mc Me)
    kClassN = 4,        // numbers (Nd Nl No)
    kClassP = 8,        // punctuation (Pc Pd Ps Pe Pi Pf Po)
    kClassS = 16,       // symbols (Sm Sc Sk So)
    kClassSpace = 32,   // White_Space (what `\s` matches)
};

// Marks a byte that does not start a valid UTF-8 sequence. It is handled as one
// character of its own with no class, so any byte string survives encode/decode.
constexpr uint32_t kInvalidCodepoint = 0xFFFFFFFFu;

// Class bits of a code point (0 for unassigned, controls, format chars, invalid).
uint8_t char_class(uint32_t cp);

// Decodes the UTF-8 sequence starting at s[i] (i < n). Returns its length (1..4) and
// stores the code point, or returns 1 with kInvalidCodepoint for a byte that does not
// start a well-formed sequence (stray continuation, overlong, surrogate, > U+10FFFF,
// truncated).
int utf8_decode(const unsigned char *s, size_t n, size_t i, uint32_t *cp);

void utf8_append(std::string &out, uint32_t cp);

// Length of the longest prefix of s that does not end inside an incomplete (but so far
// valid) UTF-8 sequence. Invalid bytes count as complete: they can never become valid.
size_t utf8_complete_prefix(std::string_view s);

// GPT-2 byte-level alphabet: every byte maps to one printable code point.
uint32_t byte_to_unicode(uint8_t b);
// Inverse mapping; returns -1 for code points outside the alphabet.
int unicode_to_byte(uint32_t cp);
// The byte-level form (UTF-8) of raw bytes.
std::string bytes_to_byte_level(std::string_view raw);

}  // namespace ds4::tok
