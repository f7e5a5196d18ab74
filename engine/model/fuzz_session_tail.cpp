// libFuzzer target for loading a saved session: the engine's tail codec
// (Session::load_tail, session_tail.cpp) and the bridge's whole-payload load
// (ds4_bridge_session_load_payload_mem: header + tokens + tail).
//
// Init makes a tiny random model with ds4-make-model (DS4_MAKE_MODEL_BIN), opens it once
// through the engine and once through the bridge, and gives each side a session that
// holds a few tokens. It also writes real payloads of a few lengths into the working
// corpus (the first folder on the command line) so the fuzzer starts from valid inputs.
//
// Each input goes to both loaders. A rejected input must throw ds4::Error (engine) or
// return an error with a message (bridge) and leave the session exactly as it was:
// pos(), tokens, logits and generation. An accepted one must save back to the same
// bytes, and the session must still run a step. The engine also gets each tail with its
// checksum recomputed, so mutated contents are accepted and run, not only rejected.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bridge/ds4_bridge.h"
#include "bridge/payload_header.h"
#include "engine/common/error.h"
#include "engine/model/model.h"
#include "engine/model/session.h"

#ifndef DS4_MAKE_MODEL_BIN
#error "DS4_MAKE_MODEL_BIN must name the ds4-make-model binary"
#endif

namespace {

constexpr int kCtx = 64;

std::string g_dir;
std::unique_ptr<ds4::Model> g_model;
std::unique_ptr<ds4::Session> g_sess;
ds4_bridge_model *g_bmodel = nullptr;
ds4_bridge_session *g_bsess = nullptr;
std::vector<int32_t> g_tokens;  // the fixed token list: engine-side tails take a prefix of it

[[noreturn]] void die(const std::string &why) {
    std::fprintf(stderr, "fuzz_session_tail: %s\n", why.c_str());
    std::abort();
}

void check(bool ok, const char *what) {
    if (!ok) die(what);
}

std::vector<int32_t> tokens(size_t n) { return std::vector<int32_t>(g_tokens.begin(), g_tokens.begin() + long(n)); }

// The engine session back at `n` tokens (a fresh prefill).
void engine_at(size_t n) {
    if (g_sess->pos() != int(n) || !g_sess->has_logits()) {
        g_sess->invalidate();
        if (n) g_sess->sync(tokens(n));
    }
}

void bridge_at(size_t n) {
    char err[256];
    if (ds4_bridge_session_pos(g_bsess) == int(n)) return;
    check(ds4_bridge_session_invalidate(g_bsess, err, sizeof err) == 0, err);
    if (n) check(ds4_bridge_session_sync(g_bsess, g_tokens.data(), int(n), err, sizeof err) == 0, err);
}

std::vector<uint8_t> bridge_payload() {
    char err[256];
    uint64_t size = 0;
    check(ds4_bridge_session_payload_size(g_bsess, &size, err, sizeof err) == 0, err);
    std::vector<uint8_t> buf(size);
    size_t len = 0;
    check(ds4_bridge_session_save_payload_mem(g_bsess, buf.data(), buf.size(), &len, err, sizeof err) == 0, err);
    buf.resize(len);
    return buf;
}

// Scratch dirs are named <prefix><pid>-XXXXXX; a fuzzer that died on a crash leaves its
// dir behind, so each start removes those of processes that are gone.
void remove_stale(const std::string &base, const std::string &prefix, void (*rm)(const std::string &)) {
    DIR *d = opendir(base.c_str());
    if (!d) return;
    std::vector<std::string> stale;
    while (struct dirent *e = readdir(d)) {
        const std::string n = e->d_name;
        if (n.compare(0, prefix.size(), prefix) != 0) continue;
        const long pid = std::strtol(n.c_str() + prefix.size(), nullptr, 10);
        if (pid > 0 && kill(pid_t(pid), 0) != 0 && errno == ESRCH) stale.push_back(base + "/" + n);
    }
    closedir(d);
    for (const std::string &p : stale) rm(p);
}

void remove_dir(const std::string &dir) {
    std::remove((dir + "/tiny.gguf").c_str());
    rmdir(dir.c_str());
}

void write_file(const std::string &path, const std::vector<uint8_t> &b) {
    FILE *f = std::fopen(path.c_str(), "wb");
    if (!f) return;
    std::fwrite(b.data(), 1, b.size(), f);
    std::fclose(f);
}

void cleanup() {
    g_sess.reset();
    g_model.reset();
    ds4_bridge_session_free(g_bsess);
    ds4_bridge_model_free(g_bmodel);
    if (!g_dir.empty()) remove_dir(g_dir);
}

struct EngineSnap {
    int pos;
    std::vector<int32_t> toks;
    bool has;
    std::vector<float> logits;
    uint64_t gen;
};

EngineSnap snap(const ds4::Session &s) {
    EngineSnap e{s.pos(), s.tokens(), s.has_logits(), {}, s.generation()};
    if (e.has) e.logits = s.logits();
    return e;
}

bool same(const EngineSnap &a, const EngineSnap &b) {
    return a.pos == b.pos && a.toks == b.toks && a.has == b.has && a.gen == b.gen && a.logits.size() == b.logits.size() &&
           std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * 4) == 0;
}

