// Damaged copies of a fixture: the converter must refuse them with a message naming the
// tensor (or config key), and must not leave an output file behind. Plus input variants
// that must convert to the same tensors: sharded files, original DeepSeek names, BF16.
#include <gtest/gtest.h>

#include <fstream>

#include <filesystem>
#include <functional>

#include "engine/common/error.h"
#include "engine/gguf/gguf.h"
#include "engine/tokenizer/vocab.h"
#include "tests/convert/convert_test_util.h"
#include "tools/convert/convert.h"
#include "tools/convert/safetensors.h"

namespace ds4::convert::test {
namespace {

std::string convert_error(const std::string &dir, const std::string &out, const std::string &type = "f32") {
    ConvertOptions o;
    o.in_dir = dir;
    o.out_path = out;
    o.type = type;
    o.progress = false;
    try {
        convert_hf(o);
    } catch (const Error &e) {
        EXPECT_FALSE(std::filesystem::exists(out)) << "output left behind after: " << e.what();
        return e.what();
    }
    return "";
}

class BadInput : public ::testing::Test {
protected:
    TempDir tmp;
    RawFile f = read_safetensors(fixture_dir("mix") + "/model.safetensors");
    std::string dir() const { return tmp.file("hf"); }
    std::string out() const { return tmp.file("out.gguf"); }
    std::string run() {
        write_model_dir(dir(), "mix", f);
        return convert_error(dir(), out());
    }
};

TEST_F(BadInput, UnmodifiedCopyConverts) { EXPECT_EQ(run(), ""); }

TEST_F(BadInput, MissingTensorIsNamed) {
    f.erase("model.layers.1.attn.indexer.wq_b.weight");
    std::string e = run();
    EXPECT_NE(e.find("missing tensor model.layers.1.attn.indexer.wq_b.weight"), std::string::npos) << e;
}

TEST_F(BadInput, MissingExpertIsNamed) {
    f.erase("model.layers.2.ffn.experts.5.w3.weight");
    std::string e = run();
    EXPECT_NE(e.find("model.layers.2.ffn.experts.5.w3.weight"), std::string::npos) << e;
}

TEST_F(BadInput, WrongShapeIsNamed) {
    // Same byte count, transposed: only a real shape check catches it.
    auto &t = f.at("model.layers.0.attn.wo_a.weight");
    std::swap(t.shape[0], t.shape[1]);
    std::string e = run();
    EXPECT_NE(e.find("model.layers.0.attn.wo_a.weight"), std::string::npos) << e;
    EXPECT_NE(e.find("shape"), std::string::npos) << e;
}

TEST_F(BadInput, UnknownTensorIsNamed) {
    f["model.layers.0.attn.mystery.weight"] = RawTensor{"F32", {4}, std::vector<uint8_t>(16, 0)};
    std::string e = run();
    EXPECT_NE(e.find("unknown tensor model.layers.0.attn.mystery.weight"), std::string::npos) << e;
}

TEST_F(BadInput, CompressorOnSlidingLayerIsUnknown) {
    // Layer 0 is sliding_attention in config.json: a compressor there contradicts it.
    f["model.layers.0.attn.compressor.ape"] = f.at("model.layers.1.attn.compressor.ape");
    std::string e = run();
    EXPECT_NE(e.find("model.layers.0.attn.compressor.ape"), std::string::npos) << e;
}

TEST_F(BadInput, UnsupportedDtypeIsNamed) {
    auto &t = f.at("model.layers.3.attn.wq_a.weight");
    t.dtype = "F8_E4M3";
    t.bytes.resize(t.bytes.size() / 4);
    std::string e = run();
    EXPECT_NE(e.find("model.layers.3.attn.wq_a.weight"), std::string::npos) << e;
    EXPECT_NE(e.find("F8_E4M3"), std::string::npos) << e;
}

TEST_F(BadInput, IntegerWeightIsRejected) {
    f.at("model.layers.3.attn.wq_a.weight").dtype = "I32";   // same size, wrong kind
    std::string e = run();
    EXPECT_NE(e.find("model.layers.3.attn.wq_a.weight"), std::string::npos) << e;
    EXPECT_NE(e.find("I32"), std::string::npos) << e;
}

TEST_F(BadInput, HashTableExpertOutOfRange) {
    auto &t = f.at("model.layers.1.ffn.gate.tid2eid");
    int64_t bad = 8;   // mix has 8 experts
    std::memcpy(t.bytes.data() + 7 * 8, &bad, 8);
    std::string e = run();
    EXPECT_NE(e.find("model.layers.1.ffn.gate.tid2eid"), std::string::npos) << e;
    EXPECT_NE(e.find("expert id 8"), std::string::npos) << e;
}

TEST_F(BadInput, TruncatedSafetensorsIsRejected) {
    write_model_dir(dir(), "mix", f);
    const std::string p = dir() + "/model.safetensors";
    for (uint64_t keep : {uint64_t{4}, uint64_t{100}, std::filesystem::file_size(p) / 2, std::filesystem::file_size(p) - 1}) {
        SCOPED_TRACE(keep);
        write_model_dir(dir(), "mix", f);
        std::filesystem::resize_file(p, keep);
        std::string e = convert_error(dir(), out());
        EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
        EXPECT_NE(e.find("truncated"), std::string::npos) << e;
    }
}

TEST_F(BadInput, CorruptHeaderJsonIsRejected) {
    write_model_dir(dir(), "mix", f);
    const std::string p = dir() + "/model.safetensors";
    std::vector<uint8_t> b = read_bytes(p);
    b[8] = '[';
    write_bytes(p, b);
    std::string e = convert_error(dir(), out());
    EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
}

// Edits one header entry in place (same JSON length, so the data section does not move).
void edit_header(const std::string &p, const std::function<void(nlohmann::json &)> &edit) {
    std::vector<uint8_t> b = read_bytes(p);
    uint64_t n;
    std::memcpy(&n, b.data(), 8);
    nlohmann::json h = nlohmann::json::parse(b.begin() + 8, b.begin() + 8 + static_cast<std::ptrdiff_t>(n));
    edit(h);
    std::string hs = h.dump();
    ASSERT_LE(hs.size(), n);
    hs.resize(n, ' ');
    std::memcpy(b.data() + 8, hs.data(), n);
    write_bytes(p, b);
}

TEST_F(BadInput, ReversedOffsetsAreRejected) {
    write_model_dir(dir(), "mix", f);
    edit_header(dir() + "/model.safetensors", [](nlohmann::json &h) {
        auto &o = h["model.norm.weight"]["data_offsets"];
        o = {o[1], o[0]};
    });
    std::string e = convert_error(dir(), out());
    EXPECT_NE(e.find("model.norm.weight"), std::string::npos) << e;
    EXPECT_NE(e.find("data_offsets"), std::string::npos) << e;
}

TEST_F(BadInput, ByteCountNotMatchingShapeIsRejected) {
    write_model_dir(dir(), "mix", f);
    edit_header(dir() + "/model.safetensors", [](nlohmann::json &h) { h["model.norm.weight"]["shape"] = {65}; });
    std::string e = convert_error(dir(), out());
    EXPECT_NE(e.find("model.norm.weight"), std::string::npos) << e;
}

TEST_F(BadInput, OverlappingTensorsAreRejected) {
    write_model_dir(dir(), "mix", f);
    edit_header(dir() + "/model.safetensors", [](nlohmann::json &h) {
        // Two same-size tensors sharing bytes.
        h["model.layers.0.attn_norm.weight"]["data_offsets"] = h["model.layers.0.ffn_norm.weight"]["data_offsets"];
    });
    std::string e = convert_error(dir(), out());
    EXPECT_NE(e.find("overlap"), std::string::npos) << e;
}

TEST_F(BadInput, MissingConfigKeyIsNamed) {
    write_model_dir(dir(), "mix", f);
    nlohmann::json j = read_json(dir() + "/config.json");
    j.erase("hidden_size");
    write_json(dir() + "/config.json", j);
    std::string e = convert_error(dir(), out());
    EXPECT_NE(e.find("hidden_size"), std::string::npos) << e;
}

TEST_F(BadInput, ConfigShapeMismatchNamesTensor) {
    // A config that disagrees with the tensors (another expert width).
    write_model_dir(dir(), "mix", f);
    nlohmann::json j = read_json(dir() + "/config.json");
    j["moe_intermediate_size"] = 64;
    write_json(dir() + "/config.json", j);
    std::string e = convert_error(dir(), out());
    EXPECT_NE(e.find("model.layers.0.ffn.experts.0.w1.weight"), std::string::npos) << e;
}

TEST_F(BadInput, NoSafetensorsAtAll) {
    std::filesystem::create_directories(dir());
    std::filesystem::copy_file(fixture_dir("mix") + "/config.json", dir() + "/config.json");
    std::string e = convert_error(dir(), out());
    EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
}

// ---- input variants that must give the same tensors ----

std::map<std::string, std::vector<uint8_t>> gguf_tensors(const std::string &path) {
    auto r = gguf::Reader::open(path);
    std::map<std::string, std::vector<uint8_t>> m;
    for (const auto &t : r->tensors()) m[t.name].assign(t.data, t.data + t.nbytes);
    return m;
}

std::string convert_ok(const std::string &dir, const std::string &out, const std::string &type = "f32") {
    ConvertOptions o;
    o.in_dir = dir;
    o.out_path = out;
    o.type = type;
    o.progress = false;
    convert_hf(o);
    return out;
}

TEST(InputVariants, ShardedEqualsSingleFile) {
    TempDir tmp;
    const RawFile f = read_safetensors(fixture_dir("flashlike") + "/model.safetensors");
    RawFile a, b;
    nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
    int i = 0;
    for (const auto &[name, t] : f) {
        const bool second = (i++ % 2) == 1;
        (second ? b : a)[name] = t;
        index["weight_map"][name] = second ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
    }
    const std::string dir = tmp.file("sharded");
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(fixture_dir("flashlike") + "/config.json", dir + "/config.json");
    write_safetensors(dir + "/model-00001-of-00002.safetensors", a);
    write_safetensors(dir + "/model-00002-of-00002.safetensors", b);
    write_json(dir + "/model.safetensors.index.json", index);
    EXPECT_EQ(gguf_tensors(convert_ok(dir, tmp.file("s.gguf"))),
              gguf_tensors(convert_ok(fixture_dir("flashlike"), tmp.file("one.gguf"))));

    // An index naming a tensor its shard does not hold is an error naming the tensor.
    index["weight_map"]["model.layers.9.attn.wq_a.weight"] = "model-00001-of-00002.safetensors";
    write_json(dir + "/model.safetensors.index.json", index);
    std::string e = convert_error(dir, tmp.file("x.gguf"));
    EXPECT_NE(e.find("model.layers.9.attn.wq_a.weight"), std::string::npos) << e;
}

TEST(InputVariants, OriginalDeepSeekNamesEqualTransformersNames) {
    TempDir tmp;
    const RawFile f = read_safetensors(fixture_dir("mix") + "/model.safetensors");
    RawFile g;
    for (const auto &[name, t] : f) {
        std::string n = name;
        if (n.rfind("model.layers.", 0) == 0) n = n.substr(6);
        if (n == "model.embed_tokens.weight") n = "embed.weight";
        if (n == "model.norm.weight") n = "norm.weight";
        if (n.rfind("model.hc_head.hc_", 0) == 0) n = "hc_head_" + n.substr(17);
        size_t p = n.find(".attn.norm.weight");
        if (p != std::string::npos) n.replace(p, 17, ".attn.kv_norm.weight");
        g[n] = t;
    }
    ASSERT_TRUE(g.count("layers.0.attn.kv_norm.weight"));
    write_model_dir(tmp.file("orig"), "mix", g);
    EXPECT_EQ(gguf_tensors(convert_ok(tmp.file("orig"), tmp.file("o.gguf"))),
              gguf_tensors(convert_ok(fixture_dir("mix"), tmp.file("t.gguf"))));

    // Both spellings of one tensor at once is ambiguous.
    g["model.norm.weight"] = f.at("model.norm.weight");
    write_model_dir(tmp.file("both"), "mix", g);
    std::string e = convert_error(tmp.file("both"), tmp.file("b.gguf"));
    EXPECT_NE(e.find("norm.weight"), std::string::npos) << e;
}

TEST(InputVariants, Bf16SourceToBf16IsBitExact) {
    TempDir tmp;
    RawFile f = read_safetensors(fixture_dir("wide") + "/model.safetensors");
    // Round every float tensor to bf16 (truncation: any bf16 value will do as a source).
    for (auto &[name, t] : f) {
        if (t.dtype != "F32") continue;
        std::vector<uint8_t> b(t.bytes.size() / 2);
        for (size_t i = 0; i < b.size() / 2; i++) std::memcpy(&b[i * 2], &t.bytes[i * 4 + 2], 2);
        t.dtype = "BF16";
        t.bytes = std::move(b);
    }
    write_model_dir(tmp.file("bf"), "wide", f);
    auto r = gguf::Reader::open(convert_ok(tmp.file("bf"), tmp.file("bf.gguf"), "bf16"));
    const gguf::TensorInfo *t = r->tensor("blk.1.attn_q_b.weight");
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->type, gguf::Type::BF16);
    const RawTensor &s = f.at("model.layers.1.attn.wq_b.weight");
    ASSERT_EQ(t->nbytes, s.bytes.size());
    EXPECT_EQ(std::memcmp(t->data, s.bytes.data(), s.bytes.size()), 0);
    // Small tensors are widened to f32 exactly.
    const gguf::TensorInfo *n = r->tensor("blk.1.attn_norm.weight");
    ASSERT_EQ(n->type, gguf::Type::F32);
    const RawTensor &ns = f.at("model.layers.1.attn_norm.weight");
    for (size_t i = 0; i < ns.bytes.size() / 2; i++) {
        uint32_t bits = static_cast<uint32_t>(ns.bytes[i * 2] | (ns.bytes[i * 2 + 1] << 8)) << 16;
        float want, got;
        std::memcpy(&want, &bits, 4);
        std::memcpy(&got, n->data + i * 4, 4);
        ASSERT_EQ(want, got) << i;
    }
}

TEST(InputVariants, TiedEmbeddingsWithoutHead) {
    TempDir tmp;
    RawFile f = read_safetensors(fixture_dir("mix") + "/model.safetensors");
    f.erase("head.weight");
    write_model_dir(tmp.file("tied"), "mix", f);
    EXPECT_NE(convert_error(tmp.file("tied"), tmp.file("a.gguf")).find("head.weight"), std::string::npos);
    nlohmann::json j = read_json(tmp.file("tied") + "/config.json");
    j["tie_word_embeddings"] = true;
    write_json(tmp.file("tied") + "/config.json", j);
    auto m = gguf_tensors(convert_ok(tmp.file("tied"), tmp.file("t.gguf")));
    EXPECT_EQ(m.at("output.weight"), m.at("token_embd.weight"));
}

}  // namespace
}  // namespace ds4::convert::test

