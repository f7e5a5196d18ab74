// Request handlers: each answers its request, and any failure inside one (std::bad_alloc
// included) fails only that request.
#include <algorithm>
#include <ctime>

#include "daemon/log.h"
#include "daemon/worker_impl.h"

namespace ds4::daemon {

// When a stored session `name` was evicted to keep the store's budget (and not stored
// since): a note saying so; empty otherwise.
std::string Worker::Impl::eviction_note(const std::string &name) const {
    kvstore::EvictedInfo ev;
    if (!cfg.store || name.empty() || !cfg.store->evicted(name, &ev)) return {};
    return "stored session '" + name + "' was evicted on " + utc_time(ev.evicted_ms / 1000) + " " + ev.why;
}

std::string Worker::Impl::utc_time(uint64_t unix_s) {
    const time_t t = time_t(unix_s);
    tm g;
    gmtime_r(&t, &g);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &g);
    return buf;
}

// Why the latest save of this session failed (its stored version is behind); empty if
// it did not. Does not wait for queued saves.
std::string Worker::Impl::save_error_of(const std::string &name) const {
    return saver && !name.empty() ? saver->last_error(name) : std::string();
}

// Any failure inside a handler (std::bad_alloc included) fails only its own request;
// the worker, and every other request, goes on.
void Worker::Impl::handle(Request &r) {
    defer_why.clear();
    try {
        std::visit([&](auto &p) { on(r, p); }, r.body);
    } catch (const std::exception &e) {
        defer_why.clear();
        const bool oom = dynamic_cast<const std::bad_alloc *>(&e) != nullptr;
        log_line("request %llu failed: %s", static_cast<unsigned long long>(r.id), oom ? "out of memory" : e.what());
        try {
            reply_error(r, fb::ErrorCode::Internal, oom ? "ds4d ran out of memory for this request" : e.what());
        } catch (const std::exception &) {
            log_line("request %llu: the error reply could not be sent either", static_cast<unsigned long long>(r.id));
        }
    }
    // It must wait for a session slot or cache memory: kept and retried in order
    // (retry_deferred), or refused now when --kv-wait is 0.
    if (defer_why.empty() || retrying) return;
    if (cfg.kv_wait.count() == 0) {
        const std::string why = defer_why;
        defer_why.clear();
        ++kv_refused;
        return reply_error(r, fb::ErrorCode::SessionLimit, why);
    }
    if (deferred.empty()) retry_state = room_state();
    deferred.push_back(Deferred{std::move(r), Clock::now(), defer_why});
    defer_why.clear();
}

void Worker::Impl::on(Request &r, OpenSessionParams &p) {
    if (stopping) return reply_error(r, fb::ErrorCode::ShuttingDown, "ds4d is shutting down");
    const uint32_t ctx = p.ctx ? p.ctx : default_ctx;
    if (ctx < 16 || (model_summary.n_ctx_max && ctx > model_summary.n_ctx_max))
        return reply_error(r, fb::ErrorCode::BadRequest,
                           "context " + std::to_string(ctx) + " is outside [16, " +
                               std::to_string(model_summary.n_ctx_max) + "]");
    if (!p.name.empty()) {
        if (auto pk = parked_names.find(p.name); pk != parked_names.end()) {
            fb::ErrorCode code = fb::ErrorCode::None;
            std::string msg;
            if (!unpark(pk->second, &code, &msg)) return reply_error(r, code, msg);
        }
        auto it = names.find(p.name);
        if (it != names.end()) {
            LiveSession *s = sessions.at(it->second).get();
            touch(s);
            if (p.ctx > s->ctx) {
                if (std::string err = grow_ctx(s, p.ctx); !err.empty())
                    return reply_error(r, fb::ErrorCode::BadRequest, err);
            }
            return emit(r.conn, r.id,
                        session_opened_frame(r.id, s->id, s->name, s->ctx, uint32_t(s->history.size()), false,
                                             save_error_of(s->name)),
                        true);
        }
    }
    if (std::string why; !make_room(&why)) return reply_error(r, fb::ErrorCode::SessionLimit, why);
    auto s = std::make_unique<LiveSession>();
    s->id = next_session++;
    s->name = p.name;
    s->owner = p.name.empty() ? r.conn->id : 0;
    s->ctx = ctx;
    s->created_unix = s->used_unix = uint64_t(std::time(nullptr));
    bool created = true;
    std::string evicted;
    if (!p.name.empty()) {
        fb::ErrorCode code = fb::ErrorCode::None;
        std::string msg;
        switch (load_stored(p.name, p.ctx, *s, &code, &msg)) {
        case Loaded::Yes: created = false; break;
        case Loaded::Absent: evicted = eviction_note(p.name); break;
        case Loaded::Failed: log_line("%s", msg.c_str()); return reply_error(r, code, msg);
        }
    }
    if (!evicted.empty()) log_line("%s; session '%s' starts empty", evicted.c_str(), p.name.c_str());
    LiveSession *raw = s.get();
    raw->saved_len = raw->history.size();
    touch(raw);
    sessions.emplace(raw->id, std::move(s));
    if (!raw->name.empty()) names.emplace(raw->name, raw->id);
    emit(r.conn, r.id,
         session_opened_frame(r.id, raw->id, raw->name, raw->ctx, uint32_t(raw->history.size()), created, {},
                              evicted),
         true);
}

