// ds4-bench-resume: what a persistent session buys. For each prompt length: time to
// re-prefill from scratch vs time to resume from the store (load + verify + restore into a
// session + first token), plus the store's save and restore MB/s. In process: the bridge
// (ds4.hpp) and the session store, the same calls ds4d makes.
//
// The model's context must exceed the longest length (ds4-make-model --preset small --ctx 20480).
//
//   ds4-bench-resume --model PATH [--state-dir DIR] [--tokens 1024,4096,16384] [--threads N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bridge/ds4.hpp"
#include "kvstore/store.h"

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

[[noreturn]] void die(const std::string &m) {
    std::fprintf(stderr, "ds4-bench-resume: %s\n", m.c_str());
    std::exit(1);
}

}  // namespace

int main(int argc, char **argv) {
    std::string model_path, state_dir;
    std::vector<int> lengths = {1024, 4096, 16384};
    int threads = 0;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) die(a + " needs a value");
            return argv[++i];
        };
        if (a == "--model") model_path = val();
        else if (a == "--state-dir") state_dir = val();
        else if (a == "--threads") threads = std::atoi(val().c_str());
        else if (a == "--tokens") {
            lengths.clear();
            std::string v = val();
            for (size_t p = 0; p < v.size();) {
                size_t q = v.find(',', p);
                if (q == std::string::npos) q = v.size();
                lengths.push_back(std::atoi(v.substr(p, q - p).c_str()));
                p = q + 1;
            }
        } else if (a == "-h" || a == "--help") {
            std::puts("usage: ds4-bench-resume --model PATH [--state-dir DIR] [--tokens 1024,4096,16384] [--threads N]");
            return 0;
        } else die("unknown argument " + a);
    }
    if (model_path.empty()) die("--model PATH is required");
    const bool own_dir = state_dir.empty();
    if (own_dir) state_dir = std::filesystem::temp_directory_path() / ("ds4-bench-resume-" + std::to_string(getpid()));

    ds4::ModelOptions mo;
    mo.model_path = model_path;
    mo.n_threads = threads;
    ds4::Model model(mo);
    const int ctx_max = model.info().n_ctx_max;

    ds4::kvstore::StoreOptions so;
    so.state_dir = state_dir;
    so.log = [](const std::string &) {};
    std::unique_ptr<ds4::kvstore::Store> store;
    if (auto st = ds4::kvstore::Store::open(so, &store); !st) die("store: " + st.to_string());
    ds4::kvstore::StoreStats ss;
    (void)store->stats(&ss);

    std::printf("model %s, context limit %d, payload I/O %s\n", model_path.c_str(), ctx_max,
                ss.uring ? "io_uring" : "buffered");
    std::printf("%8s %12s %12s %12s %10s %10s %10s %9s\n", "tokens", "prefill_ms", "resume_ms", "speedup",
                "payload_MB", "save_MB/s", "load_MB/s", "restore");
    ds4::kvstore::LoadedPayload lp;
    for (int n : lengths) {
        const int ctx = std::min(n + 64, ctx_max);
        if (n + 1 > ctx_max) {
            std::printf("%8d  skipped: the model's context is %d\n", n, ctx_max);
            continue;
        }
        std::vector<int32_t> toks(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) toks[size_t(i)] = 1 + (i * 7919) % (model.vocab_size() - 2);
        // Re-prefill: a fresh session, the whole prompt, first token.
        auto t0 = Clock::now();
        ds4::Session s(model, ctx);
        s.sync(toks);
        const int first = s.argmax();
        const double prefill_ms = ms_since(t0);

        const std::vector<uint8_t> bytes = s.save_payload();
        const std::string name = "bench-" + std::to_string(n);
        t0 = Clock::now();
        if (auto st = store->save(name, bytes.data(), bytes.size()); !st) die("save: " + st.to_string());
        const double save_ms = ms_since(t0);

        // Resume: read + verify from the store, restore into a fresh session, first token.
        // The page cache is not dropped (no root here): load MB/s is a warm-cache figure.
        t0 = Clock::now();
        if (auto st = store->load(name, &lp); !st) die("load: " + st.to_string());
        const double load_ms = ms_since(t0);
        ds4::Session r(model, ctx);
        r.load_payload(std::span<const uint8_t>(lp.bytes.data(), lp.bytes.size()));
        const int first_r = r.argmax();
        const double resume_ms = ms_since(t0);
        const double mb = double(bytes.size()) / 1e6;
        std::printf("%8d %12.1f %12.2f %11.1fx %10.2f %10.1f %10.1f %9s\n", n, prefill_ms, resume_ms,
                    prefill_ms / resume_ms, mb, mb / (save_ms / 1e3), mb / (load_ms / 1e3),
                    first == first_r ? "same" : "DIFFERS");
        std::fflush(stdout);
        (void)store->remove(name);
    }
    store.reset();
    if (own_dir) std::filesystem::remove_all(state_dir);
    return 0;
}
