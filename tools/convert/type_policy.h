// Which GGUF type each tensor is stored as. Norms, biases, sinks, position biases and
// hyper-connection tensors stay F32 (small, precision-sensitive), the hash table is I32,
// and the large matrices follow --type, with routed experts optionally overridden by
// --expert-type (a single type, or a whole ds4 layout: ds4-q2 / ds4-q4).
#pragma once
#include <map>
#include <optional>
#include <string>

#include "engine/gguf/gguf.h"
#include "tools/convert/layout.h"

namespace ds4::convert {

struct TypePolicy {
    gguf::Type matrix = gguf::Type::F32;   // every matrix role unless overridden
    std::map<Role, gguf::Type> by_role;    // overrides (expert types, ds4 layouts)
    std::string description;               // for logs / general.file_type-like notes

    // Type for SPEC. When the wanted block type does not divide ne[0], falls back to a
    // type that does (Q8_0 -> F16; 256-blocks -> Q8_0 or F16) and sets *warning.
    gguf::Type type_for(const TensorSpec &spec, std::string *warning) const;
};

// --type NAME (f32|f16|bf16|q8_0) and --expert-type NAME ("" = same as --type;
// any quantizable type name; "ds4-q2": gate/up IQ2_XXS, down Q2_K; "ds4-q4": all Q4_K;
// both ds4 layouts also set the non-expert tensors the way ds4's own files have them).
// Throws ds4::Error for unknown names and (probe) for types whose quantizer is not available.
TypePolicy make_type_policy(const std::string &type, const std::string &expert_type, bool probe = true);

// Help text lines for the two options.
extern const char *const kTypeHelp;
extern const char *const kExpertTypeHelp;

}  // namespace ds4::convert
