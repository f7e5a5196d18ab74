// The JSON output constraint (daemon/json_constraint.h): the byte state machine accepts
// exactly the prefixes of JSON objects (checked against nlohmann's parser), its closing cost is
// exact, and masked sampling over a vocabulary always ends in a parseable object within the
// token budget, even when the budget is small and the sampler picks at random.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "daemon/json_constraint.h"

using ds4::daemon::JsonState;
using ds4::daemon::JsonVocab;

namespace {

bool parses_as_object(const std::string &s) {
    const auto j = nlohmann::json::parse(s, nullptr, false);
    return !j.is_discarded() && j.is_object();
}

// The bytes a closing path may use, tried in this order to find one that lowers the cost.
const std::string kClosers = "{0\"}]:ruealsn";

// Closes st by bytes that each lower min_close() by one; returns the bytes (empty if stuck).
std::string close_greedily(JsonState st, bool *ok) {
    std::string out;
    *ok = true;
    while (!st.done()) {
        const size_t cost = st.min_close();
        bool moved = false;
        for (unsigned char c : std::string(kClosers) + "\x80") {
            JsonState next = st;
            if (next.feed(c) && next.min_close() == cost - 1) {
                st = next;
                out.push_back(char(c));
                moved = true;
                break;
            }
        }
        if (!moved) {
            *ok = false;
            return out;
        }
    }
    return out;
}

// A byte-level vocabulary: every byte, plus multi-byte pieces a model would have.
std::vector<std::string> test_vocab() {
    std::vector<std::string> v;
    for (int b = 0; b < 256; ++b) v.emplace_back(1, char(b));
    for (const char *p : {"{\"", "\":", "\": \"", "\", \"", "\"}", "}}", "]}", "true", "false", "null", "123", "-0.5",
                          "e+10", "\\n", "\\u00e9", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "  ", "\n  ", "name",
                          "def ", "(self", "):", "[1, ", "], ", "{}", "[]", ", ", "\"x\"", "<|x|>", ""})
        v.emplace_back(p);
    return v;
}

}  // namespace

TEST(JsonConstraint, AcceptsObjectsAndTheirPrefixes) {
    const std::vector<std::string> docs = {
        "{}",
        "{ \n}",
        R"({"a":1})",
        R"({"a": [1, -2.5e+3, 0, 0.0, 1E9, true, false, null, "s", {}, []], "b": {"c": "\"\\\/\b\f\n\r\t\u00e9"}})",
        "{\"k\xc3\xa9y\": \"\xe2\x82\xac\xf0\x9f\x98\x80\xed\x9f\xbf\"}",
        R"({"a":[[[]],{"b":[{}]}]})",
        R"({"":""})",
    };
    for (const std::string &d : docs) {
        ASSERT_TRUE(parses_as_object(d)) << d;   // the test's own inputs are right
        JsonState st;
        for (size_t i = 0; i < d.size(); ++i) {
            ASSERT_FALSE(st.done()) << d << " done early at " << i;
            ASSERT_TRUE(st.feed(static_cast<unsigned char>(d[i]))) << d << " refused at byte " << i;
        }
        EXPECT_TRUE(st.done()) << d;
        EXPECT_EQ(st.min_close(), 0u);
        JsonState after = st;
        EXPECT_FALSE(after.feed(static_cast<unsigned char>(' '))) << "nothing may follow the object";
    }
}

TEST(JsonConstraint, RefusesWhatBreaksTheSyntax) {
    // Each is a valid prefix followed by one byte that no JSON object can continue with.
    const std::vector<std::string> bad = {
        "[",  "1", "\"", " ", "{a", "{\"a\" 1", "{\"a\":}", "{\"a\":1,}", "{\"a\":01", "{\"a\":-}", "{\"a\":1.}",
        "{\"a\":1e}", "{\"a\":tru}", "{\"a\":nul ", "{\"a\":\"\x01", "{\"a\":\"\\x", "{\"a\":\"\\u12g", "{\"a\":[1,]",
        "{\"a\":[1}", "{\"a\":{]", "{\"a\":\"\xc0", "{\"a\":\"\xe0\x80", "{\"a\":\"\xed\xa0", "{\"a\":\"\xf5",
        "{\"a\":\"\x80", "{}}", "{} ", "{\"a\":1 2", "{" + std::string(33, ' '), "{\"a\":+", "{\"a\":.", "{\"a\":'",
        "{\"a\":1e123", "{\"a\":-" + std::string(65, '1'),   // beyond what a double holds (number overflow)
    };
    for (const std::string &b : bad) {
        const std::string prefix = b.substr(0, b.size() - 1);
        JsonState st;
        ASSERT_TRUE(st.feed(prefix)) << "prefix of " << b;
        EXPECT_FALSE(st.feed(static_cast<unsigned char>(b.back()))) << "accepted: " << b;
    }
}

