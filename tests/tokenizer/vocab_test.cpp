// Vocabulary I/O: the fallback layout, GGUF round trips, the HF tokenizer.json import
// the converter uses, and the errors for inputs the engine cannot tokenize exactly.
#include <gtest/gtest.h>

#include "engine/common/error.h"
#include "engine/tokenizer/unicode.h"
#include "tests/tokenizer/tok_test_util.h"

namespace ds4::tok::test {
namespace {

std::unique_ptr<gguf::Reader> write_and_open(gguf::Writer &w, const TempDir &dir) {
    w.write(dir.file("v.gguf"));
    return gguf::Reader::open(dir.file("v.gguf"), false);
}

std::string error_of(const std::function<void()> &f) {
    try {
        f();
    } catch (const ds4::Error &e) {
        return e.what();
    }
    return "";
}

TEST(FallbackVocab, HasTheAgreedLayoutInGguf) {
    TempDir dir;
    gguf::Writer w;
    write_fallback_vocab(w, 1000);
    auto r = write_and_open(w, dir);
    EXPECT_EQ(r->get_string("tokenizer.ggml.model"), "gpt2");
    EXPECT_EQ(r->get_string("tokenizer.ggml.pre"), "deepseek-v3");
    const auto &toks = r->get_array("tokenizer.ggml.tokens");
    const auto &types = r->get_array("tokenizer.ggml.token_type");
    ASSERT_EQ(toks.arr.size(), 1000u);
    ASSERT_EQ(types.arr.size(), 1000u);
    EXPECT_EQ(toks.arr[0].s, "<｜begin▁of▁sentence｜>");
    EXPECT_EQ(toks.arr[1].s, "<｜end▁of▁sentence｜>");
    EXPECT_EQ(toks.arr[2].s, "<｜▁pad▁｜>");
    for (int i = 0; i < 3; ++i) EXPECT_EQ(types.arr[i].as_int(), 3);
    EXPECT_EQ(toks.arr[3 + ' '].s, "Ġ");
    EXPECT_EQ(toks.arr[3 + 'A'].s, "A");
    EXPECT_EQ(toks.arr[3 + '\n'].s, "Ċ");
    for (int i = 3; i < 259; ++i) EXPECT_EQ(types.arr[i].as_int(), 1);
    EXPECT_EQ(toks.arr[259].s, "<|reserved_259|>");
    EXPECT_EQ(toks.arr[999].s, "<|reserved_999|>");
    for (int i = 259; i < 1000; ++i) EXPECT_EQ(types.arr[i].as_int(), 5);
    EXPECT_TRUE(r->get_array("tokenizer.ggml.merges").arr.empty());
    EXPECT_EQ(r->get_int("tokenizer.ggml.bos_token_id"), 0);
    EXPECT_EQ(r->get_int("tokenizer.ggml.eos_token_id"), 1);
    EXPECT_EQ(r->get_int("tokenizer.ggml.padding_token_id"), 2);

    Tokenizer tok = Tokenizer::from_gguf(*r);
    EXPECT_EQ(tok.vocab_size(), 1000);
    EXPECT_EQ(tok.encode("Hi"), (std::vector<int32_t>{3 + 'H', 3 + 'i'}));
    // Reserved names are never matched, not even on the special path.
    EXPECT_EQ(tok.encode_special("<|reserved_300|>").size(), std::string("<|reserved_300|>").size());
}

TEST(FallbackVocab, NeedsRoomForTheControlAndByteTokens) {
    gguf::Writer w;
    EXPECT_NE(error_of([&] { write_fallback_vocab(w, 258); }).find("259"), std::string::npos);
    EXPECT_THROW(Tokenizer::byte_fallback(0), ds4::Error);
    EXPECT_NO_THROW(Tokenizer::byte_fallback(259));
}

Vocab tiny_vocab() {
    Vocab v = fallback_vocab(259);
    // "ab" and "abc" by merges, the way a trained BPE stores them.
    v.tokens.push_back("ab");
    v.tokens.push_back("abc");
    v.types.push_back(1);
    v.types.push_back(1);
    v.merges = {"a b", "ab c"};
    return v;
}

TEST(Vocab, MergesApplyByRankThroughGguf) {
    TempDir dir;
    gguf::Writer w;
    write_vocab(w, tiny_vocab());
    auto r = write_and_open(w, dir);
    Tokenizer tok = Tokenizer::from_gguf(*r);
    EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{260}));
    EXPECT_EQ(tok.encode("abd"), (std::vector<int32_t>{259, 3 + 'd'}));
    EXPECT_EQ(tok.encode("cab"), (std::vector<int32_t>{3 + 'c', 259}));
}

