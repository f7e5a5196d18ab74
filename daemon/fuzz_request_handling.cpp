// libFuzzer target: request handling past frame decoding, on a real model. One Worker (the
// daemon's, with a real session store and the tiny random model) lives for the whole run;
// each input becomes a sequence of envelopes on a fresh connection that go through the real
// parser (parse_request) and into the worker, as the loop thread would send them.
//
// Input: byte 0 picks the form of the rest. Raw (byte0 % 3 == 0): a byte stream of frames,
// decoded by FrameDecoder. Structured (otherwise): a little program whose ops build valid
// requests of every kind (sessions, generations, cancels, store operations), so the
// handlers are reached without the fuzzer having to discover FlatBuffers layouts.
//
// Checked for every input: no crash or sanitizer report; every submitted request gets
// exactly one final reply and nothing after it; every reply frame verifies; the worker
// still answers a Stats request at the end. Harness bounds (not the daemon's): max_tokens
// is capped at 32 and session contexts at 4096 so one input stays fast.
// Requests also wait for session slots and cache memory (--kv-wait 20 ms, a budget of four
// full default sessions) and time out, so those paths run too.
#include <uv.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/out_queue.h"
#include "daemon/requests.h"
#include "daemon/worker.h"
#include "ipc/frame.h"
#include "kvstore/store.h"

namespace fb = ds4::ipc::fb;
using namespace ds4::daemon;

namespace {

struct Harness {
    std::string dir;
    uv_loop_t loop;
    uv_async_t async;
    OutQueue out;
    std::unique_ptr<ds4::kvstore::Store> store;
    std::unique_ptr<Worker> worker;
    uint64_t next_conn = 1;
    // What the run exercised (printed at exit): requests by kind, reply frames, errors.
    std::map<std::string, uint64_t> submitted;
    uint64_t frames = 0, error_replies = 0, rejected = 0;
};

Harness *g = nullptr;

[[noreturn]] void die(const std::string &msg) {
    std::fprintf(stderr, "fuzz_request_handling: %s\n", msg.c_str());
    std::abort();
}

void setup() {
    g = new Harness;
    char tmpl[] = "/tmp/ds4-fuzz-req-XXXXXX";
    if (!mkdtemp(tmpl)) die("mkdtemp failed");
    g->dir = tmpl;
    const std::string model = g->dir + "/tiny.gguf";
    const std::string cmd = std::string("'") + DS4_MAKE_MODEL_PATH + "' --preset tiny --quiet '" + model + "'";
    if (std::system(cmd.c_str()) != 0) die("cannot make the tiny model: " + cmd);
    uv_loop_init(&g->loop);
    uv_async_init(&g->loop, &g->async, nullptr);   // never run: the harness polls the queue
    g->out.attach(&g->async);
    ds4::kvstore::StoreOptions so;
    so.state_dir = g->dir + "/state";
    std::filesystem::create_directories(so.state_dir);
    so.log = [](const std::string &) {};
    const ds4::kvstore::Status st = ds4::kvstore::Store::open(so, &g->store);
    if (!st) die("cannot open the store: " + st.to_string());
    WorkerConfig wc;
    wc.model.model_path = model;
    wc.model.threads = 1;
    wc.ctx = 512;
    wc.max_sessions = 3;   // below the names the inputs use: the LRU release path runs
    wc.prefill_chunk = 64;
    wc.solo_prefill_chunk = 64;
    wc.store = g->store.get();
    wc.checkpoint_every = 64;   // long prompts leave checkpoints and prefix lookups run
    wc.prefix_min = 32;
    wc.max_reply = 1u << 20;
    // Waiting for a slot or memory runs (and times out) within an input; a budget of a few
    // default sessions makes requests wait for and release memory too.
    wc.kv_wait = std::chrono::milliseconds(20);
    {
        ds4::bridge::ModelOptions mo;
        mo.model_path = model;
        mo.n_threads = 1;
        ds4::bridge::Model m(mo);
        uint64_t one = 0;
        char err[256];
        if (ds4_bridge_cache_bytes_for(m.handle(), 512, 512, &one, err, sizeof err) != 0) die(err);
        wc.kv_budget = 4 * one;
    }
    g->worker = std::make_unique<Worker>(wc, g->out);
    g->worker->start();
    std::atexit([] {
        if (!g) return;
        std::fprintf(stderr, "fuzz_request_handling: %llu reply frames (%llu errors), %llu envelopes rejected by the parser; "
                             "requests:", (unsigned long long)g->frames, (unsigned long long)g->error_replies,
                     (unsigned long long)g->rejected);
        for (const auto &[k, v] : g->submitted) std::fprintf(stderr, " %s %llu", k.c_str(), (unsigned long long)v);
        std::fprintf(stderr, "\n");
        g->worker->shutdown(std::chrono::milliseconds(0));
        g->worker->join();
        g->worker.reset();
        g->store.reset();
        std::filesystem::remove_all(g->dir);
    });
}

// Per input: what was submitted and what came back.
struct Tracker {
    std::shared_ptr<ConnShared> conn;
    std::map<uint64_t, int> finals;        // request id -> final replies seen
    std::map<uint64_t, bool> inflight;     // submitted, no final yet
    std::vector<uint64_t> sessions;        // ids from SessionOpened replies
    std::vector<uint64_t> submitted;

