// ds4-bench-store: session store save/restore throughput against the disk's raw
// sequential bandwidth, both measured in the same run, on the same file system, and
// interleaved (one raw pass, one store pass, ...) so that a noisy disk (a VM's) moves
// both alike; medians are reported.
//
// Raw figures (tools/bench_kvstore/raw_disk.h): O_DIRECT 4 MiB requests, dd-like into one
// reused buffer, "into memory" (a file-sized buffer) and queued (into memory with as many
// requests in flight as the store uses); restore is judged against the best of them.
// Store figures include everything a save or load does: checksum, temp file, fsync,
// rename, directory fsync and the LMDB commit for a save; open, read, checksum and header
// verification for a load.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bridge/payload_header.h"
#include "io/aligned_buffer.h"
#include "io/uring_file_io.h"
#include "kvstore/store.h"
#include "kvstore/xxh64.h"
#include "tools/bench_kvstore/raw_disk.h"
#include "ds4_version.h"

using namespace ds4::kvstore;
using ds4::io::AlignedBuffer;
using ds4::io::UringOptions;
using ds4::bench::median;
using ds4::bench::mibs;
using ds4::bench::now_s;

namespace {

[[noreturn]] void die(const std::string &m, int code = 1) {
    std::fprintf(stderr, "ds4-bench-store: %s\n", m.c_str());
    std::exit(code);
}

// Bad arguments exit 2, as usage errors do everywhere.
[[noreturn]] void usage_die(const std::string &m) { die(m, 2); }

void fill_random(uint8_t *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i += 8) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        const uint64_t v = seed ^ (seed >> 29);
        memcpy(p + i, &v, std::min<size_t>(8, n - i));
    }
}

double checked(double mibs, const char *what) {
    if (mibs < 0) die(std::string(what) + ": " + strerror(int(-mibs)));
    return mibs;
}

std::vector<uint8_t> make_payload(uint64_t bytes, uint64_t seed) {
    ds4::payload::Header h;
    const uint32_t n_tokens = 4096;
    h.ctx_size = 65536;
    h.n_tokens = n_tokens;
    h.n_layer = 43;
    h.n_embd = 4096;
    h.n_vocab = 129280;
    h.head_dim = 512;
    h.fingerprint = 0xB0B0CAFE;
    h.tail_bytes = bytes - ds4::payload::prefix_bytes(n_tokens);
    std::vector<int32_t> toks(n_tokens);
    for (uint32_t i = 0; i < n_tokens; ++i) toks[i] = int32_t((i * 2654435761u) % h.n_vocab);
    std::vector<uint8_t> out;
    std::string err;
    if (!ds4::payload::encode_prefix(h, toks.data(), n_tokens, &out, &err)) die(err);
    const size_t at = out.size();
    out.resize(bytes);
    fill_random(out.data() + at, bytes - at, seed);
    return out;
}

void usage() {
    puts("usage: ds4-bench-store [--dir DIR] [--sizes MB,MB,...] [--reps N] [--chunk-kb KB] [--depth N]\n"
         "                       [--min-read-kb KB]\n"
         "  --dir     scratch directory on the file system to measure (default: .)\n"
         "  --sizes   payload sizes in MiB, or KiB with a K suffix (default 16,64,256)\n"
         "  --reps    interleaved repetitions per size; medians are reported (default 5)\n"
         "  --chunk-kb, --depth  the store's io_uring request size and requests in flight\n"
         "            (default 2048, 8)\n"
         "  --min-read-kb  the smallest read request the store splits a file into (default 256)");
}

}  // namespace

