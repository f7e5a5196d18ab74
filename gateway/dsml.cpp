#include "gateway/dsml.h"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace ds4::gateway {

namespace {

void python_string(const std::string &s, std::string &out) {
    out += '"';
    for (unsigned char c : s) {
        switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
            if (c < 0x20) {
                char b[8];
                std::snprintf(b, sizeof b, "\\u%04x", c);
                out += b;
            } else {
                out += char(c);
            }
        }
    }
    out += '"';
}

void big_integer_into(const Json &v, std::string &out) {
    const auto &b = v.get_binary();
    out.append(b.begin(), b.end());
}

// Builds the value as nlohmann's own DOM parser does, keeping integer literals that do not
// fit 64 bits (the lexer hands them over as doubles, with their text) as digits.
class ExactBuilder {
public:
    using number_integer_t = Json::number_integer_t;
    using number_unsigned_t = Json::number_unsigned_t;
    using number_float_t = Json::number_float_t;
    using string_t = Json::string_t;
    using binary_t = Json::binary_t;

    Json root;
    bool null() { return put(nullptr); }
    bool boolean(bool b) { return put(b); }
    bool number_integer(number_integer_t i) { return put(i); }
    bool number_unsigned(number_unsigned_t u) { return put(u); }
    bool number_float(number_float_t d, const string_t &text) {
        const size_t sign = !text.empty() && text[0] == '-' ? 1 : 0;
        if (sign < text.size() && text.find_first_not_of("0123456789", sign) == std::string::npos)   // an integer
            return put(Json::binary(std::vector<uint8_t>(text.begin(), text.end()), kBigInteger));
        return put(d);
    }
    bool string(string_t &s) { return put(std::move(s)); }
    bool binary(binary_t &b) { return put(Json::binary(std::move(b))); }
    bool start_object(std::size_t) { return open(Json::object()); }
    bool end_object() { return close(); }
    bool start_array(std::size_t) { return open(Json::array()); }
    bool end_array() { return close(); }
    bool key(string_t &k) {
        slot_ = &(*stack_.back())[k];
        return true;
    }
    bool parse_error(std::size_t, const std::string &, const nlohmann::detail::exception &) { return false; }

private:
    // The new value's place: the root, the next array element or the object's keyed slot.
    // Containers on the stack are never grown while a child of theirs is open, so the
    // pointers stay valid.
    Json *place(Json v) {
        if (stack_.empty()) {
            root = std::move(v);
            return &root;
        }
        Json &top = *stack_.back();
        if (top.is_array()) {
            top.push_back(std::move(v));
            return &top.back();
        }
        *slot_ = std::move(v);
        return slot_;
    }
    bool put(Json v) {
        place(std::move(v));
        return true;
    }
    bool open(Json v) {
        if (stack_.size() >= kMaxJsonDepth) return false;   // the writers recurse: bound them
        stack_.push_back(place(std::move(v)));
        return true;
    }
    bool close() {
        stack_.pop_back();
        return true;
    }
    std::vector<Json *> stack_;
    Json *slot_ = nullptr;
};

void exact_into(const Json &v, std::string &out) {
    switch (v.type()) {
    case Json::value_t::object: {
        out += '{';
        bool first = true;
        for (auto it = v.begin(); it != v.end(); ++it) {
            if (!first) out += ',';
            first = false;
            out += Json(it.key()).dump(-1, ' ', false, Json::error_handler_t::replace);
            out += ':';
            exact_into(it.value(), out);
        }
        out += '}';
        break;
    }
    case Json::value_t::array: {
        out += '[';
        for (size_t i = 0; i < v.size(); ++i) {
            if (i) out += ',';
            exact_into(v[i], out);
        }
        out += ']';
        break;
    }
    case Json::value_t::binary:
        if (is_big_integer(v)) {
            big_integer_into(v, out);
            break;
        }
        [[fallthrough]];
    default: out += v.dump(-1, ' ', false, Json::error_handler_t::replace); break;
    }
}

void python_json_into(const Json &v, std::string &out) {
    switch (v.type()) {
    case Json::value_t::object: {
        out += '{';
        bool first = true;
        for (auto it = v.begin(); it != v.end(); ++it) {
            if (!first) out += ", ";
            first = false;
            python_string(it.key(), out);
            out += ": ";
            python_json_into(it.value(), out);
        }
        out += '}';
        break;
    }
    case Json::value_t::array: {
        out += '[';
        for (size_t i = 0; i < v.size(); ++i) {
            if (i) out += ", ";
            python_json_into(v[i], out);
        }
        out += ']';
        break;
    }
    case Json::value_t::string: python_string(v.get_ref<const std::string &>(), out); break;
    case Json::value_t::binary:
        if (is_big_integer(v)) {
            big_integer_into(v, out);   // Python's int: the digits
            break;
        }
        [[fallthrough]];
    default: out += v.dump(); break;   // numbers, booleans, null: the same text in both
    }
}