namespace ds4::convert::test {
namespace {

TEST(Vocabulary, FallbackWhenNoTokenizerJson) {
    TempDir tmp;
    auto r = gguf::Reader::open(convert_ok(fixture_dir("mix"), tmp.file("m.gguf")));
    const tok::Vocab v = tok::read_vocab(*r);
    EXPECT_EQ(static_cast<int>(v.tokens.size()), 320);
    EXPECT_EQ(v.bos, 0);
    EXPECT_EQ(v.eos, 1);
    EXPECT_TRUE(v.merges.empty());
}

// The chat template goes into the GGUF (it is how ds4 tells a chat model from a plain
// completion one): chat_template.jinja first, else tokenizer_config.json's chat_template.
TEST(Vocabulary, ChatTemplateIsCopied) {
    TempDir tmp;
    RawFile f = read_safetensors(fixture_dir("mix") + "/model.safetensors");
    const std::string dir = tmp.file("hf");
    write_model_dir(dir, "mix", f);
    auto template_of = [&](const std::string &name) {
        return tok::read_vocab(*gguf::Reader::open(convert_ok(dir, tmp.file(name)))).chat_template;
    };
    EXPECT_EQ(template_of("none.gguf"), "") << "no template in the source, none in the GGUF";
    write_json(dir + "/tokenizer_config.json", nlohmann::json{{"chat_template", "{{ messages }}"}});
    EXPECT_EQ(template_of("config.gguf"), "{{ messages }}");
    write_json(dir + "/tokenizer_config.json",
               nlohmann::json{{"chat_template", nlohmann::json::array({{{"name", "tool_use"}, {"template", "T"}},
                                                                       {{"name", "default"}, {"template", "D"}}})}});
    EXPECT_EQ(template_of("list.gguf"), "D");
    {
        std::ofstream j(dir + "/chat_template.jinja");
        j << "{% for m in messages %}{{ m.content }}{% endfor %}";
    }
    EXPECT_EQ(template_of("jinja.gguf"), "{% for m in messages %}{{ m.content }}{% endfor %}");
}

// A fixture grown to a vocabulary that holds a real tokenizer.json: the BPE vocabulary and
// merges end up in the GGUF, padded to the model's vocab size.
TEST(Vocabulary, TokenizerJsonIsImported) {
    TempDir tmp;
    const std::string tj = std::string(DS4_SOURCE_DIR) + "/tests/fixtures/tokenizer/a/tokenizer.json";
    const nlohmann::json tok_json = read_json(tj);
    const int V = 4224;   // > 4096 + 15 added tokens
    RawFile f = read_safetensors(fixture_dir("mix") + "/model.safetensors");
    for (const char *name : {"model.embed_tokens.weight", "head.weight", "model.layers.0.ffn.gate.tid2eid",
                             "model.layers.1.ffn.gate.tid2eid"}) {
        RawTensor &t = f.at(name);
        const size_t row = t.bytes.size() / static_cast<size_t>(t.shape[0]);
        std::vector<uint8_t> b;
        for (int i = 0; i < V; i++)
            b.insert(b.end(), t.bytes.begin() + static_cast<std::ptrdiff_t>((i % t.shape[0]) * row),
                     t.bytes.begin() + static_cast<std::ptrdiff_t>((i % t.shape[0] + 1) * row));
        t.shape[0] = V;
        t.bytes = std::move(b);
    }
    const std::string dir = tmp.file("hf");
    write_model_dir(dir, "mix", f);
    nlohmann::json cfg = read_json(dir + "/config.json");
    cfg["vocab_size"] = V;
    write_json(dir + "/config.json", cfg);
    std::filesystem::copy_file(tj, dir + "/tokenizer.json");
    auto r = gguf::Reader::open(convert_ok(dir, tmp.file("t.gguf")));
    const tok::Vocab v = tok::read_vocab(*r);
    ASSERT_EQ(static_cast<int>(v.tokens.size()), V);
    EXPECT_EQ(v.merges.size(), tok_json["model"]["merges"].size());
    for (auto it = tok_json["model"]["vocab"].begin(); it != tok_json["model"]["vocab"].end(); ++it)
        ASSERT_EQ(v.tokens.at(it.value().get<size_t>()), it.key()) << "token " << it.value();
    EXPECT_EQ(v.bos, 0);   // config.json's
    EXPECT_EQ(v.eos, 1);
}

}  // namespace
}  // namespace ds4::convert::test

