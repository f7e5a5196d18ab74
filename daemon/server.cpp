#include "daemon/server.h"

#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "daemon/drafter_export.h"
#include "daemon/log.h"
#include "daemon/replies.h"
#include "daemon/requests.h"
#include "ipc/frame.h"

namespace ds4::daemon {

namespace fb = ipc::fb;

namespace {

constexpr size_t kReadBuf = 64 * 1024;
constexpr uint64_t kFlushTimeoutMs = 1000;  // after the worker stops: time left to write replies
// A connection being closed (refused, or after a fatal frame error) keeps reading, and
// dropping, what the client still sends for this long at most after its last reply, so
// the client's own writes never meet a closed socket (EPIPE/ECONNRESET would hide the
// reason from it).
constexpr uint64_t kDrainMs = 2000;
constexpr uint64_t kSweepMs = 250;          // how often connection deadlines are checked

}  // namespace

struct Conn {
    Server::Impl *server = nullptr;
    uv_pipe_t pipe{};
    uint64_t id = 0;
    std::shared_ptr<ConnShared> shared;
    ipc::FrameDecoder decoder;
    bool hello = false;
    bool reading = false;
    bool closing = false;           // uv_close issued
    bool close_when_flushed = false;  // no more requests: write what is queued, drain, close
    bool shut_wr = false;           // uv_shutdown issued
    uint64_t drain_deadline = 0;    // uv_now() after which a closing connection is dropped
    uint64_t waiting_since = 0;     // uv_now() since which Hello or the rest of a frame is awaited (0: none)
    size_t input_counted = 0;       // this connection's share of Impl::input_total
    uv_shutdown_t shutdown_req{};
    size_t pending_writes = 0;
    int drafter_shares = 0;         // GetDrafter replies sent (each passed a descriptor)
    std::unordered_set<uint64_t> inflight;  // request ids the worker has not finished
    char rbuf[kReadBuf];

    explicit Conn(ipc::Limits limits) : decoder(limits) {}
};

struct WriteReq {
    uv_write_t req{};
    Conn *conn = nullptr;
    std::vector<Frame> frames;
    std::vector<uv_buf_t> bufs;
    size_t bytes = 0;
};

struct Server::Impl {
    const DaemonOptions &opt;
    Worker &worker;
    OutQueue &out;
    ListenSocket &listen;
    ipc::Limits limits;
    uv_loop_t loop{};
    uv_pipe_t listener{};
    uv_async_t async{};
    uv_signal_t sigterm{}, sigint{};
    uv_timer_t flush_timer{};
    uv_timer_t sweep_timer{};
    bool listener_open = false;
    bool handles_closed = false;
    bool shutting_down = false;
    bool worker_done = false;
    bool shutdown_requested = false;
    uint64_t next_conn = 1;
    size_t draining = 0;            // connections in close_after_flush (not served any more)
    size_t input_total = 0;         // unfinished request bytes held across connections
    uint64_t last_overload_log = 0; // uv_now() of the last "closed at once" line (rate limit)
    std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns;
    std::vector<Outgoing> taken;    // the worker's output being written (on_async)
    uid_t uid = ::geteuid();
    DrafterExport *drafter_export = nullptr;  // null: no drafter, or --no-share-drafter

    Impl(const DaemonOptions &o, Worker &w, OutQueue &q, ListenSocket &l) : opt(o), worker(w), out(q), listen(l) {
        limits.max_frame = opt.max_frame;
    }

    // ---- writing ----

    void write_frames(Conn *c, std::vector<Frame> &&frames, size_t counted_bytes) {
        if (c->closing) return;
        auto *w = new WriteReq;
        w->conn = c;
        w->frames = std::move(frames);
        w->bytes = counted_bytes;
        for (auto &f : w->frames) w->bufs.push_back(uv_buf_init(reinterpret_cast<char *>(f.data()), unsigned(f.size())));
        w->req.data = w;
        int rc = uv_write(&w->req, reinterpret_cast<uv_stream_t *>(&c->pipe), w->bufs.data(), unsigned(w->bufs.size()),
                          on_write);
        if (rc != 0) {
            account_written(c, w->bytes);
            delete w;
            begin_close(c);
            return;
        }
        ++c->pending_writes;
    }