// DeepSeek V4's reasoning_effort "max" preamble, word for word as its encoding writes it.
const char *kEffortMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, "
    "rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

const char *kToolsTemplateHead =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
    "\"<｜DSML｜tool_calls>\" block like the following:\n\n"
    "<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, "
    "arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";
const char *kToolsTemplateTail =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

// The arguments of one call as DSML parameters (the reference's encode_arguments_to_dsml).
std::string dsml_arguments(const ToolCall &tc) {
    Json args = parse_exact(tc.arguments);
    if (args.is_discarded() || !args.is_object()) args = Json{{"arguments", tc.arguments}};
    std::string out;
    bool first = true;
    for (auto it = args.begin(); it != args.end(); ++it) {
        if (!first) out += '\n';
        first = false;
        const bool is_str = it.value().is_string();
        out += kParamOpen;
        out += it.key();
        out += is_str ? "\" string=\"true\">" : "\" string=\"false\">";
        out += is_str ? it.value().get<std::string>() : python_json(it.value());
        out += kParamClose;
    }
    return out;
}

struct Part {
    bool tool = false;
    std::string text;
    std::string id;
};

struct Turn {
    Role role;
    const Message *msg = nullptr;   // non-user turns
    std::vector<Part> parts;        // user turns (text and tool results, merged)
    bool header = false;            // the system turn that carries tools / response format
};

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Length of the longest proper prefix of `marker` that `s` ends with.
size_t partial_suffix(std::string_view s, std::string_view marker) {
    for (size_t k = std::min(s.size(), marker.size() - 1); k > 0; --k)
        if (s.substr(s.size() - k) == marker.substr(0, k)) return k;
    return 0;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// s (after whitespace) is a proper prefix of p: more input may complete it.
bool could_become(std::string_view s, std::string_view p) { return s.size() < p.size() && p.substr(0, s.size()) == s; }

void json_escape_into(std::string_view s, std::string &out) {
    const std::string q = Json(std::string(s)).dump(-1, ' ', false, Json::error_handler_t::replace);
    out.append(q, 1, q.size() - 2);
}

}  // namespace

Json parse_exact(std::string_view text) {
    ExactBuilder b;
    if (!Json::sax_parse(text.begin(), text.end(), &b)) return Json(Json::value_t::discarded);
    return std::move(b.root);
}

bool is_big_integer(const Json &v) {
    return v.is_binary() && v.get_binary().has_subtype() && v.get_binary().subtype() == kBigInteger;
}

std::string dump_exact(const Json &v) {
    std::string out;
    exact_into(v, out);
    return out;
}

std::string python_json(const Json &v) {
    std::string out;
    python_json_into(v, out);
    return out;
}

std::string render_tools(const Json &functions) {
    std::string schemas;
    for (size_t i = 0; i < functions.size(); ++i) {
        if (i) schemas += '\n';
        schemas += python_json(functions[i]);
    }
    return std::string(kToolsTemplateHead) + schemas + kToolsTemplateTail;
}

