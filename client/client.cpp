#include "client/ds4client.hpp"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "ipc/frame.h"
#include "ipc/socket_path.h"

namespace ds4::client {

namespace fb = ipc::fb;

ServerError::ServerError(int code_, std::string code_name_, std::string message, uint64_t request_id_)
    : std::runtime_error("ds4d: " + code_name_ + ": " + message),
      code(code_),
      code_name(std::move(code_name_)),
      server_message(std::move(message)),
      request_id(request_id_) {}

const char *finish_reason_name(FinishReason r) {
    return ipc::finish_reason_name(static_cast<fb::FinishReason>(r));
}

namespace {

std::string str(const flatbuffers::String *s) { return s ? s->str() : std::string(); }

ModelInfo to_model(const fb::ModelInfo *m) {
    ModelInfo out;
    if (!m) return out;
    out.family = str(m->family());
    out.name = str(m->name());
    out.backend = str(m->backend());
    out.n_layer = m->n_layer();
    out.n_embd = m->n_embd();
    out.n_vocab = m->n_vocab();
    out.n_ctx_max = m->n_ctx_max();
    out.n_head = m->n_head();
    out.n_expert = m->n_expert();
    out.chat_template = m->chat_template();
    return out;
}

[[noreturn]] void throw_server_error(const fb::Envelope *env) {
    const fb::Error *e = env->body_as_Error();
    throw ServerError(int(e->code()), ipc::error_code_name(e->code()), str(e->message()), env->request_id());
}

[[noreturn]] void unexpected(const fb::Envelope *env, const char *wanted) {
    throw ProtocolError(std::string("ds4d sent ") + fb::EnumNameMessage(env->body_type()) + " where " + wanted +
                        " was expected");
}

}  // namespace

struct Client::Impl {
    std::string path;
    std::string name;
    int fd = -1;
    ServerInfo info;
    std::atomic<uint64_t> next_rid{1};
    std::mutex write_mu;
    ipc::FrameDecoder decoder;
    int interrupt_fd = -1;
    std::vector<uint8_t> rbuf = std::vector<uint8_t>(64 * 1024);

    ~Impl() { close_fd(); }

    void close_fd() {
        if (fd >= 0) ::close(fd);
        fd = -1;
    }

    bool in_fallback_dir() const { return ipc::parent_dir(path) == ipc::fallback_socket_dir(); }

    void connect_socket() {
        close_fd();
        decoder = ipc::FrameDecoder();
        if (path.size() > ipc::kMaxSocketPath)
            throw ConnectError("socket path is longer than " + std::to_string(ipc::kMaxSocketPath) + " bytes: " + path);
        int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s < 0) throw ConnectError(std::string("socket(): ") + std::strerror(errno));
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::memcpy(addr.sun_path, path.data(), path.size());
        int rc;
        do rc = ::connect(s, reinterpret_cast<sockaddr *>(&addr), sizeof addr);
        while (rc < 0 && errno == EINTR);
        if (rc < 0) {
            int e = errno;
            ::close(s);
            std::string why = std::string(": ") + std::strerror(e);
            // When the fallback directory exists but is not ours and private, that is the story.
            struct stat st {};
            if (in_fallback_dir() && ::lstat(ipc::fallback_socket_dir().c_str(), &st) == 0) {
                const std::string dir_problem = ipc::check_private_dir(ipc::fallback_socket_dir(), ::geteuid());
                if (!dir_problem.empty()) why += " (" + dir_problem + ")";
            }
            throw ConnectError("cannot connect to ds4d at " + path + why);
        }
        // Whoever listens gets our prompts: it must be our own user, checked before any byte
        // is sent (another user may have bound the path first).
        struct ucred cred {};
        socklen_t len = sizeof cred;
        if (::getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
            int e = errno;
            ::close(s);
            throw ConnectError("cannot check who listens on " + path + ": " + std::strerror(e));
        }
        if (cred.uid != ::geteuid()) {
            ::close(s);
            throw ConnectError("refusing to talk to the server at " + path + ": it runs as uid " +
                               std::to_string(cred.uid) + " (pid " + std::to_string(cred.pid) + "), not as uid " +
                               std::to_string(::geteuid()) +
                               "; another user may have taken the socket path. Nothing was sent");
        }
        if (in_fallback_dir()) {
            const std::string dir_problem = ipc::check_private_dir(ipc::fallback_socket_dir(), ::geteuid());
            if (!dir_problem.empty()) {
                ::close(s);
                throw ConnectError("refusing to use " + path + ": " + dir_problem);
            }
        }
        fd = s;
    }

