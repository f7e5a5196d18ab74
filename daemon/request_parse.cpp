#include <algorithm>
#include <cmath>
#include <cstdio>

#include "daemon/requests.h"
#include "kvstore/session_name.h"

namespace ds4::daemon {
namespace {

namespace fb = ipc::fb;

ParseResult reject(fb::ErrorCode code, std::string msg) {
    ParseResult r;
    r.kind = ParseResult::Kind::Reject;
    r.code = code;
    r.message = std::move(msg);
    return r;
}

ParseResult bad(std::string msg) { return reject(fb::ErrorCode::BadRequest, std::move(msg)); }

ParseResult request(RequestBody body) {
    ParseResult r;
    r.kind = ParseResult::Kind::Request;
    r.body = std::move(body);
    return r;
}

std::string str(const flatbuffers::String *s) { return s ? s->str() : std::string(); }

// A number as a person writes it (1.5, not std::to_string's 1.500000).
std::string num(float v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", double(v));
    return buf;
}

// The chat template knows these roles; anything else is the client's mistake, refused here
// before the engine sees it.
bool known_role(const flatbuffers::String *r) {
    const std::string_view v = r->string_view();
    return v == "system" || v == "user" || v == "assistant";
}

// Session names follow the store's rule (kvstore/session_name.h), the only one, so a name
// is refused up front as a bad request rather than failing later in the store.
bool bad_name(const std::string &name, const char *what, ParseResult *out) {
    const kvstore::Status st = kvstore::validate_session_name(name);
    if (st) return false;
    *out = bad(std::string(what) + ": " + st.message());
    return true;
}

ParseResult parse_generate(const fb::Generate *g, const ParseLimits &lim) {
    GenerateParams p;
    p.session = g->session();
    const int forms = (g->text() != nullptr) + (g->tokens() != nullptr) + (g->messages() != nullptr);
    if (forms > 1) return bad("Generate: give one of text, tokens, messages, not " + std::to_string(forms));
    if (g->text()) {
        p.kind = GenerateParams::Prompt::Text;
        p.text = g->text()->str();
    } else if (g->tokens()) {
        p.kind = GenerateParams::Prompt::Tokens;
        p.tokens.assign(g->tokens()->begin(), g->tokens()->end());
        for (size_t i = 0; i < p.tokens.size(); ++i)
            if (p.tokens[i] < 0) return bad("Generate: token " + std::to_string(i) + " is negative (" + std::to_string(p.tokens[i]) + ")");
    } else if (g->messages()) {
        p.kind = GenerateParams::Prompt::Chat;
        if (g->messages()->size() == 0) return bad("Generate: messages is empty");
        for (const fb::ChatMessage *m : *g->messages()) {
            if (!known_role(m->role()))
                return bad("Generate: chat message role " + printable_quoted(m->role()->string_view(), 32) +
                           " is not system, user or assistant");
            p.messages.push_back({m->role()->str(), m->content()->str()});
        }
    }
    p.add_generation_prompt = g->add_generation_prompt();
    p.thinking = g->thinking();
    if (const fb::Sampling *s = g->sampling()) {
        p.temperature = s->temperature();
        p.top_k = s->top_k();
        p.top_p = s->top_p();
        p.min_p = s->min_p();
        p.seed = s->seed();
        SamplingControls &c = p.controls;
        c.repeat_penalty = s->repeat_penalty();
        c.repeat_last_n = s->repeat_last_n();
        c.frequency_penalty = s->frequency_penalty();
        c.presence_penalty = s->presence_penalty();
        if (!std::isfinite(c.repeat_penalty) || c.repeat_penalty <= 0 || c.repeat_penalty > 10)
            return bad("Generate: repeat_penalty must be in (0, 10], got " + num(c.repeat_penalty));
        if (c.repeat_last_n < -1)
            return bad("Generate: repeat_last_n must be >= -1 (-1: the whole context), got " + std::to_string(c.repeat_last_n));
        if (!std::isfinite(c.frequency_penalty) || c.frequency_penalty < -2 || c.frequency_penalty > 2)
            return bad("Generate: frequency_penalty must be in [-2, 2], got " + num(c.frequency_penalty));
        if (!std::isfinite(c.presence_penalty) || c.presence_penalty < -2 || c.presence_penalty > 2)
            return bad("Generate: presence_penalty must be in [-2, 2], got " + num(c.presence_penalty));
        if (const auto *lb = s->logit_bias()) {
            if (lb->size() > lim.max_logit_bias)
                return bad("Generate: logit_bias has " + std::to_string(lb->size()) + " entries, at most " +
                           std::to_string(lim.max_logit_bias));
            for (const fb::LogitBias *e : *lb) {
                if (e->token() < 0) return bad("Generate: logit_bias token " + std::to_string(e->token()) + " is negative");
                if (!std::isfinite(e->bias()) || e->bias() < -100 || e->bias() > 100)
                    return bad("Generate: logit_bias of token " + std::to_string(e->token()) + " must be in [-100, 100], got " +
                               num(e->bias()));
                c.logit_bias.emplace_back(e->token(), e->bias());
            }
            std::sort(c.logit_bias.begin(), c.logit_bias.end());
            for (size_t i = 1; i < c.logit_bias.size(); ++i)
                if (c.logit_bias[i].first == c.logit_bias[i - 1].first)
                    return bad("Generate: logit_bias names token " + std::to_string(c.logit_bias[i].first) + " twice");
        }
    }
    p.controls.logprobs = g->logprobs();
    p.controls.top_logprobs = g->top_logprobs();
    if (p.controls.top_logprobs > 20)
        return bad("Generate: top_logprobs must be in [0, 20], got " + std::to_string(p.controls.top_logprobs));
    if (p.controls.top_logprobs > 0 && !p.controls.logprobs)
        return bad("Generate: top_logprobs needs logprobs");
    if (!std::isfinite(p.temperature) || p.temperature < 0 || p.temperature > 100)
        return bad("Generate: temperature must be in [0, 100], got " + num(p.temperature));
    if (p.top_k < 0) return bad("Generate: top_k must be >= 0, got " + std::to_string(p.top_k));
    if (!std::isfinite(p.top_p) || p.top_p < 0 || p.top_p > 1)
        return bad("Generate: top_p must be in [0, 1], got " + num(p.top_p));
    if (!std::isfinite(p.min_p) || p.min_p < 0 || p.min_p > 1)
        return bad("Generate: min_p must be in [0, 1], got " + num(p.min_p));
    p.max_tokens = g->max_tokens();
    if (p.max_tokens > lim.max_tokens)
        return bad("Generate: max_tokens " + std::to_string(p.max_tokens) + " exceeds " + std::to_string(lim.max_tokens));
    if (g->stop_strings()) {
        if (g->stop_strings()->size() > lim.max_stop_strings)
            return bad("Generate: at most " + std::to_string(lim.max_stop_strings) + " stop strings");
        for (const flatbuffers::String *s : *g->stop_strings()) {
            if (!s || s->size() == 0) return bad("Generate: empty stop string");
            if (s->size() > lim.max_stop_string_bytes)
                return bad("Generate: stop string longer than " + std::to_string(lim.max_stop_string_bytes) + " bytes");
            p.stop_strings.push_back(s->str());
        }
    }
    if (g->stop_tokens()) p.stop_tokens.assign(g->stop_tokens()->begin(), g->stop_tokens()->end());
    p.ignore_eos = g->ignore_eos();
    p.progress = g->progress();
    p.speculate = g->speculate();
    switch (g->output_format()) {
    case fb::OutputFormat::Text: break;
    case fb::OutputFormat::JsonObject:
        p.json_object = true;
        if (p.max_tokens < 2) return bad("Generate: a JSON object needs max_tokens >= 2, got " + std::to_string(p.max_tokens));
        break;
    default: return bad("Generate: unknown output_format " + std::to_string(int(g->output_format())));
    }
    // The drafter's proposals are verified against the engine's unadjusted distribution, so a
    // request with sampling controls or constrained output decodes one plain step at a time.
    if (p.controls.active() || p.json_object) p.speculate = false;
    return request(std::move(p));
}

}  // namespace

std::string printable_quoted(std::string_view s, size_t max_bytes) {
    std::string out = "\"";
    for (size_t i = 0; i < s.size() && i < max_bytes; ++i) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') {
            out += char(c);
        } else {
            char esc[8];
            std::snprintf(esc, sizeof esc, "\\x%02x", c);
            out += esc;
        }
    }
    if (s.size() > max_bytes) out += "...";
    return out + "\"";
}