void Worker::Impl::on(Request &r, LoadSessionParams &p) {
    if (!cfg.store) return reply_error(r, fb::ErrorCode::NoStore, "ds4d runs without a session store (--no-store)");
    if (!names.count(p.name) && !quarantined.count(p.name)) {
        saver->flush();
        kvstore::EntryInfo info;
        if (cfg.store->info(p.name, &info).code() == kvstore::Code::kNotFound) {
            const std::string evicted = eviction_note(p.name);
            return reply_error(r, fb::ErrorCode::UnknownSession,
                               "no stored session named " + p.name + (evicted.empty() ? "" : " (" + evicted + ")"));
        }
    }
    OpenSessionParams o{p.name, p.ctx};
    on(r, o);
}

void Worker::Impl::on(Request &r, SaveSessionParams &p) {
    if (!cfg.store) return reply_error(r, fb::ErrorCode::NoStore, "ds4d runs without a session store (--no-store)");
    LiveSession *s = nullptr;
    if (p.session) {
        fb::ErrorCode code = fb::ErrorCode::UnknownSession;
        std::string msg = "no session " + std::to_string(p.session);
        s = lookup(r.conn, p.session, &code, &msg);
        if (!s) return reply_error(r, code, msg);
    } else {
        auto it = names.find(p.name);
        if (it != names.end()) s = sessions.at(it->second).get();
    }
    const std::string target = p.name.empty() ? (s ? s->name : std::string()) : p.name;
    if (target.empty())
        return reply_error(r, fb::ErrorCode::BadRequest, "an anonymous session needs a name to be saved under");
    if (!s) {
        // Not in memory: what the store holds is already durable.
        saver->flush();
        kvstore::EntryInfo info;
        const kvstore::Status st = cfg.store->info(target, &info);
        if (!st)
            return reply_error(r, st.code() == kvstore::Code::kNotFound ? fb::ErrorCode::UnknownSession
                                                                      : fb::ErrorCode::Store,
                               "no session named " + target + " (" + st.to_string() + ")");
        return emit(r.conn, r.id, session_saved_frame(r.id, target, info.n_tokens, info.bytes), true);
    }
    if (s->busy)
        return reply_error(r, fb::ErrorCode::SessionBusy, "session " + target + " is generating; save it after its turn");
    if (!s->bridge || s->evaluated.empty())
        return reply_error(r, fb::ErrorCode::BadRequest, "session " + target + " holds no tokens yet");
    std::vector<uint8_t> bytes;
    try {
        settle(s);
        bytes = s->bridge->save_payload();
    } catch (const BridgeFailure &e) {
        return reply_error(r, fb::ErrorCode::Engine, e.what());
    }
    const uint32_t n = uint32_t(s->evaluated.size());
    const uint64_t len = bytes.size();
    std::shared_ptr<ConnShared> conn = r.conn;
    const uint64_t rid = r.id;
    saver->save(target, std::move(bytes), [this, conn, rid, target, n, len](const kvstore::Status &st) {
        if (st) emit(conn, rid, session_saved_frame(rid, target, n, len), true);
        else
            emit(conn, rid,
                 error_frame(rid, fb::ErrorCode::Store,
                             "saving session " + target + " failed; the previous stored version is kept: " +
                                 st.to_string()),
                 true);
    });
}

