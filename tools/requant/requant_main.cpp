// ds4-requant: re-encodes the large matrices of a ds4 GGUF in another tensor type, keeping
// metadata (tokenizer included) and the small f32 / i32 tensors as they are. For comparing
// formats on one trained model (the decoded weights of the input are the starting point, so
// requantising a q8_0 file adds the new format's error on top of q8_0's).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/common/error.h"
#include "engine/gguf/gguf.h"
#include "engine/quant/quants.h"
#include "ds4_version.h"

namespace {

const char *kUsage =
    "usage: ds4-requant IN.gguf OUT.gguf --type T [--expert-type T]\n"
    "  --type T          f32 | f16 | bf16 | q8_0 | q4_k | q2_k | iq2_xxs for every matrix that\n"
    "                    is not f32 already (norms, biases and other f32 vectors stay f32)\n"
    "  --expert-type T   routed experts (*_exps) only (default: --type)\n"
    "  --nudge EPS       also scale blk.0.attn_norm.weight by 1 + EPS: a float-rounding-sized\n"
    "                    change, to see how far a format's outputs move from that alone\n"
    "                    (scripts/gpu-agreement.sh: the floor for CPU vs CUDA agreement)\n"
    "A matrix whose rows do not divide into the type's blocks keeps its input type (reported).\n";

bool is_expert(const std::string &name) { return name.find("_exps.") != std::string::npos; }

}  // namespace

int main(int argc, char **argv) {
    if (ds4_wants_version(argc, argv)) {
        ds4_print_version("ds4-requant");
        return 0;
    }
    std::string in, out, type_s, expert_s;
    float nudge = 0;
    bool nudge_pending = false;   // --nudge given and blk.0.attn_norm.weight not yet seen
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "ds4-requant: %s needs a value\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--type") type_s = val();
        else if (a == "--expert-type") expert_s = val();
        else if (a == "--nudge") {
            const std::string v = val();
            char *end = nullptr;
            nudge = std::strtof(v.c_str(), &end);
            if (v.empty() || *end || !std::isfinite(nudge)) {
                std::fprintf(stderr, "ds4-requant: --nudge: '%s' is not a number\n", v.c_str());
                return 2;
            }
            nudge_pending = true;
        }
        else if (a == "-h" || a == "--help") {
            std::fputs(kUsage, stdout);
            return 0;
        } else if (in.empty()) in = a;
        else if (out.empty()) out = a;
        else {
            std::fprintf(stderr, "ds4-requant: unexpected argument %s\n%s", a.c_str(), kUsage);
            return 2;
        }
    }
    if (in.empty() || out.empty() || type_s.empty()) {
        std::fputs(kUsage, stderr);
        return 2;
    }
    ds4::gguf::Type type, etype;
    if (!ds4::gguf::type_from_name(type_s, &type) || !ds4::gguf::type_from_name(expert_s.empty() ? type_s : expert_s, &etype)) {
        std::fprintf(stderr, "ds4-requant: unknown type (%s / %s)\n", type_s.c_str(), expert_s.c_str());
        return 2;
    }
    try {
        auto r = ds4::gguf::Reader::open(in);
        ds4::gguf::Writer w;
        for (const auto &[k, v] : r->metadata()) w.set(k, v);
        std::vector<float> f, nudged_norm;
        std::vector<uint8_t> q;
        int changed = 0, kept = 0;
        for (const ds4::gguf::TensorInfo &t : r->tensors()) {
            if (nudge_pending && t.name == "blk.0.attn_norm.weight") {
                if (t.type != ds4::gguf::Type::F32) throw ds4::Error(t.name + " is not f32; --nudge needs it f32");
                nudged_norm.assign((const float *)t.data, (const float *)t.data + t.nelements());
                for (float &x : nudged_norm) x *= 1.f + nudge;
                w.add_tensor(t.name, t.type, t.ne, nudged_norm.data(), t.nbytes);
                nudge_pending = false;
                continue;
            }
            const ds4::gguf::Type to = is_expert(t.name) ? etype : type;
            const bool plain = t.type == ds4::gguf::Type::F32 || t.type == ds4::gguf::Type::I32;
            if (plain || to == t.type || t.ne[0] % ds4::gguf::type_block_elems(to) != 0) {
                if (!plain && to != t.type) {
                    std::fprintf(stderr, "ds4-requant: %s keeps %s (rows of %lld do not fit %s blocks)\n", t.name.c_str(),
                                 ds4::gguf::type_name(t.type), (long long)t.ne[0], ds4::gguf::type_name(to));
                    ++kept;
                }
                w.add_tensor(t.name, t.type, t.ne, t.data, t.nbytes);
                continue;
            }
            const int64_t n = t.ne[0], rows = t.rows();
            const uint64_t rb = ds4::gguf::row_bytes(to, n);
            f.resize((size_t)n);
            q.resize((size_t)(rb * rows));
            const uint64_t in_rb = t.nbytes / rows;
            for (int64_t i = 0; i < rows; ++i) {
                ds4::quant::dequantize_row(t.type, t.data + i * in_rb, f.data(), n);
                ds4::quant::quantize_row(to, f.data(), q.data() + i * rb, n);
            }
            w.add_tensor(t.name, to, t.ne, q.data(), q.size());
            ++changed;
        }
        if (nudge_pending) throw ds4::Error("--nudge: the model has no blk.0.attn_norm.weight");
        w.write(out);
        std::fprintf(stderr, "ds4-requant: %d matrices re-encoded, %d kept their type -> %s\n", changed, kept, out.c_str());
    } catch (const std::exception &e) {
        std::fprintf(stderr, "ds4-requant: %s\n", e.what());
        return 1;
    }
    return 0;
}