std::string render_prompt(const std::vector<Message> &messages, const PromptOptions &opt) {
    const bool have_tools = opt.tools.is_array() && !opt.tools.empty();
    // Tool results join the user turn that follows the calls; consecutive user messages
    // and results form one turn (the reference's merge_tool_messages).
    std::vector<Turn> turns;
    for (const Message &m : messages) {
        if (m.role == Role::User || m.role == Role::Tool) {
            Part p{m.role == Role::Tool, m.content, m.tool_call_id};
            if (!turns.empty() && turns.back().role == Role::User) turns.back().parts.push_back(std::move(p));
            else turns.push_back(Turn{Role::User, nullptr, {std::move(p)}, false});
        } else {
            turns.push_back(Turn{m.role, &m, {}, false});
        }
    }
    // Results in the order of the calls they answer (stable; unknown ids first). A
    // continuation's first results answer the calls of the conversation's earlier turns.
    std::vector<std::string> order = opt.continued ? opt.prior_calls : std::vector<std::string>();
    for (Turn &t : turns) {
        if (t.role == Role::Assistant && !t.msg->tool_calls.empty()) {
            order.clear();
            for (const ToolCall &tc : t.msg->tool_calls) order.push_back(tc.id);
        } else if (t.role == Role::User && !order.empty()) {
            std::vector<Part> results;
            for (const Part &p : t.parts)
                if (p.tool) results.push_back(p);
            if (results.size() < 2) continue;
            auto rank = [&](const Part &p) {
                auto it = std::find(order.begin(), order.end(), p.id);
                return (p.id.empty() || it == order.end()) ? 0 : int(it - order.begin());
            };
            std::stable_sort(results.begin(), results.end(), [&](auto &a, auto &b) { return rank(a) < rank(b); });
            size_t k = 0;
            for (Part &p : t.parts)
                if (p.tool) p = results[k++];
        }
    }
    // Tool schemas and a response format go on the first message when it is a system
    // message, else on an empty system message put in front (as vLLM hands tools over).
    // A continuation's conversation has them in its first turn already; its tools still
    // decide what the encoding keeps below.
    static const Message empty_system{Role::System, "", "", {}, ""};
    const bool have_format = !opt.response_format.is_null();
    if ((have_tools || have_format) && !opt.continued) {
        if (turns.empty() || turns.front().role != Role::System)
            turns.insert(turns.begin(), Turn{Role::System, &empty_system, {}, false});
        turns.front().header = true;
    }
    // With tools the reference keeps every turn's reasoning (drop_thinking off).
    const bool drop_thinking = !(opt.continued ? opt.continued_tools : have_tools);
    auto last_user_turn = [&] {
        int last = -1;
        for (size_t i = 0; i < turns.size(); ++i)
            if (turns[i].role == Role::User || turns[i].role == Role::Developer) last = int(i);
        return last;
    };
    int last_user = last_user_turn();
    // Thinking without tools: developer messages before the last user turn are left out
    // (the reference's _drop_thinking_messages), after the merging above.
    if (opt.thinking && drop_thinking) {
        for (int i = last_user - 1; i >= 0; --i)
            if (turns[size_t(i)].role == Role::Developer) turns.erase(turns.begin() + i);
        last_user = last_user_turn();
    }

    // The encoding's rules look at the whole conversation, but only through what is settled
    // above: whether it has tools, the calls the first results answer, and where the last
    // user turn is (in the new turns when they have one; when they have none, every new
    // turn is after it, as it is for a last user turn of -1 here). So the new turns alone
    // render as they do at the end of the whole conversation.
    std::string out = opt.continued ? "" : kBos;
    if (opt.thinking && opt.effort_max && !opt.continued) out += kEffortMax;
    for (size_t i = 0; i < turns.size(); ++i) {
        const Turn &t = turns[i];
        const int idx = int(i);
        switch (t.role) {
        case Role::System:
            out += t.msg->content;
            if (t.header && have_tools) out += "\n\n" + render_tools(opt.tools);
            if (t.header && have_format)
                out += "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n" +
                       python_json(opt.response_format);
            break;
        case Role::Developer:
            out += kUser;
            out += t.msg->content;
            break;
        case Role::User: {
            out += kUser;
            for (size_t k = 0; k < t.parts.size(); ++k) {
                if (k) out += "\n\n";
                if (t.parts[k].tool) out += "<tool_result>" + t.parts[k].text + "</tool_result>";
                else out += t.parts[k].text;
            }
            break;
        }
        case Role::Assistant: {
            const Message &m = *t.msg;
            if (opt.thinking && (!drop_thinking || idx > last_user)) {
                out += m.reasoning;
                out += kEndThink;
            }
            out += m.content;
            if (!m.tool_calls.empty()) {
                out += "\n\n";
                out += kToolCallsOpen;
                out += '\n';
                for (size_t k = 0; k < m.tool_calls.size(); ++k) {
                    if (k) out += '\n';
                    out += kInvokeOpen + m.tool_calls[k].name + "\">\n" + dsml_arguments(m.tool_calls[k]) + "\n" +
                           kInvokeClose;
                }
                out += '\n';
                out += kToolCallsClose;
            }
            // A trailing assistant turn is a prefix for the reply to continue.
            if (i + 1 < turns.size()) out += kEos;
            break;
        }
        case Role::Tool: break;   // merged into user turns above
        }
        if (i + 1 < turns.size() && turns[i + 1].role != Role::Assistant) continue;
        if (t.role == Role::User || t.role == Role::Developer) {
            out += kAssistant;
            if (opt.thinking && (!drop_thinking || idx >= last_user)) out += kThink;
            else out += kEndThink;
        }
    }
    return out;
}

// ---------------------------------------------------------------- parser

DsmlParser::DsmlParser(bool tools, bool thinking) : tools_(tools), st_(thinking ? State::Reasoning : State::Content) {}

