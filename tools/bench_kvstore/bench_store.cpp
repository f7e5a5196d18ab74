// ds4-bench-store: session store save/restore throughput against the disk's raw
// sequential bandwidth, both measured in the same run on the same file system.
//
// Raw bandwidth is measured two ways, both with O_DIRECT so the page cache does not
// flatter the numbers: dd-like (one 4 MiB request at a time) and io_uring with the
// store's chunk size and queue depth. Store numbers include everything a save or load
// does: checksum, temp file, fsync, rename, directory fsync and the LMDB commit for a
// save; the read and checksum/header verification for a load.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bridge/payload_header.h"
#include "kvstore/aligned_buffer.h"
#include "kvstore/file_io.h"
#include "kvstore/store.h"
#include "kvstore/xxh64.h"

using namespace ds4::kvstore;

namespace {

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double mbps(uint64_t bytes, double s) { return s > 0 ? double(bytes) / (1 << 20) / s : 0; }

[[noreturn]] void die(const std::string &msg) {
    fprintf(stderr, "ds4-bench-store: %s\n", msg.c_str());
    exit(1);
}

void fill_random(uint8_t *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i += 8) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        const uint64_t v = seed ^ (seed >> 29);
        memcpy(p + i, &v, std::min<size_t>(8, n - i));
    }
}

struct Raw {
    double dd_write = 0, dd_read = 0, uring_write = 0, uring_read = 0;
};

// dd-like: synchronous 4 MiB O_DIRECT requests, one at a time.
double dd_pass(const std::string &path, AlignedBuffer &buf, uint64_t bytes, bool write) {
    const int fd = open(path.c_str(), (write ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY) | O_DIRECT, 0600);
    if (fd < 0) die("cannot open " + path + " with O_DIRECT: " + strerror(errno));
    const size_t bs = 4 << 20;
    const double t0 = now_s();
    for (uint64_t off = 0; off < bytes; off += bs) {
        const ssize_t r = write ? pwrite(fd, buf.data(), bs, off_t(off)) : pread(fd, buf.data(), bs, off_t(off));
        if (r != ssize_t(bs)) die(std::string(write ? "pwrite" : "pread") + " failed: " + strerror(errno));
    }
    if (write && fsync(fd) != 0) die("fsync failed");
    const double t = now_s() - t0;
    close(fd);
    return mbps(bytes, t);
}

double uring_pass(FileIo &io, const std::string &path, AlignedBuffer &buf, uint64_t bytes, bool write) {
    const int fd = io.open(path, (write ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY) | O_DIRECT, 0600);
    if (fd < 0) die("cannot open " + path + ": " + strerror(-fd));
    const double t0 = now_s();
    if (write) {
        if (const int rc = io.write_all(fd, buf.data(), bytes, nullptr)) die(std::string("write: ") + strerror(-rc));
        if (const int rc = io.fsync(fd)) die(std::string("fsync: ") + strerror(-rc));
    } else {
        const int64_t got = io.read_all(fd, buf.data(), bytes, nullptr);
        if (got != int64_t(bytes)) die("short read");
    }
    const double t = now_s() - t0;
    io.close(fd);
    return mbps(bytes, t);
}

Raw measure_raw(const std::string &dir, uint64_t bytes, const UringOptions &uo, int reps) {
    Raw r;
    const std::string path = dir + "/raw-bandwidth.bin";
    AlignedBuffer big(bytes);
    fill_random(big.data(), bytes, 1);
    auto io = make_uring_file_io(uo);
    for (int i = 0; i < reps; ++i) {
        r.dd_write = std::max(r.dd_write, dd_pass(path, big, bytes, true));
        r.dd_read = std::max(r.dd_read, dd_pass(path, big, bytes, false));
        r.uring_write = std::max(r.uring_write, uring_pass(*io, path, big, bytes, true));
        r.uring_read = std::max(r.uring_read, uring_pass(*io, path, big, bytes, false));
    }
    unlink(path.c_str());
    return r;
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
    puts("usage: ds4-bench-store [--dir DIR] [--sizes MB,MB,...] [--reps N] [--raw-mb MB]\n"
         "                       [--chunk-kb KB] [--depth N]\n"
         "  --dir     scratch directory on the file system to measure (default: .)\n"
         "  --sizes   payload sizes in MiB (default 64,256)\n"
         "  --reps    repetitions per measurement; the best is reported (default 3)\n"
         "  --raw-mb  size of the raw-bandwidth file in MiB (default 512)\n"
         "  --chunk-kb, --depth  io_uring request size and requests in flight (default 2048, 8)");
}

}  // namespace

