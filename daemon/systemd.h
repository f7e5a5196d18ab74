// systemd integration without libsystemd (the protocols are small and stable):
//  - socket activation (sd_listen_fds): systemd passes the listening socket as fd 3 with
//    LISTEN_FDS=1 and LISTEN_PID=<our pid>;
//  - readiness (sd_notify): "READY=1" etc. as a datagram to $NOTIFY_SOCKET;
//  - journald severity: when stderr is the journal ($JOURNAL_STREAM names it), log lines
//    start with "<N>" (syslog priority) instead of a time stamp.
// Outside systemd none of the variables is set and all of this does nothing.
#pragma once
#include <string>

namespace ds4::daemon {

// The socket systemd passed, or -1 when ds4d was not socket-activated. Throws StartupError
// (listen_socket.h) when the variables are set for us but the fds are unusable (more than
// one, not a listening Unix stream socket). Unsets LISTEN_* so children do not inherit them.
int systemd_listen_fd();

// Sends state ("READY=1", "STOPPING=1", "STATUS=...") to $NOTIFY_SOCKET; false when there is
// none or sending failed (never fatal: readiness is advisory outside Type=notify).
bool systemd_notify(const std::string &state);

// The path a listening Unix socket is bound to ("" for an unnamed or abstract one).
std::string bound_socket_path(int fd);

}  // namespace ds4::daemon