void DsmlParser::feed(std::string_view text, std::vector<DsmlEvent> &out) {
    buf_.append(text);
    run(out, false);
}

void DsmlParser::finish(std::vector<DsmlEvent> &out) {
    run(out, true);
    switch (st_) {
    case State::Reasoning:
        if (!buf_.empty()) out.push_back({DsmlEvent::Kind::Reasoning, 0, buf_});
        break;
    case State::Content:
    case State::After:
        emit_text(buf_, out);
        if (!ws_.empty()) out.push_back({DsmlEvent::Kind::Text, 0, ws_});
        ws_.clear();
        break;
    case State::ParamValue:
        param_value_ += buf_;
        end_param(out);
        [[fallthrough]];
    case State::Invoke:
    case State::ParamHead:
        out.push_back({DsmlEvent::Kind::ToolArgs, calls_ - 1, params_ ? "}" : "{}"});
        out.push_back({DsmlEvent::Kind::ToolEnd, calls_ - 1, {}});
        break;
    case State::Block:
    case State::InvokeName: break;   // cut off inside the block: nothing callable
    }
    buf_.clear();
}

void DsmlParser::emit_text(std::string_view s, std::vector<DsmlEvent> &out) {
    if (s.empty()) return;
    if (!tools_) {
        out.push_back({DsmlEvent::Kind::Text, 0, std::string(s)});
        return;
    }
    // Whitespace before a tool block belongs to the format, not the answer: hold it back
    // until something other than a block follows.
    size_t last = s.size();
    while (last > 0 && is_space(s[last - 1])) --last;
    if (last == 0) {
        ws_.append(s);
        return;
    }
    std::string t = std::move(ws_);
    t.append(s.substr(0, last));
    ws_.assign(s.substr(last));
    out.push_back({DsmlEvent::Kind::Text, 0, std::move(t)});
}

void DsmlParser::end_param(std::vector<DsmlEvent> &out) {
    const int idx = calls_ - 1;
    if (param_string_) {
        std::string d;
        json_escape_into(param_value_, d);
        d += '"';
        out.push_back({DsmlEvent::Kind::ToolArgs, idx, std::move(d)});
    } else {
        // Non-string values are JSON already and go out as the model wrote them (a double
        // would lose the digits of an integer beyond 64 bits); anything else is a string.
        const size_t a = param_value_.find_first_not_of(" \t\r\n");
        const size_t e = param_value_.find_last_not_of(" \t\r\n");
        std::string v = a == std::string::npos ? std::string() : param_value_.substr(a, e + 1 - a);
        if (!Json::accept(v)) v = Json(param_value_).dump(-1, ' ', false, Json::error_handler_t::replace);
        out.push_back({DsmlEvent::Kind::ToolArgs, idx, std::move(v)});
    }
    param_value_.clear();
}

// Malformed DSML: close the call in progress and treat the rest as text.
void DsmlParser::abandon(std::vector<DsmlEvent> &out) {
    if (st_ == State::ParamValue) end_param(out);
    if (st_ == State::Invoke || st_ == State::ParamHead || st_ == State::ParamValue) {
        out.push_back({DsmlEvent::Kind::ToolArgs, calls_ - 1, params_ ? "}" : "{}"});
        out.push_back({DsmlEvent::Kind::ToolEnd, calls_ - 1, {}});
    }
    st_ = State::Content;
}

