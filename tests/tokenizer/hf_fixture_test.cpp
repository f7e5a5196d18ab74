// Ids must equal HF tokenizers' on the committed fixtures (tools/reference/tokenizer/
// make_fixture.py, run with tokenizers 0.23.2): two tokenizers trained on different
// corpora with different vocabulary sizes and special-token layouts, every text on the
// plain and the special path, loaded both straight from tokenizer.json and through a
// GGUF written the way the converter writes it; plus the rendered chat conversations.
#include <gtest/gtest.h>

#include "engine/tokenizer/chat_template.h"
#include "tests/tokenizer/tok_test_util.h"

namespace ds4::tok::test {
namespace {

class HfFixture : public ::testing::TestWithParam<std::string> {
protected:
    void SetUp() override {
        dir_ = fixture(GetParam());
        expected_ = load_json(dir_ + "/expected.json");
    }
    std::string dir_;
    nlohmann::json expected_;
};

void expect_all_texts(const Tokenizer &tok, const nlohmann::json &expected) {
    size_t checked = 0;
    for (const auto &t : expected["texts"]) {
        const std::string text = t["text"].get<std::string>();
        const std::string name = t["name"].get<std::string>();
        EXPECT_EQ(tok.encode(text), ids_of(t["plain"])) << "plain path, text " << name;
        EXPECT_EQ(tok.encode_special(text), ids_of(t["special"])) << "special path, text " << name;
        EXPECT_EQ(tok.decode(tok.encode(text)), text) << "round trip, text " << name;
        ++checked;
    }
    EXPECT_GT(checked, 250u);
}

TEST_P(HfFixture, IdsMatchFromTokenizerJson) {
    Tokenizer tok = Tokenizer::from_hf_json(dir_ + "/tokenizer.json");
    EXPECT_EQ(tok.vocab_size(), expected_["vocab_size"].get<int>());
    expect_all_texts(tok, expected_);
}

TEST_P(HfFixture, IdsMatchThroughGguf) {
    TempDir tmp;
    // A model's embedding is usually larger than its tokenizer: pad like the converter does.
    const int n_vocab = expected_["vocab_size"].get<int>() + 61;
    Tokenizer tok = via_gguf(dir_ + "/tokenizer.json", n_vocab, tmp);
    EXPECT_EQ(tok.vocab_size(), n_vocab);
    EXPECT_EQ(tok.token_type(n_vocab - 1), TokenType::Unused);
    expect_all_texts(tok, expected_);
}

TEST_P(HfFixture, EncodingSomeTextsTwiceUsesTheCacheConsistently) {
    Tokenizer tok = Tokenizer::from_hf_json(dir_ + "/tokenizer.json");
    std::string all;
    for (const auto &t : expected_["texts"]) all += t["text"].get<std::string>();
    auto first = tok.encode(all);
    auto second = tok.encode(all);
    EXPECT_EQ(first, second);
    EXPECT_EQ(tok.decode(first), all);
}

TEST_P(HfFixture, ChatTemplateRendersTheReferenceConversations) {
    Tokenizer tok = Tokenizer::from_hf_json(dir_ + "/tokenizer.json");
    size_t n = 0;
    for (const auto &c : expected_["chats"]) {
        std::vector<ChatMessage> msgs;
        for (const auto &m : c["messages"]) {
            ChatMessage cm;
            cm.role = chat_role_from_name(m["role"].get<std::string>());
            cm.content = m.value("content", "");
            cm.reasoning = m.value("reasoning", "");
            msgs.push_back(cm);
        }
        ChatOptions opt;
        opt.thinking = c["thinking"].get<bool>();
        const std::string name = c["name"].get<std::string>();
        EXPECT_EQ(render_chat(msgs, opt), c["rendered"].get<std::string>()) << name;
        EXPECT_EQ(render_chat_tokens(tok, msgs, opt), ids_of(c["ids"])) << name;
        ++n;
    }
    EXPECT_GE(n, 6u);
}

TEST_P(HfFixture, SpecialTokensAreSingleIdsOnlyOnTheSpecialPath) {
    Tokenizer tok = Tokenizer::from_hf_json(dir_ + "/tokenizer.json");
    for (const char *s : {kChatBos, kChatEos, kChatUser, kChatAssistant, kChatThink, kChatEndThink}) {
        int32_t id = tok.find_token(s);
        ASSERT_GE(id, 0) << s;
        EXPECT_EQ(tok.token_type(id), TokenType::Control) << s;
        EXPECT_EQ(tok.encode_special(s), std::vector<int32_t>{id}) << s;
        auto plain = tok.encode(s);
        EXPECT_GT(plain.size(), 1u) << s;
        for (int32_t p : plain) EXPECT_EQ(tok.token_type(p), TokenType::Normal) << s;
        EXPECT_EQ(tok.decode(plain), s);
        EXPECT_EQ(tok.decode(std::vector<int32_t>{id}), s);
    }
    EXPECT_EQ(tok.bos(), tok.find_token(kChatBos));
    EXPECT_EQ(tok.eos(), tok.find_token(kChatEos));
    EXPECT_TRUE(tok.is_stop(tok.eos()));
    EXPECT_FALSE(tok.is_stop(tok.find_token(kChatUser)));
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, HfFixture, ::testing::Values("a", "b"));

}  // namespace
}  // namespace ds4::tok::test
