#include "tools/convert/convert.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "engine/common/error.h"
#include "engine/gguf/gguf.h"
#include "engine/quant/quants.h"
#include "tools/convert/hf_config.h"
#include "tools/convert/layout.h"
#include "tools/convert/row_fill.h"
#include "tools/convert/safetensors.h"
#include "tools/convert/type_policy.h"
#include "tools/convert/vocab.h"

namespace ds4::convert {

namespace {

using gguf::Type;

std::string join(const std::string &dir, const std::string &f) {
    return dir.empty() || dir.back() == '/' ? dir + f : dir + "/" + f;
}

std::string shape_str(const std::vector<int64_t> &s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); i++) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
}

std::string base_name(std::string dir) {
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    size_t p = dir.rfind('/');
    return p == std::string::npos ? dir : dir.substr(p + 1);
}

bool is_float(StDtype t) { return t == StDtype::F32 || t == StDtype::F16 || t == StDtype::BF16; }

// Source tensors (one, or one per expert) of one GGUF tensor.
struct Bound {
    const TensorSpec *spec;
    std::vector<const StTensor *> src;
};

std::string unknown_hint(const std::string &name) {
    if (name.rfind("mtp.", 0) == 0) return " (the MTP module is not converted yet)";
    if (name.size() > 6 && name.compare(name.size() - 6, 6, ".scale") == 0)
        return " (FP8 block scales: dequantise the checkpoint to bf16/f32 first)";
    return "";
}

}  // namespace

ConvertResult convert_hf(const ConvertOptions &opt) {
    ConvertResult res;
    if (opt.in_dir.empty() || opt.out_path.empty()) fail("ds4-convert: input directory and output file are required");
    const TypePolicy policy = make_type_policy(opt.type, opt.expert_type);
    const int threads = opt.threads > 0 ? opt.threads : default_threads();

    HfConfig hf = read_hf_config(join(opt.in_dir, "config.json"));
    const ModelConfig &cfg = hf.cfg;
    res.cfg = cfg;
    SafetensorsSet st = SafetensorsSet::open_dir(opt.in_dir);

    // Original DeepSeek spellings map onto the transformers ones; two names for one tensor
    // would make the result depend on which one we picked.
    std::unordered_map<std::string, const StTensor *> by_name;
    for (const StTensor &t : st.tensors()) {
        std::string c = canonical_hf_name(t.name);
        auto [it, fresh] = by_name.emplace(c, &t);
        if (!fresh) fail("checkpoint holds both " + it->second->name + " and " + t.name + " (the same tensor)");
    }

    const std::vector<TensorSpec> layout = model_layout(cfg);
    std::unordered_set<const StTensor *> used;
    std::vector<Bound> bound;
    bound.reserve(layout.size());
    for (const TensorSpec &spec : layout) {
        Bound b{&spec, {}};
        const int64_t count = spec.n_stack > 0 ? spec.n_stack : 1;
        const std::vector<int64_t> want = spec.hf_shape();
        for (int64_t e = 0; e < count; e++) {
            const std::string name = spec.hf_name(e);
            auto it = by_name.find(name);
            const StTensor *t = it == by_name.end() ? nullptr : it->second;
            if (!t && spec.role == Role::Output && hf.tie_word_embeddings) {
                auto emb = by_name.find("model.embed_tokens.weight");
                if (emb != by_name.end()) t = emb->second;
            }
            if (!t) fail("missing tensor " + name + " (for " + spec.gguf + ", " + role_name(spec.role) + ")");
            if (spec.role == Role::HashTable ? (t->dtype != StDtype::I64 && t->dtype != StDtype::I32) : !is_float(t->dtype))
                fail("tensor " + t->name + ": dtype " + st_dtype_name(t->dtype) + " is not supported here (" +
                     (spec.role == Role::HashTable ? "expected I64 or I32" : "expected F32, F16 or BF16") + ")");
            if (t->shape != want)
                fail("tensor " + t->name + ": shape " + shape_str(t->shape) + " does not match config.json, which implies " +
                     shape_str(want));
            used.insert(t);
            b.src.push_back(t);
        }
        bound.push_back(std::move(b));
    }
    for (const StTensor &t : st.tensors())
        if (!used.count(&t))
            fail("unknown tensor " + t.name + " in " + t.file + unknown_hint(t.name) +
                 ": not part of a DeepSeek-V4 model as config.json describes it");

    gguf::Writer w;
    cfg.to_gguf(w);
    w.set("general.name", gguf::Value::str(base_name(opt.in_dir)));
    w.set("general.source.format", gguf::Value::str("transformers DeepseekV4ForCausalLM safetensors"));
    write_vocabulary(w, opt.in_dir, cfg.n_vocab, hf.bos_token_id, hf.eos_token_id, &res.warnings);

    // Hash tables are small and validated now; everything else is streamed at write time.
    uint64_t total = 0;
    std::vector<std::pair<const Bound *, Type>> plan;
    for (const Bound &b : bound) {
        std::string warn;
        Type t = policy.type_for(*b.spec, &warn);
        if (!warn.empty()) res.warnings.push_back(warn);
        plan.emplace_back(&b, t);
        total += gguf::row_bytes(t, b.spec->ne[0]) * static_cast<uint64_t>(b.spec->rows());
    }
    if (opt.progress)
        for (const auto &wmsg : res.warnings) std::fprintf(stderr, "warning: %s\n", wmsg.c_str());

    Progress progress(total, opt.progress, "converting");
    for (const auto &[b, type] : plan) {
        const TensorSpec &spec = *b->spec;
        res.source_bytes += [&] {
            uint64_t n = 0;
            for (const StTensor *s : b->src) n += s->nbytes;
            return n;
        }();
        if (spec.role == Role::HashTable) {
            const StTensor &s = *b->src[0];
            std::vector<int64_t> ids = s.read_ints();
            std::vector<int32_t> out(ids.size());
            for (size_t i = 0; i < ids.size(); i++) {
                if (ids[i] < 0 || ids[i] >= cfg.n_expert)
                    fail("tensor " + s.name + ": expert id " + std::to_string(ids[i]) + " at token " +
                         std::to_string(i / static_cast<size_t>(cfg.n_expert_used)) + " is outside 0.." +
                         std::to_string(cfg.n_expert - 1));
                out[i] = static_cast<int32_t>(ids[i]);
            }
            w.add_tensor(spec.gguf, Type::I32, spec.ne, out.data(), out.size() * sizeof(int32_t));
            continue;
        }
        const int64_t ne0 = spec.ne[0];
        const int64_t rows_per_src = spec.rows() / static_cast<int64_t>(b->src.size());
        const uint64_t rb = gguf::row_bytes(type, ne0);
        const std::vector<const StTensor *> srcs = b->src;
        const Type t = type;
        auto rows = [srcs, rows_per_src, ne0, rb, t](int64_t first, int64_t n, uint8_t *dst) {
            thread_local std::vector<float> f;
            f.resize(static_cast<size_t>(ne0));
            for (int64_t r = first; r < first + n; r++, dst += rb) {
                const StTensor &s = *srcs[static_cast<size_t>(r / rows_per_src)];
                const int64_t rr = r % rows_per_src;
                // Same storage type in and out: copy the bits.
                if ((t == Type::F32 && s.dtype == StDtype::F32) || (t == Type::F16 && s.dtype == StDtype::F16) ||
                    (t == Type::BF16 && s.dtype == StDtype::BF16)) {
                    std::memcpy(dst, s.data + static_cast<uint64_t>(rr) * rb, rb);
                    continue;
                }
                s.read_f32(rr * ne0, ne0, f.data());
                quant::quantize_row(t, f.data(), dst, ne0);
            }
        };
        w.add_tensor_fill(spec.gguf, type, spec.ne, make_row_fill(spec.gguf, rb, spec.rows(), rows, threads, &progress));
    }
    w.write(opt.out_path);
    progress.finish();
    res.n_tensors = w.tensor_count();
    res.tensor_bytes = total;
    res.seconds = progress.seconds();
    return res;
}