int main(int argc, char **argv) {
    std::string dir = ".";
    std::vector<uint64_t> sizes_mb = {64, 256};
    int reps = 3;
    uint64_t raw_mb = 512;
    UringOptions uo;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) die("missing value after " + a);
            return argv[++i];
        };
        if (a == "--dir") dir = val();
        else if (a == "--reps") reps = std::max(1, atoi(val().c_str()));
        else if (a == "--raw-mb") raw_mb = strtoull(val().c_str(), nullptr, 10);
        else if (a == "--chunk-kb") uo.chunk_bytes = size_t(strtoull(val().c_str(), nullptr, 10)) << 10;
        else if (a == "--depth") uo.queue_depth = unsigned(atoi(val().c_str()));
        else if (a == "--sizes") {
            sizes_mb.clear();
            std::string v = val();
            for (size_t p = 0; p < v.size();) {
                const size_t q = v.find(',', p);
                sizes_mb.push_back(strtoull(v.substr(p, q - p).c_str(), nullptr, 10));
                p = q == std::string::npos ? v.size() : q + 1;
            }
        } else if (a == "--help" || a == "-h") {
            usage();
            return 0;
        } else {
            usage();
            die("unknown argument " + a);
        }
    }
    char tmpl[4096];
    snprintf(tmpl, sizeof tmpl, "%s/ds4-bench-store-XXXXXX", dir.c_str());
    if (!mkdtemp(tmpl)) die("cannot create a scratch dir in " + dir + ": " + strerror(errno));
    const std::string scratch = tmpl;

    printf("ds4-bench-store: scratch %s, io_uring chunk %zu KiB x %u in flight\n", scratch.c_str(), uo.chunk_bytes >> 10,
           uo.queue_depth);
    {
        std::vector<uint8_t> h(256 << 20);
        fill_random(h.data(), h.size(), 3);
        const double t0 = now_s();
        volatile uint64_t x = xxh64(h.data(), h.size());
        (void)x;
        printf("checksum (xxh64, in memory): %.0f MiB/s\n", mbps(h.size(), now_s() - t0));
    }
    const Raw raw = measure_raw(scratch, raw_mb << 20, uo, reps);
    printf("raw sequential, O_DIRECT, %" PRIu64 " MiB file (best of %d):\n", raw_mb, reps);
    printf("  dd-like 4 MiB x1   write+fsync %8.0f MiB/s   read %8.0f MiB/s\n", raw.dd_write, raw.dd_read);
    printf("  io_uring           write+fsync %8.0f MiB/s   read %8.0f MiB/s\n", raw.uring_write, raw.uring_read);
    const double raw_w = std::max(raw.dd_write, raw.uring_write), raw_r = std::max(raw.dd_read, raw.uring_read);

    StoreOptions so;
    so.state_dir = scratch + "/state";
    so.io_options = uo;
    so.verify_checksums_on_open = false;
    std::unique_ptr<Store> store;
    if (Status s = Store::open(so, &store); !s) die(s.to_string());
    StoreStats st;
    if (Status s = store->stats(&st); !s) die(s.to_string());
    printf("store: io_uring %s\n", st.uring ? "active" : "UNAVAILABLE (pread/pwrite fallback)");
    printf("%10s %14s %8s %14s %8s %14s %8s\n", "payload", "save MiB/s", "of raw", "restore MiB/s", "of raw",
           "(new buffer)", "of raw");
    for (const uint64_t mb : sizes_mb) {
        const auto p = make_payload(mb << 20, mb);
        const std::string name = "bench-" + std::to_string(mb);
        double best_save = 0, best_load = 0, best_fresh = 0;
        LoadedPayload reused;
        for (int i = 0; i < reps; ++i) {
            double t0 = now_s();
            if (Status s = store->save(name, p.data(), p.size()); !s) die(s.to_string());
            best_save = std::max(best_save, mbps(p.size(), now_s() - t0));
            {
                LoadedPayload fresh;  // a new buffer: includes faulting its memory in
                t0 = now_s();
                if (Status s = store->load(name, &fresh); !s) die(s.to_string());
                best_fresh = std::max(best_fresh, mbps(p.size(), now_s() - t0));
            }
            t0 = now_s();
            if (Status s = store->load(name, &reused); !s) die(s.to_string());
            best_load = std::max(best_load, mbps(p.size(), now_s() - t0));
            if (reused.bytes.size() != p.size() || memcmp(reused.bytes.data(), p.data(), p.size()) != 0)
                die("restored payload differs from the saved one");
        }
        printf("%7" PRIu64 " MiB %14.0f %7.0f%% %14.0f %7.0f%% %14.0f %7.0f%%\n", mb, best_save, 100 * best_save / raw_w,
               best_load, 100 * best_load / raw_r, best_fresh, 100 * best_fresh / raw_r);
        if (Status s = store->remove(name); !s) die(s.to_string());
    }
    store.reset();
    const std::string rm = "rm -rf '" + scratch + "'";
    if (system(rm.c_str()) != 0) fprintf(stderr, "ds4-bench-store: could not remove %s\n", scratch.c_str());
    return 0;
}
