// Op-level backend tests, in the spirit of llama.cpp's test-backend-ops.
//
// Every Executor operation (engine/backend/backend.h) runs on random activations uploaded
// with Executor::upload, with session caches pre-filled with random rows through
// SessionState::write, and its outputs (downloaded activations, cache rows read back) are
// compared with a plain reference written here from the math: straightforward loops in
// double precision over weights dequantised to f32 by the quant library. The engine's own
// kernels (kernels/ops, kernels/matmul, the CPU executor) are never called by the
// reference; only quant::dequantize_row / quantize_row and the Rope tables are shared.
// route and indexer_topk keep their choices inside the executor, so they are checked
// through the op that consumes them (routed_experts, attend).
//
// Quantised weights: products quantise their activation rows to q8, so each case is
// checked twice -- against the reference with that rounding modelled (tight), and against
// the plain math (loose); the tolerances below say why. DS4_OPS_VERBOSE=1 prints every
// output's error.
//
// Parameterised over (backend, weights): a model with random weights is generated per
// weight layout by ds4-make-model's library -- every matrix role in one type (F32, F16,
// BF16, Q8_0, Q4_K, Q2_K, IQ2_XXS), or ds4's own mixed layouts ds4-q2 / ds4-q4 -- and each
// backend in kBackends (the CPU; CUDA when built with it) runs the same cases.
//
// Shapes are tiny but every matrix row is a multiple of 256 elements so the 256-block
// types (Q4_K, Q2_K, IQ2_XXS) apply to every matrix. 16 indexer heads and top-k 2 make
// the indexer really select; the step layouts put several sessions in one step, at
// positions that cross the sliding window (8) and the CSA (4) / HCA (8) window boundaries.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/common/error.h"
#include "engine/model/model.h"
#include "engine/quant/quants.h"
#include "tools/convert/type_policy.h"
#ifdef DS4_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif
#include "tools/make_model/make_model.h"

