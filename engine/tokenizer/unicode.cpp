#include "engine/tokenizer/unicode.h"

#include <algorithm>
#include <array>
#include <unordered_map>
#include <vector>

namespace ds4::tok {
namespace {

struct Range {
    uint32_t first, last;
    uint8_t bits;
};

constexpr Range kRanges[] = {
#include "engine/tokenizer/unicode_tables.inc"
};

// Two-stage lookup: 256-code-point blocks, identical blocks shared.
struct ClassTable {
    std::vector<uint16_t> block_of;   // 0x110000 / 256 entries
    std::vector<uint8_t> blocks;      // n_unique * 256

    ClassTable() {
        block_of.resize(0x110000 / 256);
        std::unordered_map<std::string, uint16_t> seen;
        std::string block(256, '\0');
        size_t r = 0;   // first range that may touch the current block
        constexpr size_t n_ranges = sizeof(kRanges) / sizeof(kRanges[0]);
        for (uint32_t b = 0; b < block_of.size(); ++b) {
            const uint32_t lo = b * 256, hi = lo + 255;
            std::fill(block.begin(), block.end(), '\0');
            while (r < n_ranges && kRanges[r].last < lo) ++r;
            for (size_t k = r; k < n_ranges && kRanges[k].first <= hi; ++k)
                for (uint32_t c = std::max(lo, kRanges[k].first); c <= std::min(hi, kRanges[k].last); ++c)
                    block[c - lo] = static_cast<char>(kRanges[k].bits);
            auto [it, fresh] = seen.emplace(block, static_cast<uint16_t>(seen.size()));
            if (fresh) blocks.insert(blocks.end(), block.begin(), block.end());
            block_of[b] = it->second;
        }
    }
};

const ClassTable &class_table() {
    static const ClassTable t;
    return t;
}

struct ByteMap {
    std::array<uint32_t, 256> to_cp{};
    std::array<int16_t, 324> to_byte{};   // the alphabet lies in [0, 324)

    ByteMap() {
        to_byte.fill(-1);
        int extra = 0;
        for (int b = 0; b < 256; ++b) {
            bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            to_cp[b] = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + extra++);
            to_byte[to_cp[b]] = static_cast<int16_t>(b);
        }
    }
};

const ByteMap &byte_map() {
    static const ByteMap m;
    return m;
}

}  // namespace

uint8_t char_class(uint32_t cp) {
    if (cp >= 0x110000) return 0;
    const ClassTable &t = class_table();
    return t.blocks[static_cast<size_t>(t.block_of[cp >> 8]) * 256 + (cp & 0xFF)];
}

int utf8_decode(const unsigned char *s, size_t n, size_t i, uint32_t *cp) {
    unsigned char c = s[i];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int len;
    uint32_t v;
    unsigned char lo = 0x80, hi = 0xBF;   // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2, v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3, v = c & 0x0F;
        if (c == 0xE0) lo = 0xA0;          // overlong
        if (c == 0xED) hi = 0x9F;          // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4, v = c & 0x07;
        if (c == 0xF0) lo = 0x90;          // overlong
        if (c == 0xF4) hi = 0x8F;          // > U+10FFFF
    } else {
        *cp = kInvalidCodepoint;
        return 1;
    }
    if (i + len > n) {
        *cp = kInvalidCodepoint;
        return 1;
    }
    for (int k = 1; k < len; ++k) {
        unsigned char b = s[i + k];
        if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) {
            *cp = kInvalidCodepoint;
            return 1;
        }
        v = (v << 6) | (b & 0x3F);
    }
    *cp = v;
    return len;
}

void utf8_append(std::string &out, uint32_t cp) {
    if (cp < 0x80) {
        out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
        out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
}

size_t utf8_complete_prefix(std::string_view s) {
    const auto *p = reinterpret_cast<const unsigned char *>(s.data());
    size_t n = s.size();
    // A pending sequence starts at most 3 bytes before the end.
    size_t start = n > 3 ? n - 3 : 0;
    for (size_t i = start; i < n; ++i) {
        unsigned char c = p[i];
        int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        if (len == 1 || i + len <= n) continue;   // ASCII, continuation or complete
        // Incomplete: is what we have a valid prefix? Decode it padded with a
        // continuation byte that keeps every valid second byte valid.
        unsigned char buf[4] = {c, 0, 0, 0};
        size_t have = n - i;
        for (size_t k = 1; k < have; ++k) buf[k] = p[i + k];
        bool valid = true;
        for (size_t k = have; k < static_cast<size_t>(len); ++k) {
            // Pick a second byte inside the allowed window of this lead byte.
            buf[k] = (k == 1) ? (c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80) : 0x80;
        }
        uint32_t cp;
        valid = utf8_decode(buf, len, 0, &cp) == len;
        if (valid) return i;
    }
    return n;
}

uint32_t byte_to_unicode(uint8_t b) { return byte_map().to_cp[b]; }

int unicode_to_byte(uint32_t cp) {
    if (cp >= byte_map().to_byte.size()) return -1;
    return byte_map().to_byte[cp];
}

std::string bytes_to_byte_level(std::string_view raw) {
    std::string out;
    out.reserve(raw.size() * 2);
    for (unsigned char b : raw) utf8_append(out, byte_to_unicode(b));
    return out;
}

}  // namespace ds4::tok
