// Crash-safe replacement of a whole file (the bridge's payload files).
#pragma once
#include <cstdint>
#include <span>
#include <string>

namespace ds4::bridge_io {

// Writes bytes to a fresh uniquely named temporary in path's directory, fsyncs it, renames
// it over path and fsyncs the directory. Readers see the old file or the new one, never a
// mix; concurrent writers and stale temporaries from a crash do not collide. On failure
// before the rename the temporary is removed and the old file is left as it was. Throws
// ds4::Error naming the path and the system error.
void write_file_durable(const std::string &path, std::span<const uint8_t> bytes);

}  // namespace ds4::bridge_io
