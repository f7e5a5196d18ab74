// decode(encode(x)) == x for arbitrary UTF-8 and, through the byte-level fallback, for
// arbitrary bytes; the streaming detokenizer never emits a partial UTF-8 sequence.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "engine/common/error.h"
#include "engine/tokenizer/pretokenize.h"
#include "engine/tokenizer/stream_decoder.h"
#include "engine/tokenizer/unicode.h"
#include "tests/tokenizer/tok_test_util.h"

namespace ds4::tok::test {
namespace {

std::string random_utf8(std::mt19937 &rng, size_t n_chars) {
    std::string s;
    for (size_t i = 0; i < n_chars; ++i) {
        uint32_t cp;
        switch (rng() % 6) {
        case 0: cp = 0x20 + rng() % 0x5F; break;                // ASCII
        case 1: cp = "\n\r\t  "[rng() % 5]; break;              // whitespace
        case 2: cp = 0x80 + rng() % 0x780; break;               // 2-byte
        case 3: cp = 0x4E00 + rng() % 0x5200; break;            // CJK
        case 4: cp = 0x10000 + rng() % 0x100000; break;         // supplementary planes
        default: cp = rng() % 0x10000; break;                   // anything in the BMP
        }
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
        utf8_append(s, cp);
    }
    return s;
}

std::string random_bytes(std::mt19937 &rng, size_t n) {
    std::string s(n, '\0');
    for (auto &c : s) c = static_cast<char>(rng() & 0xFF);
    return s;
}

bool valid_utf8(std::string_view s) {
    const auto *p = reinterpret_cast<const unsigned char *>(s.data());
    for (size_t i = 0; i < s.size();) {
        uint32_t cp;
        int len = utf8_decode(p, s.size(), i, &cp);
        if (cp == kInvalidCodepoint) return false;
        i += len;
    }
    return true;
}

TEST(RoundTrip, ArbitraryUtf8ThroughTheTrainedTokenizers) {
    std::mt19937 rng(1234);
    for (const char *fx : {"a", "b"}) {
        Tokenizer tok = Tokenizer::from_hf_json(fixture(std::string(fx) + "/tokenizer.json"));
        for (int i = 0; i < 300; ++i) {
            std::string s = random_utf8(rng, 1 + rng() % 120);
            ASSERT_EQ(tok.decode(tok.encode(s)), s) << fx;
            ASSERT_EQ(tok.decode(tok.encode_special(s)), s) << fx;
        }
    }
}

TEST(RoundTrip, ArbitraryBytesThroughTheTrainedTokenizer) {
    std::mt19937 rng(99);
    Tokenizer tok = Tokenizer::from_hf_json(fixture("a/tokenizer.json"));
    for (int i = 0; i < 300; ++i) {
        std::string s = random_bytes(rng, rng() % 200);
        ASSERT_EQ(tok.decode(tok.encode(s)), s);
    }
}

// Long texts are pre-tokenized in blocks cut after "\n" + printable ASCII; the result
// must be that of one pass over the whole text: the BPE of each of its pieces.
TEST(RoundTrip, LongTextsEncodeLikeOnePassOverTheWholeText) {
    Tokenizer tok = Tokenizer::from_hf_json(fixture("a/tokenizer.json"));
    auto exp = load_json(fixture("a/expected.json"));
    std::mt19937 rng(3);
    const char *joins[] = {"\n", "\n\n", " ", "\r\n", "\nX", "\n ", "\t\n", "\n1", "\n.", ""};
    std::string text;
    while (text.size() < 400000) {
        const auto &t = exp["texts"][rng() % exp["texts"].size()];
        text += t["text"].get<std::string>();
        text += joins[rng() % 10];
    }
    std::vector<Piece> pieces;
    pretokenize_deepseek_v3(text, pieces);
    std::vector<int32_t> want;
    for (const Piece &p : pieces) tok.encode(std::string_view(text).substr(p.begin, p.end - p.begin), want);
    EXPECT_EQ(tok.encode(text), want);
    EXPECT_EQ(tok.decode(want), text);
}

TEST(RoundTrip, OneTokenizerServesSeveralThreads) {
    Tokenizer tok = Tokenizer::from_hf_json(fixture("b/tokenizer.json"));
    std::mt19937 rng(11);
    std::vector<std::string> texts;
    for (int i = 0; i < 64; ++i) texts.push_back(random_utf8(rng, 200 + rng() % 2000));
    std::vector<std::vector<int32_t>> serial;
    for (const auto &t : texts) serial.push_back(tok.encode(t));
    std::vector<std::vector<std::vector<int32_t>>> got(4);
    std::vector<std::thread> threads;
    for (int k = 0; k < 4; ++k)
        threads.emplace_back([&, k] {
            for (int rep = 0; rep < 3; ++rep)
                for (size_t i = k; i < texts.size() + k; ++i) got[k].push_back(tok.encode(texts[i % texts.size()]));
        });
    for (auto &th : threads) th.join();
    for (int k = 0; k < 4; ++k)
        for (size_t j = 0; j < got[k].size(); ++j) ASSERT_EQ(got[k][j], serial[(k + j) % texts.size()]);
}

TEST(RoundTrip, FallbackVocabularyEncodesEveryByteAsItsByteToken) {
    Tokenizer tok = Tokenizer::byte_fallback(300);
    std::mt19937 rng(7);
    for (int i = 0; i < 300; ++i) {
        std::string s = random_bytes(rng, rng() % 300);
        auto ids = tok.encode(s);
        ASSERT_EQ(ids.size(), s.size());
        for (size_t k = 0; k < s.size(); ++k) ASSERT_EQ(ids[k], 3 + static_cast<uint8_t>(s[k]));
        ASSERT_EQ(tok.decode(ids), s);
    }
    std::string all;
    for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
    EXPECT_EQ(tok.decode(tok.encode(all)), all);
}

TEST(RoundTrip, FallbackMatchesItsControlTokensOnTheSpecialPathOnly) {
    Tokenizer tok = Tokenizer::byte_fallback(259);
    const std::string text = "<｜begin▁of▁sentence｜>hi<｜end▁of▁sentence｜>";
    auto special = tok.encode_special(text);
    ASSERT_EQ(special.size(), 4u);
    EXPECT_EQ(special[0], 0);
    EXPECT_EQ(special[1], 3 + 'h');
    EXPECT_EQ(special[2], 3 + 'i');
    EXPECT_EQ(special[3], 1);
    EXPECT_EQ(tok.encode(text).size(), text.size());
    EXPECT_EQ(tok.decode(special), text);
    EXPECT_EQ(tok.bos(), 0);
    EXPECT_EQ(tok.eos(), 1);
    EXPECT_TRUE(tok.is_stop(1));
}

TEST(RoundTrip, DecodeRejectsIdsOutsideTheVocabulary) {
    Tokenizer tok = Tokenizer::byte_fallback(259);
    EXPECT_THROW(tok.decode(std::vector<int32_t>{259}), ds4::Error);
    EXPECT_THROW(tok.decode(std::vector<int32_t>{-1}), ds4::Error);
}

// ------------------------------------------------------------------ stream decoder

// Byte positions strictly inside a well-formed character of s.
std::vector<bool> inside_characters(std::string_view s) {
    std::vector<bool> inside(s.size() + 1, false);
    const auto *p = reinterpret_cast<const unsigned char *>(s.data());
    for (size_t i = 0; i < s.size();) {
        uint32_t cp;
        int len = utf8_decode(p, s.size(), i, &cp);
        for (int k = 1; k < len; ++k) inside[i + k] = true;
        i += len;
    }
    return inside;
}

void check_stream(const Tokenizer &tok, const std::vector<int32_t> &ids) {
    StreamDecoder raw(tok), rep(tok, /*replace_invalid=*/true);
    const std::string all = tok.decode(ids);
    const bool input_valid = valid_utf8(all);
    const std::vector<bool> inside = inside_characters(all);
    std::string got;
    for (int32_t id : ids) {
        std::string a = raw.push(id);
        got += a;
        // A chunk never ends inside a character ...
        ASSERT_FALSE(inside[got.size()]) << "chunk boundary at byte " << got.size();
        // ... so for valid text every chunk is valid UTF-8 on its own.
        if (input_valid) {
            ASSERT_TRUE(valid_utf8(a));
        }
        ASSERT_LE(raw.pending(), 3u);
        ASSERT_TRUE(valid_utf8(rep.push(id)));
    }
    got += raw.flush();
    EXPECT_EQ(got, all);
    EXPECT_EQ(raw.pending(), 0u);
    EXPECT_TRUE(valid_utf8(rep.flush()));
}

TEST(StreamDecoder, HoldsBackSplitCharactersUntilComplete) {
    Tokenizer tok = Tokenizer::byte_fallback(259);
    StreamDecoder d(tok);
    const std::string emoji = "\xF0\x9F\x98\x80";
    EXPECT_EQ(d.push(3 + 0xF0), "");
    EXPECT_EQ(d.push(3 + 0x9F), "");
    EXPECT_EQ(d.push(3 + 0x98), "");
    EXPECT_EQ(d.pending(), 3u);
    EXPECT_EQ(d.push(3 + 0x80), emoji);
    EXPECT_EQ(d.push(3 + 'a'), "a");
    EXPECT_EQ(d.push(3 + 0xE4), "");
    EXPECT_EQ(d.flush(), "\xE4");   // the incomplete tail comes out at the end
    EXPECT_EQ(d.flush(), "");
}

TEST(StreamDecoder, ReplaceModeEmitsOnlyValidUtf8) {
    Tokenizer tok = Tokenizer::byte_fallback(259);
    StreamDecoder d(tok, true);
    EXPECT_EQ(d.push(3 + 0xE4), "");
    EXPECT_EQ(d.push(3 + 'x'), "\xEF\xBF\xBDx");   // E4 can no longer complete
    EXPECT_EQ(d.push(3 + 0xFF), "\xEF\xBF\xBD");
    EXPECT_EQ(d.push(3 + 0xF0), "");
    EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");
    EXPECT_EQ(utf8_sanitize("a\xF0\x9F\x98z\xED\xA0\x80"), "a\xEF\xBF\xBDz\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(StreamDecoder, BadIdLeavesTheDecoderUnchanged) {
    Tokenizer tok = Tokenizer::byte_fallback(259);
    StreamDecoder d(tok);
    EXPECT_EQ(d.push(3 + 0xC3), "");
    EXPECT_THROW(d.push(9999), ds4::Error);
    EXPECT_EQ(d.push(3 + 0xA9), "\xC3\xA9");
}

TEST(StreamDecoder, RandomTokenStreamsOfTheTrainedTokenizers) {
    std::mt19937 rng(42);
    for (const char *fx : {"a", "b"}) {
        Tokenizer tok = Tokenizer::from_hf_json(fixture(std::string(fx) + "/tokenizer.json"));
        for (int i = 0; i < 200; ++i) {
            // Encoded valid text (merges cut characters at arbitrary byte boundaries) ...
            check_stream(tok, tok.encode(random_utf8(rng, 1 + rng() % 80)));
            // ... and arbitrary id sequences.
            std::vector<int32_t> ids(1 + rng() % 40);
            for (auto &id : ids) id = static_cast<int32_t>(rng() % tok.vocab_size());
            check_stream(tok, ids);
        }
    }
}

TEST(StreamDecoder, RandomByteStreamsOfTheFallback) {
    Tokenizer tok = Tokenizer::byte_fallback(259);
    std::mt19937 rng(5);
    for (int i = 0; i < 500; ++i) {
        std::string s = i % 2 ? random_bytes(rng, rng() % 64) : random_utf8(rng, rng() % 30);
        check_stream(tok, tok.encode(s));
    }
}

}  // namespace
}  // namespace ds4::tok::test