int main(int argc, char **argv) {
    if (ds4_wants_version(argc, argv)) {
        ds4_print_version("ds4-bench-store");
        return 0;
    }
    std::string dir = ".";
    std::vector<uint64_t> sizes_kb = {16 << 10, 64 << 10, 256 << 10};
    int reps = 5;
    UringOptions uo;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) usage_die("missing value after " + a);
            return argv[++i];
        };
        auto num = [&]() -> uint64_t {
            const std::string v = val();
            char *end = nullptr;
            const unsigned long long n = strtoull(v.c_str(), &end, 10);
            if (v.empty() || *end || n == 0) usage_die(a + " needs a positive integer, not '" + v + "'");
            return n;
        };
        if (a == "--dir") dir = val();
        else if (a == "--reps") reps = int(std::min<uint64_t>(num(), 1000));
        else if (a == "--chunk-kb") uo.chunk_bytes = size_t(num()) << 10;
        else if (a == "--depth") uo.queue_depth = unsigned(std::min<uint64_t>(num(), 64));
        else if (a == "--min-read-kb") uo.min_read_chunk = size_t(num()) << 10;
        else if (a == "--sizes") {
            sizes_kb.clear();
            std::string v = val();
            for (size_t p = 0; p <= v.size();) {
                const size_t q = std::min(v.find(',', p), v.size());
                const std::string one = v.substr(p, q - p);
                char *end = nullptr;
                const unsigned long long n = strtoull(one.c_str(), &end, 10);
                const bool kib = end && *end == 'K' && end[1] == '\0';
                const uint64_t kb = kib ? n : uint64_t(n) << 10;
                if (one.empty() || (*end && !kib) || n == 0 || kb < 64 || kb > (uint64_t(1) << 30))
                    usage_die("--sizes: bad size '" + one + "' (MiB, or KiB with a K suffix; 64K at least)");
                sizes_kb.push_back(kb);
                p = q + 1;
            }
        } else if (a == "--help" || a == "-h") {
            usage();
            return 0;
        } else {
            usage();
            usage_die("unknown argument " + a);
        }
    }
    char tmpl[4096];
    snprintf(tmpl, sizeof tmpl, "%s/ds4-bench-store-XXXXXX", dir.c_str());
    if (!mkdtemp(tmpl)) die("cannot create a scratch dir in " + dir + ": " + strerror(errno));
    const std::string scratch = tmpl;
    const std::string raw_path = scratch + "/raw-bandwidth.bin";

    printf("ds4-bench-store: scratch %s, store io_uring chunk %zu KiB x %u in flight (reads >= %zu KiB), %d "
           "interleaved reps (medians)\n",
           scratch.c_str(), uo.chunk_bytes >> 10, uo.queue_depth, uo.min_read_chunk >> 10, reps);
    {
        AlignedBuffer h(256 << 20);
        fill_random(h.data(), h.size(), 3);
        const double t0 = now_s();
        volatile uint64_t x = xxh64(h.data(), h.size());
        (void)x;
        printf("checksum (xxh64, in memory): %.0f MiB/s\n", mibs(h.size(), now_s() - t0));
    }

    StoreOptions so;
    so.state_dir = scratch + "/state";
    so.io_options = uo;
    so.verify_checksums_on_open = false;
    std::unique_ptr<Store> store;
    if (Status s = Store::open(so, &store); !s) die(s.to_string());
    StoreStats st;
    if (Status s = store->stats(&st); !s) die(s.to_string());
    printf("store: io_uring %s\n", st.uring ? "active" : "UNAVAILABLE (pread/pwrite fallback)");
    printf("raw = O_DIRECT 4 MiB requests on a file of the same size: write+fsync; read dd-like (one reused\n"
           "buffer), into memory (a file-sized buffer) and queued (into memory, %u requests in flight).\n"
           "MiB/s; %% = store / raw; restore is judged against the best of the three raw reads.\n",
           uo.queue_depth);
    char qd_col[32];
    snprintf(qd_col, sizeof qd_col, "raw qd%u", uo.queue_depth);
    printf("%8s | %8s %8s %5s | %8s %8s %8s %8s %6s | %9s\n", "payload", "save", "raw wr", "%", "restore", "raw dd",
           "raw mem", qd_col, "%best", "fresh buf");
    for (const uint64_t kb : sizes_kb) {
        const auto p = make_payload(kb << 10, kb);
        AlignedBuffer raw_src(p.size()), raw_dst(p.size());
        memcpy(raw_src.data(), p.data(), p.size());
        const std::string name = "bench-" + std::to_string(kb);
        std::vector<double> save, load, fresh, raw_w, raw_dd, raw_mem, raw_qd;
        LoadedPayload reused;
        for (int i = 0; i < reps; ++i) {
            double t0 = now_s();
            if (Status s = store->save(name, p.data(), p.size()); !s) die(s.to_string());
            save.push_back(mibs(p.size(), now_s() - t0));
            raw_w.push_back(checked(ds4::bench::raw_write_mibs(raw_path, raw_src.data(), p.size()), "raw write"));

            raw_dd.push_back(checked(ds4::bench::raw_read_mibs(raw_path, nullptr, p.size()), "raw read"));
            t0 = now_s();
            if (Status s = store->load(name, &reused); !s) die(s.to_string());
            load.push_back(mibs(p.size(), now_s() - t0));
            raw_mem.push_back(checked(ds4::bench::raw_read_mibs(raw_path, raw_dst.data(), p.size()), "raw read"));
            {
                LoadedPayload fb;  // a new buffer: includes faulting its memory in
                t0 = now_s();
                if (Status s = store->load(name, &fb); !s) die(s.to_string());
                fresh.push_back(mibs(p.size(), now_s() - t0));
            }
            raw_qd.push_back(checked(ds4::bench::raw_read_queued_mibs(raw_path, raw_dst.data(), p.size(),
                                                                      uo.queue_depth), "raw read"));
            if (reused.bytes.size() != p.size() || memcmp(reused.bytes.data(), p.data(), p.size()) != 0)
                die("restored payload differs from the saved one");
        }
        const double sv = median(save), rw = median(raw_w), ld = median(load), dd = median(raw_dd),
                     rm = median(raw_mem), rq = median(raw_qd);
        const double best = std::max({dd, rm, rq});
        char label[32];
        if (kb % 1024 == 0) snprintf(label, sizeof label, "%4" PRIu64 " MiB", kb >> 10);
        else snprintf(label, sizeof label, "%4" PRIu64 " KiB", kb);
        printf("%8s | %8.0f %8.0f %4.0f%% | %8.0f %8.0f %8.0f %8.0f %5.0f%% | %9.0f\n", label, sv, rw,
               100 * sv / rw, ld, dd, rm, rq, 100 * ld / best, median(fresh));
        fflush(stdout);
        if (Status s = store->remove(name); !s) die(s.to_string());
    }
    store.reset();
    unlink(raw_path.c_str());
    const std::string rm = "rm -rf '" + scratch + "'";
    if (system(rm.c_str()) != 0) fprintf(stderr, "ds4-bench-store: could not remove %s\n", scratch.c_str());
    return 0;
}
