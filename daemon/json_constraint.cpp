#include "daemon/json_constraint.h"

#include <cmath>
#include <stdexcept>

namespace ds4::daemon {
namespace {

constexpr uint8_t kMaxSpaces = 32;      // whitespace run outside strings: a model cannot idle forever
constexpr uint8_t kMaxIntDigits = 64;   // integer part (with the exponent cap: |x| < 1e164)
constexpr uint8_t kMaxExpDigits = 2;

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool is_hex(unsigned char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

}  // namespace

bool JsonState::feed(std::string_view bytes) {
    for (char c : bytes)
        if (!feed(static_cast<unsigned char>(c))) return false;
    return true;
}

void JsonState::end_value() { mode_ = depth_ == 0 ? Mode::Done : Mode::AfterValue; }

bool JsonState::value_start(unsigned char c) {
    switch (c) {
    case '{':
    case '[':
        if (depth_ >= kMaxDepth) return false;
        push(char(c));
        mode_ = c == '{' ? Mode::ObjKeyOrEnd : Mode::ArrValueOrEnd;
        return true;
    case '"':
        mode_ = Mode::String;
        key_ = false;
        return true;
    case '-': mode_ = Mode::Minus; return true;
    case '0': mode_ = Mode::Zero; return true;
    case 't': literal_ = "rue"; break;
    case 'f': literal_ = "alse"; break;
    case 'n': literal_ = "ull"; break;
    default:
        if (c >= '1' && c <= '9') {
            mode_ = Mode::Int;
            digits_ = 1;
            return true;
        }
        return false;
    }
    mode_ = Mode::Literal;
    pending_ = uint8_t(std::char_traits<char>::length(literal_));
    return true;
}

bool JsonState::after_value(unsigned char c) {
    const char top = this->top();
    if (c == ',') {
        mode_ = top == '{' ? Mode::ObjKey : Mode::Value;
        return true;
    }
    if ((c == '}' && top == '{') || (c == ']' && top == '[')) {
        --depth_;
        end_value();
        return true;
    }
    return false;
}

bool JsonState::end_number(unsigned char c) {
    mode_ = Mode::AfterValue;
    return feed(c);
}

bool JsonState::feed(unsigned char c) {
    // Whitespace between tokens of the syntax, a bounded run of it.
    switch (mode_) {
    case Mode::ObjKeyOrEnd: case Mode::ObjKey: case Mode::Colon:
    case Mode::Value: case Mode::ArrValueOrEnd: case Mode::AfterValue:
        if (is_space(c)) {
            if (spaces_ >= kMaxSpaces) return false;
            ++spaces_;
            return true;
        }
        spaces_ = 0;
        break;
    default: break;
    }
    switch (mode_) {
    case Mode::Start:   // the answer starts with the object itself
        if (c != '{') return false;
        push('{');
        mode_ = Mode::ObjKeyOrEnd;
        return true;
    case Mode::ObjKeyOrEnd:
        if (c == '}') return after_value(c);
        [[fallthrough]];
    case Mode::ObjKey:
        if (c != '"') return false;
        mode_ = Mode::String;
        key_ = true;
        return true;
    case Mode::Colon:
        if (c != ':') return false;
        mode_ = Mode::Value;
        return true;
    case Mode::Value: return value_start(c);
    case Mode::ArrValueOrEnd:
        if (c == ']') return after_value(c);
        return value_start(c);
    case Mode::AfterValue: return after_value(c);
    case Mode::String:
        if (c == '"') {
            if (key_) mode_ = Mode::Colon;
            else end_value();
            return true;
        }
        if (c == '\\') {
            mode_ = Mode::Escape;
            return true;
        }
        if (c < 0x20) return false;   // control characters must be escaped
        if (c < 0x80) return true;
        // UTF-8: a lead byte and its continuation bytes (no overlong forms, no surrogates).
        lo_ = 0x80;
        hi_ = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) pending_ = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            pending_ = 2;
            if (c == 0xE0) lo_ = 0xA0;
            if (c == 0xED) hi_ = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            pending_ = 3;
            if (c == 0xF0) lo_ = 0x90;
            if (c == 0xF4) hi_ = 0x8F;
        } else {
            return false;
        }
        mode_ = Mode::Utf8;
        return true;
    case Mode::Escape:
        if (c == 'u') {
            mode_ = Mode::Unicode;
            pending_ = 4;
            return true;
        }
        if (c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' && c != 'n' && c != 'r' && c != 't') return false;
        mode_ = Mode::String;
        return true;
    case Mode::Unicode:
        if (!is_hex(c)) return false;
        if (--pending_ == 0) mode_ = Mode::String;
        return true;
    case Mode::Utf8:
        if (c < lo_ || c > hi_) return false;
        lo_ = 0x80;
        hi_ = 0xBF;
        if (--pending_ == 0) mode_ = Mode::String;
        return true;
    case Mode::Minus:
        if (!is_digit(c)) return false;
        mode_ = c == '0' ? Mode::Zero : Mode::Int;
        digits_ = 1;
        return true;
    case Mode::Zero:
    case Mode::Int:
        if (mode_ == Mode::Int && is_digit(c)) return digits_ < kMaxIntDigits && ++digits_;
        if (c == '.') {
            mode_ = Mode::FracStart;
            return true;
        }
        if (c == 'e' || c == 'E') {
            mode_ = Mode::ExpStart;
            return true;
        }
        return end_number(c);
    case Mode::FracStart:
        if (!is_digit(c)) return false;
        mode_ = Mode::Frac;
        return true;
    case Mode::Frac:
        if (is_digit(c)) return true;
        if (c == 'e' || c == 'E') {
            mode_ = Mode::ExpStart;
            return true;
        }
        return end_number(c);
    case Mode::ExpStart:
        if (c == '+' || c == '-') {
            mode_ = Mode::ExpSign;
            return true;
        }
        [[fallthrough]];
    case Mode::ExpSign:
        if (!is_digit(c)) return false;
        mode_ = Mode::Exp;
        digits_ = 1;
        return true;
    case Mode::Exp:
        if (is_digit(c)) return digits_ < kMaxExpDigits && ++digits_;
        return end_number(c);
    case Mode::Literal:
        if (char(c) != *literal_) return false;
        ++literal_;
        if (--pending_ == 0) end_value();
        return true;
    case Mode::Done: return false;
    }
    return false;
}

size_t JsonState::min_close() const {
    const size_t d = depth_;   // one closing bracket per open container
    const size_t string_end = key_ ? 3 : 1;   // `":0` after a key, `"` after a value
    switch (mode_) {
    case Mode::Start: return 2;                      // {}
    case Mode::ObjKeyOrEnd:
    case Mode::ArrValueOrEnd:
    case Mode::AfterValue:
    case Mode::Zero: case Mode::Int: case Mode::Frac: case Mode::Exp: return d;
    case Mode::ObjKey: return d + 4;                 // "":0
    case Mode::Colon: return d + 2;                  // :0
    case Mode::Value:
    case Mode::Minus: case Mode::FracStart: case Mode::ExpStart: case Mode::ExpSign: return d + 1;   // 0
    case Mode::String: return d + string_end;
    case Mode::Escape: return d + 1 + string_end;
    case Mode::Unicode:
    case Mode::Utf8: return d + pending_ + string_end;
    case Mode::Literal: return d + pending_;
    case Mode::Done: return 0;
    }
    return d;
}

JsonVocab::JsonVocab(std::vector<std::string> token_bytes, const std::vector<bool> &special)
    : bytes_(std::move(token_bytes)), by_first_(256) {
    std::vector<bool> single(256, false);
    for (size_t t = 0; t < bytes_.size(); ++t) {
        if (bytes_[t].empty() || (t < special.size() && special[t])) continue;
        const unsigned char first = static_cast<unsigned char>(bytes_[t][0]);
        by_first_[first].push_back(int32_t(t));
        if (bytes_[t].size() == 1) single[first] = true;
        // From inside a string, back inside it with nothing pending: changes nothing.
        JsonState s;
        s.feed(std::string_view("{\"", 2));
        const bool plain = s.feed(bytes_[t]) && s.in_plain_string();
        (plain ? plain_ : not_plain_).push_back(int32_t(t));
    }
    // min_close() counts one token per byte along the shortest closing paths.
    std::string need = "{}[]\":0,rueals";
    for (int b = 0x80; b <= 0xBF; ++b) need.push_back(char(b));
    for (char c : need)
        if (!single[static_cast<unsigned char>(c)])
            throw std::runtime_error("JSON output needs a one-byte token for byte 0x" +
                                     std::string(1, "0123456789abcdef"[static_cast<unsigned char>(c) >> 4]) +
                                     std::string(1, "0123456789abcdef"[c & 15]) + ", and this vocabulary has none");
}

size_t JsonVocab::mask(const JsonState &state, size_t tokens_left, std::span<float> row) const {
    std::vector<char> ok(row.size(), 0);
    size_t allowed = 0;
    auto test = [&](int32_t t, const JsonState &from, size_t skip) {
        if (size_t(t) >= row.size()) return;
        JsonState s = from;
        if (!s.feed(std::string_view(bytes_[size_t(t)]).substr(skip))) return;
        if (s.min_close() > tokens_left - 1) return;   // could no longer close in time
        ok[size_t(t)] = 1;
        ++allowed;
    };
    if (tokens_left > 0 && state.in_plain_string()) {
        // Most of a vocabulary is string content: it leaves the state (and its cost) as it is.
        if (state.min_close() <= tokens_left - 1)
            for (int32_t t : plain_)
                if (size_t(t) < row.size()) {
                    ok[size_t(t)] = 1;
                    ++allowed;
                }
        for (int32_t t : not_plain_) test(t, state, 0);
    } else if (tokens_left > 0 && !state.done()) {
        for (int b = 0; b < 256; ++b) {
            const std::vector<int32_t> &group = by_first_[size_t(b)];
            if (group.empty()) continue;
            JsonState first = state;
            if (!first.feed(static_cast<unsigned char>(b))) continue;   // the whole group is out
            for (int32_t t : group) test(t, first, 1);
        }
    }
    for (size_t t = 0; t < row.size(); ++t)
        if (!ok[t]) row[t] = -INFINITY;
    return allowed;
}

}  // namespace ds4::daemon
