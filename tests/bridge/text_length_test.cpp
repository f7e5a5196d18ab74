// Text crosses the bridge length-delimited: a NUL byte is text like any other, and nothing
// after it is dropped (it used to be cut there: "import os\0import sys" was "import os").
#include <string>

#include "tests/bridge/bridge_test_util.h"

namespace bridge_test {
namespace {

using namespace std::string_literals;

class TextLength : public BridgeTest {
protected:
    static std::vector<int32_t> c_tokenize(std::string_view text, bool rendered) {
        std::vector<int32_t> out(text.size() + 16);
        int n = 0;
        Err e;
        const int rc = rendered ? ds4_bridge_tokenize_rendered_chat(model->handle(), text.data(), text.size(), out.data(),
                                                                    int(out.size()), &n, e.buf, sizeof e.buf)
                                : ds4_bridge_tokenize_text(model->handle(), text.data(), text.size(), out.data(),
                                                           int(out.size()), &n, e.buf, sizeof e.buf);
        EXPECT_EQ(rc, 0) << e.str();
        out.resize(rc == 0 ? size_t(n) : 0);
        return out;
    }
    static std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t> &b) {
        a.insert(a.end(), b.begin(), b.end());
        return a;
    }
};

TEST_F(TextLength, EmbeddedNulTokenizesLikeThePiecesAroundIt) {
    const std::string text = "import os\0import sys"s;
    ASSERT_EQ(text.size(), 20u);
    for (bool rendered : {false, true}) {
        const auto whole = c_tokenize(text, rendered);
        const auto head = c_tokenize("import os", rendered);
        // The pre-tokenizer splits before "\0import" (a letter run may take one leading
        // non-letter), so these are the pieces the whole text is made of.
        EXPECT_EQ(whole, cat(head, c_tokenize("\0import sys"s, rendered))) << "rendered " << rendered;
        EXPECT_GT(whole.size(), head.size() + 1) << "rendered " << rendered;
        EXPECT_EQ(model->detokenize(whole), text) << "rendered " << rendered;
        EXPECT_EQ(model->tokenize(text, rendered), whole) << "ds4.hpp, rendered " << rendered;
    }
    // Only text_len bytes are read: the buffer need not end in NUL.
    const std::string padded = "import osXXXX";
    EXPECT_EQ(c_tokenize(std::string_view(padded.data(), 9), false), c_tokenize("import os", false));
    EXPECT_TRUE(c_tokenize(std::string_view(), false).empty());
}

TEST_F(TextLength, TextAfterANulIsNotDropped) {
    std::string tail;
    for (int i = 0; tail.size() < 100 * 1024; ++i) tail += "line " + std::to_string(i) + " of the tail\n";
    const std::string text = "head\0"s + tail;
    const auto toks = model->tokenize(text);
    EXPECT_GT(toks.size(), tail.size() / 8) << "the 100 KB after the NUL was not tokenized";
    const std::string back = model->detokenize(toks);
    EXPECT_EQ(back.size(), text.size());
    EXPECT_TRUE(back == text) << "the round trip differs";  // not EXPECT_EQ: 100 KB in a message
}

TEST_F(TextLength, ChatContentIsLengthDelimited) {
    const std::string content = "a\0b and more"s;
    const auto with_nul = model->render_chat({{"user", content}});
    const auto cut = model->render_chat({{"user", "a"}});
    EXPECT_NE(with_nul, cut) << "the content was cut at its NUL";
    EXPECT_NE(model->detokenize(with_nul).find(content), std::string::npos);

    // Through the C ABI: content_len bytes of a buffer that goes on past them.
    const std::string buf = content + "IGNORED";
    ds4_bridge_chat_msg msgs[2] = {{"system", "be brief", 8}, {"user", buf.data(), content.size()}};
    std::vector<int32_t> out(4096);
    int n = 0;
    Err e;
    ASSERT_EQ(ds4_bridge_render_chat(model->handle(), msgs, 2, 1, 0, out.data(), int(out.size()), &n, e.buf, sizeof e.buf), 0)
        << e.str();
    out.resize(size_t(n));
    EXPECT_EQ(out, model->render_chat({{"system", "be brief"}, {"user", content}}));
    const std::string rendered = model->detokenize(out);
    EXPECT_NE(rendered.find(content), std::string::npos);
    EXPECT_EQ(rendered.find("IGNORED"), std::string::npos);

    // Empty content may be NULL; NULL with a length is an error.
    out.assign(4096, 0);
    ds4_bridge_chat_msg empty = {"user", nullptr, 0};
    EXPECT_EQ(ds4_bridge_render_chat(model->handle(), &empty, 1, 1, 0, out.data(), int(out.size()), &n, e.buf,
                                     sizeof e.buf),
              0)
        << e.str();
    ds4_bridge_chat_msg bad = {"user", nullptr, 3};
    EXPECT_NE(ds4_bridge_render_chat(model->handle(), &bad, 1, 1, 0, out.data(), int(out.size()), &n, e.buf,
                                     sizeof e.buf),
              0);
    EXPECT_TRUE(has(e.str(), "NULL content"));
}

}  // namespace
}  // namespace bridge_test
