// libFuzzer target: arbitrary bytes, split into arbitrary reads, through FrameDecoder.
// Every frame it accepts is walked field by field, so a verifier gap shows up as an
// ASan/UBSan report here rather than in the daemon.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ipc/frame.h"

namespace fb = ds4::ipc::fb;

namespace {

volatile uint64_t g_sink;

void touch(const flatbuffers::String *s) {
    if (s) g_sink = g_sink + s->size() + (s->size() ? uint8_t(s->c_str()[s->size() - 1]) : 0);
}
template <class T> void touch_vec(const flatbuffers::Vector<T> *v) {
    if (!v) return;
    for (auto x : *v) g_sink = g_sink + uint64_t(x);
}
void touch(const fb::ModelInfo *m) {
    if (!m) return;
    touch(m->family()); touch(m->name()); touch(m->backend());
    g_sink = g_sink + m->n_layer() + m->n_embd() + m->n_vocab() + m->n_ctx_max() + m->n_head() + m->n_expert();
}

void walk(const fb::Envelope *e) {
    g_sink = g_sink + e->request_id();
    // The codec promises a body for every known body type; trust it (a null here is a bug
    // that UBSan reports as a null member call).
    using M = fb::Message;
    switch (e->body_type()) {
    case M::Hello: touch(e->body_as_Hello()->client()); break;
    case M::HelloOk: touch(e->body_as_HelloOk()->model()); touch(e->body_as_HelloOk()->server()); break;
    case M::OpenSession: touch(e->body_as_OpenSession()->name()); break;
    case M::SessionOpened: touch(e->body_as_SessionOpened()->name()); break;
    case M::Generate: {
        auto g = e->body_as_Generate();
        touch(g->text());
        touch_vec(g->tokens());
        if (g->messages())
            for (auto m : *g->messages()) { touch(m->role()); touch(m->content()); }
        if (g->sampling()) g_sink = g_sink + (g->sampling()->temperature() > 0.5f) + g->sampling()->seed();
        if (g->stop_strings())
            for (auto s : *g->stop_strings()) touch(s);
        touch_vec(g->stop_tokens());
        break;
    }
    case M::TokenChunk: touch_vec(e->body_as_TokenChunk()->tokens()); touch(e->body_as_TokenChunk()->text()); break;
    case M::Tokenize: touch(e->body_as_Tokenize()->text()); break;
    case M::TokenizeResult: touch_vec(e->body_as_TokenizeResult()->tokens()); break;
    case M::Detokenize: touch_vec(e->body_as_Detokenize()->tokens()); break;
    case M::DetokenizeResult: touch(e->body_as_DetokenizeResult()->text()); break;
    case M::StatsResult: {
        auto s = e->body_as_StatsResult();
        touch(s->model());
        if (s->memory()) g_sink = g_sink + s->memory()->weights_bytes();
        break;
    }
    case M::Error: touch(e->body_as_Error()->message()); break;
    case M::SaveSession: touch(e->body_as_SaveSession()->name()); break;
    case M::SessionSaved: touch(e->body_as_SessionSaved()->name()); break;
    case M::LoadSession: touch(e->body_as_LoadSession()->name()); break;
    case M::SessionList:
        if (auto l = e->body_as_SessionList()->sessions())
            for (auto s : *l) touch(s->name());
        break;
    case M::DeleteSession: touch(e->body_as_DeleteSession()->name()); break;
    case M::PinSession: touch(e->body_as_PinSession()->name()); break;
    default: break;
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ds4::ipc::Limits limits;
    limits.max_frame = 1u << 20;
    ds4::ipc::FrameDecoder dec(limits);
    // The first byte picks the read size, so frames split at every possible boundary.
    size_t step = size ? (data[0] % 17) + 1 : 1;
    for (size_t off = 0; off < size;) {
        const size_t n = std::min(step, size - off);
        dec.feed(data + off, n);
        off += n;
        for (;;) {
            auto st = dec.next();
            if (st == ds4::ipc::FrameDecoder::Status::Frame) {
                walk(dec.envelope());
                continue;
            }
            if (st == ds4::ipc::FrameDecoder::Status::Error) return 0;
            break;
        }
    }
    // Whole input as one frame, through the one-shot check.
    std::vector<uint64_t> aligned((size + 7) / 8 + 1);
    std::memcpy(aligned.data(), data, size);
    auto p = reinterpret_cast<const uint8_t *>(aligned.data());
    if (ds4::ipc::verify_frame(p, size, limits) == ds4::ipc::FrameError::None)
        walk(fb::GetSizePrefixedEnvelope(p));
    return 0;
}