struct BridgeSnap {
    int pos;
    int logits_rc;
    std::vector<float> logits;
    uint64_t gen;
};

BridgeSnap bsnap() {
    char err[256];
    BridgeSnap b{ds4_bridge_session_pos(g_bsess), 0, std::vector<float>(size_t(ds4_bridge_model_vocab_size(g_bmodel))),
                 ds4_bridge_session_generation(g_bsess)};
    b.logits_rc = ds4_bridge_session_logits(g_bsess, b.logits.data(), int(b.logits.size()), err, sizeof err);
    if (b.logits_rc) b.logits.clear();
    return b;
}

bool same(const BridgeSnap &a, const BridgeSnap &b) {
    return a.pos == b.pos && a.logits_rc == b.logits_rc && a.gen == b.gen && a.logits.size() == b.logits.size() &&
           std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * 4) == 0;
}


// One Session::load_tail and its invariants.
void engine_load(const uint8_t *tail, size_t tail_n, const std::vector<int32_t> &toks) {
    const EngineSnap before = snap(*g_sess);
    bool ok = true;
    try {
        g_sess->load_tail(tail, tail_n, toks);
    } catch (const ds4::Error &) {
        ok = false;
    }
    if (!ok) {
        check(same(before, snap(*g_sess)), "a rejected tail changed the engine session");
        return;
    }
    const std::vector<uint8_t> again = g_sess->save_tail();
    check(again.size() == tail_n && std::memcmp(again.data(), tail, tail_n) == 0,
          "an accepted tail does not save back to the same bytes");
    check(g_sess->pos() == int(toks.size()) && g_sess->tokens() == toks, "an accepted tail holds other tokens");
    if (g_sess->pos() < kCtx) g_sess->eval(g_tokens[0]);   // the loaded caches run
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *argc, char ***argv) {
    remove_stale("/tmp", "ds4-fuzz-tail-", remove_dir);
    std::string tmpl = "/tmp/ds4-fuzz-tail-" + std::to_string(getpid()) + "-XXXXXX";
    check(mkdtemp(tmpl.data()) != nullptr, "mkdtemp failed");
    g_dir = tmpl;
    std::atexit(cleanup);
    const std::string model = g_dir + "/tiny.gguf";
    const std::string cmd = std::string("'") + DS4_MAKE_MODEL_BIN + "' --preset tiny --threads 1 --quiet '" + model + "'";
    check(std::system(cmd.c_str()) == 0, "ds4-make-model failed");

    ds4::ModelOptions mo;
    mo.n_threads = 1;
    g_model = ds4::Model::open(model, mo);
    g_sess = std::make_unique<ds4::Session>(*g_model, kCtx);
    uint32_t seed = 7;
    for (int i = 0; i < kCtx; ++i) {
        seed = seed * 1103515245u + 12345u;
        g_tokens.push_back(int32_t((seed >> 8) % uint32_t(g_model->config().n_vocab)));
    }

    char err[256];
    ds4_bridge_model_open_options o;
    ds4_bridge_model_open_options_init(&o);
    o.model_path = model.c_str();
    o.backend = DS4_BRIDGE_BACKEND_CPU;
    o.n_threads = 1;
    check(ds4_bridge_model_open(&g_bmodel, &o, err, sizeof err) == 0, err);
    check(ds4_bridge_session_create(&g_bsess, g_bmodel, kCtx, err, sizeof err) == 0, err);

    // Real payloads into the working corpus (the first non-flag argument), when there is one.
    std::string corpus;
    for (int i = 1; i < *argc; ++i) {
        struct stat st;
        const char *a = (*argv)[i];
        if (a[0] != '-' && stat(a, &st) == 0 && S_ISDIR(st.st_mode)) {
            corpus = a;
            break;
        }
    }
    for (size_t n : {0, 1, 5, 17, 40}) {
        bridge_at(n);
        const std::vector<uint8_t> p = bridge_payload();
        // Both sides agree on what a tail is.
        engine_at(n);
        const std::vector<uint8_t> t = g_sess->save_tail();
        check(p.size() >= t.size() && std::memcmp(p.data() + p.size() - t.size(), t.data(), t.size()) == 0,
              "the bridge payload does not end with the engine's tail");
        if (!corpus.empty()) {
            write_file(corpus + "/seed-payload-" + std::to_string(n), p);
            write_file(corpus + "/seed-tail-" + std::to_string(n), t);
        }
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    // Start from a session holding a few tokens, so that a load that mutated anything
    // before failing would show.
    engine_at(5);
    bridge_at(5);

    // --- engine: Session::load_tail ---
    // A whole payload gives its tokens and tail; anything else is taken as a bare tail with
    // as many of the fixed tokens as its token count field names (clamped to the context).
    {
        ds4::payload::Header h;
        std::vector<int32_t> toks;
        std::string e;
        const uint8_t *tail = data;
        size_t tail_n = size;
        if (ds4::payload::decode_payload(data, size, &h, &toks, &e)) {
            const size_t pre = ds4::payload::prefix_bytes(h.n_tokens);
            tail = data + pre;
            tail_n = size - pre;
        } else {
            uint64_t n = 0;
            if (size >= 28) std::memcpy(&n, data + 20, 8);
            toks = tokens(size_t(n < uint64_t(kCtx) ? n : uint64_t(kCtx)));
        }
        engine_load(tail, tail_n, toks);
        // The same tail with its checksum made right, so that mutated caches, counts and
        // logits get past the checksum and are loaded and run.
        if (tail_n >= 40) {
            std::vector<uint8_t> fixed(tail, tail + tail_n);
            const uint64_t c = ds4::session_tail_checksum(fixed.data(), tail_n - 8);
            if (std::memcmp(&c, fixed.data() + tail_n - 8, 8) != 0) {
                std::memcpy(fixed.data() + tail_n - 8, &c, 8);
                engine_load(fixed.data(), tail_n, toks);
            }
        }
    }

    // --- bridge: ds4_bridge_session_load_payload_mem ---
    {
        char err[256] = {0};
        const BridgeSnap before = bsnap();
        static const uint8_t empty = 0;
        const int rc = ds4_bridge_session_load_payload_mem(g_bsess, size ? data : &empty, size, err, sizeof err);
        if (rc != 0) {
            check(err[0] != 0, "the bridge rejected a payload without a message");
            check(same(before, bsnap()), "a rejected payload changed the bridge session");
        } else {
            // Header fields the session does not keep (its context size) may differ; the
            // tokens and the tail may not.
            const std::vector<uint8_t> again = bridge_payload();
            ds4::payload::Header h1, h2;
            std::vector<int32_t> t1, t2;
            std::string e;
            check(ds4::payload::decode_payload(data, size, &h1, &t1, &e), "an accepted payload does not decode");
            check(ds4::payload::decode_payload(again.data(), again.size(), &h2, &t2, &e), "a saved payload does not decode");
            check(t1 == t2 && h1.tail_bytes == h2.tail_bytes && h1.fingerprint == h2.fingerprint &&
                      std::memcmp(again.data() + again.size() - h2.tail_bytes, data + size - h1.tail_bytes,
                                  h1.tail_bytes) == 0,
                  "an accepted payload does not save back to the same tokens and tail");
            check(ds4_bridge_session_pos(g_bsess) == int(t1.size()), "an accepted payload holds another length");
            if (ds4_bridge_session_pos(g_bsess) < kCtx)
                check(ds4_bridge_eval(g_bsess, g_tokens[0], err, sizeof err) == 0, err);
        }
    }
    return 0;
}
