#include "gateway/server.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <vector>

#include "client/ds4client.hpp"
#include "gateway/api_key.h"
#include "gateway/conversation.h"
#include "gateway/dsml.h"
#include "gateway/reply.h"
#include "gateway/response_store.h"
#include "gateway/translate.h"

namespace ds4::gateway {

namespace cl = ds4::client;
using Clock = std::chrono::steady_clock;

bool is_loopback_host(const std::string &h) {
    if (h == "localhost" || h == "::1") return true;
    in_addr a{};
    return inet_pton(AF_INET, h.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

namespace {

// One request's exchange between its worker and the HTTP thread. The worker appends
// output; the HTTP thread drains it and suspends the connection while there is none.
constexpr size_t kMaxBuffered = 8u << 20;

struct Job {
    std::mutex mu;
    MHD_Connection *conn = nullptr;   // null once the request is over (client gone)
    bool suspended = false;
    bool ready = false;                // status/headers known (or a whole body)
    bool stream = false;
    bool done = false;                 // nothing follows `out`
    int status = 200;
    std::string content_type = "application/json";
    std::string out;
    std::atomic<bool> cancelled{false};
    Api api = Api::Chat;
    std::function<void(Job &, cl::Client &)> work;

    // Worker side: wakes the connection when it waits for us.
    void wake_locked() {
        if (suspended && conn) {
            suspended = false;
            MHD_resume_connection(conn);
        }
    }
    void respond(int st, std::string body, const char *ctype = "application/json") {
        std::lock_guard lk(mu);
        status = st;
        content_type = ctype;
        out = std::move(body);
        ready = true;
        done = true;
        wake_locked();
    }
    void start_stream() {
        std::lock_guard lk(mu);
        if (ready) return;
        stream = true;
        ready = true;
        content_type = "text/event-stream";
        wake_locked();
    }
    void push(const std::string &s, bool last = false) {
        std::lock_guard lk(mu);
        out += s;
        // A client that stops reading must not make us buffer its whole answer.
        if (out.size() > kMaxBuffered) cancelled = true;
        if (last) done = true;
        wake_locked();
    }
};

struct Conn {
    std::string path;
    std::string body;
    bool too_large = false;
    std::shared_ptr<Job> job;
};

struct Metrics {
    std::mutex mu;
    std::map<std::pair<std::string, int>, uint64_t> requests;   // (endpoint, status)
    std::atomic<uint64_t> prompt_tokens{0}, cached_tokens{0}, completion_tokens{0};
    std::atomic<uint64_t> generation_us{0}, first_chunk_us{0}, generations{0};
    std::atomic<int64_t> active{0}, queued{0};
    void count(const std::string &endpoint, int status) {
        std::lock_guard lk(mu);
        ++requests[{endpoint, status}];
    }
};

// A fixed set of threads with a client connection each, fed from one bounded queue.
class Workers {
public:
    Workers(std::string socket, unsigned n, unsigned cap, Metrics *m) : socket_(std::move(socket)), cap_(cap), m_(m) {
        for (unsigned i = 0; i < n; ++i) threads_.emplace_back([this] { loop(); });
    }
    ~Workers() {
        {
            std::lock_guard lk(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        for (auto &t : threads_) t.join();
    }
    bool submit(std::shared_ptr<Job> j) {
        {
            std::lock_guard lk(mu_);
            if (q_.size() >= cap_) return false;
            q_.push_back(std::move(j));
            if (m_) ++m_->queued;
        }
        cv_.notify_one();
        return true;
    }

private:
    void loop() {
        std::unique_ptr<cl::Client> client;
        for (;;) {
            std::shared_ptr<Job> j;
            {
                std::unique_lock lk(mu_);
                cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
                if (q_.empty()) return;
                j = std::move(q_.front());
                q_.pop_front();
                if (m_) --m_->queued;
            }
            if (j->cancelled) {
                j->respond(499, "{}");
                continue;
            }
            struct Active {
                Metrics *m;
                explicit Active(Metrics *m) : m(m) { if (m) ++m->active; }
                ~Active() { if (m) --m->active; }
            } active(m_);
            try {
                if (!client || !client->connected()) client = std::make_unique<cl::Client>(socket_, "ds4-gateway");
                j->work(*j, *client);
            } catch (const cl::ConnectError &e) {
                client.reset();
                j->respond(503, error_body(j->api, ApiError(503, "server_error", std::string("ds4d is not reachable: ") + e.what())));
            } catch (const std::exception &e) {
                client.reset();   // the connection may be out of step: start afresh
                j->respond(500, error_body(j->api, ApiError(500, "server_error", e.what())));
            }
        }
    }

    std::string socket_;
    unsigned cap_;
    Metrics *m_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::shared_ptr<Job>> q_;
    bool stop_ = false;
    std::vector<std::thread> threads_;
};

ApiError from_server_error(const cl::ServerError &e) {
    using namespace std::string_literals;
    switch (e.code) {
    case 5:  // BadRequest
        return ApiError(400, "invalid_request_error", e.server_message);
    case 6:  // UnknownSession
        return ApiError(404, "invalid_request_error", e.server_message, "session");
    case 7:  // SessionBusy
        return ApiError(409, "invalid_request_error", "the session is busy with another request: " + e.server_message, "session");
    case 9:  // ContextOverflow
        return ApiError(400, "invalid_request_error", e.server_message, "messages", "context_length_exceeded");
    case 8:  // SessionLimit
    case 15: // Busy
        return ApiError(429, "rate_limit_error", "ds4d is busy: " + e.server_message);
    case 12: // ShuttingDown
        return ApiError(503, "server_error", e.server_message);
    default:
        return ApiError(500, "server_error", e.code_name + ": " + e.server_message);
    }
}

Finish::Reason finish_reason(cl::FinishReason r) {
    switch (r) {
    case cl::FinishReason::Stop: return Finish::Reason::Stop;
    case cl::FinishReason::StopString: return Finish::Reason::StopString;
    case cl::FinishReason::Length: return Finish::Reason::Length;
    case cl::FinishReason::Context: return Finish::Reason::Context;
    case cl::FinishReason::Cancelled: return Finish::Reason::Cancelled;
    }
    return Finish::Reason::Stop;
}

const char *endpoint_name(Api a) {
    switch (a) {
    case Api::Chat: return "chat_completions";
    case Api::Completions: return "completions";
    case Api::Responses: return "responses";
    case Api::Messages: return "messages";
    }
    return "?";
}

}  // namespace

struct Server::Impl {
    Options opt;
    MHD_Daemon *mhd = nullptr;
    Metrics metrics;
    std::unique_ptr<Workers> gen, admin;
    std::mutex jobs_mu;
    std::vector<std::weak_ptr<Job>> live;   // for stop(): resume before MHD_stop_daemon
    std::mutex model_mu;
    std::string model_id;

    void track(const std::shared_ptr<Job> &j) {
        std::lock_guard lk(jobs_mu);
        std::erase_if(live, [](auto &w) { return w.expired(); });
        live.push_back(j);
    }

    std::string model_name(cl::Client &c) {
        std::lock_guard lk(model_mu);
        if (model_id.empty()) model_id = !opt.model_name.empty() ? opt.model_name : c.server_info().model.name;
        if (model_id.empty()) model_id = "ds4";
        return model_id;
    }

    // ------------------------------------------------------------ generation
    // Token bytes for log-probabilities, looked up on a connection of its own (the worker's
    // is busy streaming the generation) and cached: token texts never change.
    std::mutex token_mu;
    std::unique_ptr<cl::Client> token_client;
    std::unordered_map<int32_t, std::string> token_cache;

    std::string token_text(int32_t t) {
        std::lock_guard lk(token_mu);
        if (auto it = token_cache.find(t); it != token_cache.end()) return it->second;
        try {
            if (!token_client || !token_client->connected())
                token_client = std::make_unique<cl::Client>(opt.socket_path, "ds4-gateway-tokens");
            std::string s = token_client->detokenize(std::span<const int32_t>(&t, 1));
            if (token_cache.size() < (1u << 20)) token_cache.emplace(t, s);
            return s;
        } catch (...) {
            token_client.reset();
            throw;
        }
    }

    // previous_response_id: the responses this process made (gateway/response_store.h).
    ResponseStore responses;
    // Named sessions' conversations as far as a later turn's rendering needs them.
    SessionStates sessions;

    void fail_request(Job &job, const Request &req, const ApiError &ae) {
        metrics.count(endpoint_name(req.api), ae.status);
        job.respond(ae.status, error_body(req.api, ae));
    }

    void generate(Job &job, cl::Client &c, const Request &req) {
        const std::string model = model_name(c);
        // The named session: the `session` extension, or the one previous_response_id was in.
        // previous_response_id continues that session while it is the session's latest turn;
        // otherwise (an earlier turn: a fork, or a response made without a session) the
        // conversation is rebuilt from the remembered tokens and runs statelessly (its prefix
        // reused from ds4d's one-shot pool), or in the new session the request names.
        std::string session = req.session;
        std::optional<ResponseStore::Turn> prev;
        std::vector<int32_t> base;   // a fork: the conversation's tokens before this request's
        if (!req.previous_response_id.empty()) {
            prev = responses.find(req.previous_response_id);
            if (!prev)
                return fail_request(job, req, ApiError(400, "invalid_request_error",
                    "previous_response_id '" + req.previous_response_id + "' is unknown to this gateway: it remembers "
                    "the responses it made since it started (the least recently used are forgotten)",
                    "previous_response_id", "previous_response_not_found"));
        }
        if (!session.empty() && req.n > 1)
            return fail_request(job, req, ApiError(400, "invalid_request_error",
                "'n' > 1 cannot continue one named session several ways; leave out 'session' or 'n'", "n"));
        uint64_t sid = 0;
        uint32_t history = 0;
        auto open = [&](const std::string &name) -> bool {
            try {
                const cl::SessionInfo si = c.open_session(name);
                sid = si.id;
                history = si.n_tokens;
                return true;
            } catch (const cl::ServerError &e) {
                fail_request(job, req, from_server_error(e));
                return false;
            }
        };
        bool fork = false;
        if (prev && !prev->session.empty() && (session.empty() || session == prev->session)) {
            if (!open(prev->session)) return;
            if (history != prev->session_len) {
                close_quietly(c, sid);
                sid = 0;
                if (!session.empty())
                    return fail_request(job, req, ApiError(400, "invalid_request_error",
                        "previous_response_id '" + req.previous_response_id + "' is not the latest turn of session '" +
                        session + "' (it holds " + std::to_string(history) + " tokens, the response left " +
                        std::to_string(prev->session_len) + "): continuing it there would drop the later turns. "
                        "Leave out 'session' to continue from that turn statelessly, or name a new session to fork into",
                        "previous_response_id"));
                fork = true;
            } else {
                session = prev->session;
            }
        } else if (prev) {
            fork = true;   // a stateless response, or forking into the new session req.session
        } else if (!session.empty()) {
            if (!open(session)) return;
        }
        if (fork) {
            std::optional<std::vector<int32_t>> h = responses.history(req.previous_response_id);
            if (!h)
                return fail_request(job, req, ApiError(400, "invalid_request_error",
                    "the conversation up to previous_response_id '" + req.previous_response_id + "' is not held by this "
                    "gateway any more (part of it was forgotten, or it began in a session before this gateway saw it), "
                    "so it cannot continue from that turn; send the whole conversation as input instead",
                    "previous_response_id"));
            base = std::move(*h);
            history = 0;
            if (!session.empty()) {
                if (!open(session)) return;
                if (history > 0) {
                    close_quietly(c, sid);
                    return fail_request(job, req, ApiError(400, "invalid_request_error",
                        "session '" + session + "' holds " + std::to_string(history) + " tokens already; continuing "
                        "previous_response_id '" + req.previous_response_id + "' from another session forks it into "
                        "a new, empty session", "session"));
                }
            }
        }
        const bool continuation = history > 0 || prev.has_value();
        // What this gateway remembers of the conversation being continued.
        std::optional<ConversationState> known;
        std::string what;
        if (prev) {
            known = prev->conversation;
            what = "previous_response_id '" + req.previous_response_id + "'";
        } else if (history > 0) {
            known = sessions.find(session, history);
            what = "session '" + session + "'";
        }

        cl::GenerateRequest g;
        g.session = sid;
        uint32_t prompt_tokens = 0;
        std::vector<int32_t> own_tokens;   // this request's prompt tokens (base excluded)
        std::vector<int32_t> generated;    // and the tokens it generated (for ResponseStore)
        std::string prefill;   // forced tool call: the opening the output continues
        PromptOptions po;      // chat prompts: the options rendered with
        if (req.raw_prompt) {
            g.kind = cl::GenerateRequest::Prompt::Text;
            g.text = req.prompt;
        } else {
            // DeepSeek's encoding is applied to the whole rendered text, special tokens
            // included (as the reference tokenizer does).
            g.kind = cl::GenerateRequest::Prompt::Tokens;
            // A later turn renders as it would at the end of the whole conversation.
            try {
                po = prompt_options_for(req, continuation, known ? &*known : nullptr, what);
            } catch (const ApiError &e) {
                if (sid) close_quietly(c, sid);
                return fail_request(job, req, e);
            }
            std::string text = render_prompt(req.messages, po);
            if (req.force_tool) {
                if (req.prompt_options.thinking) prefill += kEndThink;
                prefill += "\n\n";
                prefill += kToolCallsOpen;
                prefill += '\n';
                if (!req.forced_tool_name.empty()) prefill += kInvokeOpen + req.forced_tool_name + "\">\n";
                text += prefill;
            }
            try {
                g.tokens = c.tokenize(text, true);
            } catch (const cl::ServerError &e) {
                if (sid) close_quietly(c, sid);
                return fail_request(job, req, from_server_error(e));
            }
            own_tokens = g.tokens;
            g.tokens.insert(g.tokens.begin(), base.begin(), base.end());
            prompt_tokens = uint32_t(g.tokens.size());
        }
        g.temperature = req.temperature;
        g.top_p = req.top_p;
        g.top_k = req.top_k;
        g.min_p = req.min_p;
        g.max_tokens = req.max_tokens ? req.max_tokens : opt.default_max_tokens;
        g.stop_strings = req.stop;
        g.thinking = req.prompt_options.thinking;
        g.ignore_eos = req.ignore_eos;
        g.repeat_penalty = req.repeat_penalty;
        g.repeat_last_n = req.repeat_last_n;
        g.frequency_penalty = req.frequency_penalty;
        g.presence_penalty = req.presence_penalty;
        g.logit_bias = req.logit_bias;
        g.logprobs = req.logprobs;
        g.top_logprobs = req.top_logprobs;
        g.json_object = req.json_object;
        if (g.json_object && g.max_tokens < 2)
            return fail_request(job, req, ApiError(400, "invalid_request_error",
                "a JSON answer needs at least 2 tokens; max_tokens is " + std::to_string(g.max_tokens), "max_tokens"));

        // n > 1: one daemon request per choice, in turn, each with its own seed; the choices
        // share the answer's id and usage adds up.
        const auto t0 = Clock::now();
        bool started = false;
        Finish total;
        std::string shared_id;
        Json merged;
        const uint64_t base_seed = req.seed ? *req.seed : std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32);
        for (uint32_t choice = 0; choice < req.n; ++choice) {
            g.seed = base_seed + choice;
            const bool last = choice + 1 == req.n;
            Reply reply(req, model, prompt_tokens);
            if (choice == 0) shared_id = reply.id();
            reply.set_choice(int(choice), shared_id, last);
            DsmlParser parser(req.parse_tools || req.force_tool, !req.raw_prompt && req.prompt_options.thinking);
            std::vector<DsmlEvent> evs;
            auto emit = [&](const std::string &s) {
                if (!req.stream) return;
                if (!started) {
                    started = true;
                    job.start_stream();
                    metrics.first_chunk_us += uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count());
                }
                if (!s.empty()) job.push(s);
            };
            // The choice's opening events (the stream's, for the first), then the prefill's.
            std::string head = (choice == 0 || req.api == Api::Chat) ? reply.begin() : std::string();
            if (!prefill.empty()) {
                parser.feed(prefill, evs);
                for (const DsmlEvent &e : evs) head += reply.event(e);
            }
            if (req.stream && !head.empty()) emit(head);
            cl::GenerateCallbacks cb;
            cb.on_chunk = [&](const cl::Chunk &ch) {
                if (req.api == Api::Responses) generated.insert(generated.end(), ch.tokens.begin(), ch.tokens.end());
                // One entry per token, in order; they go out with the text that follows.
                for (size_t i = 0; i < ch.logprobs.size() && i < ch.tokens.size(); ++i) {
                    TokenLogprobs t;
                    t.token = token_text(ch.tokens[i]);
                    t.logprob = ch.logprobs[i].logprob;
                    for (const auto &[id, v] : ch.logprobs[i].top) t.top.emplace_back(token_text(id), v);
                    reply.add_logprobs(std::move(t));
                }
                evs.clear();
                parser.feed(ch.text, evs);
                std::string s;
                for (const DsmlEvent &e : evs) s += reply.event(e);
                emit(s);
                return !job.cancelled.load();
            };
            cl::DoneInfo d;
            try {
                d = c.generate(g, cb);
            } catch (const cl::ServerError &e) {
                ApiError ae = from_server_error(e);
                if (started) job.push(reply.stream_error(ae), true);
                else job.respond(ae.status, error_body(req.api, ae));
                metrics.count(endpoint_name(req.api), ae.status);
                if (sid) close_quietly(c, sid);
                return;
            }
            evs.clear();
            parser.finish(evs);
            std::string s;
            for (const DsmlEvent &e : evs) s += reply.event(e);
            total.reason = finish_reason(d.reason);
            total.prompt_tokens += d.prompt_tokens;
            total.cached_tokens += d.cached_tokens;
            total.completion_tokens += d.generated_tokens;
            metrics.prompt_tokens += d.prompt_tokens;
            metrics.cached_tokens += d.cached_tokens;
            metrics.completion_tokens += d.generated_tokens;
            ++metrics.generations;
            Finish f{finish_reason(d.reason), d.prompt_tokens, d.cached_tokens, d.generated_tokens};
            if (last) f = total;
            f.reason = finish_reason(d.reason);
            if (req.stream) {
                emit(s);
                job.push(reply.finish(f), last);
            } else {
                Json body = parse_exact(reply.finish(f));   // exact: tool inputs' big integers
                if (choice == 0) merged = std::move(body);
                else merged["choices"].push_back(body["choices"][0]);
                if (last && req.n > 1) merged["usage"] = Json::parse(reply.finish(total))["usage"];
            }
            if (last) {
                // The session's length after this turn, for the memories below.
                std::optional<uint32_t> session_len;
                if (sid) {
                    try {
                        session_len = c.open_session(session).n_tokens;
                    } catch (const cl::ServerError &) {
                    }
                }
                // What a later turn's rendering needs (not known for raw text prompts).
                std::optional<ConversationState> after;
                if (!req.raw_prompt) after = state_after(req, po, known ? &*known : nullptr, reply.call_ids());
                if (sid) {
                    if (after && session_len) sessions.put(session, *after, *session_len);
                    else sessions.erase(session);
                }
                if (req.api == Api::Responses && req.store) {
                    // What the conversation gained: ds4d's session appended the prompt, the
                    // generated tokens and the stop token.
                    ResponseStore::Turn t;
                    t.parent = prev ? req.previous_response_id : std::string();
                    t.known_base = prev.has_value() || history == 0;
                    t.tokens = std::move(own_tokens);
                    t.tokens.insert(t.tokens.end(), generated.begin(), generated.end());
                    if (d.stop_token >= 0) t.tokens.push_back(d.stop_token);
                    t.conversation = after.value_or(ConversationState{});
                    if (sid) {
                        t.session = session;
                        t.session_len = session_len.value_or(0);
                    }
                    if (!sid || session_len) responses.add(reply.id(), std::move(t));
                }
            }
        }
        if (sid) close_quietly(c, sid);
        metrics.generation_us += uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count());
        metrics.count(endpoint_name(req.api), 200);
        if (!req.stream) job.respond(200, dump_exact(merged));
    }

    static void close_quietly(cl::Client &c, uint64_t sid) {
        try {
            c.close_session(sid);
        } catch (const cl::ServerError &) {
        }
    }

    // ------------------------------------------------------------ admin endpoints
    std::string metrics_text(cl::Client *c, std::string *daemon_error) {
        std::string o;
        auto line = [&](const char *name, const char *type, const char *help, const std::string &value) {
            o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + value + "\n";
        };
        o += "# HELP ds4_gateway_requests_total HTTP generation requests by endpoint and status.\n"
             "# TYPE ds4_gateway_requests_total counter\n";
        {
            std::lock_guard lk(metrics.mu);
            for (auto &[k, n] : metrics.requests)
                o += "ds4_gateway_requests_total{endpoint=\"" + k.first + "\",status=\"" + std::to_string(k.second) + "\"} " +
                     std::to_string(n) + "\n";
        }
        line("ds4_gateway_prompt_tokens_total", "counter", "Prompt tokens of finished requests.", std::to_string(metrics.prompt_tokens.load()));
        line("ds4_gateway_cached_prompt_tokens_total", "counter", "Prompt tokens served from cached state.",
             std::to_string(metrics.cached_tokens.load()));
        line("ds4_gateway_completion_tokens_total", "counter", "Generated tokens.", std::to_string(metrics.completion_tokens.load()));
        line("ds4_gateway_generation_seconds_total", "counter", "Wall time of finished generations.",
             std::to_string(double(metrics.generation_us.load()) / 1e6));
        const double gs = double(metrics.generation_us.load()) / 1e6;
        line("ds4_gateway_output_tokens_per_second", "gauge", "Completion tokens per second of generation wall time.",
             std::to_string(gs > 0 ? double(metrics.completion_tokens.load()) / gs : 0.0));
        line("ds4_gateway_active_requests", "gauge", "Generations running on a worker.", std::to_string(metrics.active.load()));
        line("ds4_gateway_queued_requests", "gauge", "Requests waiting for a worker.", std::to_string(metrics.queued.load()));
        if (mhd) {
            const MHD_DaemonInfo *di = MHD_get_daemon_info(mhd, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
            if (di) line("ds4_gateway_connections", "gauge", "Open HTTP connections.", std::to_string(di->num_connections));
        }
        if (!c) return o;
        try {
            cl::Stats s = c->stats();
            line("ds4d_up", "gauge", "1 when ds4d answered.", "1");
            line("ds4d_sessions", "gauge", "Sessions held by ds4d.", std::to_string(s.sessions));
            line("ds4d_connections", "gauge", "Client connections of ds4d.", std::to_string(s.connections));
            line("ds4d_active_requests", "gauge", "Requests ds4d is running.", std::to_string(s.active_requests));
            line("ds4d_queued_requests", "gauge", "Requests waiting in ds4d (not decoding yet).", std::to_string(s.queued_requests));
            line("ds4d_requests_total", "counter", "Requests ds4d served.", std::to_string(s.requests_total));
            line("ds4d_tokens_in_total", "counter", "Prompt tokens ds4d received.", std::to_string(s.tokens_in));
            line("ds4d_tokens_cached_total", "counter", "Prompt tokens ds4d did not evaluate.", std::to_string(s.tokens_cached));
            line("ds4d_tokens_out_total", "counter", "Tokens ds4d generated.", std::to_string(s.tokens_out));
            line("ds4d_prefill_tokens_per_second", "gauge", "ds4d prefill rate.", std::to_string(s.prefill_tok_s));
            line("ds4d_decode_tokens_per_second", "gauge", "ds4d decode rate.", std::to_string(s.decode_tok_s));
            line("ds4d_session_saves_failed_total", "counter", "Session store saves that failed.", std::to_string(s.saves_failed));
            line("ds4d_cache_bytes", "gauge", "Session cache memory.", std::to_string(s.memory.cache_bytes));
            line("ds4d_weights_bytes", "gauge", "Model weight memory.", std::to_string(s.memory.weights_bytes));
            if (s.draft_max) {   // ds4d --drafter: speculative decoding
                line("ds4d_spec_trials_total", "counter", "Speculative trials ds4d ran.", std::to_string(s.spec_trials));
                line("ds4d_spec_drafted_total", "counter", "Draft tokens proposed.", std::to_string(s.spec_drafted));
                line("ds4d_spec_accepted_total", "counter", "Draft tokens the model accepted.", std::to_string(s.spec_accepted));
            }
            line("ds4d_shared_bytes", "gauge", "Weight bytes other processes map too (the shared drafter).",
                 std::to_string(s.memory.shared_bytes));
            line("ds4d_private_bytes", "gauge", "Weight, cache and scratch bytes of ds4d alone.",
                 std::to_string(s.memory.private_bytes));
            if (s.drafter_offered) {
                size_t mapped = 0;
                for (const auto &i : s.drafter_importers) mapped += i.mapped ? 1 : 0;
                line("ds4d_drafter_shares_total", "counter", "Drafter descriptors ds4d passed (GetDrafter).",
                     std::to_string(s.drafter_shares));
                line("ds4d_drafter_importers", "gauge", "Processes mapping ds4d's shared drafter now.", std::to_string(mapped));
            }
            if (s.streaming) {   // ds4d --ssd-streaming
                const cl::ExpertStats &e = s.experts;
                line("ds4d_expert_acquired_total", "counter", "Routed experts used by steps.", std::to_string(e.acquired));
                line("ds4d_expert_hits_total", "counter", "Routed experts used without a demand read.",
                     std::to_string(e.acquired - std::min(e.acquired, e.misses)));
                line("ds4d_expert_misses_total", "counter", "Routed experts read on demand.", std::to_string(e.misses));
                line("ds4d_expert_read_bytes_total", "counter", "Bytes of experts read (demand and prefetch).",
                     std::to_string(e.bytes_read));
                line("ds4d_expert_io_busy_seconds_total", "counter", "Time with at least one expert read in flight.",
                     std::to_string(e.io_busy_s));
                line("ds4d_expert_wait_seconds_total", "counter", "Time steps waited for expert reads.",
                     std::to_string(e.wait_s));
                line("ds4d_expert_read_gigabytes_per_second", "gauge", "Expert read rate while reading.",
                     std::to_string(e.read_gb_s()));
                line("ds4d_expert_prefetch_hidden_ratio", "gauge", "Share of expert read time the steps did not wait for.",
                     std::to_string(e.hidden()));
                line("ds4d_expert_cache_resident", "gauge", "Experts in the cache.", std::to_string(e.resident));
                line("ds4d_expert_cache_capacity", "gauge", "Experts the cache holds.", std::to_string(e.capacity));
            }
            line("ds4d_kv_budget_bytes", "gauge", "Session-cache budget (--kv-budget).", std::to_string(s.kv_budget));
            line("ds4d_kv_in_use_bytes", "gauge", "Session-cache bytes held or reserved.", std::to_string(s.kv_in_use));
            line("ds4d_kv_waiting_requests", "gauge", "Requests waiting for session-cache memory or a session slot.",
                 std::to_string(s.kv_waiting + s.slot_waiting));
            line("ds4d_kv_refused_total", "counter", "Requests refused for session-cache memory or slots.",
                 std::to_string(s.kv_refused));
            try {
                std::vector<cl::EvictedSession> ev;
                auto stored = c->list_sessions(&ev);
                uint64_t bytes = 0;
                for (auto &x : stored) bytes += x.bytes;
                line("ds4d_store_sessions", "gauge", "Named sessions in the session store.", std::to_string(stored.size()));
                line("ds4d_store_bytes", "gauge", "Bytes of stored session payloads.", std::to_string(bytes));
            } catch (const cl::ServerError &) {
                // --no-store: no store figures
            }
        } catch (const std::exception &e) {
            line("ds4d_up", "gauge", "1 when ds4d answered.", "0");
            if (daemon_error) *daemon_error = e.what();
            throw;
        }
        return o;
    }

    // ------------------------------------------------------------ HTTP
    static MHD_Result send(MHD_Connection *c, int status, const std::string &body, const char *ctype,
                           const char *extra_header = nullptr, const char *extra_value = nullptr) {
        MHD_Response *r = MHD_create_response_from_buffer(body.size(), const_cast<char *>(body.data()), MHD_RESPMEM_MUST_COPY);
        MHD_add_response_header(r, "Content-Type", ctype);
        if (extra_header) MHD_add_response_header(r, extra_header, extra_value);
        MHD_Result ret = MHD_queue_response(c, unsigned(status), r);
        MHD_destroy_response(r);
        return ret;
    }

    static ssize_t read_stream(void *cls, uint64_t, char *buf, size_t max) {
        Job *j = static_cast<Job *>(cls);
        std::lock_guard lk(j->mu);
        if (!j->out.empty()) {
            const size_t n = std::min(max, j->out.size());
            std::memcpy(buf, j->out.data(), n);
            j->out.erase(0, n);
            return ssize_t(n);
        }
        if (j->done) return MHD_CONTENT_READER_END_OF_STREAM;
        j->suspended = true;
        MHD_suspend_connection(j->conn);
        return 0;
    }

    bool authorized(MHD_Connection *c) {
        if (!opt.auth) return true;
        if (const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization")) {
            std::string v = a;
            if (v.size() > 7 && strncasecmp(v.c_str(), "Bearer ", 7) == 0 && same_secret(v.substr(7), opt.key)) return true;
        }
        if (const char *k = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key"))
            if (same_secret(k, opt.key)) return true;
        return false;
    }

    // Admin requests (models, health, metrics) run on their own worker so they never wait
    // behind generations and never block the HTTP thread on the daemon.
    MHD_Result admin_request(MHD_Connection *c, Conn *cs, const std::string &path) {
        auto job = std::make_shared<Job>();
        job->conn = c;
        job->api = Api::Chat;
        job->work = [this, path](Job &j, cl::Client &cl) {
            if (path == "/health") {
                try {
                    cl.stats();
                    j.respond(200, "{\"status\":\"ok\"}");
                } catch (const std::exception &e) {
                    j.respond(503, Json{{"status", "unavailable"}, {"error", e.what()}}.dump());
                }
            } else if (path == "/metrics") {
                std::string err;
                try {
                    j.respond(200, metrics_text(&cl, &err), "text/plain; version=0.0.4");
                } catch (const std::exception &) {
                    j.respond(200, metrics_text(nullptr, nullptr) + "ds4d_up 0\n", "text/plain; version=0.0.4");
                }
            } else {
                const cl::ServerInfo &si = cl.server_info();
                const std::string id = model_name(cl);
                Json m = {{"id", id}, {"object", "model"}, {"created", 0}, {"owned_by", "ds4"},
                          {"context_length", si.default_ctx}, {"family", si.model.family}};
                if (path == "/v1/models") j.respond(200, Json{{"object", "list"}, {"data", Json::array({m})}}.dump());
                else if (path == "/v1/models/" + id) j.respond(200, m.dump());
                else j.respond(404, error_body(Api::Chat, ApiError(404, "invalid_request_error",
                                                                  "The model '" + path.substr(11) + "' does not exist", "model", "model_not_found")));
            }
        };
        cs->job = job;
        track(job);
        std::lock_guard lk(job->mu);
        if (!admin->submit(job)) return send(c, 503, "{\"error\":{\"message\":\"busy\",\"type\":\"server_error\"}}", "application/json");
        job->suspended = true;
        MHD_suspend_connection(c);
        return MHD_YES;
    }

    MHD_Result answer_job(MHD_Connection *c, Job &j) {
        std::lock_guard lk(j.mu);
        if (!j.ready) {   // woken before the worker had anything: wait again
            j.suspended = true;
            MHD_suspend_connection(c);
            return MHD_YES;
        }
        if (!j.stream) return send(c, j.status, j.out, j.content_type.c_str());
        MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, &Impl::read_stream, &j, nullptr);
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        MHD_Result ret = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return ret;
    }

    MHD_Result handle(MHD_Connection *c, const char *url, const char *method, const char *upload, size_t *upload_size,
                      void **con_cls) {
        Conn *cs = static_cast<Conn *>(*con_cls);
        if (!cs) {
            cs = new Conn;
            cs->path = url;
            *con_cls = cs;
            return MHD_YES;   // headers only so far; the body (if any) comes next
        }
        if (cs->job) return answer_job(c, *cs->job);
        if (*upload_size) {
            if (cs->body.size() + *upload_size > opt.max_body) cs->too_large = true;
            else cs->body.append(upload, *upload_size);
            *upload_size = 0;
            return MHD_YES;
        }
        std::string path = cs->path;
        const std::string m = method;
        const Api api = path == "/v1/messages" ? Api::Messages : Api::Chat;
        auto fail = [&](const ApiError &e) { return send(c, e.status, error_body(api, e), "application/json"); };

        if (path == "/health" && m == "GET") return admin_request(c, cs, path);
        if (!authorized(c)) {
            metrics.count("unauthorized", 401);
            return send(c, 401, error_body(api, ApiError(401, api == Api::Messages ? "authentication_error" : "invalid_request_error",
                                                         "missing or invalid API key: send 'Authorization: Bearer <key>' "
                                                         "(ds4-gateway --print-key shows it)", {}, "invalid_api_key")),
                        "application/json", "WWW-Authenticate", "Bearer");
        }
        if (m == "GET" && (path == "/metrics" || path == "/v1/models" || path.rfind("/v1/models/", 0) == 0))
            return admin_request(c, cs, path);
        static const std::map<std::string, Api> posts = {{"/v1/chat/completions", Api::Chat},
                                                         {"/v1/completions", Api::Completions},
                                                         {"/v1/responses", Api::Responses},
                                                         {"/v1/messages", Api::Messages}};
        auto it = posts.find(path);
        if (it == posts.end()) return fail(ApiError(404, "invalid_request_error", "no endpoint " + m + " " + path, {}, "unknown_url"));
        if (m != "POST") return fail(ApiError(405, "invalid_request_error", path + " takes POST, not " + m, {}, "method_not_allowed"));
        if (cs->too_large)
            return fail(ApiError(413, "invalid_request_error", "the request body is larger than --max-body (" + std::to_string(opt.max_body) + " bytes)"));
        Request req;
        try {
            req = parse_request(it->second, cs->body);
        } catch (const ApiError &e) {
            metrics.count(endpoint_name(it->second), e.status);
            return send(c, e.status, error_body(it->second, e), "application/json");
        }
        auto job = std::make_shared<Job>();
        job->conn = c;
        job->api = it->second;
        auto shared_req = std::make_shared<Request>(std::move(req));
        job->work = [this, shared_req](Job &j, cl::Client &cl) { generate(j, cl, *shared_req); };
        cs->job = job;
        cs->body.clear();
        track(job);
        std::lock_guard lk(job->mu);
        if (!gen->submit(job)) {
            metrics.count(endpoint_name(it->second), 429);
            return send(c, 429, error_body(it->second, ApiError(429, "rate_limit_error", "too many requests waiting; retry later")),
                        "application/json", "Retry-After", "1");
        }
        job->suspended = true;
        MHD_suspend_connection(c);
        return MHD_YES;
    }

    static MHD_Result on_request(void *cls, MHD_Connection *c, const char *url, const char *method, const char *,
                                 const char *upload, size_t *upload_size, void **con_cls) {
        try {
            return static_cast<Impl *>(cls)->handle(c, url, method, upload, upload_size, con_cls);
        } catch (const std::exception &e) {
            std::fprintf(stderr, "ds4-gateway: %s\n", e.what());
            return MHD_NO;
        }
    }

    static void on_completed(void *, MHD_Connection *, void **con_cls, MHD_RequestTerminationCode) {
        Conn *cs = static_cast<Conn *>(*con_cls);
        if (!cs) return;
        if (cs->job) {
            std::lock_guard lk(cs->job->mu);
            cs->job->conn = nullptr;
            cs->job->cancelled = true;   // a client that left stops its generation
        }
        delete cs;
        *con_cls = nullptr;
    }
};

Server::Server(Options o) : impl_(std::make_unique<Impl>()) { impl_->opt = std::move(o); }

Server::~Server() { stop(); }

void Server::start() {
    Options &o = impl_->opt;
    // Every connection is a descriptor: raise the soft limit to the hard one and keep the
    // cap within it.
    rlimit rl{};
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && o.max_connections + 64 > rl.rlim_cur) {
        const unsigned fit = rl.rlim_cur > 128 ? unsigned(rl.rlim_cur - 64) : 64;
        std::fprintf(stderr, "ds4-gateway: --max-connections %u does not fit the open-file limit %llu; using %u\n",
                     o.max_connections, (unsigned long long)rl.rlim_cur, fit);
        o.max_connections = fit;
    }
    const size_t colon = o.listen.rfind(':');
    if (colon == std::string::npos) throw std::runtime_error("--listen wants ADDR:PORT, got '" + o.listen + "'");
    std::string host = o.listen.substr(0, colon);
    const std::string port_s = o.listen.substr(colon + 1);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    char *end = nullptr;
    const long port = std::strtol(port_s.c_str(), &end, 10);
    if (port_s.empty() || *end || port < 0 || port > 65535) throw std::runtime_error("--listen: bad port '" + port_s + "'");
    if (!o.auth && !is_loopback_host(host))
        throw std::runtime_error("--no-auth is refused on a non-loopback address (" + host +
                                 "): anyone who can reach it could use the model; keep the key");
    sockaddr_in v4{};
    sockaddr_in6 v6{};
    sockaddr *sa = nullptr;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME;
    if (host == "localhost") host = "127.0.0.1";
    if (inet_pton(AF_INET, host.c_str(), &v4.sin_addr) == 1) {
        v4.sin_family = AF_INET;
        v4.sin_port = htons(uint16_t(port));
        sa = reinterpret_cast<sockaddr *>(&v4);
    } else if (inet_pton(AF_INET6, host.c_str(), &v6.sin6_addr) == 1) {
        v6.sin6_family = AF_INET6;
        v6.sin6_port = htons(uint16_t(port));
        sa = reinterpret_cast<sockaddr *>(&v6);
        flags |= MHD_USE_IPv6;
    } else {
        throw std::runtime_error("--listen: '" + host + "' is not an IPv4 or IPv6 address");
    }
    impl_->gen = std::make_unique<Workers>(o.socket_path, o.workers, o.queue, &impl_->metrics);
    impl_->admin = std::make_unique<Workers>(o.socket_path, 1, 64, nullptr);
    impl_->mhd = MHD_start_daemon(flags, uint16_t(port), nullptr, nullptr, &Impl::on_request, impl_.get(),
                                  MHD_OPTION_SOCK_ADDR, sa,
                                  MHD_OPTION_CONNECTION_LIMIT, o.max_connections,
                                  MHD_OPTION_CONNECTION_TIMEOUT, o.timeout_s,
                                  MHD_OPTION_CONNECTION_MEMORY_LIMIT, o.max_header,
                                  MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u,
                                  MHD_OPTION_NOTIFY_COMPLETED, &Impl::on_completed, nullptr,
                                  MHD_OPTION_END);
    if (!impl_->mhd) throw std::runtime_error("cannot listen on " + o.listen + " (address in use or not available)");
    if (!o.port_file.empty()) {
        std::ofstream f(o.port_file + ".tmp");
        f << this->port() << "\n";
        f.close();
        std::rename((o.port_file + ".tmp").c_str(), o.port_file.c_str());
    }
}

uint16_t Server::port() const {
    if (!impl_->mhd) return 0;
    const MHD_DaemonInfo *di = MHD_get_daemon_info(impl_->mhd, MHD_DAEMON_INFO_BIND_PORT);
    return di ? di->port : 0;
}

void Server::stop() {
    if (!impl_ || !impl_->mhd) return;
    // Stop accepting, let every running generation end (cancelled), and wake the
    // connections waiting on them: MHD must not be stopped with suspended connections.
    MHD_quiesce_daemon(impl_->mhd);
    {
        std::lock_guard lk(impl_->jobs_mu);
        for (auto &w : impl_->live)
            if (auto j = w.lock()) j->cancelled = true;
    }
    impl_->gen.reset();
    impl_->admin.reset();
    {
        std::lock_guard lk(impl_->jobs_mu);
        for (auto &w : impl_->live)
            if (auto j = w.lock()) {
                std::lock_guard jl(j->mu);
                j->done = true;
                j->ready = true;
                j->wake_locked();
            }
    }
    MHD_stop_daemon(impl_->mhd);
    impl_->mhd = nullptr;
}

}  // namespace ds4::gateway
