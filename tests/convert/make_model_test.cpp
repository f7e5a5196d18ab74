// ds4-make-model: deterministic, readable through ModelConfig::from_gguf, every parameter
// random with the documented scales (no all-ones norms, no zero sinks), hash tables with
// distinct in-range experts, sparse files that cost no disk.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <set>

#include "engine/common/error.h"
#include "engine/gguf/gguf.h"
#include "engine/model/config.h"
#include "engine/quant/quants.h"
#include "tests/convert/convert_test_util.h"
#include "tools/convert/convert.h"
#include "tools/make_model/make_model.h"

namespace ds4::make_model {
namespace {

using convert::test::read_bytes;
using convert::test::TempDir;

std::string make(const TempDir &tmp, const std::string &name, MakeModelOptions o) {
    o.progress = false;
    const std::string p = tmp.file(name);
    make_model(o, p);
    return p;
}

MakeModelOptions tiny(uint64_t seed = 1) {
    MakeModelOptions o;
    o.cfg = preset_config("tiny");
    o.seed = seed;
    return o;
}

struct Stats {
    double mean = 0, std = 0, min = 1e30, max = -1e30;
    size_t distinct = 0;
};

Stats stats_of(const gguf::TensorInfo &t) {
    std::vector<float> v(static_cast<size_t>(t.nelements()));
    const uint64_t rb = gguf::row_bytes(t.type, t.ne[0]);
    for (int64_t r = 0; r < t.rows(); r++) quant::dequantize_row(t.type, t.data + r * rb, v.data() + r * t.ne[0], t.ne[0]);
    Stats s;
    double sum = 0, sq = 0;
    for (float x : v) {
        sum += x;
        sq += static_cast<double>(x) * x;
        s.min = std::min<double>(s.min, x);
        s.max = std::max<double>(s.max, x);
    }
    s.mean = sum / v.size();
    s.std = std::sqrt(std::max(0.0, sq / v.size() - s.mean * s.mean));
    s.distinct = std::set<float>(v.begin(), v.end()).size();
    return s;
}

TEST(MakeModel, SameSeedSameBytesWhateverTheThreads) {
    TempDir tmp;
    MakeModelOptions a = tiny(7), b = tiny(7), c = tiny(8);
    a.threads = 1;
    b.threads = 2;
    const auto fa = read_bytes(make(tmp, "a.gguf", a));
    const auto fb = read_bytes(make(tmp, "b.gguf", b));
    const auto fc = read_bytes(make(tmp, "c.gguf", c));
    EXPECT_GT(fa.size(), 100000u);
    EXPECT_EQ(fa, fb);
    EXPECT_NE(fa, fc);
    EXPECT_EQ(fa.size(), fc.size());
}

TEST(MakeModel, FastModeIsDeterministicToo) {
    TempDir tmp;
    MakeModelOptions a = tiny(3);
    a.type = "q8_0";
    a.fast = true;
    a.threads = 1;
    MakeModelOptions b = a;
    b.threads = 2;
    EXPECT_EQ(read_bytes(make(tmp, "a.gguf", a)), read_bytes(make(tmp, "b.gguf", b)));
}

TEST(MakeModel, TinyIsReadableAndHasThePresetShape) {
    TempDir tmp;
    auto r = gguf::Reader::open(make(tmp, "t.gguf", tiny()));
    ModelConfig c = ModelConfig::from_gguf(*r);
    EXPECT_EQ(c.n_layer, 4);
    EXPECT_EQ(c.n_vocab, 512);
    EXPECT_EQ(c.n_embd, 64);
    EXPECT_EQ(c.compress_ratio, (std::vector<int>{0, 4, 128, 4}));
    EXPECT_TRUE(c.is_csa(1));
    EXPECT_TRUE(c.is_hca(2));
    EXPECT_EQ(c.n_hash_layer, 1);
    EXPECT_GE(c.indexer_heads, 16);
    EXPECT_TRUE(c.yarn);
    EXPECT_LT(std::filesystem::file_size(tmp.file("t.gguf")), 4u << 20);
}

// The generator and the converter agree on the layout: a converted fixture and a generated
// model of the same shape have the same tensor names, types and dims.
TEST(MakeModel, SameLayoutAsTheConverter) {
    TempDir tmp;
    convert::ConvertOptions co;
    co.in_dir = convert::test::fixture_dir("mix");
    co.out_path = tmp.file("conv.gguf");
    co.progress = false;
    convert::ConvertResult cr = convert::convert_hf(co);
    MakeModelOptions o;
    o.cfg = cr.cfg;
    auto g = gguf::Reader::open(make(tmp, "gen.gguf", o));
    auto c = gguf::Reader::open(co.out_path);
    ASSERT_EQ(g->tensors().size(), c->tensors().size());
    for (const auto &t : c->tensors()) {
        const gguf::TensorInfo *u = g->tensor(t.name);
        ASSERT_NE(u, nullptr) << t.name;
        EXPECT_EQ(u->ne, t.ne) << t.name;
        EXPECT_EQ(u->type, t.type) << t.name;
    }
}

TEST(MakeModel, EveryParameterIsRandomWithItsScale) {
    TempDir tmp;
    auto r = gguf::Reader::open(make(tmp, "t.gguf", tiny()));
    for (const auto &t : r->tensors()) {
        SCOPED_TRACE(t.name);
        if (t.type == gguf::Type::I32) continue;
        const Stats s = stats_of(t);
        const std::string &n = t.name;
        EXPECT_GT(s.distinct, std::min<size_t>(static_cast<size_t>(t.nelements()) / 2, 1)) << "constant tensor";
        auto has = [&](const char *k) { return n.find(k) != std::string::npos; };
        if (has("_norm.weight")) {
            EXPECT_GE(s.min, 0.7);
            EXPECT_LT(s.max, 1.3);
        } else if (has("_scale.weight")) {
            EXPECT_GE(s.min, 0.5);
            EXPECT_LT(s.max, 1.5);
        } else if (has("_ape.weight") || has("_base.weight") || has("exp_probs_b")) {
            if (t.nelements() >= 16) {
                EXPECT_NEAR(s.std, 0.5, t.nelements() >= 1024 ? 0.05 : 0.2);   // N(0, 0.5)
            }
        } else if (t.nelements() >= 1024) {
            // Linear maps: N(0, 1/fan_in); embedding N(0, 1).
            const double want = has("token_embd") ? 1.0 : 1.0 / std::sqrt(static_cast<double>(t.ne[0]));
            EXPECT_NEAR(s.std, want, want * 0.1);
            EXPECT_NEAR(s.mean, 0.0, want * 0.1);
        } else if (has("attn_sinks")) {
            EXPECT_GT(s.std, 0.2);   // N(0,1), only a few heads
        }
    }
}

TEST(MakeModel, HashTableHasDistinctExpertsPerToken) {
    TempDir tmp;
    MakeModelOptions o = tiny();
    o.cfg.n_hash_layer = 2;
    auto r = gguf::Reader::open(make(tmp, "t.gguf", o));
    const ModelConfig c = ModelConfig::from_gguf(*r);
    std::set<int> used;
    for (int l = 0; l < 2; l++) {
        const gguf::TensorInfo *t = r->tensor("blk." + std::to_string(l) + ".ffn_gate_tid2eid.weight");
        ASSERT_NE(t, nullptr);
        ASSERT_EQ(t->type, gguf::Type::I32);
        ASSERT_EQ(t->ne, (std::vector<int64_t>{c.n_expert_used, c.n_vocab}));
        const auto *ids = reinterpret_cast<const int32_t *>(t->data);
        for (int64_t tok = 0; tok < c.n_vocab; tok++) {
            std::set<int> s;
            for (int k = 0; k < c.n_expert_used; k++) {
                int e = ids[tok * c.n_expert_used + k];
                ASSERT_GE(e, 0);
                ASSERT_LT(e, c.n_expert);
                s.insert(e);
                used.insert(e);
            }
            ASSERT_EQ(static_cast<int>(s.size()), c.n_expert_used) << "token " << tok;
        }
        EXPECT_EQ(r->tensor("blk." + std::to_string(l) + ".ffn_exp_probs_b.weight"), nullptr);
    }
    EXPECT_EQ(static_cast<int>(used.size()), c.n_expert);
}

TEST(MakeModel, SparseMatricesCostNoDisk) {
    TempDir tmp;
    MakeModelOptions o;
    o.cfg = preset_config("small");
    o.sparse = true;
    const std::string p = make(tmp, "s.gguf", o);
    struct stat st;
    ASSERT_EQ(::stat(p.c_str(), &st), 0);
    EXPECT_GT(st.st_size, 60 << 20);
    EXPECT_LT(static_cast<int64_t>(st.st_blocks) * 512, 8 << 20) << "holes were written out";
    auto r = gguf::Reader::open(p);
    ModelConfig::from_gguf(*r);
    const gguf::TensorInfo *w = r->tensor("blk.1.ffn_gate_exps.weight");
    ASSERT_NE(w, nullptr);
    for (uint64_t i = 0; i < w->nbytes; i += 4093) ASSERT_EQ(w->data[i], 0);
    const Stats n = stats_of(*r->tensor("blk.1.attn_norm.weight"));
    EXPECT_GE(n.min, 0.7);   // small tensors stay real
}

TEST(MakeModel, FastQ8_0HasTheRightScale) {
    TempDir tmp;
    MakeModelOptions o;
    o.cfg = preset_config("small", 2);
    o.type = "q8_0";
    o.fast = true;
    auto r = gguf::Reader::open(make(tmp, "f.gguf", o));
    const gguf::TensorInfo *t = r->tensor("blk.0.ffn_up_exps.weight");
    ASSERT_EQ(t->type, gguf::Type::Q8_0);
    const Stats s = stats_of(*t);
    const double want = 1.0 / std::sqrt(static_cast<double>(t->ne[0]));
    EXPECT_NEAR(s.std, want, want * 0.02);
    EXPECT_NEAR(s.mean, 0.0, want * 0.02);
}

// The ds4 layouts at a shape whose rows are whole 256-blocks: experts in the 2/4-bit
// formats, synthesised directly (fast) or quantised (exact), with the wanted scale.
TEST(MakeModel, Ds4ExpertLayouts) {
    for (const char *layout : {"ds4-q2", "ds4-q4"}) {
        for (bool fast : {true, false}) {
            SCOPED_TRACE(std::string(layout) + (fast ? " fast" : " exact"));
            TempDir tmp;
            MakeModelOptions o = tiny();
            o.cfg.n_embd = 256;
            o.cfg.n_ff_exp = 256;
            o.cfg.n_expert = 2;
            o.cfg.n_layer = 2;
            apply_layer_pattern("tiny", o.cfg);   // sliding + CSA
            o.type = "q8_0";
            o.expert_type = layout;
            o.fast = fast;
            auto r = gguf::Reader::open(make(tmp, "m.gguf", o));
            const bool q2 = std::string(layout) == "ds4-q2";
            const gguf::TensorInfo *up = r->tensor("blk.1.ffn_up_exps.weight");
            const gguf::TensorInfo *down = r->tensor("blk.1.ffn_down_exps.weight");
            EXPECT_EQ(up->type, q2 ? gguf::Type::IQ2_XXS : gguf::Type::Q4_K);
            EXPECT_EQ(down->type, q2 ? gguf::Type::Q2_K : gguf::Type::Q4_K);
            EXPECT_EQ(r->tensor("blk.1.ffn_gate_inp.weight")->type, gguf::Type::F16);
            EXPECT_EQ(r->tensor("blk.1.hc_ffn_fn.weight")->type, gguf::Type::F16);
            EXPECT_EQ(r->tensor("blk.1.attn_compressor_kv.weight")->type, gguf::Type::F16);
            EXPECT_EQ(r->tensor("blk.1.attn_q_b.weight")->type, gguf::Type::Q8_0);
            EXPECT_EQ(r->tensor("blk.1.ffn_up_shexp.weight")->type, gguf::Type::Q8_0);
            EXPECT_EQ(r->tensor("blk.1.attn_norm.weight")->type, gguf::Type::F32);
            for (const gguf::TensorInfo *t : {up, down}) {
                const Stats s = stats_of(*t);
                const double want = 1.0 / 16.0;   // 1/sqrt(fan_in = 256)
                // 2-bit quantisation of a Gaussian loses some of its spread; synthesis hits it.
                EXPECT_NEAR(s.std, want, want * (fast ? 0.03 : 0.25)) << t->name;
                EXPECT_NEAR(s.mean, 0.0, want * 0.05) << t->name;
                EXPECT_GT(s.distinct, 3u);
            }
            ModelConfig::from_gguf(*r);
        }
    }
}

TEST(MakeModel, PresetsAndLayerPatterns) {
    ModelConfig f = preset_config("flash-shape");
    EXPECT_EQ(f.n_embd, 4096);
    EXPECT_EQ(f.n_head, 64);
    EXPECT_EQ(f.head_dim, 512);
    EXPECT_EQ(f.n_expert, 256);
    EXPECT_EQ(f.n_vocab, 129280);
    EXPECT_EQ(f.compress_ratio, (std::vector<int>{4, 128}));
    ModelConfig full = preset_config("flash-shape", 43);
    EXPECT_EQ(full.compress_ratio[0], 0);
    EXPECT_EQ(full.compress_ratio[1], 0);
    EXPECT_EQ(full.compress_ratio[2], 4);
    EXPECT_EQ(full.compress_ratio[3], 128);
    EXPECT_EQ(full.compress_ratio[42], 4);
    EXPECT_EQ(full.n_hash_layer, 3);
    EXPECT_EQ(static_cast<int>(full.swiglu_limit.size()), 43);
    full.validate();
    preset_config("small").validate();
    EXPECT_THROW(preset_config("huge"), ds4::Error);
}

}  // namespace
}  // namespace ds4::make_model