void Worker::Impl::on(Request &r, PinSessionParams &p) {
    if (!cfg.store) return reply_error(r, fb::ErrorCode::NoStore, "ds4d runs without a session store (--no-store)");
    saver->flush();
    const kvstore::Status st = cfg.store->pin(p.name, p.pinned);
    if (st.code() == kvstore::Code::kNotFound)
        return reply_error(r, fb::ErrorCode::UnknownSession,
                           names.count(p.name) ? "session " + p.name + " is not stored yet (it is saved after its first turn)"
                                               : "no stored session named " + p.name);
    if (!st) return reply_error(r, fb::ErrorCode::Store, st.to_string());
    emit(r.conn, r.id, ok_frame(r.id), true);
}

void Worker::Impl::on(Request &r, CloseParams &p) {
    fb::ErrorCode code = fb::ErrorCode::UnknownSession;
    std::string msg = "no session " + std::to_string(p.session);
    LiveSession *s = lookup(r.conn, p.session, &code, &msg);
    if (!s) return reply_error(r, code, msg);
    if (s->name.empty()) {
        if (s->busy) finish_job(*s->busy, fb::FinishReason::Cancelled);
        erase_session(s);
    }
    // Named sessions outlive connections; DeleteSession removes them.
    emit(r.conn, r.id, ok_frame(r.id), true);
}

void Worker::Impl::on(Request &r, DeleteSessionParams &p) {
    bool found = false;
    auto it = names.find(p.name);
    if (it != names.end()) {
        LiveSession *s = sessions.at(it->second).get();
        saving_suppressed = true;
        if (s->busy) finish_job(*s->busy, fb::FinishReason::Cancelled);
        saving_suppressed = false;
        erase_session(s);
        found = true;
    }
    if (auto pk = parked_names.find(p.name); pk != parked_names.end()) {
        parked.erase(pk->second);
        parked_names.erase(pk);
        found = true;
    }
    if (cfg.store) {
        found = quarantined.erase(p.name) > 0 || found;
        saver->flush();
        saver->forget(p.name);
        const kvstore::Status st = cfg.store->remove(p.name);
        if (st) found = true;
        else if (st.code() != kvstore::Code::kNotFound)
            return reply_error(r, fb::ErrorCode::Store, "deleting stored session " + p.name + ": " + st.to_string());
    }
    if (!found) return reply_error(r, fb::ErrorCode::UnknownSession, "no session named " + p.name);
    emit(r.conn, r.id, ok_frame(r.id), true);
}

// The store's remembered evictions of names neither stored (`stored`) nor live now.
std::vector<EvictedEntry> Worker::Impl::evicted_entries(const std::unordered_map<std::string, size_t> &stored) const {
    std::vector<EvictedEntry> out;
    std::vector<kvstore::EvictedInfo> all;
    if (!cfg.store) return out;
    if (const kvstore::Status st = cfg.store->list_evicted(&all); !st) {
        log_line("listing evicted sessions: %s", st.to_string().c_str());
        return out;
    }
    for (const auto &e : all)
        if (!stored.count(e.name) && !names.count(e.name)) out.push_back({e.name, e.evicted_ms / 1000, e.why});
    return out;
}