    // A reply produced by the loop itself: counted like the worker's output. Behind the rest
    // of a frame the worker wrote in part (it waits in the queue), the reply queues too.
    void reply(Conn *c, Frame &&f) {
        const size_t n = f.size();
        c->shared->queued_bytes.fetch_add(n, std::memory_order_relaxed);
        {
            std::lock_guard<std::mutex> lk(c->shared->wmu);
            ++c->shared->loop_frames;
            if (c->shared->remainder_queued) {
                out.push(Outgoing{c->id, std::move(f), 0, false});
                return;
            }
        }
        std::vector<Frame> v;
        v.push_back(std::move(f));
        write_frames(c, std::move(v), n);
    }

    void account_written(Conn *c, size_t bytes) {
        const size_t before = c->shared->queued_bytes.fetch_sub(bytes, std::memory_order_acq_rel);
        const size_t after = before - bytes;
        if (before >= opt.queue_bytes && after < opt.queue_bytes) {
            worker.wake();
            if (!c->reading && !c->closing && !c->close_when_flushed) start_reading(c);
        }
    }

    static void on_write(uv_write_t *req, int status) {
        auto *w = static_cast<WriteReq *>(req->data);
        Conn *c = w->conn;
        Impl *self = c->server;
        --c->pending_writes;
        {
            std::lock_guard<std::mutex> lk(c->shared->wmu);
            c->shared->loop_frames -= w->frames.size();
        }
        self->account_written(c, w->bytes);
        delete w;
        if (status != 0 && status != UV_ECANCELED) {
            self->begin_close(c);
            return;
        }
        if (c->close_when_flushed && self->flushed(c)) self->shut_write(c);
    }

    // ---- connection lifecycle ----

    void start_reading(Conn *c) {
        if (uv_read_start(reinterpret_cast<uv_stream_t *>(&c->pipe), on_alloc, on_read) == 0) c->reading = true;
        // Time spent paused by back-pressure is ds4d's doing, not the client's.
        if (c->waiting_since) c->waiting_since = uv_now(&loop);
    }

    void stop_reading(Conn *c) {
        if (c->reading) uv_read_stop(reinterpret_cast<uv_stream_t *>(&c->pipe));
        c->reading = false;
    }

    // No more requests: let queued replies go out, end our side of the stream, and drop what
    // the client still sends until it closes (or kDrainMs), then close. Closing at once
    // would turn the client's pending writes into EPIPE/ECONNRESET, losing the reply that
    // says why (a refusal, a bad frame).
    void close_after_flush(Conn *c) {
        if (c->closing || c->close_when_flushed) return;
        c->close_when_flushed = true;
        ++draining;
        drop_input(c);
        c->drain_deadline = uv_now(&loop) + kDrainMs;
        if (!c->reading) start_reading(c);
        if (flushed(c)) shut_write(c);
    }

    // Nothing of this connection is being written or waits in the queue for the loop.
    bool flushed(Conn *c) {
        if (c->pending_writes != 0) return false;
        std::lock_guard<std::mutex> lk(c->shared->wmu);
        return c->shared->loop_frames == 0;
    }

    void shut_write(Conn *c) {
        if (c->closing || c->shut_wr) return;
        c->shut_wr = true;
        {
            std::lock_guard<std::mutex> lk(c->shared->wmu);
            c->shared->write_shut = true;
        }
        c->drain_deadline = uv_now(&loop) + kDrainMs;
        c->shutdown_req.data = c;
        if (uv_shutdown(&c->shutdown_req, reinterpret_cast<uv_stream_t *>(&c->pipe), on_shutdown) != 0) begin_close(c);
    }

    static void on_shutdown(uv_shutdown_t *req, int status) {
        Conn *c = static_cast<Conn *>(req->data);
        if (status != 0 && status != UV_ECANCELED) c->server->begin_close(c);
    }