    void absorb(Outgoing &o) {
        if (o.conn == 0) die("the worker stopped");
        if (o.conn != conn->id) return;   // an earlier input's connection, closed: the loop drops these
        conn->queued_bytes.fetch_sub(o.bytes.size(), std::memory_order_acq_rel);
        std::vector<uint64_t> aligned(o.bytes.size() / 8 + 1);
        std::memcpy(aligned.data(), o.bytes.data(), o.bytes.size());
        const auto *p = reinterpret_cast<const uint8_t *>(aligned.data());
        ds4::ipc::Limits lim;
        lim.max_frame = 1u << 20;
        if (ds4::ipc::verify_frame(p, o.bytes.size(), lim) != ds4::ipc::FrameError::None)
            die("the worker sent a frame that does not verify");
        const fb::Envelope *e = fb::GetSizePrefixedEnvelope(p);
        if (e->request_id() != o.request_id) die("frame request id differs from its Outgoing");
        if (finals.count(o.request_id) && finals[o.request_id] > 0)
            die("reply after the final one for request " + std::to_string(o.request_id));
        if (!inflight.count(o.request_id)) die("reply for request " + std::to_string(o.request_id) + " never submitted");
        ++g->frames;
        if (e->body_type() == fb::Message::Error) ++g->error_replies;
        if (e->body_type() == fb::Message::SessionOpened) sessions.push_back(e->body_as_SessionOpened()->session());
        if (o.final) {
            ++finals[o.request_id];
            inflight.erase(o.request_id);
        }
    }

    // Drains until `rid` (0: every request) has its final reply.
    void wait(uint64_t rid) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        for (;;) {
            if (rid ? !inflight.count(rid) : inflight.empty()) return;
            std::vector<Outgoing> batch = g->out.take();
            for (Outgoing &o : batch) absorb(o);
            if (batch.empty()) {
                if (std::chrono::steady_clock::now() > deadline)
                    die(std::to_string(inflight.size()) + " requests got no final reply within 60 s");
                std::this_thread::sleep_for(std::chrono::microseconds(200));
            }
        }
    }

