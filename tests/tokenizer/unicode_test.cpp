// The committed class tables against the Unicode Character Database installed on this
// machine and against the classes HF tokenizers' regex engine uses; UTF-8 decoding and
// the GPT-2 byte alphabet.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>

#include "engine/tokenizer/unicode.h"
#include "tests/tokenizer/tok_test_util.h"

namespace ds4::tok::test {
namespace {

const char *kUcd = "/usr/share/unicode";

// General category of every code point listed in UnicodeData.txt (ranges expanded).
std::map<uint32_t, std::string> read_unicode_data() {
    std::map<uint32_t, std::string> gc;
    std::istringstream in(read_text(std::string(kUcd) + "/UnicodeData.txt"));
    std::string line;
    uint32_t first = 0;
    while (std::getline(in, line)) {
        std::vector<std::string> f;
        size_t s = 0, e;
        while ((e = line.find(';', s)) != std::string::npos) f.push_back(line.substr(s, e - s)), s = e + 1;
        f.push_back(line.substr(s));
        uint32_t cp = static_cast<uint32_t>(std::stoul(f[0], nullptr, 16));
        if (f[1].find(", First>") != std::string::npos) {
            first = cp;
            continue;
        }
        uint32_t lo = f[1].find(", Last>") != std::string::npos ? first : cp;
        for (uint32_t c = lo; c <= cp; ++c) gc[c] = f[2];
    }
    return gc;
}

std::set<uint32_t> read_white_space() {
    std::set<uint32_t> ws;
    std::istringstream in(read_text(std::string(kUcd) + "/PropList.txt"));
    std::string line;
    while (std::getline(in, line)) {
        line = line.substr(0, line.find('#'));
        size_t semi = line.find(';');
        if (semi == std::string::npos) continue;
        std::string prop = line.substr(semi + 1);
        prop.erase(0, prop.find_first_not_of(' '));
        prop.erase(prop.find_last_not_of(' ') + 1);
        if (prop != "White_Space") continue;
        std::string range = line.substr(0, semi);
        size_t dots = range.find("..");
        uint32_t lo = static_cast<uint32_t>(std::stoul(range, nullptr, 16));
        uint32_t hi = dots == std::string::npos ? lo : static_cast<uint32_t>(std::stoul(range.substr(dots + 2), nullptr, 16));
        for (uint32_t c = lo; c <= hi; ++c) ws.insert(c);
    }
    return ws;
}

uint8_t bits_of_category(const std::string &gc) {
    switch (gc[0]) {
    case 'L': return kClassL;
    case 'M': return kClassM;
    case 'N': return kClassN;
    case 'P': return kClassP;
    case 'S': return kClassS;
    default: return 0;
    }
}

bool have_ucd() { return std::filesystem::exists(std::string(kUcd) + "/UnicodeData.txt"); }

TEST(UnicodeTables, MatchTheInstalledUnicodeCharacterDatabase) {
    if (!have_ucd()) GTEST_SKIP() << "unicode-data is not installed";
    auto gc = read_unicode_data();
    auto ws = read_white_space();
    ASSERT_GT(gc.size(), 280000u);
    ASSERT_EQ(ws.size(), 25u);
    size_t wrong = 0;
    for (uint32_t cp = 0; cp < 0x110000; ++cp) {
        auto it = gc.find(cp);
        uint8_t want = it == gc.end() ? 0 : bits_of_category(it->second);
        if (ws.count(cp)) want |= kClassSpace;
        if (char_class(cp) != want && ++wrong <= 10) ADD_FAILURE() << "U+" << std::hex << cp;
    }
    EXPECT_EQ(wrong, 0u);
    EXPECT_EQ(char_class(0x110000), 0);
    EXPECT_EQ(char_class(kInvalidCodepoint), 0);
}

// HF tokenizers 0.23 (Oniguruma) already has Unicode 16.0; the tables come from the
// installed 15.0. On every code point 15.0 assigns, the classes must agree exactly.
TEST(UnicodeTables, AgreeWithHfRegexClassesOnEveryAssignedCodePoint) {
    if (!have_ucd()) GTEST_SKIP() << "unicode-data is not installed";
    auto gc = read_unicode_data();
    auto hf = load_json(fixture("hf_categories.json"));
    std::vector<uint8_t> hf_bits(0x110000, 0);
    const std::pair<const char *, uint8_t> names[] = {{"L", kClassL}, {"M", kClassM}, {"N", kClassN},
                                                      {"P", kClassP}, {"S", kClassS}, {"WS", kClassSpace}};
    for (const auto &[name, bit] : names)
        for (const auto &r : hf[name])
            for (uint32_t c = r[0].get<uint32_t>(); c <= r[1].get<uint32_t>(); ++c) hf_bits[c] |= bit;
    size_t newer = 0, wrong = 0;
    for (uint32_t cp = 0; cp < 0x110000; ++cp) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        if (char_class(cp) == hf_bits[cp]) continue;
        if (!gc.count(cp)) {
            ++newer;   // assigned after Unicode 15.0
            continue;
        }
        if (++wrong <= 10) ADD_FAILURE() << "U+" << std::hex << cp;
    }
    EXPECT_EQ(wrong, 0u);
    // Unicode 15.1 and 16.0 together add 5812 characters with one of these classes.
    EXPECT_EQ(newer, 5812u);
}

TEST(Utf8, DecodesWellFormedSequences) {
    const std::string s = "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80";   // a é 中 😀
    const auto *p = reinterpret_cast<const unsigned char *>(s.data());
    uint32_t cp;
    EXPECT_EQ(utf8_decode(p, s.size(), 0, &cp), 1);
    EXPECT_EQ(cp, 0x61u);
    EXPECT_EQ(utf8_decode(p, s.size(), 1, &cp), 2);
    EXPECT_EQ(cp, 0xE9u);
    EXPECT_EQ(utf8_decode(p, s.size(), 3, &cp), 3);
    EXPECT_EQ(cp, 0x4E2Du);
    EXPECT_EQ(utf8_decode(p, s.size(), 6, &cp), 4);
    EXPECT_EQ(cp, 0x1F600u);
}

TEST(Utf8, RejectsIllFormedSequencesOneByteAtATime) {
    for (const std::string bad : {"\x80", "\xC0\xAF", "\xC1\xBF", "\xE0\x80\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80",
                                  "\xF5\x80\x80\x80", "\xFF", "\xE4\xB8", "\xF0\x9F\x98", "\xC3"}) {
        uint32_t cp = 0;
        const auto *p = reinterpret_cast<const unsigned char *>(bad.data());
        EXPECT_EQ(utf8_decode(p, bad.size(), 0, &cp), 1);
        EXPECT_EQ(cp, kInvalidCodepoint);
    }
}

TEST(Utf8, CompletePrefixHoldsBackOnlyAValidIncompleteTail) {
    EXPECT_EQ(utf8_complete_prefix(""), 0u);
    EXPECT_EQ(utf8_complete_prefix("abc"), 3u);
    EXPECT_EQ(utf8_complete_prefix("ab\xE4\xB8"), 2u);
    EXPECT_EQ(utf8_complete_prefix("ab\xE4\xB8\xAD"), 5u);
    EXPECT_EQ(utf8_complete_prefix("\xF0"), 0u);
    EXPECT_EQ(utf8_complete_prefix("\xF0\x9F"), 0u);
    EXPECT_EQ(utf8_complete_prefix("\xF0\x9F\x98"), 0u);
    EXPECT_EQ(utf8_complete_prefix("x\xF0\x9F\x98\x80"), 5u);
    // Prefixes that can never complete are passed on.
    EXPECT_EQ(utf8_complete_prefix("a\xE0\x80"), 3u);   // overlong
    EXPECT_EQ(utf8_complete_prefix("a\xED\xA0"), 3u);   // surrogate
    EXPECT_EQ(utf8_complete_prefix("a\xF4\x90"), 3u);   // > U+10FFFF
    EXPECT_EQ(utf8_complete_prefix("a\xC0"), 2u);
    EXPECT_EQ(utf8_complete_prefix("a\xE4\x41"), 3u);
    EXPECT_EQ(utf8_complete_prefix("a\x80\x80"), 3u);
}

TEST(ByteLevel, IsTheGpt2Alphabet) {
    std::set<uint32_t> seen;
    for (int b = 0; b < 256; ++b) {
        uint32_t cp = byte_to_unicode(static_cast<uint8_t>(b));
        EXPECT_TRUE(seen.insert(cp).second);
        EXPECT_EQ(unicode_to_byte(cp), b);
        // Printable Latin-1 bytes stand for themselves; the others move to U+0100...
        bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        if (printable) EXPECT_EQ(cp, static_cast<uint32_t>(b));
        else EXPECT_GE(cp, 0x100u);
    }
    EXPECT_EQ(byte_to_unicode(' '), 0x120u);    // Ġ
    EXPECT_EQ(byte_to_unicode('\n'), 0x10Au);   // Ċ
    EXPECT_EQ(byte_to_unicode(0), 0x100u);
    EXPECT_EQ(byte_to_unicode(0xAD), 0x143u);
    EXPECT_EQ(unicode_to_byte(0x4E2D), -1);
    EXPECT_EQ(bytes_to_byte_level(" a\n"), "\xC4\xA0" "a" "\xC4\x8A");
}

}  // namespace
}  // namespace ds4::tok::test