    // Drops connections whose drain time is over, and those that kept ds4d waiting for Hello
    // or for the rest of a frame longer than --client-timeout (while ds4d was reading).
    static void on_sweep(uv_timer_t *t) {
        Impl *self = static_cast<Impl *>(t->data);
        const uint64_t now = uv_now(&self->loop);
        const uint64_t timeout_ms = uint64_t(self->opt.client_timeout_s) * 1000;
        std::vector<Conn *> expired, idle;
        for (auto &[id, c] : self->conns) {
            if (c->closing) continue;
            if (c->close_when_flushed) {
                if (now >= c->drain_deadline) expired.push_back(c.get());
            } else if (c->reading && c->waiting_since && now - c->waiting_since >= timeout_ms) {
                idle.push_back(c.get());
            }
        }
        for (Conn *c : expired) self->begin_close(c);
        for (Conn *c : idle) {
            const bool partial = c->decoder.buffered() > 0;
            const std::string what = partial ? "did not finish a frame (" + std::to_string(c->decoder.buffered()) +
                                                   " bytes so far)"
                                             : "did not send Hello";
            log_line("connection %llu %s for %u s (--client-timeout); closing it",
                     static_cast<unsigned long long>(c->id), what.c_str(), self->opt.client_timeout_s);
            self->reply(c, error_frame(0, partial ? fb::ErrorCode::BadFrame : fb::ErrorCode::Protocol,
                                       "the connection " + what + " for " + std::to_string(self->opt.client_timeout_s) +
                                           " s (ds4d --client-timeout); closing it"));
            self->close_after_flush(c);
        }
    }

    // ---- input accounting (--input-budget) ----

    void count_input(Conn *c) {
        const size_t now_held = c->decoder.buffered();
        input_total = input_total - c->input_counted + now_held;
        c->input_counted = now_held;
    }

    void drop_input(Conn *c) {
        c->decoder = ipc::FrameDecoder(limits);  // frees the buffer
        count_input(c);
    }

    void begin_close(Conn *c) {
        if (c->closing) return;
        c->closing = true;
        if (c->close_when_flushed) --draining;
        drop_input(c);
        stop_reading(c);
        {
            std::lock_guard<std::mutex> lk(c->shared->wmu);   // no direct write is under way
            c->shared->closed.store(true, std::memory_order_release);
        }
        worker.disconnect(c->shared);
        uv_close(reinterpret_cast<uv_handle_t *>(&c->pipe), on_conn_closed);
    }

    static void on_conn_closed(uv_handle_t *h) {
        Conn *c = static_cast<Conn *>(h->data);
        Impl *self = c->server;
        self->conns.erase(c->id);
        self->maybe_finish();
    }

