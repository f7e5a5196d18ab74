// SSD expert streaming on the GPU (cuda/cuda_expert_cache.h): routed experts in a bounded
// VRAM slot cache filled from the RAM tier must give the resident CUDA path's logits bit for
// bit -- with a cache of one token's experts per layer (evicts on every layer, and a batched
// step's experts run in several groups), a few layers' worth, and all of them; for the
// device-grouped kernels (decode, small steps), the expert tiles (a 300-token prefill), the
// per-expert path (DS4_CUDA_HOST_MOE=1) and a step of six sessions. The counters must add up.
// Skips without a CUDA device.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "tests/cuda/need_device.h"
#include "engine/common/error.h"
#include "engine/model/model.h"
#include "engine/model/session.h"
#include "tests/engine/fixture.h"

using namespace ds4;
using namespace ds4test;

namespace {

const std::string kTrained = DS4_SOURCE_DIR "/models/ds4-pystd-q8_0.gguf";

ModelOptions gpu(uint64_t stream_experts = 0, bool prefetch = true) {
    ModelOptions o;
    o.n_threads = 2;
    o.backend = BackendKind::Cuda;
    if (stream_experts) {
        o.streaming.enabled = true;
        o.streaming.cache_experts = stream_experts;
        o.streaming.prefetch = prefetch;
        o.streaming.host_cache_bytes = 64u << 20;   // a small RAM tier: it evicts too
    }
    return o;
}

// Every position's logits in each mode, then a step of six one-row sessions.
std::vector<float> logits(const Model &m, const std::vector<int32_t> &toks, const std::vector<std::string> &modes) {
    std::vector<float> out;
    for (const std::string &mode : modes) {
        const std::vector<float> v = run_mode(m, toks, mode);
        out.insert(out.end(), v.begin(), v.end());
    }
    auto ex = m.make_executor();
    std::vector<std::unique_ptr<Session>> ss;
    std::vector<BatchRow> rows;
    for (int i = 0; i < 6; ++i) {
        ss.push_back(std::make_unique<Session>(m, *ex, 64));
        ss[i]->sync(std::span<const int32_t>(toks).subspan(i, 2 + i));
        rows.push_back({ss[i].get(), toks[20 + i], ss[i]->pos(), true});
    }
    forward_batch(*ex, rows, nullptr);
    for (auto &s : ss) out.insert(out.end(), s->logits().begin(), s->logits().end());
    return out;
}

void expect_streamed_equal(const std::string &path, const std::vector<int32_t> &toks, const std::vector<std::string> &modes,
                           const char *what) {
    auto resident = Model::open(path, gpu());
    const std::vector<float> want = logits(*resident, toks, modes);
    resident.reset();
    const ModelConfig c = Model::open(path, {2})->config();
    const uint64_t k = c.n_expert_used, all = (uint64_t)c.n_layer * c.n_expert;
    for (uint64_t cap : {k, 4 * k, all}) {
        for (bool prefetch : {true, false}) {
            if (cap == all && !prefetch) continue;
            auto m = Model::open(path, gpu(cap, prefetch));
            ASSERT_TRUE(m->streams_experts());
            const std::vector<float> got = logits(*m, toks, modes);
            ASSERT_EQ(want.size(), got.size());
            EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
                << what << ": " << path << " cache " << cap << " experts, prefetch " << prefetch;
            const ExpertSourceStats st = m->experts().stats();
            EXPECT_EQ(st.capacity, cap);
            EXPECT_LE(st.resident, st.capacity);
            EXPECT_GT(st.acquired, 0u);
            EXPECT_GT(st.misses, 0u);
            EXPECT_LE(st.misses, st.acquired);
            EXPECT_GT(st.host_bytes_read, 0u);
            if (!prefetch) { EXPECT_EQ(st.prefetched, 0u); }
            std::printf("[cuda streaming] %s cache %4llu prefetch %d: %llu acquired, %llu missed, %llu prefetched (%llu used), "
                        "%.1f MB uploaded, %.1f MB read by the RAM tier\n",
                        what, (unsigned long long)cap, prefetch, (unsigned long long)st.acquired, (unsigned long long)st.misses,
                        (unsigned long long)st.prefetched, (unsigned long long)st.prefetch_used, st.bytes_read / 1e6,
                        st.host_bytes_read / 1e6);
        }
    }
}

std::string make_model(const std::string &dir, const std::string &expert_type) {
    const std::string path = dir + "/m-" + expert_type + ".gguf";
    const std::string cmd = std::string(DS4_MAKE_MODEL_BIN) + " --preset tiny --embd 256 --expert-ff 256 --type f32 --expert-type " +
                            expert_type + " --quiet " + path;
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return path;
}

std::vector<int32_t> tokens(int n, int vocab, int mul, int add) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back((i * mul + add) % vocab);
    return t;
}

TEST(CudaStreaming, TrainedModelBitIdenticalToResident) {
    NEED_DEVICE();
    const int vocab = Model::open(kTrained, {2})->config().n_vocab;
    expect_streamed_equal(kTrained, tokens(40, vocab, 7919, 13), {"prefill", "decode", "7"}, "trained q8_0");
    // more routed pairs than the device grouping takes: expert tiles
    expect_streamed_equal(kTrained, tokens(300, vocab, 53, 5), {"prefill"}, "trained q8_0 300-token prefill");
}

