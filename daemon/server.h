// The loop thread: one libuv loop does all socket I/O. It accepts connections (checking
// the peer's uid), decodes and verifies frames, answers Hello and malformed input itself,
// hands requests to the worker, and writes what the worker sends back through the
// OutQueue. It never calls into the engine.
#pragma once
#include <memory>

#include "daemon/listen_socket.h"
#include "daemon/options.h"
#include "daemon/out_queue.h"
#include "daemon/worker.h"

namespace ds4::daemon {

class DrafterExport;

class Server {
public:
    Server(const DaemonOptions &opt, Worker &worker, OutQueue &out, ListenSocket &listen);
    ~Server();
    Server(const Server &) = delete;
    Server &operator=(const Server &) = delete;

    // Runs until SIGTERM/SIGINT (or the worker stopping) has been handled: listener closed,
    // socket file removed, work finished or cancelled, connections flushed and closed.
    // Returns the process exit status.
    int run();

    // Answers GetDrafter with this export (borrowed; outlives the server). Without one,
    // GetDrafter is refused.
    void share_drafter(DrafterExport *e);

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

}  // namespace ds4::daemon
