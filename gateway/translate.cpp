#include "gateway/translate.h"

#include <cmath>

namespace ds4::gateway {

void bad_request(const std::string &param, const std::string &message) {
    throw ApiError(400, "invalid_request_error", message, param);
}

void not_supported(const std::string &param) {
    throw ApiError(400, "invalid_request_error",
                   "'" + param + "' is not supported by ds4 yet (the daemon has no support for it); leave it out",
                   param, "unsupported_parameter");
}

namespace {

const Json *field(const Json &o, const char *key) {
    auto it = o.find(key);
    return it == o.end() || it->is_null() ? nullptr : &*it;
}

std::string want_string(const Json &v, const std::string &name) {
    if (!v.is_string()) bad_request(name, "'" + name + "' must be a string");
    return v.get<std::string>();
}

double want_number(const Json &v, const std::string &name, double lo, double hi) {
    if (!v.is_number()) bad_request(name, "'" + name + "' must be a number");
    const double d = v.get<double>();
    if (!(d >= lo && d <= hi))
        bad_request(name, "'" + name + "' is " + v.dump() + ", outside [" + Json(lo).dump() + ", " + Json(hi).dump() + "]");
    return d;
}

int64_t want_int(const Json &v, const std::string &name, int64_t lo, int64_t hi) {
    if (!v.is_number_integer()) bad_request(name, "'" + name + "' must be an integer");
    const int64_t i = v.is_number_unsigned() ? int64_t(std::min<uint64_t>(v.get<uint64_t>(), uint64_t(INT64_MAX)))
                                             : v.get<int64_t>();
    if (i < lo || i > hi)
        bad_request(name, "'" + name + "' is " + std::to_string(i) + ", outside [" + std::to_string(lo) + ", " +
                              std::to_string(hi) + "]");
    return i;
}

bool want_bool(const Json &v, const std::string &name) {
    if (!v.is_boolean()) bad_request(name, "'" + name + "' must be a boolean");
    return v.get<bool>();
}

// Text of an OpenAI/Anthropic content value: a string, or an array of text parts joined
// with `sep` (tool results: "\n\n", as the reference encoding joins a result's parts).
std::string content_text(const Json &c, const std::string &name, const char *sep = "") {
    if (c.is_null()) return {};
    if (c.is_string()) return c.get<std::string>();
    if (!c.is_array()) bad_request(name, "'" + name + "' must be a string or an array of content parts");
    std::string out;
    for (size_t i = 0; i < c.size(); ++i) {
        const Json &p = c[i];
        const std::string pn = name + "[" + std::to_string(i) + "]";
        if (i) out += sep;
        if (p.is_string()) {
            out += p.get<std::string>();
            continue;
        }
        if (!p.is_object()) bad_request(pn, "'" + pn + "' must be a content part object");
        const Json *t = field(p, "type");
        const std::string type = t ? want_string(*t, pn + ".type") : "text";
        if (type == "text" || type == "input_text" || type == "output_text") {
            const Json *tx = field(p, "text");
            if (!tx) bad_request(pn + ".text", "'" + pn + ".text' is required");
            out += want_string(*tx, pn + ".text");
        } else if (type == "image_url" || type == "image" || type == "input_image" || type == "input_audio" ||
                   type == "file" || type == "input_file" || type == "document") {
            throw ApiError(400, "invalid_request_error", "'" + pn + "': " + type + " input is not supported by this model",
                           pn + ".type", "unsupported_content");
        } else {
            bad_request(pn + ".type", "'" + pn + ".type' '" + type + "' is not a known content part type");
        }
    }
    return out;
}

void common_sampling(const Json &b, Request &r, double max_temperature) {
    if (const Json *v = field(b, "temperature")) r.temperature = float(want_number(*v, "temperature", 0, max_temperature));
    if (const Json *v = field(b, "top_p")) r.top_p = float(want_number(*v, "top_p", 0, 1));
    if (const Json *v = field(b, "top_k")) r.top_k = int32_t(want_int(*v, "top_k", 0, 1 << 30));
    if (const Json *v = field(b, "min_p")) r.min_p = float(want_number(*v, "min_p", 0, 1));
    if (const Json *v = field(b, "seed")) r.seed = uint64_t(want_int(*v, "seed", INT64_MIN, INT64_MAX));
    if (const Json *v = field(b, "stream")) r.stream = want_bool(*v, "stream");
    if (const Json *v = field(b, "session")) {
        r.session = want_string(*v, "session");
        if (r.session.empty() || r.session.size() > 128)
            bad_request("session", "'session' must be a name of 1 to 128 characters");
        for (char c : r.session)
            if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'))
                bad_request("session", "'session' may contain only letters, digits, '_', '-' and '.'");
    }
    if (const Json *v = field(b, "ignore_eos")) r.ignore_eos = want_bool(*v, "ignore_eos");
}

void read_stop(const Json *v, const std::string &name, Request &r) {
    if (!v) return;
    if (v->is_string()) {
        if (!v->get<std::string>().empty()) r.stop.push_back(v->get<std::string>());
        return;
    }
    if (!v->is_array()) bad_request(name, "'" + name + "' must be a string or an array of strings");
    if (v->size() > 16) bad_request(name, "'" + name + "' has more than 16 entries");
    for (size_t i = 0; i < v->size(); ++i) {
        std::string s = want_string((*v)[i], name + "[" + std::to_string(i) + "]");
        if (!s.empty()) r.stop.push_back(std::move(s));
    }
}

uint32_t read_max_tokens(const Json &b, const char *key) {
    const Json *v = field(b, key);
    return v ? uint32_t(want_int(*v, key, 1, 1 << 30)) : 0;
}

// OpenAI's penalties and logit_bias, plus the repetition penalty of vLLM / llama.cpp's server.
void read_penalties(const Json &b, Request &r) {
    if (const Json *v = field(b, "frequency_penalty")) r.frequency_penalty = float(want_number(*v, "frequency_penalty", -2, 2));
    if (const Json *v = field(b, "presence_penalty")) r.presence_penalty = float(want_number(*v, "presence_penalty", -2, 2));
    for (const char *k : {"repetition_penalty", "repeat_penalty"})
        if (const Json *v = field(b, k)) {
            r.repeat_penalty = float(want_number(*v, k, 0, 10));
            if (!(r.repeat_penalty > 0)) bad_request(k, std::string("'") + k + "' must be above 0 (1 is off)");
        }
    if (const Json *v = field(b, "repeat_last_n")) r.repeat_last_n = int32_t(want_int(*v, "repeat_last_n", -1, INT32_MAX));
    if (const Json *v = field(b, "logit_bias")) {
        if (!v->is_object()) bad_request("logit_bias", "'logit_bias' must be an object of token id -> bias");
        if (v->size() > 300) bad_request("logit_bias", "'logit_bias' has more than 300 entries");
        for (auto it = v->begin(); it != v->end(); ++it) {
            const std::string &k = it.key();
            const std::string w = "logit_bias." + k;
            int64_t id = -1;
            if (!k.empty() && k.size() <= 10 && k.find_first_not_of("0123456789") == std::string::npos) id = std::stoll(k);
            if (id < 0 || id > INT32_MAX) bad_request("logit_bias", "'logit_bias' key '" + k + "' is not a token id");
            r.logit_bias.emplace_back(int32_t(id), float(want_number(it.value(), w, -100, 100)));
        }
    }
}

// OpenAI's sampling extras of chat/completions: penalties, logit_bias, n.
void read_openai_sampling(const Json &b, Request &r) {
    read_penalties(b, r);
    if (const Json *v = field(b, "n")) r.n = uint32_t(want_int(*v, "n", 1, 16));
}

// top_logprobs as OpenAI bounds it.
uint32_t read_top_logprobs(const Json &b) {
    const Json *v = field(b, "top_logprobs");
    return v ? uint32_t(want_int(*v, "top_logprobs", 0, 20)) : 0;
}

// A response format: chat's response_format or responses' text.format, {type: text |
// json_object | json_schema}. json_object is served by ds4d's constrained decoding.
// json_schema is that constraint plus the schema written into the prompt as DeepSeek's
// encoding writes a response format (the model is told the schema; the constraint keeps
// the answer one JSON object; the schema itself is not enforced). Chat nests the schema
// ({json_schema: {name, schema, strict}}), responses does not ({name, schema, strict}).
void read_format(const Json &f, const std::string &name, Request &r) {
    if (!f.is_object() || !field(f, "type")) bad_request(name, "'" + name + "' must be an object with a type");
    const std::string type = want_string(f["type"], name + ".type");
    if (type == "text") return;
    if (type == "json_object") {
        r.json_object = true;
        return;
    }
    if (type == "json_schema") {
        const bool nested = r.api == Api::Chat;
        const std::string where = nested ? name + ".json_schema" : name;
        const Json *js = nested ? field(f, "json_schema") : &f;
        if (!js || !js->is_object()) bad_request(where, "'" + where + "' must be an object with the schema");
        const Json *schema = field(*js, "schema");
        const std::string sw = where + ".schema";
        if (!schema) bad_request(sw, "'" + sw + "' is required (a JSON Schema whose root is an object)");
        if (!schema->is_object()) bad_request(sw, "'" + sw + "' must be a JSON Schema object");
        if (const Json *t = field(*schema, "type"); t && *t != "object")
            bad_request(sw, "'" + sw + "' must describe an object (its root 'type' is " + dump_exact(*t) +
                                "): the answer is constrained to one JSON object");
        r.json_object = true;
        r.prompt_options.response_format = *schema;
        return;
    }
    bad_request(name + ".type", "'" + name + ".type' must be 'text', 'json_object' or 'json_schema', got '" + type + "'");
}

// JSON output is the whole answer: no reasoning before it, no forced tool call instead of it.
void check_json_output(const Request &r, const std::string &name) {
    if (!r.json_object) return;
    const char *what = r.prompt_options.response_format.is_null() ? "json_object" : "json_schema";
    if (r.force_tool)
        bad_request(name, "'" + name + "' " + what + " cannot be combined with a tool_choice that forces a tool call");
    if (r.prompt_options.thinking)
        bad_request(name, "'" + name + "' " + what + " cannot be combined with thinking mode (the reasoning is free "
                    "text before the answer); turn thinking off");
}

// A reasoning effort: none/minimal turn thinking off, any other level on; "max" (and
// OpenAI's "xhigh", the level above high) also asks for DeepSeek's maximum-effort preamble.
void read_effort(const Json &v, const std::string &name, Request &r) {
    const std::string e = want_string(v, name);
    r.prompt_options.thinking = !(e == "none" || e == "minimal");
    r.prompt_options.effort_max = e == "max" || e == "xhigh";
}

// OpenAI/vLLM/DeepSeek ways of asking for thinking mode.
void read_thinking(const Json &b, Request &r) {
    if (const Json *v = field(b, "reasoning_effort")) read_effort(*v, "reasoning_effort", r);
    if (const Json *v = field(b, "reasoning")) {
        if (!v->is_object()) bad_request("reasoning", "'reasoning' must be an object");
        if (const Json *e = field(*v, "effort")) read_effort(*e, "reasoning.effort", r);
    }
    if (const Json *v = field(b, "thinking")) {
        if (v->is_boolean()) {
            r.prompt_options.thinking = v->get<bool>();
        } else if (v->is_object()) {
            const Json *t = field(*v, "type");
            if (!t) bad_request("thinking.type", "'thinking.type' is required");
            const std::string s = want_string(*t, "thinking.type");
            if (s != "enabled" && s != "disabled")
                bad_request("thinking.type", "'thinking.type' must be 'enabled' or 'disabled'");
            r.prompt_options.thinking = s == "enabled";
        } else {
            bad_request("thinking", "'thinking' must be an object or a boolean");
        }
    }
    if (const Json *k = field(b, "chat_template_kwargs")) {
        if (!k->is_object()) bad_request("chat_template_kwargs", "'chat_template_kwargs' must be an object");
        for (const char *n : {"thinking", "enable_thinking"})
            if (const Json *v = field(*k, n)) r.prompt_options.thinking = want_bool(*v, std::string("chat_template_kwargs.") + n);
        // As vLLM hands it to the encoding: only the preamble, thinking is set as above.
        if (const Json *v = field(*k, "reasoning_effort")) {
            const bool thinking = r.prompt_options.thinking;
            read_effort(*v, "chat_template_kwargs.reasoning_effort", r);
            r.prompt_options.thinking = thinking;
        }
    }
}

Json function_def(const std::string &name, const Json *description, const Json *parameters, const std::string &where) {
    Json f = Json::object();
    f["name"] = name;
    if (description) f["description"] = want_string(*description, where + ".description");
    if (parameters) {
        if (!parameters->is_object()) bad_request(where + ".parameters", "'" + where + ".parameters' must be a JSON schema object");
        f["parameters"] = *parameters;
    }
    return f;
}

std::string want_name(const Json *v, const std::string &where) {
    if (!v) bad_request(where, "'" + where + "' is required");
    std::string n = want_string(*v, where);
    if (n.empty() || n.size() > 128) bad_request(where, "'" + where + "' must be 1 to 128 characters");
    for (char c : n)
        if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' || c == ':'))
            bad_request(where, "'" + where + "' may contain only letters, digits, '_', '-', '.' and ':'");
    return n;
}

// tool_choice: OpenAI "none"/"auto"/"required"/{...}; Anthropic {type: auto|any|tool|none}.
void read_tool_choice(const Json &b, Request &r) {
    r.parse_tools = !r.prompt_options.tools.empty();
    const Json *v = field(b, "tool_choice");
    if (!v) return;
    std::string choice;
    if (v->is_string()) choice = v->get<std::string>();
    else if (v->is_object() && field(*v, "type")) choice = want_string((*v)["type"], "tool_choice.type");
    else bad_request("tool_choice", "'tool_choice' must be a string or an object with a type");
    if (choice == "none") {
        r.prompt_options.tools = Json::array();
        r.parse_tools = false;
        return;
    }
    if (choice == "auto") return;
    if (r.prompt_options.tools.empty()) bad_request("tool_choice", "'tool_choice' forces a tool call but no tools are given");
    r.force_tool = true;
    if (choice == "required" || choice == "any") return;  // OpenAI / Anthropic: some tool
    // A named one: OpenAI chat {type: function, function: {name}}, responses {type: function,
    // name}, Anthropic {type: tool, name}.
    if (choice != "function" && choice != "tool")
        bad_request("tool_choice", "'tool_choice' '" + choice + "' is not none, auto, required or a named function");
    const Json *name = field(*v, "name");
    if (const Json *fn = field(*v, "function"); !name && fn && fn->is_object()) name = field(*fn, "name");
    r.forced_tool_name = want_name(name, "tool_choice.name");
    for (const Json &t : r.prompt_options.tools)
        if (t.value("name", "") == r.forced_tool_name) return;
    bad_request("tool_choice", "'tool_choice' names '" + r.forced_tool_name + "', which is not among the tools");
}

Request parse_chat(const Json &b) {
    Request r;
    r.api = Api::Chat;
    read_openai_sampling(b, r);
    common_sampling(b, r, 2);
    if (const Json *v = field(b, "logprobs")) r.logprobs = want_bool(*v, "logprobs");
    r.top_logprobs = read_top_logprobs(b);
    if (r.top_logprobs && !r.logprobs) bad_request("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    read_thinking(b, r);
    read_stop(field(b, "stop"), "stop", r);
    r.max_tokens = read_max_tokens(b, "max_completion_tokens");
    if (!r.max_tokens) r.max_tokens = read_max_tokens(b, "max_tokens");
    if (const Json *so = field(b, "stream_options")) {
        if (!so->is_object()) bad_request("stream_options", "'stream_options' must be an object");
        if (const Json *u = field(*so, "include_usage")) r.include_usage = want_bool(*u, "stream_options.include_usage");
    }
    if (const Json *rf = field(b, "response_format")) read_format(*rf, "response_format", r);
    if (const Json *t = field(b, "tools")) {
        if (!t->is_array()) bad_request("tools", "'tools' must be an array");
        for (size_t i = 0; i < t->size(); ++i) {
            const std::string w = "tools[" + std::to_string(i) + "]";
            const Json &tool = (*t)[i];
            if (!tool.is_object()) bad_request(w, "'" + w + "' must be an object");
            if (const Json *ty = field(tool, "type"); ty && *ty != "function") not_supported(w + ".type");
            const Json *fn = field(tool, "function");
            if (!fn || !fn->is_object()) bad_request(w + ".function", "'" + w + ".function' is required");
            function_def(want_name(field(*fn, "name"), w + ".function.name"), field(*fn, "description"),
                         field(*fn, "parameters"), w + ".function");
            // Into the prompt as the client wrote it (key order, extra keys such as strict),
            // as the reference dumps tool["function"].
            r.prompt_options.tools.push_back(*fn);
        }
    }
    read_tool_choice(b, r);
    const Json *msgs = field(b, "messages");
    if (!msgs || !msgs->is_array() || msgs->empty()) bad_request("messages", "'messages' must be a non-empty array");
    for (size_t i = 0; i < msgs->size(); ++i) {
        const std::string w = "messages[" + std::to_string(i) + "]";
        const Json &m = (*msgs)[i];
        if (!m.is_object()) bad_request(w, "'" + w + "' must be an object");
        const Json *role = field(m, "role");
        if (!role) bad_request(w + ".role", "'" + w + ".role' is required");
        const std::string rs = want_string(*role, w + ".role");
        Message msg;
        const Json *content = field(m, "content");
        msg.content = content ? content_text(*content, w + ".content", rs == "tool" ? "\n\n" : "") : "";
        if (rs == "system") msg.role = Role::System;
        else if (rs == "developer") msg.role = Role::Developer;
        else if (rs == "user") msg.role = Role::User;
        else if (rs == "assistant") {
            msg.role = Role::Assistant;
            if (const Json *rc = field(m, "reasoning_content")) msg.reasoning = want_string(*rc, w + ".reasoning_content");
            if (const Json *tcs = field(m, "tool_calls")) {
                if (!tcs->is_array()) bad_request(w + ".tool_calls", "'" + w + ".tool_calls' must be an array");
                for (size_t k = 0; k < tcs->size(); ++k) {
                    const std::string tw = w + ".tool_calls[" + std::to_string(k) + "]";
                    const Json &tc = (*tcs)[k];
                    if (!tc.is_object()) bad_request(tw, "'" + tw + "' must be an object");
                    const Json *fn = field(tc, "function");
                    if (!fn || !fn->is_object()) bad_request(tw + ".function", "'" + tw + ".function' is required");
                    ToolCall call;
                    if (const Json *id = field(tc, "id")) call.id = want_string(*id, tw + ".id");
                    call.name = want_name(field(*fn, "name"), tw + ".function.name");
                    const Json *args = field(*fn, "arguments");
                    call.arguments = args ? (args->is_string() ? args->get<std::string>() : dump_exact(*args)) : "{}";
                    msg.tool_calls.push_back(std::move(call));
                }
            }
        } else if (rs == "tool") {
            msg.role = Role::Tool;
            const Json *id = field(m, "tool_call_id");
            if (!id) bad_request(w + ".tool_call_id", "'" + w + ".tool_call_id' is required for role 'tool'");
            msg.tool_call_id = want_string(*id, w + ".tool_call_id");
        } else {
            bad_request(w + ".role", "'" + w + ".role' '" + rs + "' is not system, developer, user, assistant or tool");
        }
        r.messages.push_back(std::move(msg));
    }
    return r;
}

Request parse_completions(const Json &b) {
    Request r;
    r.api = Api::Completions;
    r.raw_prompt = true;
    read_openai_sampling(b, r);
    common_sampling(b, r, 2);
    // Completions: logprobs is the number of alternatives (0..5 in OpenAI's API; up to 20 here).
    if (const Json *v = field(b, "logprobs")) {
        r.logprobs = true;
        r.top_logprobs = uint32_t(want_int(*v, "logprobs", 0, 20));
    }
    read_stop(field(b, "stop"), "stop", r);
    r.max_tokens = read_max_tokens(b, "max_tokens");
    if (!r.max_tokens) r.max_tokens = 16;   // the completions API's default
    for (const char *k : {"suffix"})
        if (field(b, k)) not_supported(k);
    if (const Json *v = field(b, "echo"); v && !(v->is_boolean() && !v->get<bool>())) not_supported("echo");
    if (const Json *v = field(b, "best_of"); v && !(v->is_number_integer() && v->get<int64_t>() == 1)) not_supported("best_of");
    if (const Json *so = field(b, "stream_options")) {
        if (!so->is_object()) bad_request("stream_options", "'stream_options' must be an object");
        if (const Json *u = field(*so, "include_usage")) r.include_usage = want_bool(*u, "stream_options.include_usage");
    }
    const Json *p = field(b, "prompt");
    if (!p) bad_request("prompt", "'prompt' is required");
    if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) r.prompt = (*p)[0].get<std::string>();
    else if (p->is_string()) r.prompt = p->get<std::string>();
    else if (p->is_array() && !p->empty() && !(*p)[0].is_string()) not_supported("prompt (token ids)");
    else if (p->is_array() && p->size() > 1) not_supported("prompt (several prompts)");
    else bad_request("prompt", "'prompt' must be a string");
    if (r.prompt.empty()) bad_request("prompt", "'prompt' is empty");
    return r;
}

Request parse_responses(const Json &b) {
    Request r;
    r.api = Api::Responses;
    common_sampling(b, r, 2);
    read_thinking(b, r);
    read_penalties(b, r);
    for (const char *k : {"conversation", "background"})
        if (const Json *v = field(b, k); v && !(v->is_boolean() && !v->get<bool>())) not_supported(k);
    if (const Json *v = field(b, "store")) r.store = want_bool(*v, "store");
    if (const Json *v = field(b, "previous_response_id")) {
        r.previous_response_id = want_string(*v, "previous_response_id");
        if (r.previous_response_id.empty()) bad_request("previous_response_id", "'previous_response_id' is empty");
    }
    // Logprobs: include ["message.output_text.logprobs"], with top_logprobs alternatives.
    r.top_logprobs = read_top_logprobs(b);
    r.logprobs = r.top_logprobs > 0;
    if (const Json *inc = field(b, "include")) {
        if (!inc->is_array()) bad_request("include", "'include' must be an array of strings");
        for (size_t i = 0; i < inc->size(); ++i)
            if (want_string((*inc)[i], "include[" + std::to_string(i) + "]") == "message.output_text.logprobs") r.logprobs = true;
    }
    if (const Json *t = field(b, "text")) {
        if (const Json *f = t->is_object() ? field(*t, "format") : nullptr) read_format(*f, "text.format", r);
    }
    r.max_tokens = read_max_tokens(b, "max_output_tokens");
    if (const Json *t = field(b, "tools")) {
        if (!t->is_array()) bad_request("tools", "'tools' must be an array");
        for (size_t i = 0; i < t->size(); ++i) {
            const std::string w = "tools[" + std::to_string(i) + "]";
            const Json &tool = (*t)[i];
            if (!tool.is_object()) bad_request(w, "'" + w + "' must be an object");
            if (const Json *ty = field(tool, "type"); !ty || *ty != "function") not_supported(w + ".type");
            r.prompt_options.tools.push_back(
                function_def(want_name(field(tool, "name"), w + ".name"), field(tool, "description"), field(tool, "parameters"), w));
        }
    }
    read_tool_choice(b, r);
    if (const Json *ins = field(b, "instructions")) r.messages.push_back({Role::System, want_string(*ins, "instructions"), "", {}, ""});
    const Json *in = field(b, "input");
    if (!in) bad_request("input", "'input' is required");
    if (in->is_string()) {
        r.messages.push_back({Role::User, in->get<std::string>(), "", {}, ""});
        return r;
    }
    if (!in->is_array() || in->empty()) bad_request("input", "'input' must be a string or a non-empty array of items");
    for (size_t i = 0; i < in->size(); ++i) {
        const std::string w = "input[" + std::to_string(i) + "]";
        const Json &it = (*in)[i];
        if (!it.is_object()) bad_request(w, "'" + w + "' must be an object");
        const Json *ty = field(it, "type");
        const std::string type = ty ? want_string(*ty, w + ".type") : "message";
        if (type == "message") {
            const Json *role = field(it, "role");
            if (!role) bad_request(w + ".role", "'" + w + ".role' is required");
            const std::string rs = want_string(*role, w + ".role");
            Message m;
            const Json *c = field(it, "content");
            m.content = c ? content_text(*c, w + ".content") : "";
            if (rs == "user") m.role = Role::User;
            else if (rs == "assistant") m.role = Role::Assistant;
            else if (rs == "system") m.role = Role::System;
            else if (rs == "developer") m.role = Role::Developer;
            else bad_request(w + ".role", "'" + w + ".role' '" + rs + "' is not user, assistant, system or developer");
            r.messages.push_back(std::move(m));
        } else if (type == "function_call") {
            ToolCall tc;
            const Json *id = field(it, "call_id");
            if (!id) bad_request(w + ".call_id", "'" + w + ".call_id' is required");
            tc.id = want_string(*id, w + ".call_id");
            tc.name = want_name(field(it, "name"), w + ".name");
            const Json *a = field(it, "arguments");
            tc.arguments = a ? want_string(*a, w + ".arguments") : "{}";
            // Calls join the assistant turn they follow (one turn may hold text and calls).
            if (r.messages.empty() || r.messages.back().role != Role::Assistant)
                r.messages.push_back({Role::Assistant, "", "", {}, ""});
            r.messages.back().tool_calls.push_back(std::move(tc));
        } else if (type == "function_call_output") {
            Message m;
            m.role = Role::Tool;
            const Json *id = field(it, "call_id");
            if (!id) bad_request(w + ".call_id", "'" + w + ".call_id' is required");
            m.tool_call_id = want_string(*id, w + ".call_id");
            const Json *o = field(it, "output");
            m.content = o ? content_text(*o, w + ".output", "\n\n") : "";
            r.messages.push_back(std::move(m));
        } else if (type == "reasoning") {
            continue;   // earlier reasoning: dropped, as the chat format drops it
        } else {
            not_supported(w + ".type (" + type + ")");
        }
    }
    return r;
}

Request parse_messages(const Json &b) {
    Request r;
    r.api = Api::Messages;
    common_sampling(b, r, 1);
    read_thinking(b, r);
    read_stop(field(b, "stop_sequences"), "stop_sequences", r);
    r.max_tokens = read_max_tokens(b, "max_tokens");
    if (!r.max_tokens) bad_request("max_tokens", "max_tokens: Field required");
    if (const Json *t = field(b, "tools")) {
        if (!t->is_array()) bad_request("tools", "tools: must be an array");
        for (size_t i = 0; i < t->size(); ++i) {
            const std::string w = "tools." + std::to_string(i);
            const Json &tool = (*t)[i];
            if (!tool.is_object()) bad_request(w, w + ": must be an object");
            if (const Json *ty = field(tool, "type"); ty && *ty != "custom") not_supported(w + ".type");
            r.prompt_options.tools.push_back(function_def(want_name(field(tool, "name"), w + ".name"),
                                                          field(tool, "description"), field(tool, "input_schema"), w));
        }
    }
    read_tool_choice(b, r);
    // System text blocks are joined as a user turn's text blocks are (below): a blank line.
    if (const Json *s = field(b, "system")) r.messages.push_back({Role::System, content_text(*s, "system", "\n\n"), "", {}, ""});
    const Json *msgs = field(b, "messages");
    if (!msgs || !msgs->is_array() || msgs->empty()) bad_request("messages", "messages: must be a non-empty array");
    for (size_t i = 0; i < msgs->size(); ++i) {
        const std::string w = "messages." + std::to_string(i);
        const Json &m = (*msgs)[i];
        if (!m.is_object()) bad_request(w, w + ": must be an object");
        const Json *role = field(m, "role");
        if (!role) bad_request(w + ".role", w + ".role: Field required");
        const std::string rs = want_string(*role, w + ".role");
        if (rs != "user" && rs != "assistant") bad_request(w + ".role", w + ".role: must be 'user' or 'assistant'");
        const Json *c = field(m, "content");
        if (!c) bad_request(w + ".content", w + ".content: Field required");
        if (c->is_string()) {
            r.messages.push_back({rs == "user" ? Role::User : Role::Assistant, c->get<std::string>(), "", {}, ""});
            continue;
        }
        if (!c->is_array()) bad_request(w + ".content", w + ".content: must be a string or an array of blocks");
        Message text{rs == "user" ? Role::User : Role::Assistant, "", "", {}, ""};
        bool have_text = false;
        for (size_t k = 0; k < c->size(); ++k) {
            const std::string bw = w + ".content." + std::to_string(k);
            const Json &blk = (*c)[k];
            if (!blk.is_object() || !field(blk, "type")) bad_request(bw, bw + ": must be a block with a type");
            const std::string type = want_string(blk["type"], bw + ".type");
            if (type == "text") {
                const Json *t = field(blk, "text");
                if (!t) bad_request(bw + ".text", bw + ".text: Field required");
                if (have_text) text.content += "\n\n";
                text.content += want_string(*t, bw + ".text");
                have_text = true;
            } else if (type == "tool_use" && rs == "assistant") {
                ToolCall tc;
                const Json *id = field(blk, "id");
                if (!id) bad_request(bw + ".id", bw + ".id: Field required");
                tc.id = want_string(*id, bw + ".id");
                tc.name = want_name(field(blk, "name"), bw + ".name");
                const Json *in = field(blk, "input");
                tc.arguments = in ? dump_exact(*in) : "{}";
                text.tool_calls.push_back(std::move(tc));
            } else if (type == "tool_result" && rs == "user") {
                Message tm{Role::Tool, "", "", {}, ""};
                const Json *id = field(blk, "tool_use_id");
                if (!id) bad_request(bw + ".tool_use_id", bw + ".tool_use_id: Field required");
                tm.tool_call_id = want_string(*id, bw + ".tool_use_id");
                if (const Json *tc = field(blk, "content")) tm.content = content_text(*tc, bw + ".content", "\n\n");
                r.messages.push_back(std::move(tm));
            } else if (type == "thinking" && rs == "assistant") {
                if (const Json *t = field(blk, "thinking")) text.reasoning += want_string(*t, bw + ".thinking");
            } else if (type == "redacted_thinking") {
                continue;
            } else if (type == "image" || type == "document") {
                throw ApiError(400, "invalid_request_error", bw + ": " + type + " input is not supported by this model",
                               bw + ".type", "unsupported_content");
            } else {
                bad_request(bw + ".type", bw + ".type: '" + type + "' is not allowed in a " + rs + " message");
            }
        }
        if (have_text || !text.tool_calls.empty() || !text.reasoning.empty() || rs == "assistant")
            r.messages.push_back(std::move(text));
    }
    return r;
}

const char *anthropic_type(int status) {
    switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return "api_error";
    }
}

}  // namespace