TEST(CudaStreaming, FixtureTypesBitIdenticalToResident) {
    NEED_DEVICE();
    char dir[] = "/tmp/ds4-cuda-stream-XXXXXX";
    ASSERT_TRUE(mkdtemp(dir));
    for (const char *et : {"ds4-q2", "q4_k"}) {
        const std::string path = make_model(dir, et);
        expect_streamed_equal(path, tokens(40, 200, 53, 7), {"prefill", "decode"}, et);
        expect_streamed_equal(path, tokens(300, 200, 31, 3), {"prefill"}, (std::string(et) + " 300-token prefill").c_str());
        std::remove(path.c_str());
    }
    // f32 experts multiply f32 activations: always the per-expert path
    const std::string f32 = make_model(dir, "f32");
    expect_streamed_equal(f32, tokens(40, 200, 53, 7), {"prefill", "decode"}, "f32 experts");
    std::remove(f32.c_str());
    rmdir(dir);
}

TEST(CudaStreaming, HostGroupedPathBitIdenticalToResident) {
    NEED_DEVICE();
    setenv("DS4_CUDA_HOST_MOE", "1", 1);
    const int vocab = Model::open(kTrained, {2})->config().n_vocab;
    expect_streamed_equal(kTrained, tokens(40, vocab, 7919, 13), {"prefill", "decode"}, "trained q8_0, host-grouped");
    unsetenv("DS4_CUDA_HOST_MOE");
}

// The counters against what a step must do: a decode step of one row on the trained model
// acquires exactly n_expert_used experts per layer; with every expert fitting, a second
// pass over the same tokens uploads nothing; bytes uploaded are whole experts.
TEST(CudaStreaming, StatsAddUp) {
    NEED_DEVICE();
    const ModelConfig c = Model::open(kTrained, {2})->config();
    const uint64_t all = (uint64_t)c.n_layer * c.n_expert;
    auto m = Model::open(kTrained, gpu(all, /*prefetch=*/false));
    const std::vector<int32_t> toks = tokens(12, c.n_vocab, 7919, 13);
    Session s(*m, 64);
    s.sync(std::span<const int32_t>(toks).subspan(0, 1));
    const ExpertSourceStats a = m->experts().stats();
    EXPECT_EQ(a.acquired, (uint64_t)c.n_layer * c.n_expert_used);
    EXPECT_EQ(a.misses, a.acquired);   // a cold cache
    const auto &L0 = m->weights().layers[0];
    const uint64_t per_expert = L0.gate_exps.first.bytes() + L0.up_exps.first.bytes() + L0.down_exps.first.bytes();
    EXPECT_EQ(a.bytes_read, a.misses * per_expert);
    for (size_t i = 1; i < toks.size(); ++i) s.eval(toks[i]);
    const ExpertSourceStats b = m->experts().stats();
    EXPECT_EQ(b.acquired, (uint64_t)toks.size() * c.n_layer * c.n_expert_used);
    EXPECT_EQ(b.bytes_read, b.misses * per_expert);
    EXPECT_GT(b.io_busy_ns, 0u);
    // the same tokens again, the same way: every expert is in VRAM
    Session s2(*m, 64);
    s2.sync(std::span<const int32_t>(toks).subspan(0, 1));
    for (size_t i = 1; i < toks.size(); ++i) s2.eval(toks[i]);
    const ExpertSourceStats d = m->experts().stats();
    EXPECT_GT(d.acquired, b.acquired);
    EXPECT_EQ(d.misses, b.misses);
    EXPECT_EQ(d.bytes_read, b.bytes_read);
    EXPECT_EQ(d.resident, b.misses);
    std::printf("[cuda streaming] stats: %llu acquired, %llu uploaded (%.1f MB, %.2f GB/s while copying), RAM tier %.1f MB read\n",
                (unsigned long long)d.acquired, (unsigned long long)d.misses, d.bytes_read / 1e6,
                d.io_busy_ns ? d.bytes_read / (double)d.io_busy_ns : 0.0, d.host_bytes_read / 1e6);
}

TEST(CudaStreaming, PrefetchUploadsTheNextLayer) {
    NEED_DEVICE();
    const ModelConfig c = Model::open(kTrained, {2})->config();
    auto m = Model::open(kTrained, gpu((uint64_t)c.n_expert_used * 4));
    Session s(*m, 64);
    const std::vector<int32_t> toks = tokens(20, c.n_vocab, 7919, 13);
    s.sync(std::span<const int32_t>(toks).subspan(0, 4));
    for (int i = 0; i < 16; ++i) s.eval(s.argmax());
    const ExpertSourceStats st = m->experts().stats();
    // the guess for layer l+1 is made from layer l's input and uploaded before l+1 asks
    EXPECT_GT(st.prefetched, 0u);
    EXPECT_GT(st.prefetch_used, 0u);
    EXPECT_LE(st.prefetch_used, st.prefetched);
    EXPECT_LE(st.misses + st.prefetch_used, st.acquired);
}

TEST(CudaStreaming, BudgetTooSmallIsAClearError) {
    NEED_DEVICE();
    const int k = Model::open(kTrained, {2})->config().n_expert_used;
    try {
        Model::open(kTrained, gpu((uint64_t)k - 1));
        FAIL() << "a VRAM cache smaller than one token's experts per layer was accepted";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("too small"), std::string::npos) << e.what();
    }
}

}  // namespace
