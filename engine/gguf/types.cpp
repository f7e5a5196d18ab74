// GGML tensor type traits: names, block geometry, and which ones this engine holds.
#include <climits>
#include <cstring>

#include "engine/common/error.h"
#include "engine/gguf/gguf.h"

namespace ds4::gguf {
namespace {

struct Traits {
    const char *name;   // nullptr: id not used by GGML
    int64_t block_elems;
    int64_t block_bytes;
    bool supported;
};

// Indexed by type id. Ids 4 and 5 were retired formats (Q4_2, Q4_3).
constexpr Traits kTraits[] = {
    {"f32", 1, 4, true},         // 0
    {"f16", 1, 2, true},         // 1
    {"q4_0", 32, 18, false},     // 2
    {"q4_1", 32, 20, false},     // 3
    {nullptr, 0, 0, false},      // 4
    {nullptr, 0, 0, false},      // 5
    {"q5_0", 32, 22, false},     // 6
    {"q5_1", 32, 24, false},     // 7
    {"q8_0", 32, 34, true},      // 8
    {"q8_1", 32, 36, false},     // 9
    {"q2_k", 256, 84, true},     // 10
    {"q3_k", 256, 110, false},   // 11
    {"q4_k", 256, 144, true},    // 12
    {"q5_k", 256, 176, false},   // 13
    {"q6_k", 256, 210, false},   // 14
    {"q8_k", 256, 292, false},   // 15
    {"iq2_xxs", 256, 66, true},  // 16
    {"iq2_xs", 256, 74, false},  // 17
    {"iq3_xxs", 256, 98, false}, // 18
    {"iq1_s", 256, 50, false},   // 19
    {"iq4_nl", 32, 18, false},   // 20
    {"iq3_s", 256, 110, false},  // 21
    {"iq2_s", 256, 82, false},   // 22
    {"iq4_xs", 256, 136, false}, // 23
    {"i8", 1, 1, false},         // 24
    {"i16", 1, 2, false},        // 25
    {"i32", 1, 4, true},         // 26
    {"i64", 1, 8, false},        // 27
    {"f64", 1, 8, false},        // 28
    {"iq1_m", 256, 56, false},   // 29
    {"bf16", 1, 2, true},        // 30
};
constexpr uint32_t kNumTypes = sizeof(kTraits) / sizeof(kTraits[0]);

const Traits *traits(Type t) {
    auto id = static_cast<uint32_t>(t);
    if (id >= kNumTypes || !kTraits[id].name) return nullptr;
    return &kTraits[id];
}

}  // namespace

bool type_known(uint32_t id) { return id < kNumTypes && kTraits[id].name; }

bool type_supported(Type t) {
    const Traits *tr = traits(t);
    return tr && tr->supported;
}

const char *type_name(Type t) {
    const Traits *tr = traits(t);
    return tr ? tr->name : "?";
}

bool type_from_name(std::string_view name, Type *out) {
    for (uint32_t id = 0; id < kNumTypes; id++) {
        if (kTraits[id].name && name == kTraits[id].name) {
            if (out) *out = static_cast<Type>(id);
            return true;
        }
    }
    return false;
}

int64_t type_block_elems(Type t) {
    const Traits *tr = traits(t);
    if (!tr) failf("gguf: unknown tensor type %u", static_cast<uint32_t>(t));
    return tr->block_elems;
}

int64_t type_block_bytes(Type t) {
    const Traits *tr = traits(t);
    if (!tr) failf("gguf: unknown tensor type %u", static_cast<uint32_t>(t));
    return tr->block_bytes;
}

uint64_t row_bytes(Type t, int64_t n) {
    const Traits *tr = traits(t);
    if (!tr) failf("gguf: unknown tensor type %u", static_cast<uint32_t>(t));
    if (n < 0) failf("gguf: negative row length %lld", static_cast<long long>(n));
    if (n % tr->block_elems != 0)
        failf("gguf: row of %lld elements is not a multiple of the %s block size %lld",
              static_cast<long long>(n), tr->name, static_cast<long long>(tr->block_elems));
    uint64_t blocks = static_cast<uint64_t>(n / tr->block_elems), bytes;
    if (__builtin_mul_overflow(blocks, static_cast<uint64_t>(tr->block_bytes), &bytes))
        failf("gguf: row of %lld %s elements overflows", static_cast<long long>(n), tr->name);
    return bytes;
}

}  // namespace ds4::gguf
