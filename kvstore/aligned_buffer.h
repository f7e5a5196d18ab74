// Moved to io/aligned_buffer.h (ds4_io). Kept for code that still names it here
// (tools/bench_daemon); new code includes io/aligned_buffer.h.
#pragma once
#include "io/aligned_buffer.h"

namespace ds4::kvstore {
using io::AlignedBuffer;
using io::kIoAlign;
using io::round_up;
}  // namespace ds4::kvstore