void Worker::Impl::on(Request &r, ListSessionsParams &) {
    std::vector<SessionListEntry> v;
    std::unordered_map<std::string, size_t> at;
    if (cfg.store) {
        saver->flush();  // turns that ended before this request are listed as stored
        std::vector<kvstore::EntryInfo> stored;
        const kvstore::Status st = cfg.store->list(&stored);
        if (!st) return reply_error(r, fb::ErrorCode::Store, "listing stored sessions: " + st.to_string());
        for (const auto &e : stored) {
            at[e.name] = v.size();
            v.push_back({e.name, e.n_tokens, e.bytes, e.created_ms / 1000, e.last_used_ms / 1000, e.pinned, false,
                         e.n_tokens, save_error_of(e.name)});
        }
    }
    for (auto &[id, s] : sessions) {
        if (s->name.empty()) continue;
        auto f = at.find(s->name);
        if (f == at.end()) {
            v.push_back({s->name, uint32_t(s->history.size()), 0, s->created_unix, s->used_unix, false, true, 0,
                         save_error_of(s->name)});
        } else {
            SessionListEntry &e = v[f->second];
            e.live = true;
            e.n_tokens = uint32_t(s->history.size());
            e.last_used_unix = std::max(e.last_used_unix, s->used_unix);
        }
    }
    std::sort(v.begin(), v.end(), [](auto &a, auto &b) { return a.name < b.name; });
    emit(r.conn, r.id, session_list_frame(r.id, v, evicted_entries(at)), true);
}

void Worker::Impl::on(Request &r, TokenizeParams &p) {
    try {
        auto toks = model->tokenize(p.text, p.special);
        emit(r.conn, r.id, tokenize_result_frame(r.id, toks), true);
    } catch (const BridgeFailure &e) {
        reply_error(r, fb::ErrorCode::Engine, e.what());
    }
}

void Worker::Impl::on(Request &r, DetokenizeParams &p) {
    for (size_t i = 0; i < p.tokens.size(); ++i)
        if (p.tokens[i] < 0 || p.tokens[i] >= model->vocab())
            return reply_error(r, fb::ErrorCode::BadRequest,
                               "token " + std::to_string(i) + " (" + std::to_string(p.tokens[i]) +
                                   ") is outside the vocabulary of " + std::to_string(model->vocab()));
    try {
        emit(r.conn, r.id, detokenize_result_frame(r.id, model->detokenize(p.tokens)), true);
    } catch (const BridgeFailure &e) {
        reply_error(r, fb::ErrorCode::Engine, e.what());
    }
}