ParseResult parse_request(const fb::Envelope *env, const ParseLimits &lim) {
    using M = fb::Message;
    const M type = env->body_type();
    switch (type) {
    case M::NONE: return reject(fb::ErrorCode::Protocol, "message has no body");
    case M::Hello: {
        ParseResult r;
        r.kind = ParseResult::Kind::Hello;
        r.hello_version = env->body_as_Hello()->protocol_version();
        return r;
    }
    case M::OpenSession: {
        const fb::OpenSession *o = env->body_as_OpenSession();
        OpenSessionParams p{str(o->name()), o->ctx()};
        ParseResult r;
        if (!p.name.empty() && bad_name(p.name, "OpenSession", &r)) return r;
        return request(std::move(p));
    }
    case M::Close: return request(CloseParams{env->body_as_Close()->session()});
    case M::Generate: return parse_generate(env->body_as_Generate(), lim);
    case M::Cancel: {
        ParseResult r;
        r.kind = ParseResult::Kind::Cancel;
        r.cancel_target = env->body_as_Cancel()->target();
        return r;
    }
    case M::Tokenize: {
        const fb::Tokenize *t = env->body_as_Tokenize();
        if (!t->text()) return bad("Tokenize: text is missing");
        return request(TokenizeParams{t->text()->str(), t->special()});
    }
    case M::Detokenize: {
        const fb::Detokenize *d = env->body_as_Detokenize();
        DetokenizeParams p;
        if (d->tokens()) p.tokens.assign(d->tokens()->begin(), d->tokens()->end());
        return request(std::move(p));
    }
    case M::Stats: return request(StatsParams{});
    case M::ListSessions: return request(ListSessionsParams{});
    case M::DeleteSession: {
        DeleteSessionParams p{str(env->body_as_DeleteSession()->name())};
        ParseResult r;
        if (bad_name(p.name, "DeleteSession", &r)) return r;
        return request(std::move(p));
    }
    case M::SaveSession: {
        const fb::SaveSession *m = env->body_as_SaveSession();
        SaveSessionParams p{m->session(), str(m->name())};
        ParseResult r;
        if (p.session == 0 && p.name.empty()) return bad("SaveSession: neither a session id nor a name");
        if (!p.name.empty() && bad_name(p.name, "SaveSession", &r)) return r;
        return request(std::move(p));
    }
    case M::LoadSession: {
        const fb::LoadSession *m = env->body_as_LoadSession();
        LoadSessionParams p{str(m->name()), m->ctx()};
        ParseResult r;
        if (bad_name(p.name, "LoadSession", &r)) return r;
        return request(std::move(p));
    }
    case M::PinSession: {
        const fb::PinSession *m = env->body_as_PinSession();
        PinSessionParams p{str(m->name()), m->pinned()};
        ParseResult r;
        if (bad_name(p.name, "PinSession", &r)) return r;
        return request(std::move(p));
    }
    case M::GetDrafter:  // the connection loop answers it (it passes a descriptor)
        return reject(fb::ErrorCode::Protocol, "GetDrafter is answered by ds4d's connection loop only");
    case M::HelloOk:
    case M::SessionOpened:
    case M::Ok:
    case M::Progress:
    case M::TokenChunk:
    case M::Done:
    case M::TokenizeResult:
    case M::DetokenizeResult:
    case M::StatsResult:
    case M::Error:
    case M::SessionSaved:
    case M::SessionList:
    case M::DrafterShare:
        return reject(fb::ErrorCode::Protocol, std::string(fb::EnumNameMessage(type)) + " is a reply, not a request");
    }
    return reject(fb::ErrorCode::Protocol, "unknown message type " + std::to_string(int(type)));
}

}  // namespace ds4::daemon
