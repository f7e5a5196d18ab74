#include "engine/tokenizer/stream_decoder.h"

#include "engine/tokenizer/unicode.h"

namespace ds4::tok {

StreamDecoder::StreamDecoder(const Tokenizer &tok, bool replace_invalid) : tok_(tok), replace_(replace_invalid) {}

std::string StreamDecoder::take(size_t n) {
    std::string out = pending_.substr(0, n);
    pending_.erase(0, n);
    return replace_ ? utf8_sanitize(out) : out;
}

std::string StreamDecoder::push(int32_t id) {
    const std::string &bytes = tok_.token_bytes(id);   // throws before any change
    pending_ += bytes;
    return take(utf8_complete_prefix(pending_));
}

std::string StreamDecoder::flush() {
    std::string out = take(pending_.size());
    pending_.clear();
    return out;
}

std::string utf8_sanitize(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    const auto *p = reinterpret_cast<const unsigned char *>(s.data());
    size_t i = 0;
    while (i < s.size()) {
        uint32_t cp;
        int len = utf8_decode(p, s.size(), i, &cp);
        if (cp != kInvalidCodepoint) {
            out.append(s.substr(i, len));
            i += len;
            continue;
        }
        // Maximal subpart: the lead byte plus the continuation bytes that were still valid.
        size_t j = i + 1;
        unsigned char c = p[i];
        int need = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 1;
        for (int k = 1; k < need && j < s.size(); ++k, ++j) {
            unsigned char b = p[j];
            unsigned char lo = 0x80, hi = 0xBF;
            if (k == 1) {
                if (c == 0xE0) lo = 0xA0;
                if (c == 0xED) hi = 0x9F;
                if (c == 0xF0) lo = 0x90;
                if (c == 0xF4) hi = 0x8F;
            }
            if (b < lo || b > hi) break;
        }
        out += "\xEF\xBF\xBD";
        i = j;
    }
    return out;
}

}  // namespace ds4::tok
