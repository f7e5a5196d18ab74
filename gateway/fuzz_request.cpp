// libFuzzer target for the HTTP front's request side and its DSML parser: the first byte
// picks the API, the rest is the request body. A body that parses is rendered into a
// prompt and answered through Reply; the body's text is also fed to the DSML parser whole
// and in small pieces, and both must give the same text and the same tool calls, each
// with arguments that are a JSON object.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "gateway/dsml.h"
#include "gateway/reply.h"
#include "gateway/translate.h"

using namespace ds4::gateway;

namespace {

struct Parsed {
    std::string text, reasoning;
    std::vector<std::string> names, args;
    int open = -1;
};

Parsed collect(const std::vector<DsmlEvent> &evs) {
    Parsed p;
    for (const DsmlEvent &e : evs) {
        switch (e.kind) {
        case DsmlEvent::Kind::Text: p.text += e.text; break;
        case DsmlEvent::Kind::Reasoning: p.reasoning += e.text; break;
        case DsmlEvent::Kind::ToolStart:
            if (p.open != -1 || e.index != int(p.names.size())) std::abort();
            p.names.push_back(e.text);
            p.args.emplace_back();
            p.open = e.index;
            break;
        case DsmlEvent::Kind::ToolArgs:
            if (e.index != p.open) std::abort();
            p.args.back() += e.text;
            break;
        case DsmlEvent::Kind::ToolEnd:
            if (e.index != p.open) std::abort();
            if (!Json::accept(p.args.back()) || !Json::parse(p.args.back()).is_object()) std::abort();
            p.open = -1;
            break;
        }
    }
    if (p.open != -1) std::abort();   // finish() closes every call
    return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const Api api = Api(data[0] & 3);
    const bool tools = data[0] & 4, thinking = data[0] & 8;
    std::string_view body(reinterpret_cast<const char *>(data + 1), size - 1);
    try {
        Request r = parse_request(api, body);
        if (!r.raw_prompt) (void)render_prompt(r.messages, r.prompt_options);
        Reply reply(r, "m", 3);
        (void)reply.begin();
        DsmlParser p(r.parse_tools, r.prompt_options.thinking);
        std::vector<DsmlEvent> evs;
        p.feed(body, evs);
        p.finish(evs);
        for (const DsmlEvent &e : evs) (void)reply.event(e);
        (void)reply.finish(Finish{});
    } catch (const ApiError &e) {
        (void)error_body(api, e);
    }

    std::vector<DsmlEvent> whole, pieces;
    DsmlParser a(tools, thinking), b(tools, thinking);
    a.feed(body, whole);
    a.finish(whole);
    const size_t step = 1 + (data[0] >> 4);
    for (size_t i = 0; i < body.size(); i += step) b.feed(body.substr(i, step), pieces);
    b.finish(pieces);
    Parsed pa = collect(whole), pb = collect(pieces);
    if (pa.text != pb.text || pa.reasoning != pb.reasoning || pa.names != pb.names || pa.args != pb.args) std::abort();
    return 0;
}
