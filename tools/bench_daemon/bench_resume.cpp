// ds4-bench-resume: what a persistent session buys. For each prompt length: time to
// re-prefill from scratch vs time to resume from the store (load + verify + restore into a
// session + first token), plus the store's save and restore MB/s against the disk's raw
// O_DIRECT bandwidth for a file of the same size, measured in the same run and interleaved
// with the store's passes (tools/bench_kvstore/raw_disk.h). In process: the bridge
// (ds4.hpp) and the session store, the same calls ds4d makes. Medians over --reps.
//
// The model's context must exceed the longest length (ds4-make-model --preset small --ctx 20480).
//
//   ds4-bench-resume --model PATH [--state-dir DIR] [--tokens 1024,4096,16384] [--threads N] [--reps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <span>
#include <unistd.h>
#include <string>
#include <vector>

#include "bridge/ds4.hpp"
#include "kvstore/aligned_buffer.h"
#include "kvstore/store.h"
#include "tools/bench_kvstore/raw_disk.h"
#include "ds4_version.h"

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

[[noreturn]] void die(const std::string &m, int code = 1) {
    std::fprintf(stderr, "ds4-bench-resume: %s\n", m.c_str());
    std::exit(code);
}

// Bad arguments exit 2, as usage errors do everywhere.
[[noreturn]] void usage_die(const std::string &m) { die(m, 2); }

double raw(double mibs) {
    if (mibs < 0) die(std::string("raw disk pass: ") + std::strerror(int(-mibs)));
    return mibs;
}

}  // namespace