    static void on_connection(uv_stream_t *server, int status) {
        Impl *self = static_cast<Impl *>(server->data);
        if (status < 0) {
            log_line("accept failed: %s", uv_strerror(status));
            return;
        }
        auto conn = std::make_unique<Conn>(self->limits);
        Conn *c = conn.get();
        c->server = self;
        c->id = self->next_conn++;
        c->shared = std::make_shared<ConnShared>(c->id);
        uv_pipe_init(&self->loop, &c->pipe, 0);
        c->pipe.data = c;
        if (int rc = uv_accept(server, reinterpret_cast<uv_stream_t *>(&c->pipe)); rc != 0) {
            // libuv already reset the client (e.g. out of file descriptors): say so.
            log_line("could not accept a connection: %s", uv_strerror(rc));
            uv_close(reinterpret_cast<uv_handle_t *>(&c->pipe), [](uv_handle_t *h) { delete static_cast<Conn *>(h->data); });
            conn.release();
            return;
        }
        self->conns.emplace(c->id, std::move(conn));
        c->waiting_since = uv_now(&self->loop);
        const size_t served = self->conns.size() - 1 - self->draining;
        if (served >= self->opt.max_connections) {
            // Refused connections drain for a while; a flood of them must not hold every fd.
            if (self->draining >= self->opt.max_connections) {
                const uint64_t now = uv_now(&self->loop);
                if (now - self->last_overload_log >= 1000) {
                    self->last_overload_log = now;
                    log_line("closing new connections at once: %zu served and %zu being refused (--max-connections %u)",
                             served, self->draining, self->opt.max_connections);
                }
                self->begin_close(c);
                return;
            }
            log_line("refused connection %llu: %zu connections are open (--max-connections %u)",
                     static_cast<unsigned long long>(c->id), served, self->opt.max_connections);
            self->reply(c, error_frame(0, fb::ErrorCode::Busy,
                                       "ds4d serves at most " + std::to_string(self->opt.max_connections) +
                                           " connections at once (--max-connections); try again later"));
            self->close_after_flush(c);
            return;
        }
        uv_os_fd_t fd = -1;
        uv_fileno(reinterpret_cast<uv_handle_t *>(&c->pipe), &fd);
        struct ucred cred {};
        socklen_t len = sizeof cred;
        if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != self->uid) {
            log_line("refused a client with uid %d (ds4d runs as uid %d)", int(cred.uid), int(self->uid));
            self->reply(c, error_frame(0, fb::ErrorCode::PermissionDenied,
                                       "ds4d serves only its own user (uid " + std::to_string(self->uid) + ")"));
            self->close_after_flush(c);
            return;
        }
        {
            std::lock_guard<std::mutex> lk(c->shared->wmu);
            c->shared->fd = fd;   // the worker may write replies here itself (ConnShared)
        }
        self->start_reading(c);
    }

    static void on_alloc(uv_handle_t *h, size_t, uv_buf_t *buf) {
        Conn *c = static_cast<Conn *>(h->data);
        *buf = uv_buf_init(c->rbuf, sizeof c->rbuf);
    }

