// ds4d: opens the model, prewarms it, and only then listens on the socket.
#include <signal.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "daemon/listen_socket.h"
#include "daemon/log.h"
#include "daemon/options.h"
#include "daemon/server.h"
#include "daemon/worker.h"

using namespace ds4::daemon;

int main(int argc, char **argv) {
    DaemonOptions opt;
    try {
        opt = parse_daemon_args(argc, argv);
    } catch (const UsageError &e) {
        std::fprintf(stderr, "ds4d: %s\nRun 'ds4d --help' for usage.\n", e.what());
        return 2;
    }
    if (opt.help) {
        std::fputs(daemon_usage().c_str(), stdout);
        return 0;
    }
    ::signal(SIGPIPE, SIG_IGN);

    try {
        // Claim the path before the (slow) model load, so a second daemon fails at once.
        SocketLock lock(opt.socket_path);
        clear_stale_socket(opt.socket_path);

        if (!opt.state_dir.empty()) {
            if (::mkdir(opt.state_dir.c_str(), 0700) != 0 && errno != EEXIST)
                throw StartupError("cannot create --state-dir " + opt.state_dir + ": " + std::strerror(errno));
            log_line("warning: the persistent session store is not built yet; --state-dir %s is not used, "
                     "sessions live in memory only", opt.state_dir.c_str());
        }

        WorkerConfig wc;
        wc.model.model_path = opt.model_path;
        wc.model.mtp_path = opt.mtp_path;
        wc.model.threads = opt.threads;
        wc.model.backend = opt.backend == DaemonOptions::Backend::Cuda ? ModelOpenConfig::Backend::Cuda
                                                                        : ModelOpenConfig::Backend::Cpu;
        wc.backend_auto = opt.backend == DaemonOptions::Backend::Auto;
        wc.ctx = opt.ctx;
        wc.max_sessions = opt.max_sessions;
        wc.prefill_chunk = opt.prefill_chunk;
        wc.queue_bytes = opt.queue_bytes;

        OutQueue out;
        Worker worker(wc, out);
        log_line("loading %s", opt.model_path.c_str());
        worker.start();
        const ModelSummary &m = worker.model();
        log_line("model %s (%s) on %s: %u layers, %u wide, vocab %u, context %u (limit %u)", m.name.c_str(),
                 m.family.c_str(), m.backend.c_str(), m.n_layer, m.n_embd, m.n_vocab, worker.default_ctx(),
                 m.n_ctx_max);

        ListenSocket listen(opt.socket_path, 128);
        Server server(opt, worker, out, listen);
        log_line("listening on %s", opt.socket_path.c_str());
        const int rc = server.run();
        worker.join();
        log_line("stopped");
        return rc;
    } catch (const StartupError &e) {
        log_line("%s", e.what());
        return 1;
    } catch (const std::exception &e) {
        log_line("%s", e.what());
        return 1;
    }
}