    void submit(uint64_t rid, RequestBody body) {
        if (auto *gp = std::get_if<GenerateParams>(&body)) gp->max_tokens = std::min<uint32_t>(gp->max_tokens, 32);
        if (auto *op = std::get_if<OpenSessionParams>(&body)) op->ctx = std::min<uint32_t>(op->ctx, 4096);
        if (auto *lp = std::get_if<LoadSessionParams>(&body)) lp->ctx = std::min<uint32_t>(lp->ctx, 4096);
        if (auto *sp = std::get_if<StatsParams>(&body)) sp->connections = 1;
        static const char *kinds[] = {"Generate", "OpenSession", "Close", "Tokenize", "Detokenize", "Stats",
                                      "ListSessions", "DeleteSession", "SaveSession", "LoadSession", "PinSession"};
        ++g->submitted[kinds[body.index()]];
        inflight[rid] = true;
        finals[rid] = 0;
        submitted.push_back(rid);
        g->worker->submit(Request{conn, rid, std::move(body)});
    }

    // The loop thread's handling of one verified envelope (server.cpp handle_frame), minus
    // the Hello handshake. Returns the request id submitted, 0 if none.
    uint64_t handle(const fb::Envelope *env) {
        const uint64_t rid = env->request_id();
        ParseResult pr = parse_request(env);
        switch (pr.kind) {
        case ParseResult::Kind::Reject:
            if (pr.message.empty()) die("a rejection without a message");
            ++g->rejected;
            return 0;
        case ParseResult::Kind::Hello: return 0;
        case ParseResult::Kind::Cancel: g->worker->cancel(conn, pr.cancel_target); return 0;
        case ParseResult::Kind::Request: break;
        }
        if (rid == 0 || inflight.count(rid)) return 0;   // the loop refuses these itself
        submit(rid, std::move(pr.body));
        return rid;
    }
};

// ---- the structured form

struct Bytes {
    const uint8_t *p;
    size_t n;
    uint8_t u8() {
        if (!n) return 0;
        --n;
        return *p++;
    }
    uint32_t u32() { return uint32_t(u8()) | uint32_t(u8()) << 8 | uint32_t(u8()) << 16 | uint32_t(u8()) << 24; }
    uint64_t u64() { return uint64_t(u32()) | uint64_t(u32()) << 32; }
    std::string str(size_t max) {
        const size_t len = std::min<size_t>(u8() % (max + 1), n);
        std::string s(reinterpret_cast<const char *>(p), len);
        p += len;
        n -= len;
        return s;
    }
};

std::string pick_name(Bytes &b) {
    static const char *names[] = {"a", "b", "c", "d", "e", "", "a..b", "x/y", ".hidden"};
    const uint8_t k = b.u8();
    if (k < 200) return names[k % 5];   // mostly valid names, more than max_sessions
    if (k < 240) return names[5 + k % 4];
    return b.str(40);
}

uint32_t pick_ctx(Bytes &b) {
    static const uint32_t ctxs[] = {0, 16, 64, 128, 512, 4096};
    const uint8_t k = b.u8();
    return k < 240 ? ctxs[k % 6] : b.u32();
}

std::vector<int32_t> pick_tokens(Bytes &b, size_t max) {
    std::vector<int32_t> t(b.u8() % (max + 1));
    for (auto &x : t) {
        const uint8_t k = b.u8();
        x = k < 250 ? int32_t(b.u8()) * 2 + (k & 1) : int32_t(b.u32());   // mostly within vocab 512
    }
    return t;
}

template <class F> std::vector<uint8_t> build(uint64_t rid, F body) {
    flatbuffers::FlatBufferBuilder fbb;
    ds4::ipc::finish_frame(fbb, rid, body(fbb));
    return ds4::ipc::frame_bytes(fbb);
}