namespace ds4 {
namespace {

using gguf::Type;
using Vec = std::vector<double>;
using Outs = std::vector<Vec>;

// ---------------------------------------------------------------------------------------
// Test model, backends, tolerances

constexpr int kCtx = 64;     // session context (entry arrays: kCtx / ratio entries)
constexpr int kChunk = 8;    // most rows of one session in a step

ModelConfig op_config() {
    ModelConfig c = make_model::preset_config("tiny", 3);
    c.n_vocab = 512;
    c.n_embd = 256;
    c.n_head = 8;
    c.head_dim = 64;
    c.n_rot = 16;
    c.q_lora = 256;
    c.o_groups = 2;        // o_a rows: 8 * 64 / 2 = 256
    c.o_lora = 128;        // o_b rows: 2 * 128 = 256
    c.n_expert = 4;
    c.n_expert_used = 2;
    c.n_ff_exp = 256;
    c.sliding_window = 8;
    c.indexer_heads = 16;
    c.indexer_dim = 32;
    c.indexer_topk = 2;
    c.compress_ratio = {0, 4, 8};   // sliding only, CSA (ratio 4), HCA (ratio 8)
    c.csa_ratio = 4;
    c.n_hash_layer = 1;             // layer 0 routes by the hash table
    c.swiglu_limit = {1.0f, 10.f, 0.7f};   // small clamps so SwiGLU's clamping is exercised
    c.validate();
    return c;
}

bool same_shape(const ModelConfig &a, const ModelConfig &b) {
    return a.n_layer == b.n_layer && a.n_vocab == b.n_vocab && a.n_embd == b.n_embd && a.n_head == b.n_head &&
           a.head_dim == b.head_dim && a.n_rot == b.n_rot && a.q_lora == b.q_lora && a.o_groups == b.o_groups &&
           a.o_lora == b.o_lora && a.n_expert == b.n_expert && a.n_expert_used == b.n_expert_used &&
           a.n_ff_exp == b.n_ff_exp && a.sliding_window == b.sliding_window && a.indexer_heads == b.indexer_heads &&
           a.indexer_dim == b.indexer_dim && a.indexer_topk == b.indexer_topk && a.compress_ratio == b.compress_ratio &&
           a.csa_ratio == b.csa_ratio && a.n_hash_layer == b.n_hash_layer && a.swiglu_limit == b.swiglu_limit &&
           a.hc_mult == b.hc_mult && a.hc_iters == b.hc_iters && a.yarn == b.yarn;
}

// The weight layouts under test: every matrix in one type (each type the engine reads), or
// one of ds4's own mixed layouts (ds4-q2: experts gate/up IQ2_XXS and down Q2_K; ds4-q4: all
// experts Q4_K; both with f16 compressor/indexer/router/hyper-connection matrices and q8_0
// attention, shared experts and output).
const std::vector<std::pair<std::string, Type>> kSingleTypes = {
    {"f32", Type::F32},   {"f16", Type::F16},   {"bf16", Type::BF16},       {"q8_0", Type::Q8_0},
    {"q4_k", Type::Q4_K}, {"q2_k", Type::Q2_K}, {"iq2_xxs", Type::IQ2_XXS}};
const char *const kMixedLayouts[] = {"ds4-q2", "ds4-q4"};

const std::vector<convert::Role> kMatrixRoles = {
    convert::Role::Embedding,    convert::Role::Output,     convert::Role::AttnProj,   convert::Role::CompressorProj,
    convert::Role::IndexerProj,  convert::Role::Router,     convert::Role::ExpertGate, convert::Role::ExpertUp,
    convert::Role::ExpertDown,   convert::Role::SharedExpert, convert::Role::HcFn};

// The type each matrix role gets in a layout.
std::map<convert::Role, Type> role_types(const std::string &weights) {
    std::map<convert::Role, Type> m;
    for (const auto &[name, t] : kSingleTypes)
        if (name == weights)
            for (convert::Role r : kMatrixRoles) m[r] = t;
    if (m.empty()) {
        const convert::TypePolicy p = convert::make_type_policy("f32", weights, false);
        for (convert::Role r : kMatrixRoles) m[r] = p.by_role.count(r) ? p.by_role.at(r) : p.matrix;
    }
    return m;
}

bool quantised(Type t) { return t != Type::F32 && t != Type::F16 && t != Type::BF16; }

// Whether any product of the layout quantises its activations.
bool quantised(const std::string &weights) {
    for (const auto &[r, t] : role_types(weights))
        if (quantised(t)) return true;
    return false;
}

// The backends under test: the CPU always, CUDA when built with it (its cases skip when no
// device is present). Another backend is one more name here, its ModelOptions in
// options_for() and a branch in backend_for().
const std::vector<std::string> kBackends = {"cpu",
#ifdef DS4_HAVE_CUDA
                                            "cuda",
#endif
};

ModelOptions options_for(const std::string &backend) {
    ModelOptions o;
    o.n_threads = 2;
    if (backend == "cpu") {
        o.backend = BackendKind::Cpu;
        return o;
    }
    if (backend == "cuda") {
        o.backend = BackendKind::Cuda;
        return o;
    }
    fail("backend_ops_test: unknown backend " + backend);
}

// Whether the backend's products with quantised weights quantise their activation rows to q8
// (both do: the CPU's integer dots and the CUDA integer kernels, with the same quantiser).
// Decides which reference a case is held to (verify()).
bool q8_activations(const std::string &backend) { return backend == "cpu" || backend == "cuda"; }

// Why the backend cannot run here ("" when it can).
std::string unavailable(const std::string &backend) {
    std::string why;
#ifdef DS4_HAVE_CUDA
    if (backend == "cuda" && !cuda::cuda_device_available(&why)) return "no CUDA device: " + why;
#endif
    (void)backend;
    return why;
}

const Backend &backend_for(const std::string &name, const Model &m) {
    if (m.backend().name() != name) fail("the model's backend is " + m.backend().name() + ", not " + name);
    return m.backend();
}

// The model file of a weight layout. ctest runs each test in its own process, so the files
// are kept in the build tree (DS4_OPS_MODEL_DIR) and made once: written under a temporary
// name and renamed, so parallel test processes never see a partial file; a file of another
// shape or type (an older version of this test) is replaced.
std::string model_file(const std::string &weights) {
    const ModelConfig want = op_config();
    const std::string dir = DS4_OPS_MODEL_DIR;
    std::filesystem::create_directories(dir);
    const std::string path = dir + "/ops-" + weights + ".gguf";
    const std::map<convert::Role, Type> types = role_types(weights);
    if (std::filesystem::exists(path)) {
        try {
            std::unique_ptr<Model> m = Model::open(path);
            const LayerWeights &L0 = m->weights().layers[0];
            if (same_shape(m->config(), want) && L0.gate_exps.first.type == types.at(convert::Role::ExpertGate) &&
                L0.down_exps.first.type == types.at(convert::Role::ExpertDown) &&
                L0.q_a.type == types.at(convert::Role::AttnProj) && L0.hc_attn_fn.type == types.at(convert::Role::HcFn))
                return path;
        } catch (const std::exception &) {
        }
    }
    make_model::MakeModelOptions o;
    o.cfg = want;
    uint64_t seed = 1000;
    for (char ch : weights) seed = seed * 31 + (unsigned char)ch;
    o.seed = seed;
    o.threads = 2;
    o.progress = false;
    o.role_types = types;
    const std::string tmp = path + ".tmp." + std::to_string(getpid());
    make_model::make_model(o, tmp);
    std::filesystem::rename(tmp, path);
    return path;
}

// One opened model per (backend, weight layout), kept for the process.
const Model &model_for(const std::string &backend, const std::string &weights) {
    static std::map<std::string, std::unique_ptr<Model>> cache;
    const std::string key = backend + "/" + weights;
    auto it = cache.find(key);
    if (it == cache.end()) it = cache.emplace(key, Model::open(model_file(weights), options_for(backend))).first;
    return *it->second;
}

// f32/f16/bf16 weights (or any weights, on a backend that multiplies f32 activations) meet
// f32 activations: only float rounding separates the backend from the double reference
// (observed: at most ~3e-7 of the largest output on these widths), so 1e-5 leaves ~30x
// margin and still catches any real slip in the math.
constexpr double kTolPlain = 1e-5;
// Quantised weights on the CPU: products quantise the activation row to Q8_0 (for Q8_0
// weights) or Q8_K (the K and IQ types). The reference models that rounding (quantize_row +
// dequantize_row of the activation type) before its double dot, so the integer dots agree
// up to float rounding as well (observed ~3e-7). What remains is a chained product (q_b
// after q_a, o_b after o_a, an expert's down after gate/up, the head after the
// hyper-head) whose input differs from the reference's by float rounding and can land on
// the other side of a q8 rounding boundary for an element: one quantum (max|x|/127 for
// Q8_K) of one element moves an output by ~1e-3 of the largest output at n = 256
// (observed once: 9.9e-4, q2_k routed experts). Hence 3e-3.
constexpr double kTolQuantEmulated = 3e-3;
// Against the plain math (no activation rounding modelled): a q8 activation element is off
// by up to max|x|/254, which over n >= 256 random products is ~1% of an output's rms and a
// few times that in the worst output; two chained products (experts) roughly add up.
// Observed up to 1.9e-2 (routed experts), so 5e-2. Ops with a discrete choice (biased
// top-k routing, indexer top-k) are not held to it: there the rounding can flip a near-tie
// (observed: q8_0 indexer, 0.42), which is why the emulated reference is the primary check.
constexpr double kTolQuantPlain = 5e-2;

struct OpParam {
    std::string backend;
    std::string weights;   // a kSingleTypes name or a kMixedLayouts name
};

void PrintTo(const OpParam &p, std::ostream *os) { *os << p.backend << "/" << p.weights; }

std::string param_name(const testing::TestParamInfo<OpParam> &p) {
    std::string n = p.param.backend + "_" + p.param.weights;
    std::replace(n.begin(), n.end(), '-', '_');
    return n;
}

std::vector<OpParam> all_params() {
    std::vector<OpParam> v;
    for (const std::string &b : kBackends)
    {
        for (const auto &[name, t] : kSingleTypes) v.push_back({b, name});
        for (const char *l : kMixedLayouts) v.push_back({b, l});
    }
    return v;
}

// ---------------------------------------------------------------------------------------
// Random data and step layouts

std::vector<float> randn(std::mt19937 &rng, size_t n, float scale = 1.f, float mean = 0.f) {
    std::normal_distribution<float> d(mean, scale);
    std::vector<float> v(n);
    for (float &x : v) x = d(rng);
    return v;
}

std::vector<float> randu(std::mt19937 &rng, size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (float &x : v) x = d(rng);
    return v;
}

struct Seg {
    int64_t n0;
    int n;
};

// Three sessions in one step (a prefill chunk crossing the window and ratio boundaries, a
// fresh session from position 0, a later two-row chunk); a single decode row; a full chunk
// from a window boundary (closes two CSA entries and one HCA entry at once) next to a
// decode row that closes the first CSA window (entry 0: no previous window to overlap).
const std::vector<std::vector<Seg>> kLayouts = {{{13, 6}, {0, 5}, {42, 2}}, {{29, 1}}, {{8, 8}, {3, 1}}};

struct Step {
    std::vector<std::unique_ptr<SessionState>> states;
    std::vector<Seg> segv;
    std::vector<int32_t> tokens;
    std::vector<int64_t> pos;
    std::vector<int> seg;
    std::vector<StepSegment> segs;
    StepLayout lay;
    int R = 0;