    static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
        Conn *c = static_cast<Conn *>(s->data);
        Impl *self = c->server;
        if (nread < 0) {
            self->begin_close(c);
            return;
        }
        if (nread == 0 || c->close_when_flushed) return;  // draining: dropped unread
        c->decoder.feed(reinterpret_cast<const uint8_t *>(buf->base), size_t(nread));
        bool completed = false;
        for (;;) {
            auto st = c->decoder.next();
            if (st == ipc::FrameDecoder::Status::NeedMore) break;
            if (st == ipc::FrameDecoder::Status::Error) {
                const auto code = c->decoder.error() == ipc::FrameError::TooLarge ? fb::ErrorCode::FrameTooLarge
                                                                                  : fb::ErrorCode::BadFrame;
                log_line("connection %llu: %s; closing it", static_cast<unsigned long long>(c->id),
                         c->decoder.error_message().c_str());
                self->reply(c, error_frame(0, code, c->decoder.error_message()));
                self->close_after_flush(c);
                return;
            }
            self->handle_frame(c, c->decoder.envelope());
            completed = true;
            if (c->closing || c->close_when_flushed) return;
        }
        self->count_input(c);
        // The clock runs from connecting until Hello, and from a frame's first byte until its
        // last: a client that trickles bytes cannot hold a connection (and its buffer) forever.
        if (c->hello && c->decoder.buffered() == 0) c->waiting_since = 0;
        else if (completed || !c->waiting_since) c->waiting_since = uv_now(&self->loop);
        if (self->input_total > self->opt.input_budget) {
            log_line("refused connection %llu: unfinished requests hold %zu bytes across connections (--input-budget %zu)",
                     static_cast<unsigned long long>(c->id), self->input_total, self->opt.input_budget);
            self->reply(c, error_frame(0, fb::ErrorCode::Busy,
                                       "ds4d holds too much unfinished request data across connections (--input-budget " +
                                           std::to_string(self->opt.input_budget) + " bytes); try again later"));
            self->close_after_flush(c);
            return;
        }
        if (c->shared->queued_bytes.load(std::memory_order_acquire) >= self->opt.queue_bytes) self->stop_reading(c);
    }

    // ---- requests ----

    void handle_frame(Conn *c, const fb::Envelope *env) {
        const uint64_t rid = env->request_id();
        if (env->body_type() == fb::Message::GetDrafter)
            return share_drafter(c, rid, env->body_as_GetDrafter()->device());
        ParseResult pr = parse_request(env);
        switch (pr.kind) {
        case ParseResult::Kind::Reject: reply(c, error_frame(rid, pr.code, pr.message)); return;
        case ParseResult::Kind::Hello:
            if (pr.hello_version != ipc::kProtocolVersion) {
                reply(c, error_frame(rid, fb::ErrorCode::VersionMismatch,
                                     "client speaks protocol " + std::to_string(pr.hello_version) + ", ds4d speaks " +
                                         std::to_string(ipc::kProtocolVersion)));
                close_after_flush(c);
                return;
            }
            c->hello = true;
            reply(c, hello_ok_frame(rid, worker.model(), worker.default_ctx(), uint32_t(opt.max_frame)));
            return;
        case ParseResult::Kind::Cancel:
            if (!c->hello) return reply(c, error_frame(rid, fb::ErrorCode::Protocol, "send Hello first"));
            worker.cancel(c->shared, pr.cancel_target);
            return;
        case ParseResult::Kind::Request: break;
        }
        if (!c->hello) return reply(c, error_frame(rid, fb::ErrorCode::Protocol, "send Hello first"));
        if (rid == 0) return reply(c, error_frame(0, fb::ErrorCode::Protocol, "request id 0 is reserved"));
        if (shutting_down) return reply(c, error_frame(rid, fb::ErrorCode::ShuttingDown, "ds4d is shutting down"));
        if (c->inflight.count(rid))
            return reply(c, error_frame(rid, fb::ErrorCode::BadRequest,
                                        "request id " + std::to_string(rid) + " is still running on this connection"));
        if (c->inflight.size() >= opt.max_inflight)
            return reply(c, error_frame(rid, fb::ErrorCode::Busy,
                                        std::to_string(c->inflight.size()) + " requests are running on this connection"));
        if (auto *st = std::get_if<StatsParams>(&pr.body)) {
            st->connections = uint32_t(conns.size());
            if (drafter_export && drafter_export->ready()) st->drafter = drafter_export->sharing();
        }
        c->inflight.insert(rid);
        worker.submit(Request{c->shared, rid, std::move(pr.body)});
    }

    // GetDrafter, answered by the loop itself (the export is fixed after start-up): the reply
    // frame goes out with sendmsg so the memfd rides on its first byte. Only when nothing
    // else is still queued on the connection, so frames stay in order.
    void share_drafter(Conn *c, uint64_t rid, bool want_device) {
        if (!c->hello) return reply(c, error_frame(rid, fb::ErrorCode::Protocol, "send Hello first"));
        if (rid == 0) return reply(c, error_frame(0, fb::ErrorCode::Protocol, "request id 0 is reserved"));
        if (shutting_down) return reply(c, error_frame(rid, fb::ErrorCode::ShuttingDown, "ds4d is shutting down"));
        if (!drafter_export || !drafter_export->ready())
            return reply(c, error_frame(rid, fb::ErrorCode::NotImplemented,
                                        opt.drafter_path.empty() ? "ds4d runs without a drafter (--drafter PATH)"
                                                                 : "ds4d does not share its drafter (--no-share-drafter)"));
        if (c->drafter_shares >= kDrafterSharesPerConnection)
            return reply(c, error_frame(rid, fb::ErrorCode::Busy,
                                        "this connection already received the drafter " +
                                            std::to_string(kDrafterSharesPerConnection) + " times"));
        // Held while the frame goes out, so the worker does not write in between.
        std::unique_lock<std::mutex> wlk(c->shared->wmu);
        auto *stream = reinterpret_cast<uv_stream_t *>(&c->pipe);
        if (uv_stream_get_write_queue_size(stream) != 0 || c->shared->loop_frames != 0) {
            wlk.unlock();
            return reply(c, error_frame(rid, fb::ErrorCode::Busy,
                                        "replies are still being written on this connection; ask again"));
        }
        uv_os_fd_t fd = -1;
        uv_fileno(reinterpret_cast<uv_handle_t *>(&c->pipe), &fd);
        // The device handle too when the peer asks (its drafter runs on a GPU) and ds4d's
        // drafter is exportable from device memory.
        const bool device = want_device && drafter_export->has_device();
        Frame f = drafter_export->share_frame(rid, device);
        const long n = drafter_export->send_share(fd, f, device);
        if (n >= 0 && size_t(n) < f.size()) {
            // The rest goes out through the loop; counted before the worker may look again.
            ++c->shared->loop_frames;
            c->shared->queued_bytes.fetch_add(f.size() - size_t(n), std::memory_order_relaxed);
        }
        wlk.unlock();
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return reply(c, error_frame(rid, fb::ErrorCode::Busy, "the connection is not reading; ask again"));
            return begin_close(c);
        }
        struct ucred cred {};
        socklen_t len = sizeof cred;
        if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) cred = {};
        drafter_export->record_share(int32_t(cred.pid), uint32_t(cred.uid));
        if (c->drafter_shares++ == 0)
            log_line("connection %llu: shared the drafter with pid %d (%llu bytes, read-only%s)",
                     static_cast<unsigned long long>(c->id), int(cred.pid),
                     static_cast<unsigned long long>(drafter_export->bytes()),
                     device ? ", and its GPU weights" : "");
        if (size_t(n) < f.size()) {
            std::vector<Frame> rest;
            rest.push_back(Frame(f.begin() + n, f.end()));
            write_frames(c, std::move(rest), f.size() - size_t(n));
        }
    }

    // ---- worker output ----

    static void on_async(uv_async_t *a) {
        Impl *self = static_cast<Impl *>(a->data);
        std::vector<Outgoing> &batch = self->taken;   // reused: its storage is kept
        self->out.take(batch);
        // Group per connection, keeping order, so each connection gets one writev. A batch
        // rarely spans more than a few connections: a linear scan beats a map here.
        struct Slot {
            Conn *conn;
            std::vector<Frame> frames;
            size_t bytes = 0;
        };
        std::vector<Slot> slots;
        bool done = false;
        for (Outgoing &o : batch) {
            if (o.conn == 0) {
                done = true;
                continue;
            }
            Slot *slot = nullptr;
            for (auto &s : slots)
                if (s.conn->id == o.conn) slot = &s;
            if (!slot) {
                auto it = self->conns.find(o.conn);
                if (it == self->conns.end()) continue;  // closed: its accounting died with it
                slots.push_back(Slot{it->second.get(), {}, 0});
                slot = &slots.back();
            }
            if (o.final) slot->conn->inflight.erase(o.request_id);
            if (o.bytes.empty()) continue;   // the worker wrote the frame itself; only the end is news
            slot->bytes += o.bytes.size();
            slot->frames.push_back(std::move(o.bytes));
        }
        for (Slot &s : slots) {
            if (s.conn->closing) {
                s.conn->shared->queued_bytes.fetch_sub(s.bytes, std::memory_order_acq_rel);
                continue;
            }
            if (s.frames.empty()) continue;
            self->write_frames(s.conn, std::move(s.frames), s.bytes);
            // A remainder of this connection is in this batch if anywhere (the worker writes
            // nothing itself while these frames are counted): it is in the stream's order
            // now, so the loop's replies may go straight on.
            std::lock_guard<std::mutex> lk(s.conn->shared->wmu);
            s.conn->shared->remainder_queued = false;
        }
        if (done) self->on_worker_done();
    }

    // ---- shutdown ----

    static void on_signal(uv_signal_t *s, int signum) {
        Impl *self = static_cast<Impl *>(s->data);
        if (self->shutting_down) {
            log_line("second %s: cancelling running requests now", signum == SIGINT ? "SIGINT" : "SIGTERM");
            self->worker.shutdown(std::chrono::milliseconds(0));
            return;
        }
        log_line("%s: shutting down", signum == SIGINT ? "SIGINT" : "SIGTERM");
        self->shutdown_requested = true;
        self->begin_shutdown();
    }

    void begin_shutdown() {
        if (shutting_down) return;
        shutting_down = true;
        if (listener_open) {
            listener_open = false;
            uv_close(reinterpret_cast<uv_handle_t *>(&listener), nullptr);
        }
        listen.remove_file();
        worker.shutdown(std::chrono::milliseconds(opt.shutdown_grace_ms));
    }

    void on_worker_done() {
        if (worker_done) return;
        worker_done = true;
        if (!shutting_down) {
            log_line("the worker stopped; shutting down");
            begin_shutdown();
        }
        for (auto &[id, c] : conns) close_after_flush(c.get());
        uv_timer_start(&flush_timer, on_flush_timeout, kFlushTimeoutMs, 0);
        maybe_finish();
    }

    static void on_flush_timeout(uv_timer_t *t) {
        Impl *self = static_cast<Impl *>(t->data);
        for (auto &[id, c] : self->conns) self->begin_close(c.get());
        self->maybe_finish();
    }

    void maybe_finish() {
        if (!worker_done || !conns.empty() || handles_closed) return;
        handles_closed = true;
        uv_close(reinterpret_cast<uv_handle_t *>(&async), nullptr);
        uv_close(reinterpret_cast<uv_handle_t *>(&sigterm), nullptr);
        uv_close(reinterpret_cast<uv_handle_t *>(&sigint), nullptr);
        uv_close(reinterpret_cast<uv_handle_t *>(&flush_timer), nullptr);
        uv_close(reinterpret_cast<uv_handle_t *>(&sweep_timer), nullptr);
    }
};

