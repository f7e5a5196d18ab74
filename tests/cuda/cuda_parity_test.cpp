// The CUDA backend end to end: HF reference parity on float32 fixtures (every mode), every
// tensor type against the CPU backend on the same file, batch-first steps, trial/commit,
// and payload tails that move between backends. Skips when no CUDA device is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_graph.h"
#include "tests/cuda/need_device.h"
#include "engine/model/model.h"
#include "engine/model/session.h"
#include "engine/quant/quants.h"
#include "tests/engine/fixture.h"

using namespace ds4;
using namespace ds4test;

namespace {

std::unique_ptr<Model> open(const std::string &path, BackendKind b) {
    ModelOptions o;
    o.n_threads = 2;
    o.backend = b;
    return Model::open(path, o);
}

double rel(const std::vector<float> &ref, const std::vector<float> &got) {
    EXPECT_EQ(ref.size(), got.size());
    float mx = 0, d = 0;
    for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
        if (!std::isfinite(got[i])) return INFINITY;
        mx = std::max(mx, std::fabs(ref[i]));
        d = std::max(d, std::fabs(ref[i] - got[i]));
    }
    return mx > 0 ? d / mx : d;
}

class CudaParity : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaParity, F32AllModesMatchReference) {
    NEED_DEVICE();
    RefFixture fx = load_fixture(GetParam());
    auto m = open(converted_gguf(fx.name, "f32"), BackendKind::Cuda);
    for (const char *mode : {"prefill", "decode", "5", "16"}) {
        std::vector<float> got = run_mode(*m, fx.tokens, mode);
        ASSERT_EQ(got.size(), fx.logits.size()) << mode;
        const double e = rel_error(fx.logits, got, fx.vocab);
        EXPECT_LE(e, 1e-4) << fx.name << " mode " << mode;
        std::printf("[cuda parity] %s f32 %-7s rel %.3g\n", fx.name.c_str(), mode, e);
    }
    std::vector<float> got = run_mode(*m, fx.tokens, "prefill", 7);
    EXPECT_LE(rel_error(fx.logits, got, fx.vocab), 1e-4) << fx.name << " prefill cap 7";
}

