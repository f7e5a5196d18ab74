#include "tools/make_model/make_model.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "engine/common/error.h"
#include "engine/gguf/gguf.h"
#include "engine/quant/quants.h"
#include "tools/convert/layout.h"
#include "tools/convert/row_fill.h"
#include "tools/convert/type_policy.h"
#include "tools/convert/vocab.h"
#include "tools/make_model/random_fill.h"
#include "tools/make_model/scripted.h"

namespace ds4::make_model {

using convert::Role;
using convert::TensorSpec;
using gguf::Type;

const char *const kPresetNames = "tiny, small, flash-shape, scripted";

void apply_layer_pattern(const std::string &preset, ModelConfig &c) {
    const int n = c.n_layer;
    if (n <= 0) fail("--layers must be positive");
    const int csa = c.csa_ratio, hca = 128;
    c.compress_ratio.assign(static_cast<size_t>(n), 0);
    if (preset == "flash-shape") {
        // V4-Flash: two sliding layers, then CSA/HCA alternating; 3 hash layers. Fewer
        // layers keep the compressed kinds first, since they are what a benchmark needs.
        const int lead = n >= 4 ? 2 : (n == 3 ? 1 : 0);
        for (int l = lead; l < n; l++) c.compress_ratio[static_cast<size_t>(l)] = ((l - lead) % 2 == 0) ? csa : hca;
        c.n_hash_layer = std::min(3, n - 1);
    } else {
        for (int l = 1; l < n; l++) c.compress_ratio[static_cast<size_t>(l)] = (l % 2 == 1) ? csa : hca;
        c.n_hash_layer = n > 1 ? 1 : 0;
    }
    c.swiglu_limit.assign(static_cast<size_t>(n), 10.f);
}

ModelConfig preset_config(const std::string &preset, int n_layer) {
    ModelConfig c;
    c.hc_mult = 4;
    c.hc_iters = 20;
    c.hc_eps = 1e-6f;
    c.rms_eps = 1e-6f;
    c.expert_scale = 1.5f;
    c.n_expert_shared = 1;
    c.csa_ratio = 4;
    c.rope_base = 10000.f;
    c.compress_rope_base = 160000.f;
    c.yarn = true;
    c.yarn_beta_fast = 32.f;
    c.yarn_beta_slow = 1.f;
    if (preset == "tiny") {
        c.n_layer = 4;
        c.n_vocab = 512;
        c.n_embd = 64;
        c.n_head = 4;
        c.head_dim = 32;
        c.n_rot = 8;
        c.q_lora = 32;
        c.o_groups = 2;
        c.o_lora = 16;
        c.n_expert = 8;
        c.n_expert_used = 2;
        c.n_ff_exp = 32;
        c.sliding_window = 16;
        c.indexer_heads = 16;
        c.indexer_dim = 16;
        c.indexer_topk = 4;
        c.n_ctx_train = 4096;
        c.yarn_factor = 4.f;
        c.yarn_orig_ctx = 1024;
    } else if (preset == "small") {
        c.n_layer = 6;
        c.n_vocab = 8192;
        c.n_embd = 256;
        c.n_head = 8;
        c.head_dim = 64;
        c.n_rot = 16;
        c.q_lora = 128;
        c.o_groups = 4;
        c.o_lora = 64;
        c.n_expert = 32;
        c.n_expert_used = 4;
        c.n_ff_exp = 64;
        c.sliding_window = 64;
        c.indexer_heads = 16;
        c.indexer_dim = 32;
        c.indexer_topk = 16;
        c.n_ctx_train = 16384;
        c.yarn_factor = 4.f;
        c.yarn_orig_ctx = 4096;
    } else if (preset == "flash-shape") {
        c.n_layer = 2;
        c.n_vocab = 129280;
        c.n_embd = 4096;
        c.n_head = 64;
        c.head_dim = 512;
        c.n_rot = 64;
        c.q_lora = 1024;
        c.o_groups = 8;
        c.o_lora = 1024;
        c.n_expert = 256;
        c.n_expert_used = 6;
        c.n_ff_exp = 2048;
        c.sliding_window = 128;
        c.indexer_heads = 64;
        c.indexer_dim = 128;
        c.indexer_topk = 512;
        c.n_ctx_train = 1048576;
        c.yarn_factor = 16.f;
        c.yarn_orig_ctx = 65536;
    } else if (preset == "scripted") {
        return scripted_config();
    } else {
        fail("unknown preset '" + preset + "' (presets: " + kPresetNames + ")");
    }
    if (n_layer > 0) c.n_layer = n_layer;
    apply_layer_pattern(preset, c);
    return c;
}

MakeModelResult make_model(const MakeModelOptions &opt, const std::string &out_path) {
    MakeModelResult res;
    const ModelConfig &cfg = opt.cfg;
    cfg.validate();
    // Sparse and fast files never run the block quantisers on the matrices.
    convert::TypePolicy policy = convert::make_type_policy(opt.type, opt.expert_type, !opt.sparse && !opt.fast);
    for (const auto &[role, t] : opt.role_types) policy.by_role[role] = t;
    const int threads = opt.threads > 0 ? opt.threads : convert::default_threads();
    const std::vector<TensorSpec> layout = convert::model_layout(cfg);

    gguf::Writer w;
    cfg.to_gguf(w);
    w.set("general.name", gguf::Value::str(opt.name));
    w.set("general.source.format", gguf::Value::str("ds4-make-model random"));
    w.set("ds4.make_model.seed", gguf::Value::u64(opt.seed));
    w.set("ds4.make_model.mode", gguf::Value::str(opt.scripted ? "scripted" : opt.sparse ? "sparse" : opt.fast ? "fast" : "exact"));
    if (opt.scripted) {
        // Fixed weights and vocabulary that make greedy decoding follow a script.
        tok::write_vocab(w, scripted_vocab(cfg.n_vocab));
        for (const TensorSpec &s : convert::model_layout(cfg)) {
            if (s.role == Role::HashTable) fail("scripted model: hash-routed layers are not part of the script");
            const std::vector<float> v = scripted_values(s, cfg);
            w.add_tensor(s.gguf, Type::F32, s.ne, v.data(), v.size() * sizeof(float));
            res.tensor_bytes += v.size() * sizeof(float);
        }
        w.write(out_path);
        res.n_tensors = w.tensor_count();
        res.written_bytes = res.tensor_bytes;
        return res;
    }
    convert::write_vocabulary(w, "", cfg.n_vocab, -1, -1, &res.warnings);

    struct Item {
        const TensorSpec *spec;
        Type type;
    };
    std::vector<Item> items;
    uint64_t generated = 0;
    for (const TensorSpec &s : layout) {
        std::string warn;
        Type t = policy.type_for(s, &warn);
        if (!warn.empty()) res.warnings.push_back(warn);
        items.push_back({&s, t});
        const uint64_t bytes = gguf::row_bytes(t, s.ne[0]) * static_cast<uint64_t>(s.rows());
        res.tensor_bytes += bytes;
        if (!(opt.sparse && convert::role_is_matrix(s.role)) && s.role != Role::HashTable) generated += bytes;
    }
    if (opt.progress)
        for (const auto &m : res.warnings) std::fprintf(stderr, "warning: %s\n", m.c_str());

    convert::Progress progress(generated, opt.progress, "generating");
    for (const Item &it : items) {
        const TensorSpec &s = *it.spec;
        const uint64_t key = tensor_key(opt.seed, s.gguf);
        if (s.role == Role::HashTable) {
            std::vector<int32_t> t = hash_table(key, cfg.n_expert_used, cfg.n_expert, cfg.n_vocab);
            w.add_tensor(s.gguf, Type::I32, s.ne, t.data(), t.size() * sizeof(int32_t));
            continue;
        }
        if (opt.sparse && convert::role_is_matrix(s.role)) {
            w.add_tensor_fill(s.gguf, it.type, s.ne, nullptr);   // a hole: reads as zeros
            continue;
        }
        const Dist d = role_dist(s);
        const int64_t ne0 = s.ne[0];
        const Type t = it.type;
        const uint64_t rb = gguf::row_bytes(t, ne0);
        // Fast mode applies to the big matrices; the small tensors are always exact.
        const bool fast = opt.fast && convert::role_is_matrix(s.role);
        auto rows = [key, d, ne0, t, rb, fast](int64_t first, int64_t n, uint8_t *dst) {
            thread_local std::vector<float> f;
            f.resize(static_cast<size_t>(ne0));
            for (int64_t r = first; r < first + n; r++, dst += rb) {
                if (fast && fast_block_supported(t)) {
                    fast_block_row(t, key, d, r, ne0, dst);
                    continue;
                }
                if (fast) fast_values(key, d, r * ne0, ne0, f.data());
                else exact_values(key, d, r * ne0, ne0, f.data());
                quant::quantize_row(t, f.data(), dst, ne0);
            }
        };
        w.add_tensor_fill(s.gguf, t, s.ne, convert::make_row_fill(s.gguf, rb, s.rows(), rows, threads, &progress));
    }
    w.write(out_path);
    progress.finish();
    res.n_tensors = w.tensor_count();
    res.written_bytes = generated;
    res.seconds = progress.seconds();
    return res;
}

namespace {

const char *kUsage =
    "usage: ds4-make-model [--preset P] [shape options] [--type T] [--seed S] [--fast|--exact]\n"
    "                      [--sparse] [--threads N] [--quiet] OUT.gguf\n"
    "\n"
    "Writes a deterministic random DeepSeek-V4 model (architecture deepseek4, the same layout\n"
    "ds4-convert produces) directly as GGUF. The same options and seed give the same bytes.\n"
    "Every parameter is random with sane scales: linear weights N(0, 1/fan_in), embedding\n"
    "N(0,1), norm weights U(0.7,1.3), attention sinks N(0,1), compressor position biases\n"
    "N(0,0.5), hyper-connection base N(0,0.5) and scale U(0.5,1.5), router bias N(0,0.5),\n"
    "hash routing table with distinct random experts per token. Vocabulary: the byte-level\n"
    "fallback of the model's vocab size.\n"
    "\n"
    "presets (--preset, default tiny):\n"
    "  tiny         vocab 512, 64 wide, 4 layers (sliding, CSA 4, HCA 128, CSA), 4x32 heads,\n"
    "               8 experts (2 used), 16 indexer heads, f32: ~2 MB. The embedded default.\n"
    "  small        vocab 8192, 256 wide, 6 layers, 8x64 heads, 32 experts (4 used), ~65 MB f32\n"
    "  scripted     one sliding layer whose fixed weights make greedy decoding follow a\n"
    "               script (a DSML tool call after a chat prompt, a plain answer once a\n"
    "               <tool_result> is in the window): the HTTP front's end-to-end fixture.\n"
    "  flash-shape  the real V4-Flash widths: 4096 wide, 64x512 heads (rope 64), q_lora 1024,\n"
    "               8 output groups x 1024, 256 experts (6 used + 1 shared, 2048 wide), vocab\n"
    "               129280, indexer 64x128 top-512, window 128, 2 layers by default (CSA +\n"
    "               HCA; 43 layers give Flash's own pattern). Defaults to --type q8_0 --fast:\n"
    "               ~7 GB per layer plus ~1.1 GB embedding/output.\n"
    "\n"
    "shape options (override the preset):\n"
    "  --layers N --vocab N --embd N --heads N --head-dim N --rope-dim N --q-lora N\n"
    "  --o-lora N --o-groups N --experts N --experts-used N --shared-experts 0|1\n"
    "  --expert-ff N --window N --indexer-heads N --indexer-dim N --indexer-topk N\n"
    "  --hash-layers N --ctx N --hc N --hc-iters N --swiglu X --expert-scale X\n"
    "  --ratios R0,R1,...   per-layer compress ratio (0 = sliding only, 4 = CSA, else HCA)\n"
    "  --no-yarn            plain RoPE on the compressed layers\n"
    "\n"
    "data options:\n";
const char *kUsageTail =
    "  --seed S           PRNG seed (default 1)\n"
    "  --fast             benchmark-grade data for the big matrices: counter-based hashing\n"
    "                     (splitmix64), block formats synthesised directly from hashed bytes\n"
    "                     with one scale per tensor giving the right std (q8_0: codes uniform\n"
    "                     in -127..127; q4_k/q2_k: codes uniform at maximal sub-block scales;\n"
    "                     iq2_xxs: random grid points and signs), f32/f16/bf16 an Irwin-Hall\n"
    "                     approximation of the normal. Several GB/s per core; the disk is the\n"
    "                     limit. Default for flash-shape.\n"
    "  --exact            true Gaussian values quantised with the engine's quantiser (default\n"
    "                     for tiny and small)\n"
    "  --sparse           leave every large matrix as a file hole: no disk used, reads as zeros\n"
    "                     (small tensors and the hash table are still real). For load tests.\n"
    "  --name S           general.name (default ds4-random)\n"
    "  --threads N        generation threads (default: one per core)\n"
    "  --quiet            no progress on stderr\n"
    "  -h, --help         this text\n";

int parse_int(const std::string &opt, const std::string &v, int lo, int hi) {
    char *end = nullptr;
    long n = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || !end || *end || n < lo || n > hi)
        fail(opt + ": '" + v + "' is not an integer in " + std::to_string(lo) + ".." + std::to_string(hi));
    return static_cast<int>(n);
}

float parse_float(const std::string &opt, const std::string &v) {
    char *end = nullptr;
    float f = std::strtof(v.c_str(), &end);
    if (v.empty() || !end || *end) fail(opt + ": '" + v + "' is not a number");
    return f;
}

}  // namespace

