#include "daemon/text_stream.h"

#include <algorithm>

namespace ds4::daemon {

size_t utf8_incomplete_tail(std::string_view s) {
    const size_t n = s.size();
    // Walk back over at most 3 continuation bytes to the sequence's lead byte.
    for (size_t back = 1; back <= std::min<size_t>(4, n); ++back) {
        const unsigned char c = static_cast<unsigned char>(s[n - back]);
        if ((c & 0xC0) == 0x80) continue;  // continuation byte
        size_t need;
        if (c < 0x80) need = 1;
        else if ((c & 0xE0) == 0xC0) need = 2;
        else if ((c & 0xF0) == 0xE0) need = 3;
        else if ((c & 0xF8) == 0xF0) need = 4;
        else return 0;  // invalid lead byte: nothing will complete it
        return back < need ? back : 0;
    }
    return 0;  // only continuation bytes: not a sequence start we could wait for
}

TextStream::TextStream(std::vector<std::string> stop_strings) {
    for (auto &s : stop_strings)
        if (!s.empty()) stops_.push_back(std::move(s));
}

std::string TextStream::push(std::string_view bytes) {
    if (stopped_) return {};
    held_.append(bytes);

    // Earliest complete stop string wins.
    size_t best = std::string::npos;
    for (const auto &s : stops_) {
        size_t p = held_.find(s);
        if (p != std::string::npos && p < best) {
            best = p;
            matched_ = s;
        }
    }
    if (best != std::string::npos) {
        stopped_ = true;
        std::string out = held_.substr(0, best);
        held_.clear();
        return out;
    }

    // Hold the longest suffix that is a proper prefix of some stop string: no future match
    // can then start inside text already emitted.
    size_t keep = 0;
    for (const auto &s : stops_) {
        const size_t max_len = std::min(s.size() - 1, held_.size());
        for (size_t len = max_len; len > keep; --len)
            if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
                keep = len;
                break;
            }
    }
    keep = std::max(keep, utf8_incomplete_tail(held_));
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
}

std::string TextStream::flush() {
    std::string out;
    out.swap(held_);
    if (stopped_) out.clear();
    return out;
}

}  // namespace ds4::daemon