void DsmlParser::run(std::vector<DsmlEvent> &out, bool final) {
    for (;;) {
        switch (st_) {
        case State::Reasoning: {
            size_t end = buf_.find(kEndThink);
            size_t tc = tools_ ? buf_.find(kToolCallsOpen) : std::string::npos;
            if (end != std::string::npos && (tc == std::string::npos || end < tc)) {
                if (end) out.push_back({DsmlEvent::Kind::Reasoning, 0, buf_.substr(0, end)});
                buf_.erase(0, end + std::string_view(kEndThink).size());
                st_ = State::Content;
                continue;
            }
            if (tc != std::string::npos) {   // a block while still thinking ends the reasoning
                if (tc) out.push_back({DsmlEvent::Kind::Reasoning, 0, buf_.substr(0, tc)});
                buf_.erase(0, tc);
                st_ = State::Content;
                continue;
            }
            if (final) return;
            size_t hold = partial_suffix(buf_, kEndThink);
            if (tools_) hold = std::max(hold, partial_suffix(buf_, kToolCallsOpen));
            if (buf_.size() > hold) {
                out.push_back({DsmlEvent::Kind::Reasoning, 0, buf_.substr(0, buf_.size() - hold)});
                buf_.erase(0, buf_.size() - hold);
            }
            return;
        }
        case State::Content:
        case State::After: {
            if (!tools_) {
                if (!buf_.empty()) emit_text(buf_, out);
                buf_.clear();
                return;
            }
            size_t tc = buf_.find(kToolCallsOpen);
            if (tc != std::string::npos) {
                emit_text(std::string_view(buf_).substr(0, tc), out);
                ws_.clear();
                buf_.erase(0, tc + std::string_view(kToolCallsOpen).size());
                st_ = State::Block;
                continue;
            }
            if (final) return;
            const size_t hold = partial_suffix(buf_, kToolCallsOpen);
            emit_text(std::string_view(buf_).substr(0, buf_.size() - hold), out);
            buf_.erase(0, buf_.size() - hold);
            return;
        }
        case State::Block:
        case State::Invoke: {
            size_t p = 0;
            while (p < buf_.size() && is_space(buf_[p])) ++p;
            std::string_view rest = std::string_view(buf_).substr(p);
            const bool block = st_ == State::Block;
            const std::string_view open = block ? kInvokeOpen : kParamOpen;
            const std::string_view close = block ? kToolCallsClose : kInvokeClose;
            if (starts_with(rest, open)) {
                buf_.erase(0, p + open.size());
                st_ = block ? State::InvokeName : State::ParamHead;
                continue;
            }
            if (starts_with(rest, close)) {
                buf_.erase(0, p + close.size());
                if (block) {
                    st_ = State::After;
                } else {
                    out.push_back({DsmlEvent::Kind::ToolArgs, calls_ - 1, params_ ? "}" : "{}"});
                    out.push_back({DsmlEvent::Kind::ToolEnd, calls_ - 1, {}});
                    st_ = State::Block;
                }
                continue;
            }
            if (!final && (could_become(rest, open) || could_become(rest, close))) return;
            abandon(out);
            continue;
        }
        case State::InvokeName:
        case State::ParamHead: {
            size_t q = buf_.find("\">");
            if (q == std::string::npos) {
                if (!final && buf_.size() < 512 && buf_.find('<') == std::string::npos) return;
                abandon(out);
                continue;
            }
            std::string head = buf_.substr(0, q);
            if (head.find('<') != std::string::npos || head.find('\n') != std::string::npos) {
                abandon(out);
                continue;
            }
            buf_.erase(0, q + 2);
            if (st_ == State::InvokeName) {
                out.push_back({DsmlEvent::Kind::ToolStart, calls_, head});
                ++calls_;
                params_ = 0;
                st_ = State::Invoke;
                continue;
            }
            // name" string="true|false  (a missing attribute reads as a string)
            std::string name = head;
            param_string_ = true;
            size_t qq = head.find('"');
            if (qq != std::string::npos) {
                name = head.substr(0, qq);
                param_string_ = head.find("string=\"false", qq) == std::string::npos;
            }
            std::string d = params_ ? ", " : "{";
            d += Json(name).dump(-1, ' ', false, Json::error_handler_t::replace);
            d += ": ";
            if (param_string_) d += '"';
            out.push_back({DsmlEvent::Kind::ToolArgs, calls_ - 1, std::move(d)});
            ++params_;
            st_ = State::ParamValue;
            continue;
        }
        case State::ParamValue: {
            size_t c = buf_.find(kParamClose);
            if (c != std::string::npos) {
                param_value_ += buf_.substr(0, c);
                buf_.erase(0, c + std::string_view(kParamClose).size());
                end_param(out);
                st_ = State::Invoke;
                continue;
            }
            if (final) return;
            size_t keep = buf_.size() - partial_suffix(buf_, kParamClose);
            if (param_string_) {
                // Never escape half a UTF-8 character: keep an unfinished one for later.
                for (size_t back = 1; back <= 3 && back <= keep; ++back) {
                    const unsigned char c = static_cast<unsigned char>(buf_[keep - back]);
                    if ((c & 0xC0) == 0x80) continue;   // continuation byte
                    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
                    if (len > back) keep -= back;
                    break;
                }
                // String values stream as they are generated.
                if (keep) {
                    std::string d;
                    json_escape_into(std::string_view(param_value_ + buf_.substr(0, keep)), d);
                    param_value_.clear();
                    out.push_back({DsmlEvent::Kind::ToolArgs, calls_ - 1, std::move(d)});
                }
            } else {
                param_value_ += buf_.substr(0, keep);
            }
            buf_.erase(0, keep);
            return;
        }
        }
    }
}

}  // namespace ds4::gateway