    uint64_t rid() { return next_rid.fetch_add(1); }

    void send_bytes(const uint8_t *p, size_t n) {
        std::lock_guard<std::mutex> lk(write_mu);
        if (fd < 0) throw ProtocolError("not connected to ds4d");
        while (n > 0) {
            ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
            if (w < 0) {
                if (errno == EINTR) continue;
                const int e = errno;
                if (e == EPIPE || e == ECONNRESET) throw_pending_error();
                throw ProtocolError(std::string("lost the connection to ds4d: ") + std::strerror(e));
            }
            p += w;
            n -= size_t(w);
        }
    }

    // The daemon closed while we were writing: it usually said why first (a refusal, a
    // frame error). Throws that Error if it is already in the socket; returns otherwise.
    void throw_pending_error() {
        for (;;) {
            auto st = decoder.next();
            if (st == ipc::FrameDecoder::Status::Frame) {
                const fb::Envelope *env = decoder.envelope();
                if (env->body_type() == fb::Message::Error) throw_server_error(env);
                continue;
            }
            if (st == ipc::FrameDecoder::Status::Error) return;
            ssize_t r = ::recv(fd, rbuf.data(), rbuf.size(), MSG_DONTWAIT);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) return;
            decoder.feed(rbuf.data(), size_t(r));
        }
    }

    void send(const flatbuffers::FlatBufferBuilder &fbb) { send_bytes(fbb.GetBufferPointer(), fbb.GetSize()); }

    // Next frame from the daemon; valid until the next call. on_interrupt runs when the
    // interrupt fd becomes readable (after draining it).
    const fb::Envelope *read_frame(const std::function<void()> &on_interrupt = {}) {
        for (;;) {
            auto st = decoder.next();
            if (st == ipc::FrameDecoder::Status::Frame) return decoder.envelope();
            if (st == ipc::FrameDecoder::Status::Error)
                throw ProtocolError("unreadable frame from ds4d: " + decoder.error_message());
            if (fd < 0) throw ProtocolError("not connected to ds4d");
            // With an interrupt fd to watch, poll both; without one, the blocking recv alone
            // waits (one system call a frame instead of two: a streamed token is a frame).
            if (on_interrupt && interrupt_fd >= 0) {
                pollfd pfd[2] = {{fd, POLLIN, 0}, {interrupt_fd, POLLIN, 0}};
                int rc = ::poll(pfd, 2, -1);
                if (rc < 0) {
                    if (errno == EINTR) continue;
                    throw ProtocolError(std::string("poll(): ") + std::strerror(errno));
                }
                if (pfd[1].revents & POLLIN) {
                    char sink[64];
                    while (::read(interrupt_fd, sink, sizeof sink) == ssize_t(sizeof sink)) {
                    }
                    on_interrupt();
                }
                if (!(pfd[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            }
            ssize_t r = ::recv(fd, rbuf.data(), rbuf.size(), 0);
            if (r < 0) {
                if (errno == EINTR || errno == EAGAIN) continue;
                int e = errno;
                close_fd();
                throw ProtocolError(std::string("lost the connection to ds4d: ") + std::strerror(e));
            }
            if (r == 0) {
                close_fd();
                throw ProtocolError("ds4d closed the connection");
            }
            decoder.feed(rbuf.data(), size_t(r));
        }
    }

    // Reads until the reply to rid; Error replies (and unattributed errors) throw.
    const fb::Envelope *await(uint64_t rid) {
        for (;;) {
            const fb::Envelope *env = read_frame();
            const bool is_error = env->body_type() == fb::Message::Error;
            if (is_error && (env->request_id() == rid || env->request_id() == 0)) throw_server_error(env);
            if (env->request_id() == rid) return env;
            // A late frame of an earlier request (e.g. one abandoned by an exception): skip.
        }
    }

    void do_hello() {
        flatbuffers::FlatBufferBuilder fbb;
        const uint64_t id = rid();
        ipc::finish_frame(fbb, id, fb::CreateHelloDirect(fbb, ipc::kProtocolVersion, name.c_str()));
        send(fbb);
        const fb::Envelope *env = await(id);
        const fb::HelloOk *ok = env->body_as_HelloOk();
        if (!ok) unexpected(env, "HelloOk");
        info.protocol_version = ok->protocol_version();
        info.server = str(ok->server());
        info.model = to_model(ok->model());
        info.default_ctx = ok->default_ctx();
        info.max_frame = ok->max_frame();
        if (info.protocol_version != ipc::kProtocolVersion)
            throw ProtocolError("ds4d speaks protocol " + std::to_string(info.protocol_version) + ", this client " +
                                std::to_string(ipc::kProtocolVersion));
    }
};

Client::Client(std::string socket_path, std::string client_name) : impl_(std::make_unique<Impl>()) {
    impl_->path = socket_path.empty() ? ipc::default_socket_path() : std::move(socket_path);
    impl_->name = std::move(client_name);
    impl_->connect_socket();
    impl_->do_hello();
}

Client::~Client() = default;

void Client::reconnect() {
    impl_->connect_socket();
    impl_->do_hello();
}

void Client::disconnect() { impl_->close_fd(); }
bool Client::connected() const { return impl_->fd >= 0; }
const std::string &Client::socket_path() const { return impl_->path; }

ServerInfo Client::hello() {
    impl_->do_hello();
    return impl_->info;
}

const ServerInfo &Client::server_info() const { return impl_->info; }

SessionInfo Client::open_session(const std::string &name, uint32_t ctx) {
    flatbuffers::FlatBufferBuilder fbb;
    const uint64_t id = impl_->rid();
    ipc::finish_frame(fbb, id, fb::CreateOpenSessionDirect(fbb, name.c_str(), ctx));
    impl_->send(fbb);
    const fb::Envelope *env = impl_->await(id);
    const fb::SessionOpened *o = env->body_as_SessionOpened();
    if (!o) unexpected(env, "SessionOpened");
    return SessionInfo{o->session(), str(o->name()),       o->ctx(),          o->n_tokens(),
                       o->created(), str(o->save_error()), str(o->evicted())};
}

void Client::close_session(uint64_t session) {
    flatbuffers::FlatBufferBuilder fbb;
    const uint64_t id = impl_->rid();
    ipc::finish_frame(fbb, id, fb::CreateClose(fbb, session));
    impl_->send(fbb);
    const fb::Envelope *env = impl_->await(id);
    if (!env->body_as_Ok()) unexpected(env, "Ok");
}

std::vector<StoredSession> Client::list_sessions(std::vector<EvictedSession> *evicted) {
    flatbuffers::FlatBufferBuilder fbb(64);
    const uint64_t id = impl_->rid();
    ipc::finish_frame(fbb, id, fb::CreateListSessions(fbb));
    impl_->send(fbb);
    const fb::Envelope *env = impl_->await(id);
    const fb::SessionList *l = env->body_as_SessionList();
    if (!l) unexpected(env, "SessionList");
    std::vector<StoredSession> out;
    if (l->sessions())
        for (const fb::SessionInfo *i : *l->sessions())
            out.push_back({str(i->name()), i->n_tokens(), i->bytes(), i->created_unix(), i->last_used_unix(),
                           i->pinned(), i->live(), i->stored_tokens(), str(i->save_error())});
    if (evicted) {
        evicted->clear();
        if (l->evicted())
            for (const fb::EvictedSession *e : *l->evicted())
                evicted->push_back({str(e->name()), e->evicted_unix(), str(e->reason())});
    }
    return out;
}

SavedSession Client::save_session(const std::string &name, uint64_t session) {
    flatbuffers::FlatBufferBuilder fbb(128);
    const uint64_t id = impl_->rid();
    ipc::finish_frame(fbb, id, fb::CreateSaveSessionDirect(fbb, session, name.c_str()));
    impl_->send(fbb);
    const fb::Envelope *env = impl_->await(id);
    const fb::SessionSaved *r = env->body_as_SessionSaved();
    if (!r) unexpected(env, "SessionSaved");
    return SavedSession{str(r->name()), r->n_tokens(), r->bytes()};
}

SessionInfo Client::load_session(const std::string &name, uint32_t ctx) {
    flatbuffers::FlatBufferBuilder fbb(128);
    const uint64_t id = impl_->rid();
    ipc::finish_frame(fbb, id, fb::CreateLoadSessionDirect(fbb, name.c_str(), ctx));
    impl_->send(fbb);
    const fb::Envelope *env = impl_->await(id);
    const fb::SessionOpened *o = env->body_as_SessionOpened();
    if (!o) unexpected(env, "SessionOpened");
    return SessionInfo{o->session(), str(o->name()),       o->ctx(),          o->n_tokens(),
                       o->created(), str(o->save_error()), str(o->evicted())};
}

void Client::delete_session(const std::string &name) {
    flatbuffers::FlatBufferBuilder fbb(128);
    const uint64_t id = impl_->rid();
    ipc::finish_frame(fbb, id, fb::CreateDeleteSessionDirect(fbb, name.c_str()));
    impl_->send(fbb);
    const fb::Envelope *env = impl_->await(id);
    if (!env->body_as_Ok()) unexpected(env, "Ok");
}

void Client::pin_session(const std::string &name, bool pinned) {
    flatbuffers::FlatBufferBuilder fbb(128);
    const uint64_t id = impl_->rid();
    ipc::finish_frame(fbb, id, fb::CreatePinSessionDirect(fbb, name.c_str(), pinned));
    impl_->send(fbb);
    const fb::Envelope *env = impl_->await(id);
    if (!env->body_as_Ok()) unexpected(env, "Ok");
}

DoneInfo Client::generate(const GenerateRequest &req, const GenerateCallbacks &cb) {
    flatbuffers::FlatBufferBuilder fbb(1024 + req.text.size() + req.tokens.size() * 4);
    flatbuffers::Offset<flatbuffers::String> text;
    flatbuffers::Offset<flatbuffers::Vector<int32_t>> tokens;
    flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::ChatMessage>>> messages;
    switch (req.kind) {
    case GenerateRequest::Prompt::Text: text = fbb.CreateString(req.text); break;
    case GenerateRequest::Prompt::Tokens: tokens = fbb.CreateVector(req.tokens); break;
    case GenerateRequest::Prompt::Chat: {
        std::vector<flatbuffers::Offset<fb::ChatMessage>> msgs;
        for (const auto &m : req.messages)
            msgs.push_back(fb::CreateChatMessage(fbb, fbb.CreateString(m.role), fbb.CreateString(m.content)));
        messages = fbb.CreateVector(msgs);
        break;
    }
    }
    std::vector<flatbuffers::Offset<flatbuffers::String>> stops;
    for (const auto &s : req.stop_strings) stops.push_back(fbb.CreateString(s));
    auto stop_strings = stops.empty() ? 0 : fbb.CreateVector(stops);
    auto stop_tokens = req.stop_tokens.empty() ? 0 : fbb.CreateVector(req.stop_tokens);
    flatbuffers::Offset<flatbuffers::Vector<const fb::LogitBias *>> bias = 0;
    if (!req.logit_bias.empty()) {
        std::vector<fb::LogitBias> b;
        for (const auto &[t, v] : req.logit_bias) b.emplace_back(t, v);
        bias = fbb.CreateVectorOfStructs(b);
    }
    if (req.top_logprobs > 255) throw std::invalid_argument("generate: top_logprobs must be in [0, 20]");
    auto sampling = fb::CreateSampling(fbb, req.temperature, req.top_k, req.top_p, req.min_p, req.seed, req.repeat_penalty,
                                       req.repeat_last_n, req.frequency_penalty, req.presence_penalty, bias);
    auto body = fb::CreateGenerate(fbb, req.session, text, tokens, messages, req.add_generation_prompt, req.thinking,
                                   sampling, req.max_tokens, stop_strings, stop_tokens, req.ignore_eos, req.progress,
                                   req.speculate, req.logprobs, uint8_t(req.top_logprobs),
                                   req.json_object ? fb::OutputFormat::JsonObject : fb::OutputFormat::Text);
    const uint64_t id = impl_->rid();
    ipc::finish_frame(fbb, id, body);
    impl_->send(fbb);
    if (cb.on_start) cb.on_start(id);

    bool cancel_sent = false;
    auto cancel_once = [&] {
        if (!cancel_sent) {
            cancel_sent = true;
            cancel(id);
        }
    };
    std::exception_ptr callback_error;
    for (;;) {
        const fb::Envelope *env = impl_->read_frame(cancel_once);
        if (env->request_id() != id) {
            if (env->body_type() == fb::Message::Error && env->request_id() == 0) throw_server_error(env);
            continue;
        }
        switch (env->body_type()) {
        case fb::Message::TokenChunk: {
            if (callback_error || !cb.on_chunk) break;
            const fb::TokenChunk *c = env->body_as_TokenChunk();
            Chunk chunk;
            if (c->tokens()) chunk.tokens = std::span<const int32_t>(c->tokens()->data(), c->tokens()->size());
            if (c->text()) chunk.text = std::string_view(c->text()->data(), c->text()->size());
            std::vector<TokenLogprob> lps;
            if (c->logprobs()) {
                for (const fb::Logprob *l : *c->logprobs()) {
                    TokenLogprob x;
                    x.logprob = l->logprob();
                    if (l->top())
                        for (const fb::TopLogprob *t : *l->top()) x.top.emplace_back(t->token(), t->logprob());
                    lps.push_back(std::move(x));
                }
                chunk.logprobs = lps;
            }
            try {
                if (!cb.on_chunk(chunk)) cancel_once();
            } catch (...) {
                callback_error = std::current_exception();
                cancel_once();
            }
            break;
        }
        case fb::Message::Progress:
            if (cb.on_progress && !callback_error) {
                try {
                    cb.on_progress(env->body_as_Progress()->current(), env->body_as_Progress()->total());
                } catch (...) {
                    callback_error = std::current_exception();
                    cancel_once();
                }
            }
            break;
        case fb::Message::Done: {
            if (callback_error) std::rethrow_exception(callback_error);
            const fb::Done *d = env->body_as_Done();
            DoneInfo out;
            out.request_id = id;
            out.reason = static_cast<FinishReason>(d->reason());
            out.prompt_tokens = d->prompt_tokens();
            out.cached_tokens = d->cached_tokens();
            out.generated_tokens = d->generated_tokens();
            out.prefill_us = d->prefill_us();
            out.decode_us = d->decode_us();
            out.stop_token = d->stop_token();
            return out;
        }
        case fb::Message::Error:
            if (callback_error) std::rethrow_exception(callback_error);
            throw_server_error(env);
        default: unexpected(env, "TokenChunk, Progress or Done");
        }
    }
}

void Client::cancel(uint64_t request_id) {
    flatbuffers::FlatBufferBuilder fbb(64);
    ipc::finish_frame(fbb, impl_->rid(), fb::CreateCancel(fbb, request_id));
    impl_->send(fbb);
}

void Client::set_interrupt_fd(int fd) { impl_->interrupt_fd = fd; }

std::vector<int32_t> Client::tokenize(const std::string &text, bool special) {
    flatbuffers::FlatBufferBuilder fbb(128 + text.size());
    const uint64_t id = impl_->rid();
    ipc::finish_frame(fbb, id, fb::CreateTokenize(fbb, fbb.CreateString(text), special));
    impl_->send(fbb);
    const fb::Envelope *env = impl_->await(id);
    const fb::TokenizeResult *r = env->body_as_TokenizeResult();
    if (!r) unexpected(env, "TokenizeResult");
    std::vector<int32_t> out;
    if (r->tokens()) out.assign(r->tokens()->begin(), r->tokens()->end());
    return out;
}

std::string Client::detokenize(std::span<const int32_t> tokens) {
    flatbuffers::FlatBufferBuilder fbb(128 + tokens.size() * 4);
    const uint64_t id = impl_->rid();
    ipc::finish_frame(fbb, id, fb::CreateDetokenize(fbb, fbb.CreateVector(tokens.data(), tokens.size())));
    impl_->send(fbb);
    const fb::Envelope *env = impl_->await(id);
    const fb::DetokenizeResult *r = env->body_as_DetokenizeResult();
    if (!r) unexpected(env, "DetokenizeResult");
    return str(r->text());
}

Stats Client::stats() {
    flatbuffers::FlatBufferBuilder fbb(64);
    const uint64_t id = impl_->rid();
    ipc::finish_frame(fbb, id, fb::CreateStats(fbb));
    impl_->send(fbb);
    const fb::Envelope *env = impl_->await(id);
    const fb::StatsResult *r = env->body_as_StatsResult();
    if (!r) unexpected(env, "StatsResult");
    Stats s;
    s.uptime_s = r->uptime_s();
    s.model = to_model(r->model());
    s.sessions = r->sessions();
    s.connections = r->connections();
    s.active_requests = r->active_requests();
    s.queued_requests = r->queued_requests();
    s.requests_total = r->requests_total();
    s.tokens_in = r->tokens_in();
    s.tokens_cached = r->tokens_cached();
    s.tokens_out = r->tokens_out();
    s.prefill_tok_s = r->prefill_tok_s();
    s.decode_tok_s = r->decode_tok_s();
    s.saves_failed = r->saves_failed();
    s.steps = r->steps();
    s.step_rows = r->step_rows();
    s.step_requests = r->step_requests();
    s.step_seconds = r->step_seconds();
    s.max_batch = r->max_batch();
    s.step_tokens = r->step_tokens();
    s.draft_max = r->draft_max();
    s.spec_trials = r->spec_trials();
    s.spec_drafted = r->spec_drafted();
    s.spec_accepted = r->spec_accepted();
    s.spec_fallbacks = r->spec_fallbacks();
    s.spec_tokens = r->spec_tokens();
    s.spec_solo_tokens = r->spec_solo_tokens();
    s.spec_solo_seconds = r->spec_solo_seconds();
    s.solo_steps = r->solo_steps();
    s.solo_seconds = r->solo_seconds();
    s.kv_budget = r->kv_budget();
    s.kv_in_use = r->kv_in_use();
    s.kv_waiting = r->kv_waiting();
    s.slot_waiting = r->slot_waiting();
    s.kv_refused = r->kv_refused();
    if (const fb::DrafterSharing *d = r->drafter_sharing()) {
        s.drafter_offered = true;
        s.drafter_share_bytes = d->bytes();
        s.drafter_shares = d->shares();
        if (d->importers())
            for (const fb::DrafterImporter *x : *d->importers()) {
                if (!x) continue;
                s.drafter_importers.push_back(DrafterImporter{x->pid(), x->uid(), x->first_unix(), x->last_unix(),
                                                              x->shares(), x->bytes(), x->mapped()});
            }
    }
    if (const fb::ExpertStats *e = r->experts()) {
        s.streaming = true;
        ExpertStats &x = s.experts;
        x.acquired = e->acquired(), x.misses = e->misses(), x.late = e->late();
        x.prefetched = e->prefetched(), x.prefetch_used = e->prefetch_used(), x.bytes_read = e->bytes_read();
        x.store_reads = e->store_reads(), x.store_corrupt = e->store_corrupt();
        x.wait_s = e->wait_s(), x.io_busy_s = e->io_busy_s();
        x.resident = e->resident(), x.capacity = e->capacity(), x.capacity_bytes = e->capacity_bytes();
    }
    if (r->streams())
        for (const fb::StreamStats *x : *r->streams()) {
            if (!x) continue;
            Stats::Stream st;
            st.request_id = x->request_id();
            if (x->session()) st.session = x->session()->str();
            st.prefilling = x->prefilling();
            st.prompt_tokens = x->prompt_tokens();
            st.prefilled = x->prefilled();
            st.generated = x->generated();
            st.tok_s = x->tok_s();
            st.drafted = x->drafted();
            st.accepted = x->accepted();
            s.streams.push_back(std::move(st));
        }
    if (const fb::MemoryStats *m = r->memory()) {
        s.memory.weights_bytes = m->weights_bytes();
        s.memory.cache_bytes = m->cache_bytes();
        s.memory.scratch_bytes = m->scratch_bytes();
        s.memory.device_free = m->device_free();
        s.memory.device_total = m->device_total();
        s.memory.device_weights_bytes = m->device_weights_bytes();
        if (m->device()) s.memory.device = m->device()->str();
        s.memory.drafter_bytes = m->drafter_bytes();
        s.memory.shared_bytes = m->shared_bytes();
        s.memory.private_bytes = m->private_bytes();
    }
    return s;
}

void Client::send_raw(std::span<const uint8_t> bytes) { impl_->send_bytes(bytes.data(), bytes.size()); }

}  // namespace ds4::client