namespace ds4::convert::test {
namespace {

// Random byte mutations of a small file's header and data: every outcome is either a
// clean ds4::Error or a set whose every tensor can be read in full (ASan checks the rest).
TEST(SafetensorsReader, MutatedFilesNeverCrash) {
    TempDir tmp;
    RawFile f;
    f["a"] = RawTensor{"F32", {3, 4}, std::vector<uint8_t>(48, 1)};
    f["b"] = RawTensor{"BF16", {8}, std::vector<uint8_t>(16, 2)};
    f["c"] = RawTensor{"I64", {2, 2}, std::vector<uint8_t>(32, 3)};
    f["d"] = RawTensor{"F16", {0}, {}};
    f["e"] = RawTensor{"I32", {5}, std::vector<uint8_t>(20, 4)};
    const std::string p = tmp.file("m.safetensors");
    write_safetensors(p, f);
    const std::vector<uint8_t> orig = read_bytes(p);
    uint64_t rng = 12345;
    auto next = [&] {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        return static_cast<uint32_t>(rng >> 33);
    };
    const char *tokens[] = {"\"", "[", "]", "{", "}", ",", ":", "-1", "99999999999999999999", "1e9", "\"F8_E4M3\"", "null"};
    int ok = 0, rejected = 0;
    for (int iter = 0; iter < 600; iter++) {
        std::vector<uint8_t> b = orig;
        const int edits = 1 + static_cast<int>(next() % 3);
        for (int e = 0; e < edits; e++) {
            const size_t pos = next() % b.size();
            switch (next() % 4) {
            case 0: b[pos] = static_cast<uint8_t>(next()); break;
            case 1: b.resize(pos); break;
            case 2: {
                const std::string t = tokens[next() % (sizeof tokens / sizeof *tokens)];
                b.insert(b.begin() + static_cast<std::ptrdiff_t>(pos), t.begin(), t.end());
                break;
            }
            default: if (b.size() > 8) b[next() % 8] = static_cast<uint8_t>(next()); break;   // header length
            }
            if (b.empty()) break;
        }
        write_bytes(p, b);
        try {
            SafetensorsSet s = SafetensorsSet::open_file(p);
            for (const StTensor &t : s.tensors()) {
                if (t.dtype == StDtype::I64 || t.dtype == StDtype::I32) {
                    (void)t.read_ints();
                } else {
                    std::vector<float> v(static_cast<size_t>(t.nelements()));
                    t.read_f32(0, t.nelements(), v.data());
                }
            }
            ok++;
        } catch (const Error &) {
            rejected++;
        }
    }
    EXPECT_GT(rejected, 100);
    EXPECT_GT(ok, 0);
}

}  // namespace
}  // namespace ds4::convert::test