    Step(const Backend &b, const ModelConfig &c, const std::vector<Seg> &ss, std::mt19937 &rng) : segv(ss) {
        const CacheGeometry geo = CacheGeometry::make(c, kCtx, kChunk, 0);
        std::uniform_int_distribution<int> tok(0, c.n_vocab - 1);
        for (size_t s = 0; s < ss.size(); ++s) {
            states.push_back(b.make_state(geo));
            segs.push_back({states.back().get(), ss[s].n0, R, ss[s].n});
            for (int i = 0; i < ss[s].n; ++i) {
                tokens.push_back(tok(rng));
                pos.push_back(ss[s].n0 + i);
                seg.push_back((int)s);
                ++R;
            }
        }
        lay.tokens = tokens;
        lay.pos = pos;
        lay.seg = seg;
        lay.segs = segs;
    }
    SessionState &state_of_row(int t) { return *states[seg[t]]; }
};

// ---------------------------------------------------------------------------------------
// The reference: plain loops in double

const std::vector<float> &dequantised(const WeightView &w) {
    static std::map<std::pair<const uint8_t *, int64_t>, std::vector<float>> cache;
    auto key = std::make_pair(w.data, w.out);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    std::vector<float> f((size_t)(w.in * w.out));
    for (int64_t r = 0; r < w.out; ++r) quant::dequantize_row(w.type, w.row(r), f.data() + r * w.in, w.in);
    return cache.emplace(key, std::move(f)).first->second;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double silu(double x) { return x / (1.0 + std::exp(-x)); }
double softplus(double x) { return std::log1p(std::exp(x)); }

struct Ref {
    const ModelConfig &c;
    bool emulate;   // model the q8 rounding of activations inside quantised products

    // The activation row as a product with weights of type t sees it.
    Vec act(Type t, const Vec &x) const {
        const Type vt = quant::vec_dot_type(t);
        if (!emulate || vt == Type::F32) return x;
        const int64_t n = (int64_t)x.size();
        std::vector<float> f(x.begin(), x.end());
        std::vector<uint8_t> q(gguf::row_bytes(vt, n));
        quant::quantize_row(vt, f.data(), q.data(), n);
        quant::dequantize_row(vt, q.data(), f.data(), n);
        return Vec(f.begin(), f.end());
    }
    // y = W x (W: ne = [in, out]).
    Vec mv(const WeightView &w, const Vec &x) const {
        EXPECT_EQ((int64_t)x.size(), w.in);
        const std::vector<float> &W = dequantised(w);
        const Vec xa = act(w.type, x);
        Vec y((size_t)w.out, 0.0);
        for (int64_t o = 0; o < w.out; ++o) {
            double s = 0;
            const float *row = W.data() + o * w.in;
            for (int64_t i = 0; i < w.in; ++i) s += (double)row[i] * xa[i];
            y[o] = s;
        }
        return y;
    }
    Vec rmsnorm(const Vec &x, const float *w) const {
        double ss = 0;
        for (double v : x) ss += v * v;
        const double r = 1.0 / std::sqrt(ss / (double)x.size() + (double)c.rms_eps);
        Vec y(x.size());
        for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * (w ? (double)w[i] : 1.0);
        return y;
    }
    // Interleaved pairs on the trailing 2*n_pairs channels of x[0, n); sign -1 rotates back.
    static void rope(double *x, int n, const Rope &rp, int64_t pos, double sign) {
        std::vector<float> cs(rp.n_pairs), sn(rp.n_pairs);
        rp.cos_sin(pos, cs.data(), sn.data());
        double *r = x + n - 2 * rp.n_pairs;
        for (int i = 0; i < rp.n_pairs; ++i) {
            const double co = cs[i], si = sign * sn[i];
            const double a = r[2 * i], b = r[2 * i + 1];
            r[2 * i] = a * co - b * si;
            r[2 * i + 1] = b * co + a * si;
        }
    }
    // Hyper-connection pre of one row's streams h[hc][D] -> x, post, comb.
    void hc_pre(const WeightView &fn, const float *base, const float *scale, const Vec &h, Vec &x, Vec &post,
                Vec &comb) const {
        const int hc = c.hc_mult, D = c.n_embd;
        const Vec m = mv(fn, rmsnorm(h, nullptr));
        Vec pre(hc);
        post.assign(hc, 0);
        for (int k = 0; k < hc; ++k) {
            pre[k] = sigmoid(m[k] * scale[0] + base[k]) + c.hc_eps;
            post[k] = 2.0 * sigmoid(m[hc + k] * scale[1] + base[hc + k]);
        }
        comb.assign((size_t)hc * hc, 0);
        for (int j = 0; j < hc; ++j) {
            double mx = -INFINITY;
            for (int k = 0; k < hc; ++k) {
                comb[j * hc + k] = m[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
                mx = std::max(mx, comb[j * hc + k]);
            }
            double s = 0;
            for (int k = 0; k < hc; ++k) s += comb[j * hc + k] = std::exp(comb[j * hc + k] - mx);
            for (int k = 0; k < hc; ++k) comb[j * hc + k] = comb[j * hc + k] / s + c.hc_eps;
        }
        auto cols = [&] {
            for (int k = 0; k < hc; ++k) {
                double s = 0;
                for (int j = 0; j < hc; ++j) s += comb[j * hc + k];
                for (int j = 0; j < hc; ++j) comb[j * hc + k] /= s + c.hc_eps;
            }
        };
        auto rows = [&] {
            for (int j = 0; j < hc; ++j) {
                double s = 0;
                for (int k = 0; k < hc; ++k) s += comb[j * hc + k];
                for (int k = 0; k < hc; ++k) comb[j * hc + k] /= s + c.hc_eps;
            }
        };
        cols();
        for (int it = 1; it < c.hc_iters; ++it) {
            rows();
            cols();
        }
        x.assign(D, 0);
        for (int k = 0; k < hc; ++k)
            for (int d = 0; d < D; ++d) x[d] += pre[k] * h[(size_t)k * D + d];
    }
    // Clamped SwiGLU expert: down(silu(min(gate x, L)) * clamp(up x, -L, L)).
    Vec expert(const WeightView &gate, const WeightView &up, const WeightView &down, const Vec &x, double lim) const {
        const Vec g = mv(gate, x), u = mv(up, x);
        Vec h(g.size());
        for (size_t i = 0; i < g.size(); ++i) h[i] = silu(std::min(g[i], lim)) * std::clamp(u[i], -lim, lim);
        return mv(down, h);
    }
};

Vec row_of(const std::vector<float> &v, size_t row, size_t width) {
    return Vec(v.begin() + row * width, v.begin() + (row + 1) * width);
}

void append(Vec &dst, const Vec &src) { dst.insert(dst.end(), src.begin(), src.end()); }

// ---------------------------------------------------------------------------------------
// Comparison

double rel_error(const Vec &ref, const std::vector<float> &got, double *max_ref) {
    double mx = 0, worst = 0;
    for (double v : ref) mx = std::max(mx, std::fabs(v));
    for (size_t i = 0; i < ref.size(); ++i) {
        const double d = std::fabs((double)got[i] - ref[i]);
        worst = std::isfinite(d) ? std::max(worst, d) : INFINITY;   // a NaN or inf output fails
    }
    if (max_ref) *max_ref = mx;
    return mx > 0 ? worst / mx : worst;
}

class BackendOps : public testing::TestWithParam<OpParam> {
protected:
    void SetUp() override {
        const std::string why = unavailable(GetParam().backend);
        if (!why.empty()) GTEST_SKIP() << why;
        model_ = &model_for(GetParam().backend, GetParam().weights);
        backend_ = &backend_for(GetParam().backend, *model_);
        // One executor per test, reused across its layouts and layers: a warm executor
        // must not carry anything over from a previous step of another shape.
        ex_ = backend_->make_executor(2);
    }
    const Model &m() const { return *model_; }
    const ModelConfig &cfg() const { return model_->config(); }
    const ModelWeights &w() const { return model_->weights(); }
    const std::string &weights() const { return GetParam().weights; }

    // Compares each output with the reference. ref(emulate) computes it with (true) or
    // without (false) the q8 rounding of activations in quantised products modelled. Where
    // the backend rounds them (q8_activations) and the weights are quantised, the outputs
    // are held to ref(true) at kTolQuantEmulated and, unless the op makes a discrete choice
    // that a near-tie could flip, to ref(false) at kTolQuantPlain; otherwise to ref(false)
    // at kTolPlain, whatever the weight type.
    void verify(const std::string &what, const std::vector<std::string> &names, const std::vector<std::vector<float>> &got,
                const std::function<Outs(bool)> &ref, bool discrete = false) {
        const bool q = quantised(weights()) && q8_activations(GetParam().backend);
        const Outs e = ref(q);
        ASSERT_EQ(e.size(), got.size());
        Outs p;
        if (q) p = ref(false);
        for (size_t i = 0; i < e.size(); ++i) {
            ASSERT_EQ(e[i].size(), got[i].size()) << what << " " << names[i];
            double mx = 0;
            const double err = rel_error(e[i], got[i], &mx);
            // Not trivially satisfied: the outputs are O(1), never all zeros.
            EXPECT_GT(mx, 1e-2) << what << " " << names[i] << ": the reference output is (nearly) all zeros";
            EXPECT_LE(err, q ? kTolQuantEmulated : kTolPlain) << what << " " << names[i];
            double perr = -1;
            if (q) {
                perr = rel_error(p[i], got[i], nullptr);
                if (!discrete) {
                    EXPECT_LE(perr, kTolQuantPlain) << what << " " << names[i] << " (plain reference)";
                }
            }
            if (std::getenv("DS4_OPS_VERBOSE"))   // one line per output: the numbers behind the tolerances
                std::printf("  %-8s %-6s %-26s max|ref| %8.3g  rel.err %9.3g%s\n", GetParam().backend.c_str(),
                        weights().c_str(), (what + " " + names[i]).c_str(), mx, err,
                        perr >= 0 ? (" (plain math " + std::to_string(perr) + ")").c_str() : "");
        }
    }

    const Model *model_ = nullptr;
    const Backend *backend_ = nullptr;
    std::unique_ptr<Executor> ex_;
};

// ---------------------------------------------------------------------------------------
// The model really stores its matrices in the type under test.

TEST_P(BackendOps, ModelUsesType) {
    using convert::Role;
    const std::map<Role, Type> t = role_types(weights());
    EXPECT_EQ(w().token_embd.type, t.at(Role::Embedding));
    EXPECT_EQ(w().output.type, t.at(Role::Output));
    EXPECT_EQ(w().output_hc_fn.type, t.at(Role::HcFn));
    for (const LayerWeights &L : w().layers) {
        for (const WeightView *v : {&L.hc_attn_fn, &L.hc_ffn_fn}) {
            EXPECT_EQ(v->type, t.at(Role::HcFn));
        }
        for (const WeightView *v : {&L.q_a, &L.q_b, &L.kv, &L.o_a, &L.o_b}) {
            EXPECT_EQ(v->type, t.at(Role::AttnProj));
        }
        for (const WeightView *v : {&L.gate_sh, &L.up_sh, &L.down_sh}) {
            EXPECT_EQ(v->type, t.at(Role::SharedExpert));
        }
        EXPECT_EQ(L.gate_inp.type, t.at(Role::Router));
        EXPECT_EQ(L.gate_exps.first.type, t.at(Role::ExpertGate));
        EXPECT_EQ(L.up_exps.first.type, t.at(Role::ExpertUp));
        EXPECT_EQ(L.down_exps.first.type, t.at(Role::ExpertDown));
        if (!L.comp.kv.empty()) {
            EXPECT_EQ(L.comp.kv.type, t.at(Role::CompressorProj));
            EXPECT_EQ(L.comp.gate.type, t.at(Role::CompressorProj));
        }
        if (!L.i_q_b.empty()) {
            EXPECT_EQ(L.icomp.kv.type, t.at(Role::CompressorProj));
            EXPECT_EQ(L.i_q_b.type, t.at(Role::IndexerProj));
            EXPECT_EQ(L.i_proj.type, t.at(Role::IndexerProj));
        }
    }
}

// ---------------------------------------------------------------------------------------
// embed: H <- token embedding in every stream.

TEST_P(BackendOps, Embed) {
    const int D = cfg().n_embd, hc = cfg().hc_mult;
    std::mt19937 rng(11);
    for (const auto &segs : kLayouts) {
        Step st(*backend_, cfg(), segs, rng);
        Executor *ex = ex_.get();
        ex->begin(st.lay);
        ex->embed(w().token_embd);
        std::vector<float> H((size_t)st.R * hc * D);
        ex->download(Act::H, H.data(), H.size());
        verify("embed", {"H"}, {H}, [&](bool) {
            Vec out;
            std::vector<float> row(D);
            for (int t = 0; t < st.R; ++t) {
                quant::dequantize_row(w().token_embd.type, w().token_embd.row(st.tokens[t]), row.data(), D);
                for (int k = 0; k < hc; ++k) out.insert(out.end(), row.begin(), row.end());
            }
            return Outs{out};
        });
    }
}

// ---------------------------------------------------------------------------------------
// hc_pre: H -> X, Post, Comb (attention and FFN sides of two layers).

TEST_P(BackendOps, HcPre) {
    const int D = cfg().n_embd, hc = cfg().hc_mult;
    std::mt19937 rng(12);
    for (const auto &segs : kLayouts)
        for (int l : {0, 2})
            for (int side = 0; side < 2; ++side) {
                const LayerWeights &L = w().layers[l];
                const WeightView &fn = side ? L.hc_ffn_fn : L.hc_attn_fn;
                const float *base = side ? L.hc_ffn_base.data() : L.hc_attn_base.data();
                const float *scale = side ? L.hc_ffn_scale.data() : L.hc_attn_scale.data();
                Step st(*backend_, cfg(), segs, rng);
                const std::vector<float> H = randn(rng, (size_t)st.R * hc * D);
                Executor *ex = ex_.get();
                ex->begin(st.lay);
                ex->upload(Act::H, H.data(), H.size());
                ex->hc_pre(fn, base, scale);
                std::vector<float> X((size_t)st.R * D), P((size_t)st.R * hc), C((size_t)st.R * hc * hc);
                ex->download(Act::X, X.data(), X.size());
                ex->download(Act::Post, P.data(), P.size());
                ex->download(Act::Comb, C.data(), C.size());
                verify("hc_pre l" + std::to_string(l) + (side ? " ffn" : " attn"), {"X", "Post", "Comb"}, {X, P, C},
                       [&](bool emu) {
                           Ref r{cfg(), emu};
                           Outs o(3);
                           for (int t = 0; t < st.R; ++t) {
                               Vec x, post, comb;
                               r.hc_pre(fn, base, scale, row_of(H, t, (size_t)hc * D), x, post, comb);
                               append(o[0], x);
                               append(o[1], post);
                               append(o[2], comb);
                           }
                           return o;
                       });
            }
}

// ---------------------------------------------------------------------------------------
// norm: XN <- RMSNorm(X) * w.

TEST_P(BackendOps, Norm) {
    const int D = cfg().n_embd;
    std::mt19937 rng(13);
    for (const auto &segs : kLayouts) {
        Step st(*backend_, cfg(), segs, rng);
        const std::vector<float> X = randn(rng, (size_t)st.R * D, 0.3f, 0.1f);
        const float *nw = w().layers[1].ffn_norm.data();
        Executor *ex = ex_.get();
        ex->begin(st.lay);
        ex->upload(Act::X, X.data(), X.size());
        ex->norm(nw);
        std::vector<float> XN((size_t)st.R * D);
        ex->download(Act::XN, XN.data(), XN.size());
        verify("norm", {"XN"}, {XN}, [&](bool emu) {
            Ref r{cfg(), emu};
            Vec o;
            for (int t = 0; t < st.R; ++t) append(o, r.rmsnorm(row_of(X, t, D), nw));
            return Outs{o};
        });
    }
}

// ---------------------------------------------------------------------------------------
// hc_post: H <- Post * A + Comb^T H.

TEST_P(BackendOps, HcPost) {
    const int D = cfg().n_embd, hc = cfg().hc_mult;
    std::mt19937 rng(14);
    for (const auto &segs : kLayouts) {
        Step st(*backend_, cfg(), segs, rng);
        const std::vector<float> H = randn(rng, (size_t)st.R * hc * D), A = randn(rng, (size_t)st.R * D),
                                 P = randu(rng, (size_t)st.R * hc, 0.f, 2.f), C = randu(rng, (size_t)st.R * hc * hc, 0.f, 1.f);
        Executor *ex = ex_.get();
        ex->begin(st.lay);
        ex->upload(Act::H, H.data(), H.size());
        ex->upload(Act::A, A.data(), A.size());
        ex->upload(Act::Post, P.data(), P.size());
        ex->upload(Act::Comb, C.data(), C.size());
        ex->hc_post();
        std::vector<float> Hn(H.size());
        ex->download(Act::H, Hn.data(), Hn.size());
        verify("hc_post", {"H"}, {Hn}, [&](bool) {
            Vec o((size_t)st.R * hc * D, 0.0);
            for (int t = 0; t < st.R; ++t)
                for (int k = 0; k < hc; ++k)
                    for (int d = 0; d < D; ++d) {
                        double s = (double)P[t * hc + k] * A[(size_t)t * D + d];
                        for (int j = 0; j < hc; ++j)
                            s += (double)C[((size_t)t * hc + j) * hc + k] * H[((size_t)t * hc + j) * D + d];
                        o[((size_t)t * hc + k) * D + d] = s;
                    }
            return Outs{o};
        });
    }
}

// ---------------------------------------------------------------------------------------
// q_kv: XN -> QR, Q and the K=V row of each row into its session's window ring.

TEST_P(BackendOps, QKv) {
    const ModelConfig &c = cfg();
    const int D = c.n_embd, H = c.n_head, hd = c.head_dim;
    std::mt19937 rng(15);
    for (const auto &segs : kLayouts)
        for (int l : {0, 1}) {   // plain rope (sliding layer) and the compressed layers' YaRN rope
            const LayerWeights &L = w().layers[l];
            const Rope &rope = m().rope(c.compress_ratio[l] != 0);
            Step st(*backend_, c, segs, rng);
            const std::vector<float> XN = randn(rng, (size_t)st.R * D);
            Executor *ex = ex_.get();
            ex->begin(st.lay);
            ex->upload(Act::XN, XN.data(), XN.size());
            ex->q_kv(l, L, rope);
            std::vector<float> QR((size_t)st.R * c.q_lora), Q((size_t)st.R * H * hd), KV((size_t)st.R * hd);
            ex->download(Act::QR, QR.data(), QR.size());
            ex->download(Act::Q, Q.data(), Q.size());
            for (int t = 0; t < st.R; ++t) st.state_of_row(t).read(l, Cache::Kv, st.pos[t], 1, KV.data() + (size_t)t * hd);
            verify("q_kv l" + std::to_string(l), {"QR", "Q", "kv ring"}, {QR, Q, KV}, [&](bool emu) {
                Ref r{c, emu};
                Outs o(3);
                for (int t = 0; t < st.R; ++t) {
                    const Vec xn = row_of(XN, t, D);
                    const Vec qr = r.rmsnorm(r.mv(L.q_a, xn), L.q_a_norm.data());
                    append(o[0], qr);
                    const Vec q = r.mv(L.q_b, qr);
                    for (int h = 0; h < H; ++h) {
                        Vec qh = r.rmsnorm(Vec(q.begin() + h * hd, q.begin() + (h + 1) * hd), nullptr);
                        Ref::rope(qh.data(), hd, rope, st.pos[t], 1);
                        append(o[1], qh);
                    }
                    Vec kv = r.rmsnorm(r.mv(L.kv, xn), L.kv_norm.data());
                    Ref::rope(kv.data(), hd, rope, st.pos[t], 1);
                    append(o[2], kv);
                }
                return o;
            });
        }
}

// ---------------------------------------------------------------------------------------
// compress: XN -> the compressor's kv/gate rings; entries closing in the step, softmax over
// each window's slots per channel (CSA: plus the previous window's first-half channels),
// normed, rotated at the window's first position.

struct CompCase {
    int layer, which;
};

TEST_P(BackendOps, Compress) {
    const ModelConfig &c = cfg();
    const int D = c.n_embd;
    std::mt19937 rng(16);
    for (const auto &segs : kLayouts)
        for (CompCase cc : {CompCase{1, 0}, CompCase{1, 1}, CompCase{2, 0}}) {
            const LayerWeights &L = w().layers[cc.layer];
            const CompressorWeights &cw = cc.which ? L.icomp : L.comp;
            const Cache ckv = cc.which ? Cache::IcompKv : Cache::CompKv, cgate = cc.which ? Cache::IcompGate : Cache::CompGate,
                        cent = cc.which ? Cache::IcompEntries : Cache::CompEntries;
            const Rope &rope = m().rope(true);
            Step st(*backend_, c, segs, rng);
            const CompGeometry &g = cc.which ? st.states[0]->geometry().layers[cc.layer].icomp
                                             : st.states[0]->geometry().layers[cc.layer].comp;
            const int r = g.ratio, wd = g.width, dim = g.dim;
            ASSERT_EQ(wd, cw.width);
            // Per session: the ring rows the step's windows still need, and earlier entries.
            std::vector<std::map<int64_t, std::vector<float>>> kv_at(segs.size()), gate_at(segs.size());
            std::vector<std::vector<float>> old_entries(segs.size());
            for (size_t s = 0; s < segs.size(); ++s) {
                SessionState &ss = *st.states[s];
                const int64_t n0 = segs[s].n0;
                for (int64_t p = g.needed_from(n0); p < n0; ++p) {
                    kv_at[s][p] = randn(rng, wd);
                    gate_at[s][p] = randn(rng, wd);
                    ss.write(cc.layer, ckv, p, 1, kv_at[s][p].data());
                    ss.write(cc.layer, cgate, p, 1, gate_at[s][p].data());
                }
                const int have = (int)(n0 / r);
                old_entries[s] = randn(rng, (size_t)have * dim);
                if (have) ss.write(cc.layer, cent, 0, have, old_entries[s].data());
                ss.set_n_entries(cc.layer, cc.which, have);
            }
            const std::vector<float> XN = randn(rng, (size_t)st.R * D);
            Executor *ex = ex_.get();
            ex->begin(st.lay);
            ex->upload(Act::XN, XN.data(), XN.size());
            ex->compress(cc.layer, cc.which, cw, rope);
            // Read back: the step's ring rows and the entries that closed.
            std::vector<float> gkv, ggate, gent;
            int closed = 0;
            for (size_t s = 0; s < segs.size(); ++s) {
                SessionState &ss = *st.states[s];
                const int first = (int)(segs[s].n0 / r), last = (int)((segs[s].n0 + segs[s].n) / r);
                EXPECT_EQ(ss.n_entries(cc.layer, cc.which), last);
                if (first) {   // entries closed before the step are left alone
                    std::vector<float> e((size_t)first * dim);
                    ss.read(cc.layer, cent, 0, first, e.data());
                    EXPECT_EQ(e, old_entries[s]) << "compress rewrote entries closed before the step";
                }
                std::vector<float> buf((size_t)segs[s].n * wd);
                ss.read(cc.layer, ckv, segs[s].n0, segs[s].n, buf.data());
                gkv.insert(gkv.end(), buf.begin(), buf.end());
                ss.read(cc.layer, cgate, segs[s].n0, segs[s].n, buf.data());
                ggate.insert(ggate.end(), buf.begin(), buf.end());
                if (last > first) {
                    std::vector<float> e((size_t)(last - first) * dim);
                    ss.read(cc.layer, cent, first, last - first, e.data());
                    gent.insert(gent.end(), e.begin(), e.end());
                    closed += last - first;
                }
            }
            std::vector<std::string> names = {"kv ring", "gate ring"};
            std::vector<std::vector<float>> got = {gkv, ggate};
            if (closed) {
                names.push_back("entries");
                got.push_back(gent);
            }
            const std::string what = "compress l" + std::to_string(cc.layer) + (cc.which ? " idx" : " main");
            verify(what, names, got, [&](bool emu) {
                Ref rf{c, emu};
                Outs o(closed ? 3 : 2);
                for (size_t s = 0; s < segs.size(); ++s) {
                    std::map<int64_t, Vec> kvp, gp;
                    for (auto &[p, v] : kv_at[s]) kvp[p] = Vec(v.begin(), v.end());
                    for (auto &[p, v] : gate_at[s]) gp[p] = Vec(v.begin(), v.end());
                    for (int i = 0; i < segs[s].n; ++i) {
                        const int t = st.segs[s].row0 + i;
                        const int64_t p = segs[s].n0 + i;
                        const Vec xn = row_of(XN, t, D);
                        kvp[p] = rf.mv(cw.kv, xn);
                        Vec gt = rf.mv(cw.gate, xn);
                        for (int k = 0; k < wd; ++k) gt[k] += cw.ape[(size_t)(p % r) * wd + k];
                        gp[p] = gt;
                        append(o[0], kvp[p]);
                        append(o[1], gp[p]);
                    }
                    const int first = (int)(segs[s].n0 / r), last = (int)((segs[s].n0 + segs[s].n) / r);
                    for (int e = first; e < last; ++e) {
                        const int64_t start = (int64_t)e * r;
                        Vec out(dim);
                        for (int ch = 0; ch < dim; ++ch) {
                            std::vector<double> lg, val;
                            if (g.overlap && e > 0)
                                for (int j = 0; j < r; ++j) {
                                    lg.push_back(gp.at(start - r + j)[ch]);
                                    val.push_back(kvp.at(start - r + j)[ch]);
                                }
                            const int off = g.overlap ? dim : 0;
                            for (int j = 0; j < r; ++j) {
                                lg.push_back(gp.at(start + j)[off + ch]);
                                val.push_back(kvp.at(start + j)[off + ch]);
                            }
                            const double mx = *std::max_element(lg.begin(), lg.end());
                            double den = 0, acc = 0;
                            for (size_t k = 0; k < lg.size(); ++k) {
                                const double pk = std::exp(lg[k] - mx);
                                den += pk;
                                acc += pk * val[k];
                            }
                            out[ch] = acc / den;
                        }
                        out = rf.rmsnorm(out, cw.norm.data());
                        Ref::rope(out.data(), dim, rope, start, 1);
                        append(o[2], out);
                    }
                }
                return o;
            });
        }
}

// ---------------------------------------------------------------------------------------
// Attention inputs shared by the attend and indexer tests: every session's window ring
// rows up to the step's last position and its closed compressed entries, random.

struct AttnCaches {
    std::vector<std::map<int64_t, std::vector<float>>> kv;   // [session][pos]
    std::vector<std::vector<float>> ent, ient;               // [session][entry * dim]
    std::vector<int> n_ent, n_ient;
};

// ties: every indexer entry of a session equal, so every score ties and the indexer must
// keep the lowest indices.
AttnCaches fill_attn_caches(Step &st, const ModelConfig &c, int layer, std::mt19937 &rng, bool ties = false) {
    AttnCaches a;
    const int hd = c.head_dim, W = c.sliding_window, r = c.compress_ratio[layer];
    for (size_t s = 0; s < st.segv.size(); ++s) {
        SessionState &ss = *st.states[s];
        const Seg sg = st.segv[s];
        a.kv.emplace_back();
        for (int64_t p = std::max<int64_t>(0, sg.n0 - W + 1); p < sg.n0 + sg.n; ++p) {
            a.kv[s][p] = randn(rng, hd);
            ss.write(layer, Cache::Kv, p, 1, a.kv[s][p].data());
        }
        const int ne = r ? (int)((sg.n0 + sg.n) / r) : 0;
        a.n_ent.push_back(ne);
        a.ent.push_back(randn(rng, (size_t)ne * hd));
        if (ne) ss.write(layer, Cache::CompEntries, 0, ne, a.ent[s].data());
        if (r) ss.set_n_entries(layer, 0, ne);
        const int ni = c.is_csa(layer) ? ne : 0;
        a.n_ient.push_back(ni);
        a.ient.push_back(randn(rng, (size_t)ni * c.indexer_dim));
        if (ties)
            for (int e = 1; e < ni; ++e)
                std::copy(a.ient[s].begin(), a.ient[s].begin() + c.indexer_dim, a.ient[s].begin() + (size_t)e * c.indexer_dim);
        if (ni) ss.write(layer, Cache::IcompEntries, 0, ni, a.ient[s].data());
        if (c.is_csa(layer)) ss.set_n_entries(layer, 1, ni);
    }
    return a;
}

// One row's attention over the given keys (= values) with the head's sink, rotated back.
Vec ref_attend_row(const ModelConfig &c, const std::vector<float> &Q, int t, int64_t pos, const std::vector<const float *> &keys,
                   const float *sinks, const Rope &rope) {
    const int H = c.n_head, hd = c.head_dim;
    Vec out;
    for (int h = 0; h < H; ++h) {
        const float *q = Q.data() + ((size_t)t * H + h) * hd;
        std::vector<double> lg(keys.size());
        double mx = sinks[h];
        for (size_t k = 0; k < keys.size(); ++k) {
            double d = 0;
            for (int i = 0; i < hd; ++i) d += (double)q[i] * keys[k][i];
            lg[k] = d / std::sqrt((double)hd);
            mx = std::max(mx, lg[k]);
        }
        double den = std::exp((double)sinks[h] - mx);
        for (double &v : lg) den += v = std::exp(v - mx);
        Vec o(hd, 0.0);
        for (size_t k = 0; k < keys.size(); ++k)
            for (int i = 0; i < hd; ++i) o[i] += lg[k] / den * keys[k][i];
        Ref::rope(o.data(), hd, rope, pos, -1);
        append(out, o);
    }
    return out;
}

std::vector<const float *> window_keys(const AttnCaches &a, int s, int64_t pos, int W) {
    std::vector<const float *> keys;
    for (int64_t j = std::max<int64_t>(0, pos - W + 1); j <= pos; ++j) keys.push_back(a.kv[s].at(j).data());
    return keys;
}

// attend on the sliding-only layer (window only) and the HCA layer (window + every closed
// entry the row can see).
TEST_P(BackendOps, Attend) {
    const ModelConfig &c = cfg();
    const int H = c.n_head, hd = c.head_dim, W = c.sliding_window;
    std::mt19937 rng(17);
    for (const auto &segs : kLayouts)
        for (int l : {0, 2}) {
            const int r = c.compress_ratio[l];
            const Rope &rope = m().rope(r != 0);
            const float *sinks = w().layers[l].sinks.data();
            Step st(*backend_, c, segs, rng);
            const AttnCaches a = fill_attn_caches(st, c, l, rng);
            const std::vector<float> Q = randn(rng, (size_t)st.R * H * hd);
            Executor *ex = ex_.get();
            ex->begin(st.lay);
            ex->upload(Act::Q, Q.data(), Q.size());
            ex->attend(l, AttnSpec{W, r, false}, sinks, rope);
            std::vector<float> O(Q.size());
            ex->download(Act::O, O.data(), O.size());
            verify("attend l" + std::to_string(l), {"O"}, {O}, [&](bool) {
                Vec o;
                for (int t = 0; t < st.R; ++t) {
                    const int s = st.seg[t];
                    const int64_t pos = st.pos[t];
                    std::vector<const float *> keys = window_keys(a, s, pos, W);
                    if (r)
                        for (int e = 0; e < std::min<int>(a.n_ent[s], (int)((pos + 1) / r)); ++e)
                            keys.push_back(a.ent[s].data() + (size_t)e * hd);
                    append(o, ref_attend_row(c, Q, t, pos, keys, sinks, rope));
                }
                return Outs{o};
            });
        }
}

// indexer_topk + attend on the CSA layer: the lightning indexer scores every visible
// indexer entry by sum_h w_h ReLU(q_h . k) (queries rotated at the row's position), keeps
// the top-k (ties to the lower index), and attention sees the window plus the main
// compressor's entries at those indices. The selection is only observable through O. Run
// twice: random indexer entries, and all entries of a session equal (every score ties).
TEST_P(BackendOps, IndexerTopkAttend) {
    const ModelConfig &c = cfg();
    const int l = 1, D = c.n_embd, H = c.n_head, hd = c.head_dim, W = c.sliding_window, r = c.compress_ratio[l];
    const int IH = c.indexer_heads, Id = c.indexer_dim, K = c.indexer_topk;
    ASSERT_TRUE(c.is_csa(l));
    const LayerWeights &L = w().layers[l];
    const Rope &rope = m().rope(true);
    std::mt19937 rng(18);
    int selective_rows = 0;   // rows where the indexer had more candidates than top-k
    for (bool ties : {false, true}) {
        for (const auto &segs : kLayouts) {
            Step st(*backend_, c, segs, rng);
            const AttnCaches a = fill_attn_caches(st, c, l, rng, ties);
            const std::vector<float> QR = randn(rng, (size_t)st.R * c.q_lora), XN = randn(rng, (size_t)st.R * D),
                                     Q = randn(rng, (size_t)st.R * H * hd);
            Executor *ex = ex_.get();
            ex->begin(st.lay);
            ex->upload(Act::QR, QR.data(), QR.size());
            ex->upload(Act::XN, XN.data(), XN.size());
            ex->upload(Act::Q, Q.data(), Q.size());
            ex->indexer_topk(l, L, rope, K);
            ex->attend(l, AttnSpec{W, r, true}, L.sinks.data(), rope);
            std::vector<float> O(Q.size());
            ex->download(Act::O, O.data(), O.size());
            for (int t = 0; t < st.R; ++t) selective_rows += std::min<int>(a.n_ient[st.seg[t]], (int)((st.pos[t] + 1) / r)) > K;
            verify(ties ? "indexer_topk+attend l1 ties" : "indexer_topk+attend l1", {"O"}, {O},
                   [&](bool emu) {
                       Ref rf{c, emu};
                       Vec o;
                       for (int t = 0; t < st.R; ++t) {
                           const int s = st.seg[t];
                           const int64_t pos = st.pos[t];
                           const Vec iq = rf.mv(L.i_q_b, row_of(QR, t, c.q_lora));
                           const Vec iw = rf.mv(L.i_proj, row_of(XN, t, D));
                           std::vector<std::pair<double, int>> sc;
                           const int n_vis = std::min<int>(a.n_ient[s], (int)((pos + 1) / r));
                           for (int e = 0; e < n_vis; ++e) {
                               const float *k = a.ient[s].data() + (size_t)e * Id;
                               double score = 0;
                               for (int h = 0; h < IH; ++h) {
                                   Vec qh(iq.begin() + h * Id, iq.begin() + (h + 1) * Id);
                                   Ref::rope(qh.data(), Id, rope, pos, 1);
                                   double d = 0;
                                   for (int i = 0; i < Id; ++i) d += qh[i] * k[i];
                                   score += std::max(d, 0.0) / std::sqrt((double)Id) * iw[h] / std::sqrt((double)IH);
                               }
                               sc.push_back({score, e});
                           }
                           std::stable_sort(sc.begin(), sc.end(), [](auto &x, auto &y) { return x.first > y.first; });
                           std::vector<const float *> keys = window_keys(a, s, pos, W);
                           for (int i = 0; i < std::min<int>(K, (int)sc.size()); ++i)
                               keys.push_back(a.ent[s].data() + (size_t)sc[i].second * hd);
                           append(o, ref_attend_row(c, Q, t, pos, keys, L.sinks.data(), rope));
                       }
                       return Outs{o};
                   },
                   /*discrete=*/true);
        }
    }
    EXPECT_GE(selective_rows, 4) << "the layouts must make the indexer choose";
}

// ---------------------------------------------------------------------------------------
// out_proj: O -> A through the grouped low-rank projection.

TEST_P(BackendOps, OutProj) {
    const ModelConfig &c = cfg();
    const int H = c.n_head, hd = c.head_dim, G = c.o_groups, gin = H * hd / G, gl = c.o_lora;
    std::mt19937 rng(19);
    for (const auto &segs : kLayouts)
        for (int l : {0, 1}) {
            const LayerWeights &L = w().layers[l];
            Step st(*backend_, c, segs, rng);
            const std::vector<float> O = randn(rng, (size_t)st.R * H * hd);
            Executor *ex = ex_.get();
            ex->begin(st.lay);
            ex->upload(Act::O, O.data(), O.size());
            ex->out_proj(L);
            std::vector<float> A((size_t)st.R * c.n_embd);
            ex->download(Act::A, A.data(), A.size());
            verify("out_proj l" + std::to_string(l), {"A"}, {A}, [&](bool emu) {
                Ref rf{c, emu};
                Vec o;
                for (int t = 0; t < st.R; ++t) {
                    Vec oa;
                    for (int g = 0; g < G; ++g) {
                        const Vec in(O.begin() + (size_t)t * H * hd + (size_t)g * gin,
                                     O.begin() + (size_t)t * H * hd + (size_t)(g + 1) * gin);
                        append(oa, rf.mv(L.o_a.rows((int64_t)g * gl, gl), in));
                    }
                    append(o, rf.mv(L.o_b, oa));
                }
                return Outs{o};
            });
        }
}

// ---------------------------------------------------------------------------------------
// route + routed_experts: sqrt-softplus scores; hash-table experts (layer 0) or top-k of
// score + bias (ties to the lower index); weights renormalised and scaled; A <- the
// weighted clamped-SwiGLU experts (A's old contents are overwritten). route's choice is
// only observable through routed_experts.

TEST_P(BackendOps, RouteExperts) {
    const ModelConfig &c = cfg();
    const int D = c.n_embd, E = c.n_expert, K = c.n_expert_used;
    std::mt19937 rng(20);
    for (const auto &segs : kLayouts)
        for (int l : {0, 1, 2}) {
            const LayerWeights &L = w().layers[l];
            const bool hash = c.is_hash(l);
            Step st(*backend_, c, segs, rng);
            const std::vector<float> XN = randn(rng, (size_t)st.R * D), A0 = randn(rng, (size_t)st.R * D);
            Executor *ex = ex_.get();
            ex->begin(st.lay);
            ex->upload(Act::XN, XN.data(), XN.size());
            ex->upload(Act::A, A0.data(), A0.size());
            ex->route(l, L, hash);
            ex->routed_experts(l, L, m().experts());
            std::vector<float> A(A0.size());
            ex->download(Act::A, A.data(), A.size());
            verify("route+experts l" + std::to_string(l) + (hash ? " hash" : ""), {"A"}, {A},
                   [&](bool emu) {
                       Ref rf{c, emu};
                       Vec o;
                       for (int t = 0; t < st.R; ++t) {
                           const Vec xn = row_of(XN, t, D);
                           Vec sc = rf.mv(L.gate_inp, xn);
                           for (double &v : sc) v = std::sqrt(softplus(v));
                           std::vector<int> ids;
                           if (hash) {
                               for (int k = 0; k < K; ++k) ids.push_back(L.tid2eid[(size_t)st.tokens[t] * K + k]);
                           } else {
                               std::vector<int> order(E);
                               for (int e = 0; e < E; ++e) order[e] = e;
                               std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
                                   return sc[a] + L.probs_b[a] > sc[b] + L.probs_b[b];
                               });
                               ids.assign(order.begin(), order.begin() + K);
                           }
                           double sum = 0;
                           for (int id : ids) sum += sc[id];
                           Vec y(D, 0.0);
                           for (int id : ids) {
                               const double wt = sc[id] / sum * c.expert_scale;
                               const Vec ey = rf.expert(L.gate_exps.expert(id), L.up_exps.expert(id), L.down_exps.expert(id),
                                                        xn, c.swiglu_limit[l]);
                               for (int d = 0; d < D; ++d) y[d] += wt * ey[d];
                           }
                           append(o, y);
                       }
                       return Outs{o};
                   },
                   /*discrete=*/!hash);
        }
}

// ---------------------------------------------------------------------------------------
// The streaming source's guess of a layer's experts (routed_experts asks the source for a
// router and prefetches that router's top-k of the MoE input). A source that hands out the
// routed layer's own router must be told exactly the experts route picked and the layer then
// acquires: the guess ranks as route ranks (score + bias, ties to the lower index).

// The model's resident experts, recording what each layer acquired and what was prefetched;
// predictor(l) is layer l's own router.
class RecordingExperts final : public ExpertSource {
public:
    RecordingExperts(ExpertSource &inner, const ModelWeights &w) : inner_(inner), w_(w) {}
    void acquire(int layer, std::span<const int> ids, ExpertView *out) override {
        acquired[layer].insert(acquired[layer].end(), ids.begin(), ids.end());
        inner_.acquire(layer, ids, out);
    }
    void release() override { inner_.release(); }
    void prefetch(int layer, std::span<const int> ids) override { predicted[layer].assign(ids.begin(), ids.end()); }
    const LayerWeights *predictor(int layer) const override { return &w_.layers[layer]; }
    ExpertSourceStats stats() const override { return inner_.stats(); }
    std::map<int, std::vector<int>> acquired, predicted;

private:
    ExpertSource &inner_;
    const ModelWeights &w_;
};

TEST_P(BackendOps, PredictedExpertsRankAsTheRouter) {
    if (GetParam().backend != "cpu") GTEST_SKIP() << "the CUDA executor predicts only for its VRAM expert cache";
    const ModelConfig &c = cfg();
    const int D = c.n_embd;
    const int l = 1;   // routed by score, and so is the layer after it
    ASSERT_TRUE(!c.is_hash(l) && !c.is_hash(l + 1) && l + 1 < c.n_layer) << "the test model's layer kinds changed";
    std::mt19937 rng(23);
    for (const auto &segs : kLayouts) {
        const LayerWeights &L = w().layers[l];
        Step st(*backend_, c, segs, rng);
        const std::vector<float> XN = randn(rng, (size_t)st.R * D);
        RecordingExperts rec(m().experts(), w());
        Executor *ex = ex_.get();
        ex->begin(st.lay);
        ex->upload(Act::XN, XN.data(), XN.size());
        ex->route(l, L, false);
        ex->routed_experts(l, L, rec);
        std::vector<int> used = rec.acquired[l];
        std::sort(used.begin(), used.end());
        used.erase(std::unique(used.begin(), used.end()), used.end());
        ASSERT_FALSE(used.empty());
        ASSERT_EQ(rec.predicted.count(l + 1), 1u) << "no prediction for layer " << l + 1;
        EXPECT_EQ(rec.predicted[l + 1], used) << st.R << " rows";
    }
}

// ---------------------------------------------------------------------------------------
// shared_expert: A += shared expert(XN).

TEST_P(BackendOps, SharedExpert) {
    const ModelConfig &c = cfg();
    const int D = c.n_embd;
    std::mt19937 rng(21);
    for (const auto &segs : kLayouts)
        for (int l : {0, 2}) {
            const LayerWeights &L = w().layers[l];
            Step st(*backend_, c, segs, rng);
            const std::vector<float> XN = randn(rng, (size_t)st.R * D), A0 = randn(rng, (size_t)st.R * D, 0.5f);
            Executor *ex = ex_.get();
            ex->begin(st.lay);
            ex->upload(Act::XN, XN.data(), XN.size());
            ex->upload(Act::A, A0.data(), A0.size());
            ex->shared_expert(l, L);
            std::vector<float> A(A0.size());
            ex->download(Act::A, A.data(), A.size());
            verify("shared_expert l" + std::to_string(l), {"A"}, {A}, [&](bool emu) {
                Ref rf{c, emu};
                Vec o;
                for (int t = 0; t < st.R; ++t) {
                    const Vec y = rf.expert(L.gate_sh, L.up_sh, L.down_sh, row_of(XN, t, D), c.swiglu_limit[l]);
                    for (int d = 0; d < D; ++d) o.push_back(A0[(size_t)t * D + d] + y[d]);
                }
                return Outs{o};
            });
        }
}

// ---------------------------------------------------------------------------------------
// head: hyper-head (sigmoid collapse of the streams), output norm, output projection, for
// a subset of the rows in any order.

TEST_P(BackendOps, Head) {
    const ModelConfig &c = cfg();
    const int D = c.n_embd, hc = c.hc_mult, V = c.n_vocab;
    std::mt19937 rng(22);
    for (const auto &segs : kLayouts) {
        Step st(*backend_, c, segs, rng);
        const std::vector<float> H = randn(rng, (size_t)st.R * hc * D);
        std::vector<int> rows = {st.R - 1};
        if (st.R > 2) rows = {st.R - 1, 0, 2};
        Executor *ex = ex_.get();
        ex->begin(st.lay);
        ex->upload(Act::H, H.data(), H.size());
        std::vector<float> logits(rows.size() * V);
        ex->head(w(), rows, logits.data());
        verify("head", {"logits"}, {logits}, [&](bool emu) {
            Ref rf{c, emu};
            Vec o;
            for (int row : rows) {
                const Vec h = row_of(H, row, (size_t)hc * D);
                const Vec mix = rf.mv(w().output_hc_fn, rf.rmsnorm(h, nullptr));
                Vec y(D, 0.0);
                for (int k = 0; k < hc; ++k) {
                    const double p = sigmoid(mix[k] * w().output_hc_scale[0] + w().output_hc_base[k]) + c.hc_eps;
                    for (int d = 0; d < D; ++d) y[d] += p * h[(size_t)k * D + d];
                }
                append(o, rf.mv(w().output, rf.rmsnorm(y, w().output_norm.data())));
            }
            return Outs{o};
        });
    }
}

INSTANTIATE_TEST_SUITE_P(Ops, BackendOps, testing::ValuesIn(all_params()), param_name);

}  // namespace
}  // namespace ds4