int main(int argc, char **argv) {
    if (ds4_wants_version(argc, argv)) {
        ds4_print_version("ds4-bench-resume");
        return 0;
    }
    std::string model_path, state_dir;
    std::vector<int> lengths = {1024, 4096, 16384};
    int threads = 0, reps = 5;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) usage_die(a + " needs a value");
            return argv[++i];
        };
        if (a == "--model") model_path = val();
        else if (a == "--state-dir") state_dir = val();
        else if (a == "--threads") threads = std::atoi(val().c_str());
        else if (a == "--reps") reps = std::clamp(std::atoi(val().c_str()), 1, 1000);
        else if (a == "--tokens") {
            lengths.clear();
            std::string v = val();
            for (size_t p = 0; p < v.size();) {
                size_t q = v.find(',', p);
                if (q == std::string::npos) q = v.size();
                const int n = std::atoi(v.substr(p, q - p).c_str());
                if (n <= 0) usage_die("--tokens: bad length '" + v.substr(p, q - p) + "'");
                lengths.push_back(n);
                p = q + 1;
            }
        } else if (a == "-h" || a == "--help") {
            std::puts("usage: ds4-bench-resume --model PATH [--state-dir DIR] [--tokens 1024,4096,16384] [--threads N]\n"
                      "                        [--reps N]\n"
                      "  --state-dir  where the store and the raw-bandwidth file go (default: a temp dir);\n"
                      "               put it on the disk to measure\n"
                      "  --reps       save/resume repetitions per length, interleaved with raw passes (default 5)");
            return 0;
        } else usage_die("unknown argument " + a);
    }
    if (model_path.empty() && std::getenv("DS4_MODEL")) model_path = std::getenv("DS4_MODEL");  // --model default
    if (model_path.empty()) usage_die("--model PATH is required");
    const bool own_dir = state_dir.empty();
    if (own_dir) state_dir = std::filesystem::temp_directory_path() / ("ds4-bench-resume-" + std::to_string(getpid()));

    ds4::bridge::ModelOptions mo;
    mo.model_path = model_path;
    mo.n_threads = threads;
    ds4::bridge::Model model(mo);
    const int ctx_max = model.info().n_ctx_max;

    ds4::kvstore::StoreOptions so;
    so.state_dir = state_dir;
    so.log = [](const std::string &) {};
    std::unique_ptr<ds4::kvstore::Store> store;
    if (auto st = ds4::kvstore::Store::open(so, &store); !st) die("store: " + st.to_string());
    ds4::kvstore::StoreStats ss;
    (void)store->stats(&ss);

    std::printf("model %s, context limit %d, payload I/O %s, %d reps (medians)\n", model_path.c_str(), ctx_max,
                ss.uring ? "io_uring" : "buffered", reps);
    const unsigned qd = so.io_options.queue_depth;
    std::printf("raw = O_DIRECT reads of the stored payload file itself (dd-like: one reused 4 MiB buffer; mem:\n"
                "into a file-sized buffer; qd%u: into memory, %u requests in flight) and write+fsync of a file\n"
                "of the same size; %% = store / raw, load judged against the best raw read\n",
                qd, qd);
    std::printf("%7s %10s %10s %8s %8s | %7s %7s %4s | %7s %7s %7s %7s %5s | %s\n", "tokens", "prefill_ms",
                "resume_ms", "speedup", "MB", "save", "raw_wr", "%", "load", "raw_dd", "raw_mem", "raw_qd", "%best",
                "first");
    ds4::kvstore::LoadedPayload lp;
    const std::string raw_path = state_dir + "/raw-bandwidth.bin";
    using ds4::bench::median;
    for (int n : lengths) {
        const int ctx = std::min(n + 64, ctx_max);
        if (n + 1 > ctx_max) {
            std::printf("%7d  skipped: the model's context is %d\n", n, ctx_max);
            continue;
        }
        std::vector<int32_t> toks(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) toks[size_t(i)] = 1 + (i * 7919) % (model.vocab_size() - 2);
        // Re-prefill: a fresh session, the whole prompt, first token.
        auto t0 = Clock::now();
        ds4::bridge::Session s(model, ctx);
        s.sync(toks);
        const int first = s.argmax();
        const double prefill_ms = ms_since(t0);

        const std::vector<uint8_t> bytes = s.save_payload();
        ds4::kvstore::AlignedBuffer raw_src(bytes.size()), raw_dst(bytes.size());
        std::memcpy(raw_src.data(), bytes.data(), bytes.size());
        const std::string name = "bench-" + std::to_string(n);
        std::vector<double> save, raw_wr, load, raw_dd, raw_mem, raw_qd, resume;
        bool same = true;
        for (int rep = 0; rep < reps; ++rep) {
            t0 = Clock::now();
            if (auto st = store->save(name, bytes.data(), bytes.size()); !st) die("save: " + st.to_string());
            save.push_back(ms_since(t0));
            raw_wr.push_back(raw(ds4::bench::raw_write_mibs(raw_path, raw_src.data(), bytes.size())));
            ds4::kvstore::EntryInfo info;
            if (auto st = store->info(name, &info); !st) die("info: " + st.to_string());
            const std::string payload_file = state_dir + "/payloads/" + info.file;

            raw_dd.push_back(raw(ds4::bench::raw_read_mibs(payload_file, nullptr, bytes.size())));
            // Resume: read + verify from the store, restore into a fresh session, first token.
            t0 = Clock::now();
            if (auto st = store->load(name, &lp); !st) die("load: " + st.to_string());
            load.push_back(ms_since(t0));
            ds4::bridge::Session r(model, ctx);
            r.load_payload(std::span<const uint8_t>(lp.bytes.data(), lp.bytes.size()));
            same = same && r.argmax() == first;
            resume.push_back(ms_since(t0));
            raw_mem.push_back(raw(ds4::bench::raw_read_mibs(payload_file, raw_dst.data(), bytes.size())));
            raw_qd.push_back(raw(ds4::bench::raw_read_queued_mibs(payload_file, raw_dst.data(), bytes.size(), qd)));
        }
        const double mb = double(bytes.size()) / (1 << 20);
        const double sv = mb / (median(save) / 1e3), ld = mb / (median(load) / 1e3);
        const double rw = median(raw_wr), dd = median(raw_dd), rm = median(raw_mem), rq = median(raw_qd);
        const double best = std::max({dd, rm, rq});
        std::printf("%7d %10.1f %10.2f %7.0fx %8.2f | %7.0f %7.0f %3.0f%% | %7.0f %7.0f %7.0f %7.0f %4.0f%% | %s\n", n,
                    prefill_ms, median(resume), prefill_ms / median(resume), mb, sv, rw, 100 * sv / rw, ld, dd, rm,
                    rq, 100 * ld / best, same ? "same" : "DIFFERS");
        std::fflush(stdout);
        (void)store->remove(name);
    }
    store.reset();
    ::unlink(raw_path.c_str());
    if (own_dir) std::filesystem::remove_all(state_dir);
    return 0;
}