// *opens: the op opens a session (its reply carries an id later ops may use).
std::vector<uint8_t> op_frame(Bytes &b, uint64_t rid, Tracker &t, bool *opens) {
    const uint8_t op = b.u8() % 13;
    *opens = op == 2 || op == 10;
    auto session = [&]() -> uint64_t {
        const uint8_t k = b.u8();
        if (k < 220 && !t.sessions.empty()) return t.sessions[k % t.sessions.size()];
        return k < 240 ? 0 : b.u64();
    };
    switch (op) {
    case 0:
    case 1: {  // Generate, one-shot or on a session
        const uint64_t s = op == 1 ? session() : 0;
        const uint8_t form = b.u8();
        const uint8_t flags = b.u8();
        const uint32_t max_tokens = b.u8() % 24;
        const float temp = (flags & 1) ? float(b.u8()) / 64.0f : 0.0f;
        return build(rid, [&](auto &fbb) {
            flatbuffers::Offset<flatbuffers::String> text;
            flatbuffers::Offset<flatbuffers::Vector<int32_t>> toks, stop_toks;
            flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::ChatMessage>>> msgs;
            flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>> stops;
            if (form % 4 == 1) text = fbb.CreateString(b.str(120));
            if (form % 4 == 2) toks = fbb.CreateVector(pick_tokens(b, 80));
            if (form % 4 == 3) {
                std::vector<flatbuffers::Offset<fb::ChatMessage>> m;
                static const char *roles[] = {"system", "user", "assistant", "tool"};
                const int n = b.u8() % 4;
                for (int i = 0; i < n; ++i) {
                    const std::string role = roles[b.u8() % 4];
                    m.push_back(fb::CreateChatMessageDirect(fbb, role.c_str(), b.str(60).c_str()));
                }
                msgs = fbb.CreateVector(m);
            }
            if (form & 4) {
                std::vector<flatbuffers::Offset<flatbuffers::String>> v;
                const int n = b.u8() % 3;
                for (int i = 0; i < n; ++i) v.push_back(fbb.CreateString(b.str(8)));
                stops = fbb.CreateVector(v);
            }
            if (form & 8) stop_toks = fbb.CreateVector(pick_tokens(b, 4));
            const float top_k_etc[3] = {float(b.u8() % 50), float(b.u8()) / 255.0f, float(b.u8() % 16) / 255.0f};
            const uint64_t seed = b.u64();
            // flags & 8: the sampling controls (daemon/sampling.h), out-of-range values included.
            float rp = 1, fp = 0, pp = 0;
            int32_t last_n = 64;
            flatbuffers::Offset<flatbuffers::Vector<const fb::LogitBias *>> bias;
            bool logprobs = false;
            uint8_t top = 0;
            if (flags & 8) {
                rp = float(b.u8()) / 64.0f;
                last_n = int32_t(int8_t(b.u8()));
                fp = float(int(b.u8()) - 128) / 50.0f;
                pp = float(int(b.u8()) - 128) / 50.0f;
                std::vector<fb::LogitBias> lb;
                for (int32_t t : pick_tokens(b, 6)) lb.emplace_back(t, float(int(b.u8()) - 128));
                bias = fbb.CreateVectorOfStructs(lb);
                logprobs = (flags & 16) != 0;
                top = b.u8() % 24;
            }
            auto sampling = fb::CreateSampling(fbb, temp, int32_t(top_k_etc[0]), top_k_etc[1], top_k_etc[2], seed, rp,
                                               last_n, fp, pp, bias);
            return fb::CreateGenerate(fbb, s, text, toks, msgs, (form & 16) == 0, (form & 32) != 0, sampling, max_tokens,
                                      stops, stop_toks, (flags & 2) != 0, (flags & 4) != 0, (flags & 32) == 0, logprobs, top);
        });
    }
    case 2: {
        const std::string name = pick_name(b);
        const uint32_t ctx = pick_ctx(b);
        return build(rid, [&](auto &fbb) { return fb::CreateOpenSessionDirect(fbb, name.c_str(), ctx); });
    }
    case 3: {
        const uint64_t s = session();
        return build(rid, [&](auto &fbb) { return fb::CreateClose(fbb, s); });
    }
    case 4: {
        const std::string text = b.str(200);
        const bool special = b.u8() & 1;
        return build(rid, [&](auto &fbb) { return fb::CreateTokenizeDirect(fbb, text.c_str(), special); });
    }
    case 5: {
        const auto toks = pick_tokens(b, 40);
        return build(rid, [&](auto &fbb) { return fb::CreateDetokenizeDirect(fbb, &toks); });
    }
    case 6: return build(rid, [&](auto &fbb) { return fb::CreateStats(fbb); });
    case 7: return build(rid, [&](auto &fbb) { return fb::CreateListSessions(fbb); });
    case 8: {
        const std::string name = pick_name(b);
        return build(rid, [&](auto &fbb) { return fb::CreateDeleteSessionDirect(fbb, name.c_str()); });
    }
    case 9: {
        const uint64_t s = (b.u8() & 1) ? session() : 0;
        const std::string name = (b.u8() & 1) ? pick_name(b) : std::string();
        return build(rid, [&](auto &fbb) { return fb::CreateSaveSessionDirect(fbb, s, name.c_str()); });
    }
    case 10: {
        const std::string name = pick_name(b);
        const uint32_t ctx = pick_ctx(b);
        return build(rid, [&](auto &fbb) { return fb::CreateLoadSessionDirect(fbb, name.c_str(), ctx); });
    }
    case 11: {
        const std::string name = pick_name(b);
        const bool pinned = b.u8() & 1;
        return build(rid, [&](auto &fbb) { return fb::CreatePinSessionDirect(fbb, name.c_str(), pinned); });
    }
    default: {  // Cancel a request of this input (or an unknown id)
        const uint8_t k = b.u8();
        const uint64_t target = !t.submitted.empty() && k < 230 ? t.submitted[k % t.submitted.size()] : b.u64();
        return build(rid, [&](auto &fbb) { return fb::CreateCancel(fbb, target); });
    }
    }
}

