// The worker thread: start-up, the command queue, the loop that runs one batched step at a
// time (generation.cpp), and shutdown. Requests are handled in handlers.cpp.
#include <sys/socket.h>

#include <algorithm>
#include <string_view>

#include "daemon/log.h"
#include "daemon/worker_impl.h"

namespace ds4::daemon {

void Worker::Impl::emit(const std::shared_ptr<ConnShared> &conn, uint64_t rid, Frame &&bytes, bool final) {
    if (!conn || conn->closed.load(std::memory_order_acquire)) return;
    // A client refuses frames above its limit (and drops the connection), so an oversized
    // reply becomes this request's error instead.
    if (bytes.size() > cfg.max_reply + 4) {
        log_line("request %llu: a reply of %zu bytes exceeds the frame limit of %zu; sent an error instead",
                 static_cast<unsigned long long>(rid), bytes.size() - 4, cfg.max_reply);
        bytes = error_frame(rid, fb::ErrorCode::BadRequest,
                            "the reply (" + std::to_string(bytes.size() - 4) + " bytes) would exceed the frame limit of " +
                                std::to_string(cfg.max_reply) + " bytes (--max-frame); ask for less at a time");
        final = true;
    }
    std::lock_guard<std::mutex> lk(conn->wmu);
    if (conn->closed.load(std::memory_order_acquire)) return;
    if (cfg.direct_writes && conn->loop_frames == 0 && !conn->write_shut && conn->fd >= 0) {
        // Nothing of this connection is with the loop: write the frame here (the socket is
        // non-blocking), which saves waking the loop thread for every token.
        const ssize_t n = ::send(conn->fd, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n == ssize_t(bytes.size())) {
            // The loop still has to know the request ended (its in-flight set).
            if (final) out.push(Outgoing{conn->id, {}, rid, true});
            return;
        }
        if (n > 0) {
            bytes.erase(bytes.begin(), bytes.begin() + n);
            conn->remainder_queued = true;
        }
        // n < 0 (the socket is full, or failed): the loop writes it and meets what is wrong
    }
    ++conn->loop_frames;
    conn->queued_bytes.fetch_add(bytes.size(), std::memory_order_relaxed);
    out.push(Outgoing{conn->id, std::move(bytes), rid, final});
}

void Worker::Impl::reply_error(const Request &r, fb::ErrorCode code, const std::string &msg) {
    if (!defer_why.empty()) return;   // the request waits (kv_budget.cpp) and is answered later
    emit(r.conn, r.id, error_frame(r.id, code, msg), true);
}

void Worker::Impl::open_model() {
    ModelOpenConfig mc = cfg.model;
    if (cfg.backend_auto) {
        mc.backend = ModelOpenConfig::Backend::Cuda;
        try {
            model = std::make_unique<BridgeModel>(mc);
        } catch (const BridgeFailure &e) {
            // A drafter that does not fit the model fails on any backend: say so once.
            if (std::string_view(e.what()).find("does not fit the model") != std::string_view::npos) throw;
            log_line("CUDA backend unavailable (%s); using the CPU backend", e.what());
            mc.backend = ModelOpenConfig::Backend::Cpu;
        }
    }
    if (!model) model = std::make_unique<BridgeModel>(mc);
    model_summary = model->summary();
    draft_max = model->model().spec_counters().draft_max;
    if (draft_max > 0)
        log_line("speculative decoding: drafter %s, at most %d drafts per trial", cfg.model.drafter_path.c_str(), draft_max);
    const uint32_t limit = model_summary.n_ctx_max;
    if (cfg.ctx) {
        if (limit && cfg.ctx > limit)
            throw BridgeFailure("--ctx " + std::to_string(cfg.ctx) + " exceeds the model's context limit of " +
                                std::to_string(limit));
        default_ctx = cfg.ctx;
    } else {
        default_ctx = limit ? std::min<uint32_t>(4096, limit) : 4096;
    }
    try {
        template_prefix = model->render_chat({}, false, false);
    } catch (const BridgeFailure &) {
        template_prefix.clear();
    }
    // One real forward before the socket exists: failures show up now, and the first
    // client does not pay for lazy allocation. The session is kept for reuse.
    std::vector<int32_t> warm;
    try {
        warm = model->tokenize("Hello", false);
    } catch (const BridgeFailure &e) {
        log_line("text prompts will be refused: %s", e.what());  // token prompts still work
    }
    if (warm.empty()) warm.push_back(0);
    auto bs = std::make_unique<BridgeSession>(*model, int(default_ctx));
    bs->sync(warm);
    (void)bs->argmax();
    pool.push_back(Pooled{std::move(bs), warm});
    batch = std::make_unique<ds4::bridge::Batch>(model->model());
    fingerprint = model->fingerprint();
    if (cfg.store) {
        saver = std::make_unique<SessionSaver>(*cfg.store);
        for (const std::string &n : cfg.store->recovery_report().quarantined_sessions) quarantined.insert(n);
    }
}

void Worker::Impl::on_cancel(const std::shared_ptr<ConnShared> &conn, uint64_t target) {
    for (auto it = deferred.begin(); it != deferred.end(); ++it)
        if (it->request.conn->id == conn->id && it->request.id == target) {
            emit(conn, target, error_frame(target, fb::ErrorCode::SessionLimit, "cancelled while waiting: " + it->why),
                 true);
            deferred.erase(it);
            retry_state = 0;   // the next one is tried afresh
            return;
        }
    for (auto &j : jobs)
        if (j->conn->id == conn->id && j->rid == target) {
            finish_job(*j, fb::FinishReason::Cancelled);
            return;
        }
}

void Worker::Impl::on_disconnect(const std::shared_ptr<ConnShared> &conn) {
    deferred.remove_if([&](const Deferred &d) { return d.request.conn->id == conn->id; });
    retry_state = 0;
    for (auto it = jobs.begin(); it != jobs.end();) {
        Job &j = **it++;
        if (j.conn->id == conn->id) end_job(j);
    }
    for (auto it = sessions.begin(); it != sessions.end();) {
        LiveSession *s = it->second.get();
        ++it;
        if (s->owner == conn->id) erase_session(s);
    }
}

void Worker::Impl::cancel_all() {
    while (!jobs.empty()) finish_job(*jobs.front(), fb::FinishReason::Cancelled);
}

void Worker::Impl::process(std::vector<Command> &cmds) {
    for (Command &c : cmds) {
        switch (c.kind) {
        case Command::Kind::Request: handle(c.request); break;
        case Command::Kind::Cancel: on_cancel(c.conn, c.target); break;
        case Command::Kind::Disconnect: on_disconnect(c.conn); break;
        case Command::Kind::Shutdown:
            if (!stopping) {
                stopping = true;
                deadline = Clock::now() + c.grace;
            } else {
                deadline = std::min(deadline, Clock::now() + c.grace);
            }
            break;
        }
    }
}

void Worker::Impl::loop() {
    for (;;) {
        std::vector<Command> cmds;
        {
            std::lock_guard<std::mutex> lk(mu);
            cmds.swap(commands);
            woken = false;
        }
        process(cmds);
        retry_deferred();
        if (stopping && !jobs.empty() && Clock::now() >= deadline) cancel_all();
        if (stopping && jobs.empty()) return;
        if (run_step()) continue;
        std::unique_lock<std::mutex> lk(mu);
        auto ready = [&] { return !commands.empty() || woken; };
        if (stopping)
            cv.wait_until(lk, deadline, ready);
        else if (const Clock::time_point t = next_wait_deadline(); t != Clock::time_point::max())
            cv.wait_until(lk, t, ready);   // a waiting request times out then
        else
            cv.wait(lk, ready);
    }
}

void Worker::Impl::teardown() {
    saver.reset();  // every queued save becomes durable (or is logged as failed) first
    deferred.clear();
    jobs.clear();
    sessions.clear();
    names.clear();
    pool.clear();
    model.reset();
}

void Worker::Impl::main(std::promise<void> &ready) {
    try {
        open_model();
    } catch (...) {
        teardown();
        ready.set_exception(std::current_exception());
        return;
    }
    ready.set_value();
    try {
        loop();
    } catch (const std::exception &e) {
        log_line("worker stopped on an unexpected error: %s", e.what());
    }
    teardown();
    out.push(Outgoing{});  // conn 0: the worker is done
}

void Worker::Impl::push(Command &&c) {
    {
        std::lock_guard<std::mutex> lk(mu);
        commands.push_back(std::move(c));
    }
    cv.notify_one();
}


Worker::Worker(WorkerConfig cfg, OutQueue &out) : impl_(std::make_unique<Impl>(std::move(cfg), out)) {}

Worker::~Worker() {
    if (impl_->thread.joinable()) {
        shutdown(std::chrono::milliseconds(0));
        impl_->thread.join();
    }
}

void Worker::start() {
    std::promise<void> ready;
    auto fut = ready.get_future();
    impl_->thread = std::thread([this, &ready] { impl_->main(ready); });
    try {
        fut.get();
    } catch (...) {
        impl_->thread.join();
        throw;
    }
}

const ModelSummary &Worker::model() const { return impl_->model_summary; }
uint32_t Worker::default_ctx() const { return impl_->default_ctx; }

void Worker::submit(Request r) {
    Command c{Command::Kind::Request, std::move(r), nullptr, 0, {}};
    impl_->push(std::move(c));
}

void Worker::cancel(const std::shared_ptr<ConnShared> &conn, uint64_t target) {
    impl_->push(Command{Command::Kind::Cancel, {}, conn, target, {}});
}

void Worker::disconnect(const std::shared_ptr<ConnShared> &conn) {
    impl_->push(Command{Command::Kind::Disconnect, {}, conn, 0, {}});
}

void Worker::shutdown(std::chrono::milliseconds grace) {
    impl_->push(Command{Command::Kind::Shutdown, {}, nullptr, 0, grace});
}

void Worker::wake() {
    {
        std::lock_guard<std::mutex> lk(impl_->mu);
        impl_->woken = true;
    }
    impl_->cv.notify_one();
}

void Worker::join() {
    if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace ds4::daemon