int make_model_main(int argc, char **argv) {
    bool parsing = true;  // errors until the model is being made are usage errors: exit 2
    try {
        std::string preset = "tiny";
        // First pass: the preset (shape options apply on top of it, in any order).
        for (int i = 1; i < argc; i++) {
            std::string a = argv[i];
            if (a == "-h" || a == "--help") {
                std::printf("%s%s%s%s", kUsage, convert::kTypeHelp, convert::kExpertTypeHelp, kUsageTail);
                return 0;
            }
            if (a == "--preset" && i + 1 < argc) preset = argv[i + 1];
        }
        MakeModelOptions o;
        o.cfg = preset_config(preset);
        o.scripted = preset == "scripted";
        const bool flash = preset == "flash-shape";
        o.type = flash ? "q8_0" : "f32";
        o.fast = flash;
        int layers = -1, hash_layers = -1;
        std::vector<int> ratios;
        std::string out;
        ModelConfig &c = o.cfg;
        for (int i = 1; i < argc; i++) {
            const std::string a = argv[i];
            auto val = [&]() -> std::string {
                if (i + 1 >= argc) fail(a + " needs a value");
                return argv[++i];
            };
            auto iv = [&](int lo = 1, int hi = 1 << 30) { return parse_int(a, val(), lo, hi); };
            if (a == "--preset") val();
            else if (a == "--layers") layers = iv(1, 4096);
            else if (a == "--vocab") c.n_vocab = iv();
            else if (a == "--embd") c.n_embd = iv();
            else if (a == "--heads") c.n_head = iv();
            else if (a == "--head-dim") c.head_dim = iv();
            else if (a == "--rope-dim") c.n_rot = iv();
            else if (a == "--q-lora") c.q_lora = iv();
            else if (a == "--o-lora") c.o_lora = iv();
            else if (a == "--o-groups") c.o_groups = iv();
            else if (a == "--experts") c.n_expert = iv();
            else if (a == "--experts-used") c.n_expert_used = iv();
            else if (a == "--shared-experts") c.n_expert_shared = iv(0, 1);
            else if (a == "--expert-ff") c.n_ff_exp = iv();
            else if (a == "--window") c.sliding_window = iv();
            else if (a == "--indexer-heads") c.indexer_heads = iv();
            else if (a == "--indexer-dim") c.indexer_dim = iv();
            else if (a == "--indexer-topk") c.indexer_topk = iv();
            else if (a == "--hash-layers") hash_layers = iv(0, 4096);
            else if (a == "--ctx") c.n_ctx_train = iv();
            else if (a == "--hc") c.hc_mult = iv(1, 16);
            else if (a == "--hc-iters") c.hc_iters = iv();
            else if (a == "--swiglu") c.swiglu_limit.assign(c.swiglu_limit.size(), parse_float(a, val()));
            else if (a == "--expert-scale") c.expert_scale = parse_float(a, val());
            else if (a == "--no-yarn") c.yarn = false;
            else if (a == "--ratios") {
                ratios.clear();
                std::stringstream ss(val());
                std::string tok;
                while (std::getline(ss, tok, ',')) ratios.push_back(parse_int("--ratios", tok, 0, 65536));
            } else if (a == "--type") o.type = val();
            else if (a == "--expert-type") o.expert_type = val();
            else if (a == "--seed") {
                std::string v = val();
                char *end = nullptr;
                unsigned long long s = std::strtoull(v.c_str(), &end, 0);
                if (v.empty() || !end || *end) fail("--seed: '" + v + "' is not an unsigned integer");
                o.seed = s;
            } else if (a == "--fast") o.fast = true;
            else if (a == "--exact") o.fast = false;
            else if (a == "--sparse") o.sparse = true;
            else if (a == "--name") o.name = val();
            else if (a == "--threads") o.threads = iv(1, 256);
            else if (a == "--quiet") o.progress = false;
            else if (a.size() > 1 && a[0] == '-') fail("unknown option " + a + " (see --help)");
            else if (out.empty()) out = a;
            else fail("more than one output file given ('" + out + "', '" + a + "')");
        }
        if (out.empty()) {
            std::fprintf(stderr, "%s", kUsage);
            return 2;
        }
        const float clamp = c.swiglu_limit.empty() ? 10.f : c.swiglu_limit[0];
        if (layers > 0) {
            c.n_layer = layers;
            apply_layer_pattern(preset, c);
            c.swiglu_limit.assign(static_cast<size_t>(c.n_layer), clamp);
        }
        if (!ratios.empty()) {
            if (static_cast<int>(ratios.size()) != c.n_layer)
                fail("--ratios has " + std::to_string(ratios.size()) + " entries for " + std::to_string(c.n_layer) + " layers");
            c.compress_ratio = ratios;
        }
        if (hash_layers >= 0) c.n_hash_layer = hash_layers;
        if (o.sparse && o.fast) o.fast = false;   // nothing big is generated anyway
        parsing = false;
        MakeModelResult r = make_model(o, out);
        if (o.progress)
            std::fprintf(stderr, "wrote %s: %zu tensors, %.3f GB of tensor data%s (%s)\n", out.c_str(), r.n_tensors,
                         r.tensor_bytes / 1e9, o.sparse ? ", matrices sparse" : "", c.summary().c_str());
        return 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "ds4-make-model: error: %s\n", e.what());
        return parsing ? 2 : 1;
    }
}

}  // namespace ds4::make_model