TEST(JsonConstraint, ClosingCostIsExactAndClosingParses) {
    // From every prefix of these documents, the greedy closer finishes in exactly min_close()
    // bytes and the result parses; no shorter completion exists (a byte never lowers the cost
    // by more than one).
    const std::vector<std::string> docs = {
        R"({"key": [1, -2.5e+3, {"x": "\u00e9s\"c"}, true, null], "k2": {"a": fals)",
        "{\"s\": \"\xe2\x82", "{\"a\":{\"b\":[[-", "{\"\\", "{ \"a\" ", "{\"a\":1e+", "{\"a\": 0.",
    };
    for (const std::string &d : docs) {
        for (size_t n = 0; n <= d.size(); ++n) {
            JsonState st;
            ASSERT_TRUE(st.feed(d.substr(0, n))) << d.substr(0, n);
            bool ok = false;
            const std::string tail = close_greedily(st, &ok);
            ASSERT_TRUE(ok) << "stuck closing " << d.substr(0, n) << tail;
            EXPECT_EQ(tail.size(), st.min_close()) << d.substr(0, n);
            EXPECT_TRUE(parses_as_object(d.substr(0, n) + tail)) << d.substr(0, n) + tail;
            for (int c = 0; c < 256; ++c) {
                JsonState next = st;
                if (next.feed(static_cast<unsigned char>(c))) {
                    EXPECT_GE(next.min_close() + 1, st.min_close()) << d.substr(0, n) << " + byte " << c;
                }
            }
        }
    }
}

TEST(JsonConstraint, MaskedRandomSamplingEndsInAnObjectWithinTheBudget) {
    std::vector<std::string> vocab = test_vocab();
    std::vector<bool> special(vocab.size(), false);
    special[vocab.size() - 2] = true;   // "<|x|>": markup, never allowed
    const JsonVocab jv(vocab, special);
    std::mt19937_64 rng(7);
    for (int round = 0; round < 400; ++round) {
        const size_t budget = 2 + size_t(rng() % 40);
        JsonState st;
        std::string out;
        size_t used = 0;
        while (!st.done()) {
            ASSERT_LT(used, budget) << "ran past the budget: " << out;
            std::vector<float> row(vocab.size(), 0.0f);
            const size_t allowed = jv.mask(st, budget - used, row);
            ASSERT_GT(allowed, 0u) << "no token allowed after " << out;
            std::vector<int32_t> ok;
            for (size_t t = 0; t < row.size(); ++t)
                if (std::isfinite(row[t])) ok.push_back(int32_t(t));
            ASSERT_EQ(ok.size(), allowed);
            // Uniform over the allowed tokens: far from what a model does, so every branch is hit.
            const int32_t t = ok[rng() % ok.size()];
            EXPECT_NE(t, int32_t(vocab.size() - 2)) << "a special token was allowed";
            EXPECT_NE(t, int32_t(vocab.size() - 1)) << "an empty token was allowed";
            ASSERT_TRUE(st.feed(vocab[size_t(t)])) << out << " + " << vocab[size_t(t)];
            out += vocab[size_t(t)];
            ++used;
        }
        EXPECT_TRUE(parses_as_object(out)) << out;
        EXPECT_LE(used, budget);
    }
}

TEST(JsonConstraint, ABudgetTooSmallAllowsNothingAndAVocabularyWithoutClosersIsRefused) {
    std::vector<std::string> vocab = test_vocab();
    const JsonVocab jv(vocab, std::vector<bool>(vocab.size(), false));
    std::vector<float> row(vocab.size(), 0.0f);
    EXPECT_EQ(jv.mask(JsonState(), 1, row), 1u);   // only "{}" closes in one token
    EXPECT_TRUE(std::isfinite(row[size_t(std::find(vocab.begin(), vocab.end(), "{}") - vocab.begin())]));
    std::fill(row.begin(), row.end(), 0.0f);
    EXPECT_EQ(jv.mask(JsonState(), 0, row), 0u);
    // Without a one-byte '}' token, closing in time cannot be promised: refused up front.
    std::vector<std::string> no_brace;
    for (const std::string &t : vocab)
        if (t != "}") no_brace.push_back(t);
    EXPECT_THROW(JsonVocab(no_brace, std::vector<bool>(no_brace.size(), false)), std::runtime_error);
}