void Worker::Impl::on(Request &r, StatsParams &p) {
    StatsFields s;
    s.uptime_s = std::chrono::duration<double>(Clock::now() - started_at).count();
    s.sessions = uint32_t(sessions.size());
    s.connections = p.connections;
    // Active: every request ds4d holds; queued: those not running yet (waiting for memory or
    // their first step). A request in prefill is running.
    s.active_requests = uint32_t(jobs.size());
    for (auto &j : jobs) s.queued_requests += j->admitted && j->started ? 0 : 1;
    // Rates over finished and running requests alike: the token counters move with every step.
    uint64_t prefill_ns = prefill_ns_total, decode_ns = decode_ns_total;
    for (auto &j : jobs) {
        prefill_ns += j->prefill_ns;
        decode_ns += j->decode_ns;
    }
    s.requests_total = requests_total;
    s.tokens_in = tokens_in;
    s.tokens_cached = tokens_cached;
    s.tokens_out = tokens_out;
    s.prefill_tok_s = prefill_ns ? double(prefill_tokens) * 1e9 / double(prefill_ns) : 0.0;
    s.decode_tok_s = decode_ns ? double(tokens_out) * 1e9 / double(decode_ns) : 0.0;
    s.memory = model->memory();
    s.drafter = std::move(p.drafter);
    const bool mapped_elsewhere = std::any_of(s.drafter.importers.begin(), s.drafter.importers.end(),
                                              [](const DrafterImporter &i) { return i.mapped; });
    if (mapped_elsewhere) {
        // ds4d's drafter lives in the memfd it exports: its in-place tensors are the pages
        // the importers map.
        s.memory.shared_bytes += s.memory.drafter_mapped_bytes;
        s.memory.private_bytes -= std::min(s.memory.private_bytes, s.memory.drafter_mapped_bytes);
    }
    s.experts = model->model().expert_stats();
    s.streaming = s.experts.streaming != 0;
    s.saves_failed = saver ? saver->saves_failed() : 0;
    s.steps = steps;
    s.step_rows = step_rows;
    s.step_requests = step_sessions;
    s.step_seconds = double(step_ns_total) * 1e-9;
    s.max_batch = cfg.max_batch;
    s.step_tokens = cfg.step_tokens;
    if (draft_max > 0) {
        const ds4_bridge_spec_counters_t c = model->model().spec_counters();
        s.draft_max = uint32_t(draft_max);
        s.spec_trials = c.trials;
        s.spec_drafted = c.drafted;
        s.spec_accepted = c.accepted;
        s.spec_fallbacks = c.fallbacks;
    }
    s.spec_tokens = spec_tokens;
    s.spec_solo_tokens = spec_solo_tokens;
    s.spec_solo_seconds = double(spec_solo_ns) * 1e-9;
    s.solo_steps = solo_steps;
    s.solo_seconds = double(solo_ns) * 1e-9;
    s.kv_budget = cfg.kv_budget;
    s.kv_in_use = kv_in_use();
    for (auto &j : jobs) s.kv_waiting += j->admitted ? 0 : 1;
    s.slot_waiting = uint32_t(deferred.size());
    s.kv_refused = kv_refused;
    const auto now = Clock::now();
    for (auto &j : jobs) {
        StatsFields::Stream x;
        x.request_id = j->rid;
        x.session = j->session->name;
        x.prefilling = !j->decoding;
        x.prompt_tokens = j->prompt_tokens;
        x.prefilled = uint32_t(j->synced > j->base_len ? j->synced - j->base_len : 0);
        x.generated = j->generated;
        const double secs = j->generated ? std::chrono::duration<double>(now - j->first_token_at).count() : 0.0;
        x.tok_s = secs > 0 ? double(j->generated) / secs : 0.0;
        x.drafted = j->drafted;
        x.accepted = j->accepted;
        s.streams.push_back(std::move(x));
    }
    emit(r.conn, r.id, stats_result_frame(r.id, model_summary, s), true);
}

