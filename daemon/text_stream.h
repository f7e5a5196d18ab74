// Turns the byte pieces of generated tokens into text deltas that are safe to send:
// an incomplete trailing UTF-8 sequence and any suffix that could begin a stop string are
// held back until the next piece decides them. A matched stop string ends the stream; the
// text before it is emitted, the stop string and everything after it are not.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace ds4::daemon {

class TextStream {
public:
    explicit TextStream(std::vector<std::string> stop_strings = {});

    // Appends the bytes of one token; returns the text that can be emitted now.
    std::string push(std::string_view bytes);

    // Everything still held back (nothing once a stop string matched).
    std::string flush();

    bool stopped() const { return stopped_; }
    const std::string &matched_stop() const { return matched_; }

private:
    std::vector<std::string> stops_;
    std::string held_;
    std::string matched_;
    bool stopped_ = false;
};

// Number of bytes at the end of s that form the start of a UTF-8 sequence still missing
// continuation bytes (0 when s ends on a boundary or in bytes that can never complete).
size_t utf8_incomplete_tail(std::string_view s);

}  // namespace ds4::daemon
