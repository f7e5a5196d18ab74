// Connections must fit the open-file limit: at that limit libuv accepts and drops new
// clients itself (its EMFILE trick), so they see a reset and ds4d has nothing to log.
#pragma once
#include <cstdint>
#include <string>

namespace ds4::daemon {

// Raises the soft RLIMIT_NOFILE to the hard one, then returns how many connections fit:
// `wanted`, or fewer when the files already open, a margin, and one descriptor per served
// and per refused (still draining) connection do not fit. *note says why when it is fewer.
uint32_t connections_within_fd_limit(uint32_t wanted, std::string *note);

}  // namespace ds4::daemon
