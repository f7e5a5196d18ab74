// ds4d: opens the model, prewarms it, and only then listens on the socket (or, socket-
// activated, starts serving the socket systemd passed and tells it READY=1).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>

#include "daemon/drafter_export.h"
#include "daemon/fd_limit.h"
#include "daemon/listen_socket.h"
#include "daemon/log.h"
#include "daemon/options.h"
#include "daemon/server.h"
#include "daemon/systemd.h"
#include "daemon/worker.h"
#include "ds4_version.h"
#include "kvstore/store.h"

using namespace ds4::daemon;

namespace {

// mkdir -p with mode 0700 for the parts it creates.
void make_dirs(const std::string &dir) {
    for (size_t i = 1; i <= dir.size(); ++i) {
        if (i != dir.size() && dir[i] != '/') continue;
        const std::string part = dir.substr(0, i);
        if (::mkdir(part.c_str(), 0700) != 0 && errno != EEXIST)
            throw StartupError("cannot create " + part + ": " + std::strerror(errno));
    }
}

}  // namespace

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
    if (opt.version) {
        ds4_print_version("ds4d");
        return 0;
    }
    ::signal(SIGPIPE, SIG_IGN);

    try {
        // Socket activation: systemd owns the socket file and runs one instance per socket.
        const int activated_fd = systemd_listen_fd();
        std::unique_ptr<SocketLock> lock;
        if (activated_fd >= 0) {
            const std::string bound = bound_socket_path(activated_fd);
            opt.socket_path = bound.empty() ? "(socket from systemd)" : bound;
            log_line("socket activation: serving %s (fd %d)", opt.socket_path.c_str(), activated_fd);
        } else {
            // Claim the path before the (slow) model load, so a second daemon fails at once.
            prepare_socket_dir(opt.socket_path);
            lock = std::make_unique<SocketLock>(opt.socket_path);
            clear_stale_socket(opt.socket_path);
        }

        std::unique_ptr<ds4::kvstore::Store> store;
        std::string expert_store_dir;  // SSD streaming's expert store, under the state dir
        if (!opt.no_store) {
            const std::string dir = resolve_state_dir(opt.state_dir);
            if (dir.empty())
                throw StartupError("no state dir: set --state-dir, $XDG_STATE_HOME or $HOME (or run with --no-store)");
            make_dirs(dir);
            if (opt.ssd_streaming) expert_store_dir = dir + "/experts";
            ds4::kvstore::StoreOptions so;
            so.state_dir = dir;
            so.budget_bytes = opt.store_budget;
            so.log = [](const std::string &l) { log_line("store: %s", l.c_str()); };
            const ds4::kvstore::Status st = ds4::kvstore::Store::open(so, &store);
            if (!st) throw StartupError("cannot open the session store in " + dir + ": " + st.to_string());
            const ds4::kvstore::RecoveryReport &rr = store->recovery_report();
            ds4::kvstore::StoreStats ss;
            (void)store->stats(&ss);
            log_line("session store %s: %llu sessions, %llu checkpoints, %llu bytes; recovery removed %d temp and %d "
                     "orphan files, quarantined %d entries, dropped %d bad index records, evicted %d",
                     dir.c_str(), static_cast<unsigned long long>(ss.sessions),
                     static_cast<unsigned long long>(ss.checkpoints), static_cast<unsigned long long>(ss.bytes),
                     rr.temp_files_removed, rr.orphan_files_removed, rr.entries_quarantined, rr.bad_index_records,
                     rr.entries_evicted);
            for (const std::string &n : rr.quarantined_sessions)
                log_line("stored session '%s' was quarantined: it will be refused until deleted", n.c_str());
        } else {
            log_line("no session store (--no-store): sessions live in memory only");
        }

        // A shared drafter: the bridge opens it from the sealed memfd that importers map.
        std::unique_ptr<DrafterExport> drafter_export;
        if (!opt.drafter_path.empty() && opt.share_drafter) {
            try {
                drafter_export = DrafterExport::create(opt.drafter_path);
            } catch (const std::exception &e) {
                throw StartupError(e.what());
            }
        }

        WorkerConfig wc;
        wc.model.model_path = opt.model_path;
        wc.model.drafter_path = drafter_export ? drafter_export->open_path() : opt.drafter_path;
        wc.model.draft_max = int32_t(opt.draft_max);
        wc.model.threads = opt.threads;
        wc.model.ssd_streaming = opt.ssd_streaming;
        wc.model.ssd_cold = opt.ssd_cold;
        wc.model.expert_cache_experts = opt.expert_cache_experts;
        wc.model.expert_cache_bytes = opt.expert_cache_bytes;
        wc.model.expert_store_dir = expert_store_dir;
        if (opt.ssd_streaming)
            log_line("SSD expert streaming: cache %s, expert store %s",
                     opt.expert_cache_experts ? (std::to_string(opt.expert_cache_experts) + " experts").c_str()
                     : opt.expert_cache_bytes ? (std::to_string(opt.expert_cache_bytes) + " bytes").c_str()
                                              : "4 GiB (default)",
                     expert_store_dir.empty() ? "none (--no-store)" : expert_store_dir.c_str());
        wc.model.backend = opt.backend == DaemonOptions::Backend::Cuda ? ModelOpenConfig::Backend::Cuda
                                                                        : ModelOpenConfig::Backend::Cpu;
        wc.backend_auto = opt.backend == DaemonOptions::Backend::Auto;
        wc.ctx = opt.ctx;
        wc.max_sessions = opt.max_sessions;
        wc.kv_budget = opt.kv_budget ? opt.kv_budget : default_kv_budget();
        wc.kv_wait = std::chrono::seconds(opt.kv_wait_s);
        wc.prefill_chunk = opt.prefill_chunk;
        wc.solo_prefill_chunk = opt.solo_prefill_chunk;
        wc.max_batch = opt.max_batch;
        wc.step_tokens = opt.step_tokens;
        wc.queue_bytes = opt.queue_bytes;
        if (const char *e = std::getenv("DS4D_DIRECT_WRITES"); e && std::string_view(e) == "0") wc.direct_writes = false;
        wc.max_reply = opt.max_frame;
        wc.store = store.get();
        wc.checkpoint_every = opt.checkpoint_every;
        wc.max_checkpoints = opt.max_checkpoints;
        wc.prefix_min = opt.prefix_min;

        // On a terminal, show the weights being read in (a large model takes minutes); the
        // journal and log files get the log lines only.
        if (::isatty(2) && !stderr_is_journal()) {
            wc.model.on_prewarm = [](uint64_t done, uint64_t total) {
                std::fprintf(stderr, "\r\033[Kds4d: reading the weights: %.2f of %.2f GiB (%.0f%%)",
                             double(done) / double(1ull << 30), double(total) / double(1ull << 30),
                             total ? 100.0 * double(done) / double(total) : 100.0);
                if (done >= total) std::fputs("\r\033[K", stderr);
                std::fflush(stderr);
            };
        }
        OutQueue out;
        Worker worker(wc, out);
        log_line("loading %s", opt.model_path.c_str());
        systemd_notify("STATUS=loading and prewarming " + opt.model_path);
        try {
            worker.start();
        } catch (const std::exception &e) {
            if (!drafter_export) throw;
            // Name the drafter by its file, not by the memfd's /proc link the bridge saw.
            std::string msg = e.what();
            const std::string link = drafter_export->open_path();
            for (size_t at; (at = msg.find(link)) != std::string::npos;) msg.replace(at, link.size(), opt.drafter_path);
            throw StartupError(msg);
        }
        const ModelSummary &m = worker.model();
        log_line("session caches: budget %.1f MiB (--kv-budget), requests wait up to %u s for room (--kv-wait)",
                 double(wc.kv_budget) / 1048576.0, opt.kv_wait_s);
        log_line("model %s (%s) on %s: %u layers, %u wide, vocab %u, context %u (limit %u)", m.name.c_str(),
                 m.family.c_str(), m.backend.c_str(), m.n_layer, m.n_embd, m.n_vocab, worker.default_ctx(),
                 m.n_ctx_max);

        std::string fd_note;
        opt.max_connections = connections_within_fd_limit(opt.max_connections, &fd_note);
        if (!fd_note.empty()) log_line("%s", fd_note.c_str());

        std::unique_ptr<ListenSocket> listen =
            activated_fd >= 0 ? std::make_unique<ListenSocket>(ListenSocket::Adopt{}, activated_fd, opt.socket_path)
                              : std::make_unique<ListenSocket>(opt.socket_path, 128);
        Server server(opt, worker, out, *listen);
        if (drafter_export) {
            drafter_export->set_identity(m.drafter_fingerprint, m.drafter_n_vocab);
            const ds4_bridge_drafter_device_t &dd = m.drafter_device;
            if (dd.export_fd >= 0) {
                DrafterExport::Device dev;
                dev.bytes = dd.bytes, dev.granularity = dd.granularity, dev.layout_hash = dd.layout_hash;
                std::memcpy(dev.uuid, dd.uuid, sizeof dev.uuid);
                try {
                    drafter_export->set_device(dd.export_fd, dev);
                } catch (const std::exception &e) {
                    log_line("%s: importers upload the drafter to their GPU themselves", e.what());
                }
            } else if (dd.on_device) {
                log_line("the drafter's GPU weights are not exportable (%s): importers upload them themselves",
                         dd.why[0] ? dd.why : "unknown reason");
            }
            server.share_drafter(drafter_export.get());
            log_line("drafter %s shared read-only with this user's processes (%llu bytes in a sealed memfd%s)",
                     opt.drafter_path.c_str(), static_cast<unsigned long long>(drafter_export->bytes()),
                     drafter_export->has_device()
                         ? (", " + std::to_string(drafter_export->device().bytes) + " bytes of GPU memory").c_str()
                         : "");
        }
        log_line("listening on %s", opt.socket_path.c_str());
        // The model is loaded and prewarmed: clients queued on the socket are served from here.
        systemd_notify("READY=1\nSTATUS=serving " + m.name + " on " + opt.socket_path);
        const int rc = server.run();
        systemd_notify("STOPPING=1");
        worker.join();
        log_line("stopped");
        return rc;
    } catch (const StartupError &e) {
        log_error("%s", e.what());
        return 1;
    } catch (const std::exception &e) {
        log_error("%s", e.what());
        return 1;
    }
}
