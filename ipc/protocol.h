// Protocol constants and the generated message types (ipc/ds4.fbs).
#pragma once
#include <cstddef>
#include <cstdint>

#include "ipc/ds4_generated.h"

namespace ds4::ipc {

inline constexpr uint32_t kProtocolVersion = static_cast<uint32_t>(fb::ProtocolVersion::Current);
inline constexpr char kFileIdentifier[] = "DS4P";

// Limits applied to every received frame before any field is read.
struct Limits {
    size_t max_frame = 16u << 20;   // bytes after the length prefix
    uint32_t max_depth = 32;        // nesting of tables and vectors
    uint32_t max_tables = 100000;   // tables visited by the verifier
};

// Frames above this are refused whatever the configuration says (the verifier's own
// ceiling is 2 GiB; nothing in the protocol needs more than a long prompt).
inline constexpr size_t kMaxFrameCeiling = 1u << 30;

const char *error_code_name(fb::ErrorCode code);
const char *finish_reason_name(fb::FinishReason reason);

}  // namespace ds4::ipc