TEST(Vocab, LowerRankWinsAndTiesGoLeft) {
    Vocab v = fallback_vocab(259);
    for (const char *t : {"bc", "ab", "aa"}) v.tokens.push_back(t), v.types.push_back(1);
    v.merges = {"b c", "a b", "a a"};   // bc first, then ab, then aa
    Tokenizer tok = Tokenizer::from_vocab(v);
    EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{3 + 'a', 259}));   // "a" + "bc"
    EXPECT_EQ(tok.encode("aaa"), (std::vector<int32_t>{261, 3 + 'a'}));   // leftmost pair first
    EXPECT_EQ(tok.encode("aab"), (std::vector<int32_t>{3 + 'a', 260}));   // ab outranks aa
}

TEST(Vocab, AnotherPreTokenizerDecodesButRefusesToEncodeText) {
    // Real V4-Flash GGUFs name their pre-tokenizer 'joyai-llm': such a model opens, its
    // tokens decode, and encoding text fails loudly instead of splitting it differently.
    TempDir dir;
    gguf::Writer w;
    write_vocab(w, tiny_vocab());
    w.set("tokenizer.ggml.pre", gguf::Value::str("joyai-llm"));
    auto r = write_and_open(w, dir);
    const Tokenizer tok = Tokenizer::from_gguf(*r);
    EXPECT_EQ(tok.decode(std::vector<int32_t>{3 + 'a', 3 + 'b'}), "ab");
    const std::string why = error_of([&] { tok.encode("ab"); });
    EXPECT_NE(why.find("joyai-llm"), std::string::npos) << why;
    EXPECT_NE(why.find("token ids"), std::string::npos) << why;
    EXPECT_NE(error_of([&] { tok.encode_special("ab"); }).find("joyai-llm"), std::string::npos);
    EXPECT_TRUE(tok.encode("").empty());
}

TEST(Vocab, RejectsWhatItCannotTokenizeExactly) {
    auto open_with = [](const std::function<void(gguf::Writer &)> &edit) {
        TempDir dir;
        gguf::Writer w;
        write_vocab(w, tiny_vocab());
        edit(w);
        auto r = write_and_open(w, dir);
        Tokenizer::from_gguf(*r);
    };
    EXPECT_NE(error_of([&] { open_with([](gguf::Writer &w) { w.set("tokenizer.ggml.model", gguf::Value::str("llama")); }); })
                  .find("tokenizer.ggml.model"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  open_with([](gguf::Writer &w) { w.set("tokenizer.ggml.token_type", gguf::Value::i32_array({1, 1})); });
              }).find("token_type"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  open_with([](gguf::Writer &w) { w.set("tokenizer.ggml.merges", gguf::Value::str_array({"a zz"})); });
              }).find("merges[0]"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  open_with([](gguf::Writer &w) { w.set("tokenizer.ggml.merges", gguf::Value::str_array({"ab"})); });
              }).find("merges[0]"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  open_with([](gguf::Writer &w) { w.set("tokenizer.ggml.eos_token_id", gguf::Value::u32(100000)); });
              }).find("eos_token_id"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                  open_with([](gguf::Writer &w) { w.set("tokenizer.ggml.tokens", gguf::Value::u32(3)); });
              }).find("tokenizer.ggml.tokens"),
              std::string::npos);
}

// ------------------------------------------------------------------ HF tokenizer.json

nlohmann::json fixture_json() { return load_json(fixture("a/tokenizer.json")); }

std::string write_json(const TempDir &dir, const nlohmann::json &j, const std::string &name = "tokenizer.json") {
    std::string p = dir.file(name);
    std::ofstream(p) << j.dump();
    return p;
}