Request parse_request(Api api, std::string_view body) {
    Json b = parse_exact(body);   // big integers in tool inputs and schemas keep their digits
    if (b.is_discarded())
        throw ApiError(400, "invalid_request_error",
                       "the request body is not valid JSON (or nests deeper than " + std::to_string(kMaxJsonDepth) + " levels)",
                       {}, "invalid_json");
    if (!b.is_object()) throw ApiError(400, "invalid_request_error", "the request body must be a JSON object");
    Request r;
    switch (api) {
    case Api::Chat:
        r = parse_chat(b);
        check_json_output(r, "response_format");
        break;
    case Api::Completions: r = parse_completions(b); break;
    case Api::Responses:
        r = parse_responses(b);
        check_json_output(r, "text.format");
        break;
    case Api::Messages: r = parse_messages(b); break;
    }
    if (const Json *m = field(b, "model")) r.model = want_string(*m, "model");
    else if (api == Api::Messages) bad_request("model", "model: Field required");
    return r;
}

std::string error_body(Api api, const ApiError &e) {
    Json j;
    if (api == Api::Messages) {
        j["type"] = "error";
        j["error"] = {{"type", anthropic_type(e.status)}, {"message", e.what()}};
    } else {
        j["error"] = {{"message", e.what()},
                      {"type", e.type},
                      {"param", e.param.empty() ? Json(nullptr) : Json(e.param)},
                      {"code", e.code.empty() ? Json(nullptr) : Json(e.code)}};
    }
    return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace ds4::gateway