// Converted half / bf16 / q8_0 files: the GPU must be at least as close to the reference as
// the CPU on the same file (both quantise activations to q8_0 for q8_0 weights).
TEST_P(CudaParity, ConvertedTypesAsCloseAsTheCpu) {
    NEED_DEVICE();
    RefFixture fx = load_fixture(GetParam());
    for (const char *type : {"f16", "bf16", "q8_0"}) {
        const std::string path = converted_gguf(fx.name, type);
        auto cpu = open(path, BackendKind::Cpu), gpu = open(path, BackendKind::Cuda);
        for (const char *mode : {"prefill", "decode"}) {
            const double ec = rel_error(fx.logits, run_mode(*cpu, fx.tokens, mode), fx.vocab);
            const double eg = rel_error(fx.logits, run_mode(*gpu, fx.tokens, mode), fx.vocab);
            std::printf("[cuda parity] %s %-5s %-7s vs HF: cpu %.3g gpu %.3g\n", fx.name.c_str(), type, mode, ec, eg);
            EXPECT_LE(eg, std::max(1.2 * ec, 1e-4)) << fx.name << " " << type << " " << mode;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaParity, ::testing::Values("mix", "flashlike", "wide"));

// Every tensor type: a random model from ds4-make-model stored in that type, on the GPU,
// against the CPU. F32/F16/BF16: both multiply f32 activations, so the GPU must equal the CPU
// (on the file and on the weights decoded to f32) to 1e-4. Block formats: both quantise the
// activations bit-identically and take integer dots (checked op by op: CudaQuant below,
// tests/backend), but end to end the comparison is chaotic -- a float-rounding difference
// anywhere (a norm, attention) flips one q8 rounding, which moves later inputs by ~1e-3 and
// flips many more, so later outputs differ as much as the q8 rounding itself. (The CPU alone
// shows it: scaling one layer-0 norm vector by 1 + 2e-7 moves the trained q8_0 model's argmax
// on 0.8% of 512 positions, an f16 copy's on none.) Observed on the H200: 4e-3 .. 1.8e-2 of
// the largest logit, 0.2 for ds4-q2, against 2e-2 .. 0.35 from the GPU to the CPU on the
// decoded weights (the size of the q8 effect). So block formats are held only to that size:
// within max(2x it, 0.05), which a wrong block decoding or scale (errors of O(1)) does not meet.
std::string decode_to_f32(const std::string &path) {
    auto r = gguf::Reader::open(path);
    gguf::Writer w;
    for (const auto &[k, v] : r->metadata()) w.set(k, v);
    std::vector<float> f;
    for (const gguf::TensorInfo &t : r->tensors()) {
        if (t.type == gguf::Type::F32 || t.type == gguf::Type::I32) {
            w.add_tensor(t.name, t.type, t.ne, t.data, t.nbytes);
            continue;
        }
        f.resize((size_t)t.nelements());
        quant::dequantize_row(t.type, t.data, f.data(), t.nelements());
        w.add_tensor(t.name, gguf::Type::F32, t.ne, f.data(), f.size() * sizeof(float));
    }
    const std::string out = path + ".f32.gguf";
    w.write(out);
    return out;
}

class CudaTypes : public ::testing::TestWithParam<std::string> {};

// A tiny random model of "--type:--expert-type" (the CudaTypes parameter) in a new directory
// under /tmp, removed with it; extra: more ds4-make-model flags.
struct TinyModel {
    std::string dir, path;
    void make(const std::string &type, const std::string &extra = "") {
        char d[] = "/tmp/ds4-cuda-types-XXXXXX";
        ASSERT_TRUE(mkdtemp(d));
        dir = d, path = dir + "/m.gguf";
        const std::string t = type.substr(0, type.find(':')), et = type.substr(type.find(':') + 1);
        const std::string cmd = std::string(DS4_MAKE_MODEL_BIN) + " --preset tiny --embd 256 --expert-ff 256 " + extra + " --type " +
                                t + " --expert-type " + et + " --quiet " + path;
        ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
    ~TinyModel() {
        if (!path.empty()) std::remove(path.c_str());
        if (!dir.empty()) rmdir(dir.c_str());
    }
};

TEST_P(CudaTypes, MatchesTheCpu) {
    NEED_DEVICE();
    const std::string type = GetParam();   // "--type:--expert-type"
    const std::string t = type.substr(0, type.find(':')), et = type.substr(type.find(':') + 1);
    TinyModel tm;
    ASSERT_NO_FATAL_FAILURE(tm.make(type));
    const std::string &path = tm.path;
    const std::string plain = decode_to_f32(path);
    auto cpu = open(plain, BackendKind::Cpu), gpu = open(path, BackendKind::Cuda), cpu_q = open(path, BackendKind::Cpu);
    std::vector<int32_t> toks;
    for (int i = 0; i < 40; ++i) toks.push_back((i * 37 + 11) % cpu->config().n_vocab);
    const bool plain_types = (t == "f32" || t == "f16" || t == "bf16") && (et == "f32" || et == "f16" || et == "bf16");
    for (const char *mode : {"prefill", "decode"}) {
        const std::vector<float> c = run_mode(*cpu, toks, mode), g = run_mode(*gpu, toks, mode);
        const double e = rel(c, g), eq = rel(run_mode(*cpu_q, toks, mode), g);
        std::printf("[cuda types] %-12s %-7s gpu vs cpu on the file %.3g   (vs cpu on the decoded f32 weights %.3g)\n",
                    type.c_str(), mode, eq, e);
        if (plain_types) {
            EXPECT_LE(e, 1e-4) << type << " " << mode;
            EXPECT_LE(eq, 1e-4) << type << " " << mode;
        } else {
            EXPECT_LE(eq, std::max(2 * e, 0.05)) << type << " " << mode;
        }
    }
    if (!plain_types) {
        // a prefill of more routed pairs than the device grouping takes: expert tiles on the
        // tensor cores (and the dense products there too)
        std::vector<int32_t> longer;
        for (int i = 0; i < 300; ++i) longer.push_back((i * 53 + 5) % cpu->config().n_vocab);
        const std::vector<float> c = run_mode(*cpu, longer, "prefill"), g = run_mode(*gpu, longer, "prefill");
        const double e = rel(c, g), eq = rel(run_mode(*cpu_q, longer, "prefill"), g);
        std::printf("[cuda types] %-12s 300-token prefill: gpu vs cpu on the file %.3g   (vs decoded f32 %.3g)\n", type.c_str(),
                    eq, e);
        EXPECT_LE(eq, std::max(2 * e, 0.05)) << type << " 300-token prefill";
    }
    std::remove(plain.c_str());
}

INSTANTIATE_TEST_SUITE_P(Types, CudaTypes, ::testing::Values("f32:f32", "f16:f16", "bf16:bf16", "q8_0:q8_0", "f32:q4_k", "f32:q2_k",
                                                   "f32:iq2_xxs", "f32:ds4-q2", "f32:ds4-q4"));

// Routed experts grouped on the device (few rows: decode, small batches, short prefills)
// against the host-grouped path (DS4_CUDA_HOST_MOE=1): the same integer dots in the same
// order, so the logits must be equal bit for bit -- in every mode and for a batched step.
std::vector<float> logits_with(const std::string &path, const std::vector<int32_t> &toks, const char *mode, bool host_moe) {
    if (host_moe) setenv("DS4_CUDA_HOST_MOE", "1", 1);
    auto m = open(path, BackendKind::Cuda);
    std::vector<float> out = run_mode(*m, toks, mode);
    // a step of six sessions, one row each
    auto ex = m->make_executor();
    std::vector<std::unique_ptr<Session>> ss;
    std::vector<BatchRow> rows;
    for (int i = 0; i < 6; ++i) {
        ss.push_back(std::make_unique<Session>(*m, *ex, 64));
        ss[i]->sync(std::span<const int32_t>(toks).subspan(i, 2 + i));
        rows.push_back({ss[i].get(), toks[20 + i], ss[i]->pos(), true});
    }
    forward_batch(*ex, rows, nullptr);
    for (auto &s : ss) out.insert(out.end(), s->logits().begin(), s->logits().end());
    unsetenv("DS4_CUDA_HOST_MOE");
    return out;
}

TEST_P(CudaTypes, DeviceGroupedExpertsEqualHostGrouped) {
    NEED_DEVICE();
    const std::string type = GetParam();
    const std::string et = type.substr(type.find(':') + 1);
    if (et == "f32" || et == "f16" || et == "bf16") GTEST_SKIP() << "f32-activation experts always group on the host";
    TinyModel tm;
    ASSERT_NO_FATAL_FAILURE(tm.make(type));
    const std::string &path = tm.path;
    std::vector<int32_t> toks;
    for (int i = 0; i < 40; ++i) toks.push_back((i * 53 + 7) % 200);
    for (const char *mode : {"prefill", "decode", "7"}) {   // "7": chunks of 7
        const std::vector<float> dev = logits_with(path, toks, mode, false), host = logits_with(path, toks, mode, true);
        ASSERT_EQ(dev.size(), host.size());
        size_t diff = 0;
        for (size_t i = 0; i < dev.size(); ++i) diff += std::memcmp(&dev[i], &host[i], sizeof(float)) != 0;
        EXPECT_EQ(diff, 0u) << type << " " << mode << ": " << diff << " of " << dev.size() << " logits differ";
    }
}

// Steps of up to 16 rows run as CUDA graphs a layer at a time, kept between steps and
// updated where a launch's arguments or grid changed (cuda/cuda_graph.h), and norms, SwiGLU
// and the attention output's rope quantise their results in the same launch (DS4_CUDA_FUSE).
// Against every kernel launched on the stream, unfused (DS4_CUDA_GRAPH=0 DS4_CUDA_FUSE=0),
// the logits must be equal bit for bit: decode through compressor emits of ratio 4 and 8 (a
// layer's kernels differ between steps), a segment of two layers, chunks of 7, speculative
// trial rows (journaled cache writes), and batched steps of six sessions at different
// positions.
std::vector<float> logits_graph(const std::string &path, const std::vector<int32_t> &toks, const char *graph, const char *fuse) {
    setenv("DS4_CUDA_GRAPH", graph, 1);
    setenv("DS4_CUDA_FUSE", fuse, 1);
    auto m = open(path, BackendKind::Cuda);
    std::vector<float> out = run_mode(*m, toks, "decode"), c7 = run_mode(*m, toks, "7");
    out.insert(out.end(), c7.begin(), c7.end());
    {
        Session t(*m, 64, 8, 0);
        t.sync(std::span<const int32_t>(toks).first(9));
        t.trial(std::span<const int32_t>(toks).subspan(9, 4), nullptr);
        t.commit(2);
        for (int k = 0; k < 6; ++k) {
            t.eval(toks[20 + k]);
            out.insert(out.end(), t.logits().begin(), t.logits().end());
        }
    }
    auto ex = m->make_executor();
    std::vector<std::unique_ptr<Session>> ss;
    for (int i = 0; i < 6; ++i) {
        ss.push_back(std::make_unique<Session>(*m, *ex, 64));
        ss[i]->sync(std::span<const int32_t>(toks).first(1 + 3 * i));
    }
    for (int k = 0; k < 12; ++k) {
        std::vector<BatchRow> rows;
        for (int i = 0; i < 6; ++i) rows.push_back({ss[i].get(), toks[(7 * i + k) % toks.size()], ss[i]->pos(), true});
        forward_batch(*ex, rows, nullptr);
        for (auto &s : ss) out.insert(out.end(), s->logits().begin(), s->logits().end());
    }
    unsetenv("DS4_CUDA_GRAPH");
    unsetenv("DS4_CUDA_FUSE");
    return out;
}

TEST_P(CudaTypes, GraphStepsAndFusedLaunchesEqualPlainLaunches) {
    NEED_DEVICE();
    const std::string type = GetParam();
    TinyModel tm;
    ASSERT_NO_FATAL_FAILURE(tm.make(type, "--ratios 0,4,8,4"));
    const std::string &path = tm.path;
    std::vector<int32_t> toks;
    for (int i = 0; i < 40; ++i) toks.push_back((i * 41 + 3) % 200);
    const std::vector<float> plain = logits_graph(path, toks, "0", "0");
    for (auto [graph, fuse] : {std::pair{"1", "0"}, std::pair{"0", "1"}, std::pair{"1", "1"}, std::pair{"2", "1"}}) {
        const std::vector<float> g = logits_graph(path, toks, graph, fuse);
        ASSERT_EQ(g.size(), plain.size());
        size_t diff = 0;
        for (size_t i = 0; i < g.size(); ++i) diff += std::memcmp(&g[i], &plain[i], sizeof(float)) != 0;
        EXPECT_EQ(diff, 0u) << type << " DS4_CUDA_GRAPH=" << graph << " DS4_CUDA_FUSE=" << fuse << ": " << diff << " of "
                            << g.size() << " logits differ";
    }
}

// A graph that fails to build (here on purpose: StepGraphs::fail_build_after) does not fail
// the step: its kernels are launched on the stream instead and the executor stops using
// graphs, so the logits are still those of plain launches, bit for bit, whether the failure
// comes at the first build or after some segments already ran as graphs.
TEST_P(CudaTypes, AGraphThatFailsToBuildFallsBackToStreamLaunches) {
    NEED_DEVICE();
    const std::string type = GetParam();
    TinyModel tm;
    ASSERT_NO_FATAL_FAILURE(tm.make(type, "--ratios 0,4,8,4"));
    std::vector<int32_t> toks;
    for (int i = 0; i < 40; ++i) toks.push_back((i * 41 + 3) % 200);
    const std::vector<float> plain = logits_graph(tm.path, toks, "0", "1");
    for (int after : {0, 3}) {
        cuda::StepGraphs::fail_build_after(after);
        ::testing::internal::CaptureStderr();
        const std::vector<float> g = logits_graph(tm.path, toks, "1", "1");
        const std::string err = ::testing::internal::GetCapturedStderr();
        cuda::StepGraphs::fail_build_after(-1);
        EXPECT_NE(err.find("CUDA graph failed"), std::string::npos) << "after " << after << ": no fallback reported";
        ASSERT_EQ(g.size(), plain.size());
        size_t diff = 0;
        for (size_t i = 0; i < g.size(); ++i) diff += std::memcmp(&g[i], &plain[i], sizeof(float)) != 0;
        EXPECT_EQ(diff, 0u) << type << " failure after " << after << " builds: " << diff << " of " << g.size()
                            << " logits differ";
    }
}

struct CudaSessions : ::testing::Test {
    void SetUp() override {
        std::string why;
        if (!cuda::cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
        fx = load_fixture("mix");
        gpu = open(converted_gguf("mix", "f32"), BackendKind::Cuda);
        cpu = open(converted_gguf("mix", "f32"), BackendKind::Cpu);
    }
    RefFixture fx;
    std::unique_ptr<Model> gpu, cpu;
    std::span<const int32_t> toks(size_t off, size_t n) const { return std::span<const int32_t>(fx.tokens).subspan(off, n); }
};

TEST_F(CudaSessions, EightSessionsInOneStepMatchEachAlone) {
    auto ex = gpu->make_executor();
    std::vector<std::unique_ptr<Session>> together, alone;
    for (int i = 0; i < 8; ++i) {
        together.push_back(std::make_unique<Session>(*gpu, *ex, 96));
        alone.push_back(std::make_unique<Session>(*gpu, 96));
        together[i]->sync(toks(i, 3 + 5 * i));
        alone[i]->sync(toks(i, 3 + 5 * i));
    }
    for (int k = 0; k < 10; ++k) {
        std::vector<BatchRow> rows;
        for (int i = 0; i < 8; ++i) {
            const int32_t t = fx.tokens[(11 * i + 3 * k + 1) % fx.tokens.size()];
            rows.push_back({together[i].get(), t, together[i]->pos(), true});
            alone[i]->eval(t);
        }
        forward_batch(*ex, rows, nullptr);
        for (int i = 0; i < 8; ++i) EXPECT_LE(rel(alone[i]->logits(), together[i]->logits()), 1e-5) << i << " step " << k;
    }
}

TEST_F(CudaSessions, TrialCommitEqualsASessionThatOnlySawThePrefix) {
    const int V = fx.vocab;
    for (int n0 : {0, 5, 8, 13, 21}) {
        for (int j : {0, 2, 6}) {
            Session t(*gpu, 64, 8, 0), r(*gpu, 64, 8, 0);
            if (n0) t.sync(toks(0, n0));
            t.trial(toks(n0, 6), nullptr);
            t.commit(j);
            if (n0 + j) r.sync(toks(0, n0 + j));
            ASSERT_EQ(t.tokens(), r.tokens());
            if (r.has_logits()) {
                EXPECT_LE(rel(r.logits(), t.logits()), 1e-5) << n0 << " " << j;
            }
            for (int s = 0; s < 4; ++s) {
                t.eval(fx.tokens[40 + s]);
                r.eval(fx.tokens[40 + s]);
                EXPECT_LE(rel(r.logits(), t.logits()), 1e-5) << n0 << " " << j << " continue " << s;
            }
            (void)V;
        }
    }
}

TEST_F(CudaSessions, PayloadTailsMoveBetweenBackends) {
    for (auto [from, to] : {std::pair{gpu.get(), cpu.get()}, std::pair{cpu.get(), gpu.get()}}) {
        Session a(*from, 96), b(*to, 96), ref(*to, 96);
        a.sync(toks(0, 37));
        const std::vector<uint8_t> tail = a.save_tail();
        b.load_tail(tail.data(), tail.size(), a.tokens());
        ref.sync(toks(0, 37));
        EXPECT_EQ(b.logits(), a.logits());   // the saved logits themselves
        for (int s = 0; s < 6; ++s) {
            b.eval(fx.tokens[50 + s]);
            ref.eval(fx.tokens[50 + s]);
            EXPECT_LE(rel(ref.logits(), b.logits()), 1e-4) << from->backend().name() << " -> " << to->backend().name();
        }
    }
}

}  // namespace