TEST(HfJson, RejectsOtherPipelines) {
    TempDir dir;
    auto expect_reject = [&](const std::function<void(nlohmann::json &)> &edit, const char *what) {
        nlohmann::json j = fixture_json();
        edit(j);
        std::string err = error_of([&] { Tokenizer::from_hf_json(write_json(dir, j)); });
        EXPECT_NE(err.find(what), std::string::npos) << err;
    };
    expect_reject([](auto &j) { j["pre_tokenizer"]["pretokenizers"][2]["pattern"]["Regex"] = "\\s+"; }, "step 2");
    expect_reject([](auto &j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; }, "step 0");
    expect_reject([](auto &j) { j["pre_tokenizer"]["pretokenizers"][3]["add_prefix_space"] = true; }, "step 3");
    expect_reject([](auto &j) { j["pre_tokenizer"] = {{"type", "ByteLevel"}}; }, "pre_tokenizer");
    expect_reject([](auto &j) { j["normalizer"] = {{"type", "NFC"}}; }, "normalizer");
    expect_reject([](auto &j) { j["model"]["type"] = "Unigram"; }, "model.type");
    expect_reject([](auto &j) { j["model"]["byte_fallback"] = true; }, "byte_fallback");
    expect_reject([](auto &j) { j["model"]["merges"][0] = 5; }, "merges");
    EXPECT_THROW(Tokenizer::from_hf_json(dir.file("missing.json")), ds4::Error);
    std::ofstream(dir.file("bad.json")) << "{not json";
    EXPECT_THROW(Tokenizer::from_hf_json(dir.file("bad.json")), ds4::Error);
}

TEST(HfJson, AcceptsLegacyStringMergesAndEscapedNewlinesInTheRegex) {
    TempDir dir;
    nlohmann::json j = fixture_json();
    for (auto &m : j["model"]["merges"]) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
    std::string re = j["pre_tokenizer"]["pretokenizers"][2]["pattern"]["Regex"];
    std::string escaped;
    for (char c : re) escaped += c == '\r' ? std::string("\\r") : c == '\n' ? std::string("\\n") : std::string(1, c);
    j["pre_tokenizer"]["pretokenizers"][2]["pattern"]["Regex"] = escaped;
    Tokenizer a = Tokenizer::from_hf_json(fixture("a/tokenizer.json"));
    Tokenizer b = Tokenizer::from_hf_json(write_json(dir, j));
    const std::string text = "Hello, world!\r\n  def f(x):\n\treturn 42 # 東京";
    EXPECT_EQ(a.encode(text), b.encode(text));
}

TEST(HfJson, ConverterEntryPointPadsAndBoundsTheVocabulary) {
    TempDir dir;
    gguf::Writer w;
    EXPECT_NE(error_of([&] { write_tokenizer_from_hf_json(w, fixture("a/tokenizer.json"), 4000); }).find("does not fit"),
              std::string::npos);
    Tokenizer tok = via_gguf(fixture("a/tokenizer.json"), 4096 + 4, dir);
    EXPECT_EQ(tok.vocab_size(), 4100);
    EXPECT_EQ(tok.token_text(4099), "<|reserved_4099|>");
    EXPECT_EQ(tok.bos(), 0);
    EXPECT_EQ(tok.eos(), 1);
    EXPECT_EQ(tok.vocab().pad, 2);
}

TEST(HfJson, TokenizerConfigNamesBosAndEos) {
    TempDir dir;
    write_json(dir, fixture_json());
    nlohmann::json cfg = {{"bos_token", {{"content", "<｜User｜>"}}}, {"eos_token", "<｜Assistant｜>"}};
    write_json(dir, cfg, "tokenizer_config.json");
    Tokenizer tok = Tokenizer::from_hf_json(dir.file("tokenizer.json"));
    EXPECT_EQ(tok.bos(), tok.find_token("<｜User｜>"));
    EXPECT_EQ(tok.eos(), tok.find_token("<｜Assistant｜>"));
    EXPECT_TRUE(tok.is_stop(tok.find_token("<｜Assistant｜>")));
}

TEST(HfJson, AppendedAddedTokensKeepTheirIds) {
    // Fixture b appends its chat tokens after the trained vocabulary (DeepSeek's layout).
    Tokenizer tok = Tokenizer::from_hf_json(fixture("b/tokenizer.json"));
    auto j = load_json(fixture("b/tokenizer.json"));
    for (const auto &a : j["added_tokens"]) {
        int32_t id = a["id"].get<int32_t>();
        EXPECT_EQ(tok.token_text(id), a["content"].get<std::string>());
        EXPECT_EQ(tok.token_type(id), TokenType::Control);
        EXPECT_EQ(tok.encode_special(a["content"].get<std::string>()), std::vector<int32_t>{id});
    }
    EXPECT_GT(tok.find_token("<think>"), 2000);
}

}  // namespace
}  // namespace ds4::tok::test
