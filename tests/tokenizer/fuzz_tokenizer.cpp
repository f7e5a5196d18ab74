// libFuzzer target: arbitrary bytes through pre-tokenizer, BPE (a vocabulary with merges
// across ASCII and UTF-8 byte boundaries), the special path and the stream decoder.
// Invariants: no crash, pieces tile the input, decode(encode(x)) == x on both paths,
// encoding is deterministic, streamed output equals decode and never splits a character.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/tokenizer/pretokenize.h"
#include "engine/tokenizer/stream_decoder.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode.h"

using namespace ds4::tok;

namespace {

const Tokenizer &tokenizer() {
    static const Tokenizer tok = [] {
        Vocab v = fallback_vocab(259);
        auto add_merge = [&](const std::string &a, const std::string &b) {
            v.tokens.push_back(a + b);
            v.types.push_back(static_cast<int32_t>(TokenType::Normal));
            v.merges.push_back(a + " " + b);
        };
        auto bl = [](const std::string &raw) { return bytes_to_byte_level(raw); };
        // Letter pairs, then a few longer words built from them.
        for (char a : std::string("etaoinsh")) for (char b : std::string("etaoinsh")) add_merge(bl({a}), bl({b}));
        add_merge(bl(" "), bl("t")), add_merge(bl(" t"), bl("he")), add_merge(bl("in"), bl("g"));
        // UTF-8: the lead/continuation pairs of a few CJK characters and of é.
        add_merge(bl("\xE4"), bl("\xB8")), add_merge(bl("\xE4\xB8"), bl("\xAD"));
        add_merge(bl("\xC3"), bl("\xA9")), add_merge(bl("\xF0"), bl("\x9F"));
        v.tokens.push_back("<think>");
        v.types.push_back(static_cast<int32_t>(TokenType::Control));
        v.tokens.push_back("<tag>");
        v.types.push_back(static_cast<int32_t>(TokenType::UserDefined));
        return Tokenizer::from_vocab(v);
    }();
    return tok;
}

void check(bool ok) {
    if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const std::string text(reinterpret_cast<const char *>(data), size);
    const Tokenizer &tok = tokenizer();

    std::vector<Piece> pieces;
    pretokenize_deepseek_v3(text, pieces);
    uint32_t at = 0;
    for (const Piece &p : pieces) {
        check(p.begin == at && p.end > p.begin);
        at = p.end;
    }
    check(at == text.size());

    std::vector<int32_t> plain = tok.encode(text);
    check(tok.decode(plain) == text);
    check(tok.encode(text) == plain);
    std::vector<int32_t> special = tok.encode_special(text);
    check(tok.decode(special) == text);

    // Character boundaries of the decoded text.
    std::vector<bool> inside(text.size() + 1, false);
    const auto *s = reinterpret_cast<const unsigned char *>(text.data());
    for (size_t i = 0; i < text.size();) {
        uint32_t cp;
        int len = utf8_decode(s, text.size(), i, &cp);
        for (int k = 1; k < len; ++k) inside[i + k] = true;
        i += len;
    }
    StreamDecoder raw(tok), rep(tok, true);
    std::string got;
    for (int32_t id : special) {
        got += raw.push(id);
        check(!inside[got.size()]);
        std::string r = rep.push(id);
        check(utf8_sanitize(r) == r);
    }
    got += raw.flush();
    check(got == text);
    std::string r = rep.flush();
    check(utf8_sanitize(r) == r);
    return 0;
}