// Verifies and hands one whole frame to the tracker, as the decoder would.
uint64_t feed_frame(Tracker &t, const std::vector<uint8_t> &frame) {
    std::vector<uint64_t> aligned(frame.size() / 8 + 1);
    std::memcpy(aligned.data(), frame.data(), frame.size());
    const auto *p = reinterpret_cast<const uint8_t *>(aligned.data());
    if (ds4::ipc::verify_frame(p, frame.size(), ds4::ipc::Limits{}) != ds4::ipc::FrameError::None) return 0;
    return t.handle(fb::GetSizePrefixedEnvelope(p));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g) setup();
    if (size == 0) return 0;
    Tracker t;
    t.conn = std::make_shared<ConnShared>(g->next_conn++);
    if (data[0] % 3 == 0) {
        ds4::ipc::Limits limits;
        limits.max_frame = 1u << 20;
        ds4::ipc::FrameDecoder dec(limits);
        dec.feed(data + 1, size - 1);
        for (int frames = 0; frames < 64; ++frames) {
            if (dec.next() != ds4::ipc::FrameDecoder::Status::Frame) break;
            const fb::Message type = dec.envelope()->body_type();
            const uint64_t rid = t.handle(dec.envelope());
            // Session opens are waited for, as a client would before using the session.
            if (rid && (type == fb::Message::OpenSession || type == fb::Message::LoadSession)) t.wait(rid);
        }
    } else {
        Bytes b{data + 1, size - 1};
        uint64_t rid = 1;
        for (int ops = 0; ops < 24 && b.n; ++ops) {
            const uint8_t ctl = b.u8();
            bool opens = false;
            const std::vector<uint8_t> f = op_frame(b, rid, t, &opens);
            const uint64_t sent = feed_frame(t, f);
            ++rid;
            // Opens are waited for so later ops can use the session id; other requests
            // overlap unless ctl says to wait.
            if (sent && (opens || (ctl & 3) == 0)) t.wait(sent);
        }
    }
    t.wait(0);
    // The worker is alive and answers.
    const uint64_t stats_id = 1ull << 62;
    t.submit(stats_id, StatsParams{});
    t.wait(stats_id);
    if (t.finals[stats_id] != 1) die("Stats got no reply");
    for (const auto &[rid, n] : t.finals)
        if (n != 1) die("request " + std::to_string(rid) + " got " + std::to_string(n) + " final replies");
    g->worker->disconnect(t.conn);
    return 0;
}