namespace {

const char *kUsage =
    "usage: ds4-convert HF_DIR OUT.gguf [--type T] [--expert-type T] [--threads N] [--quiet]\n"
    "\n"
    "Converts a directory written by transformers' DeepseekV4ForCausalLM.save_pretrained\n"
    "(config.json; model.safetensors, or model-0000K-of-0000N.safetensors shards with\n"
    "model.safetensors.index.json; optional tokenizer.json) into one GGUF file in the ds4\n"
    "layout: architecture deepseek4, deepseek4.* metadata, per-expert tensors stacked.\n"
    "Safetensors dtypes F32, F16, BF16 (weights) and I64/I32 (hash table) are read; FP8\n"
    "checkpoints must be dequantised first. With tokenizer.json the BPE vocabulary, merges\n"
    "and special tokens are stored; without it, a byte-level fallback vocabulary.\n"
    "Every tensor is checked against config.json (presence, dtype, shape, no unknown\n"
    "names) before anything is written.\n"
    "\n"
    "options:\n";
const char *kUsageTail =
    "  --threads N        encoding threads (default: one per core)\n"
    "  --quiet            no progress or warnings on stderr\n"
    "  -h, --help         this text\n";

}  // namespace

int convert_main(int argc, char **argv) {
    ConvertOptions o;
    std::vector<std::string> pos;
    bool parsing = true;  // errors until the conversion starts are usage errors: exit 2
    try {
        for (int i = 1; i < argc; i++) {
            std::string a = argv[i];
            auto value = [&](const char *opt) -> std::string {
                if (i + 1 >= argc) fail(std::string(opt) + " needs a value");
                return argv[++i];
            };
            if (a == "-h" || a == "--help") {
                std::printf("%s%s%s%s", kUsage, kTypeHelp, kExpertTypeHelp, kUsageTail);
                return 0;
            } else if (a == "--type") {
                o.type = value("--type");
            } else if (a == "--expert-type") {
                o.expert_type = value("--expert-type");
            } else if (a == "--threads") {
                std::string v = value("--threads");
                char *end = nullptr;
                long n = std::strtol(v.c_str(), &end, 10);
                if (!end || *end || n < 1 || n > 256) fail("--threads: '" + v + "' is not a count from 1 to 256");
                o.threads = static_cast<int>(n);
            } else if (a == "--quiet") {
                o.progress = false;
            } else if (a.size() > 1 && a[0] == '-') {
                fail("unknown option " + a + " (see --help)");
            } else {
                pos.push_back(a);
            }
        }
        if (pos.size() != 2) {
            std::fprintf(stderr, "%s", kUsage);
            return 2;
        }
        o.in_dir = pos[0];
        o.out_path = pos[1];
        parsing = false;
        ConvertResult r = convert_hf(o);
        if (o.progress)
            std::fprintf(stderr, "wrote %s: %zu tensors, %.3f GB (%s)\n", o.out_path.c_str(), r.n_tensors,
                         r.tensor_bytes / 1e9, r.cfg.summary().c_str());
        return 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "ds4-convert: error: %s\n", e.what());
        return parsing ? 2 : 1;
    }
}

}  // namespace ds4::convert