Server::Server(const DaemonOptions &opt, Worker &worker, OutQueue &out, ListenSocket &listen)
    : impl_(std::make_unique<Impl>(opt, worker, out, listen)) {
    Impl &s = *impl_;
    uv_loop_init(&s.loop);
    uv_async_init(&s.loop, &s.async, Impl::on_async);
    s.async.data = &s;
    out.attach(&s.async);
    uv_signal_init(&s.loop, &s.sigterm);
    uv_signal_init(&s.loop, &s.sigint);
    s.sigterm.data = s.sigint.data = &s;
    uv_timer_init(&s.loop, &s.flush_timer);
    s.flush_timer.data = &s;
    uv_timer_init(&s.loop, &s.sweep_timer);
    s.sweep_timer.data = &s;
    uv_pipe_init(&s.loop, &s.listener, 0);
    s.listener.data = &s;
}

void Server::share_drafter(DrafterExport *e) { impl_->drafter_export = e; }

Server::~Server() {
    uv_loop_close(&impl_->loop);
}

int Server::run() {
    Impl &s = *impl_;
    int fd = s.listen.fd();
    int rc = uv_pipe_open(&s.listener, fd);
    if (rc == 0) {
        s.listen.release_fd();
        rc = uv_listen(reinterpret_cast<uv_stream_t *>(&s.listener), 128, Impl::on_connection);
    }
    if (rc != 0) {
        log_line("cannot listen on %s: %s", s.opt.socket_path.c_str(), uv_strerror(rc));
        s.shutdown_requested = false;
        uv_close(reinterpret_cast<uv_handle_t *>(&s.listener), nullptr);
        s.shutting_down = true;
        s.listen.remove_file();
        s.worker.shutdown(std::chrono::milliseconds(0));
    } else {
        s.listener_open = true;
    }
    uv_signal_start(&s.sigterm, Impl::on_signal, SIGTERM);
    uv_signal_start(&s.sigint, Impl::on_signal, SIGINT);
    uv_timer_start(&s.sweep_timer, Impl::on_sweep, kSweepMs, kSweepMs);
    uv_run(&s.loop, UV_RUN_DEFAULT);
    return (rc == 0 && s.shutdown_requested) ? 0 : 1;
}

}  // namespace ds4::daemon
