#include "tools/convert/type_policy.h"

#include <vector>

#include "engine/common/error.h"
#include "engine/quant/quants.h"

namespace ds4::convert {

using gguf::Type;

const char *const kTypeHelp =
    "  --type T           storage of the large matrices (attention, compressor and indexer\n"
    "                     projections, router, experts, shared experts, embedding, output):\n"
    "                     f32 | f16 | bf16 | q8_0 (default f32). Norms, biases, sinks,\n"
    "                     position biases and hyper-connection tensors always stay f32, the\n"
    "                     hash routing table i32. A q8_0 matrix whose rows are not a multiple\n"
    "                     of 32 elements is stored as f16 instead (with a warning).\n";
const char *const kExpertTypeHelp =
    "  --expert-type T    routed experts only: any --type value, or q2_k | q4_k | iq2_xxs,\n"
    "                     or a whole ds4 layout: ds4-q2 (gate/up iq2_xxs, down q2_k) or\n"
    "                     ds4-q4 (all q4_k); the ds4 layouts also store compressor, indexer,\n"
    "                     router and hyper-connection fn as f16 and attention, shared experts\n"
    "                     and output as q8_0, like ds4's own files. iq2_xxs is quantised\n"
    "                     without an importance matrix. Types whose quantiser this build lacks\n"
    "                     are rejected up front.\n";

namespace {

Type parse_type(const std::string &opt, const std::string &name) {
    Type t;
    if (!gguf::type_from_name(name, &t)) fail(opt + ": unknown type '" + name + "'");
    switch (t) {
    case Type::F32: case Type::F16: case Type::BF16: case Type::Q8_0:
    case Type::Q2_K: case Type::Q4_K: case Type::IQ2_XXS:
        return t;
    default:
        fail(opt + ": type '" + name + "' cannot be written (f32, f16, bf16, q8_0, q2_k, q4_k, iq2_xxs)");
    }
}

// Fails now rather than halfway through a multi-GB file when a quantiser is missing.
void probe_quantizer(const std::string &opt, Type t) {
    if (t == Type::F32) return;
    const int64_t n = 256;
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i++) x[static_cast<size_t>(i)] = static_cast<float>((i % 7) - 3) * 0.25f;
    std::vector<uint8_t> buf(gguf::row_bytes(t, n));
    try {
        quant::quantize_row(t, x.data(), buf.data(), n);
    } catch (const std::exception &e) {
        fail(opt + " " + gguf::type_name(t) + ": this build cannot quantise to it yet (" + e.what() + ")");
    }
}

bool is_expert(Role r) { return r == Role::ExpertGate || r == Role::ExpertUp || r == Role::ExpertDown; }

}  // namespace

Type TypePolicy::type_for(const TensorSpec &spec, std::string *warning) const {
    if (warning) warning->clear();
    Type want;
    auto it = by_role.find(spec.role);
    if (it != by_role.end()) want = it->second;
    else if (role_is_matrix(spec.role)) want = matrix;
    else if (spec.role == Role::HashTable) return Type::I32;
    else return Type::F32;

    const int64_t be = gguf::type_block_elems(want);
    if (spec.ne[0] % be == 0) return want;
    Type fb = (be > 32 && spec.ne[0] % 32 == 0) ? Type::Q8_0 : Type::F16;
    if (warning)
        *warning = spec.gguf + ": " + gguf::type_name(want) + " needs rows of a multiple of " + std::to_string(be) +
                   " elements but ne[0] = " + std::to_string(spec.ne[0]) + "; stored as " + gguf::type_name(fb);
    return fb;
}

TypePolicy make_type_policy(const std::string &type, const std::string &expert_type, bool probe) {
    TypePolicy p;
    p.matrix = parse_type("--type", type.empty() ? "f32" : type);
    if (p.matrix != Type::F32 && p.matrix != Type::F16 && p.matrix != Type::BF16 && p.matrix != Type::Q8_0)
        fail("--type: '" + type + "' is not one of f32, f16, bf16, q8_0 (2- and 4-bit types are for --expert-type)");
    if (probe) probe_quantizer("--type", p.matrix);
    p.description = gguf::type_name(p.matrix);
    if (expert_type.empty()) return p;

    if (expert_type == "ds4-q2" || expert_type == "ds4-q4") {
        const bool q2 = expert_type == "ds4-q2";
        p.by_role[Role::ExpertGate] = q2 ? Type::IQ2_XXS : Type::Q4_K;
        p.by_role[Role::ExpertUp] = q2 ? Type::IQ2_XXS : Type::Q4_K;
        p.by_role[Role::ExpertDown] = q2 ? Type::Q2_K : Type::Q4_K;
        for (Role r : {Role::CompressorProj, Role::IndexerProj, Role::Router, Role::HcFn}) p.by_role[r] = Type::F16;
        for (Role r : {Role::AttnProj, Role::SharedExpert, Role::Output}) p.by_role[r] = Type::Q8_0;
        // Not pinned by the ds4 layout description; f16 keeps the lookup table exact enough.
        p.by_role[Role::Embedding] = Type::F16;
        p.description = expert_type;
    } else {
        Type t = parse_type("--expert-type", expert_type);
        for (Role r : {Role::ExpertGate, Role::ExpertUp, Role::ExpertDown}) p.by_role[r] = t;
        p.description += std::string(" (experts ") + gguf::type_name(t) + ")";
    }
    std::vector<Type> seen;
    for (const auto &[r, t] : p.by_role) {
        bool dup = false;
        for (Type s : seen) dup |= s == t;
        if (!dup && probe) {
            probe_quantizer(is_expert(r) ? "--expert-type" : "--expert-type " + expert_type, t);
            seen.push_back(t);
        }
    }
    return p;
}

}  // namespace ds4::convert