void Worker::Impl::on(Request &r, GenerateParams &p) {
    if (stopping) return reply_error(r, fb::ErrorCode::ShuttingDown, "ds4d is shutting down");
    for (auto &j : jobs)
        if (j->conn->id == r.conn->id && j->rid == r.id)
            return reply_error(r, fb::ErrorCode::BadRequest,
                               "request id " + std::to_string(r.id) + " is already running on this connection");
    auto job = std::make_unique<Job>();
    if (p.session == 0) {
        job->ephemeral = std::make_unique<LiveSession>();
        job->ephemeral->ctx = default_ctx;
        job->ephemeral->ephemeral = true;
        job->session = job->ephemeral.get();
    } else {
        fb::ErrorCode code = fb::ErrorCode::UnknownSession;
        std::string msg = "no session " + std::to_string(p.session);
        job->session = lookup(r.conn, p.session, &code, &msg);
        if (!job->session) return reply_error(r, code, msg);
        if (job->session->busy)
            return reply_error(r, fb::ErrorCode::SessionBusy,
                               "session " + std::to_string(p.session) + " is already generating");
    }
    LiveSession *s = job->session;
    for (const auto &[t, b] : p.controls.logit_bias)
        if (t >= model->vocab())
            return reply_error(r, fb::ErrorCode::BadRequest,
                               "logit_bias token " + std::to_string(t) + " is outside the vocabulary of " +
                                   std::to_string(model->vocab()));
    std::vector<int32_t> prompt;
    try {
        switch (p.kind) {
        case GenerateParams::Prompt::None: break;
        case GenerateParams::Prompt::Text: prompt = model->tokenize(p.text, false); break;
        case GenerateParams::Prompt::Tokens:
            for (size_t i = 0; i < p.tokens.size(); ++i)
                if (p.tokens[i] >= model->vocab())
                    return reply_error(r, fb::ErrorCode::BadRequest,
                                       "token " + std::to_string(i) + " (" + std::to_string(p.tokens[i]) +
                                           ") is outside the vocabulary of " + std::to_string(model->vocab()));
            prompt = p.tokens;
            break;
        case GenerateParams::Prompt::Chat:
            prompt = model->render_chat(p.messages, p.add_generation_prompt, p.thinking);
            // A later turn continues the conversation: drop the template's opening
            // (the beginning-of-sequence part) that the history already has.
            if (!s->history.empty() && prompt.size() >= template_prefix.size() &&
                std::equal(template_prefix.begin(), template_prefix.end(), prompt.begin()))
                prompt.erase(prompt.begin(), prompt.begin() + ptrdiff_t(template_prefix.size()));
            break;
        }
    } catch (const BridgeFailure &e) {
        return reply_error(r, fb::ErrorCode::Engine, e.what());
    }
    if (p.json_object && !json_vocab) {
        try {
            std::vector<std::string> bytes(size_t(model->vocab()));
            std::vector<bool> special(bytes.size());
            for (size_t t = 0; t < bytes.size(); ++t) {
                bytes[t] = model->token_text(int32_t(t));
                special[t] = model->is_special(int32_t(t));
            }
            json_vocab = std::make_unique<JsonVocab>(std::move(bytes), special);
        } catch (const std::exception &e) {
            return reply_error(r, fb::ErrorCode::NotImplemented, e.what());
        }
    }
    std::vector<int32_t> full = s->history;
    full.insert(full.end(), prompt.begin(), prompt.end());
    if (full.empty()) return reply_error(r, fb::ErrorCode::BadRequest, "empty prompt on an empty session");
    if (s->history.size() >= s->ctx)
        return reply_error(r, fb::ErrorCode::ContextOverflow,
                           "the session's context of " + std::to_string(s->ctx) + " tokens is full (" +
                               std::to_string(s->history.size()) +
                               " tokens of history); open it again with a larger context, or delete it");
    if (full.size() >= s->ctx)
        return reply_error(r, fb::ErrorCode::ContextOverflow,
                           "history " + std::to_string(s->history.size()) + " + prompt " +
                               std::to_string(prompt.size()) + " tokens do not fit the session's context of " +
                               std::to_string(s->ctx));
    {
        const uint64_t most = std::min<uint64_t>(s->ctx, uint64_t(full.size()) + p.max_tokens);
        const uint64_t need = request_need(s->ctx, most, p.speculate);
        if (need > cfg.kv_budget) {
            ++kv_refused;
            return reply_error(r, fb::ErrorCode::SessionLimit,
                               "this request's session cache needs " + std::to_string(need >> 20) + " MiB (context " +
                                   std::to_string(s->ctx) + ", up to " + std::to_string(most) +
                                   " tokens), more than the whole session-cache budget of " +
                                   std::to_string(cfg.kv_budget >> 20) +
                                   " MiB (--kv-budget); ask for fewer tokens or a smaller context");
        }
    }
    job->conn = r.conn;
    job->arrival = next_arrival++;
    job->rid = r.id;
    job->p = std::move(p);
    job->text = TextStream(job->p.stop_strings);
    if (job->p.json_object) job->json = std::make_unique<JsonState>();
    std::sort(job->p.stop_tokens.begin(), job->p.stop_tokens.end());
    job->rng = splitmix64(job->p.seed);
    job->base_len = s->history.size();
    job->prompt_tokens = uint32_t(prompt.size());
    job->full = std::move(full);
    // The allocations come before the session changes: if one fails, handle() answers
    // with an error and the session is as it was (not busy with a job that never ran).
    std::vector<int32_t> history = job->full;
    Job *raw = job.get();
    jobs.push_back(std::move(job));
    s->history = std::move(history);
    s->busy = raw;
    s->used_unix = uint64_t(std::time(nullptr));
    ++requests_total;
    tokens_in += prompt.size();
}

}  // namespace ds4::daemon
