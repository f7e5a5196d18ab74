// Session names are index keys only (payload files get generated names), but they are
// still restricted so they are safe to show, log and pass around: 1..128 bytes of
// printable ASCII (0x20..0x7E), no '/' or '\\', no "..", not starting or ending with a
// space.
#pragma once
#include <string_view>

#include "kvstore/status.h"

namespace ds4::kvstore {

inline constexpr size_t kMaxSessionName = 128;

Status validate_session_name(std::string_view name);

}  // namespace ds4::kvstore
