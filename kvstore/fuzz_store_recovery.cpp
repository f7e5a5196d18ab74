// libFuzzer target for start-up recovery (store_recovery.cpp, lmdb_check.cpp) over damaged
// state dirs. Init builds one state dir with the real store: sessions (one pinned) and two
// prefix checkpoints. Each input is a list of mutations applied to a fresh copy of it:
//
//   op byte: low 3 bits pick the action, the rest (with the next byte) the file
//   0, 1, 2  overwrite: u24 offset (0: the first 16 KiB of LMDB pages are favoured), a
//            length byte (1..16) and that many bytes
//   3        truncate to a u24 length (mod the size + 1)
//   4        write a 64-bit value (all ones, zero, 0x7fff..., from the input) at an 8-byte
//            aligned u16 offset
//   5        append up to 16 bytes
//   6        delete the file
//   7        replace a payload file by a copy of another entry's file
//
// then opens the store (recovery runs), lists and loads every session, serves every
// checkpoint through find_longest_prefix/load_longest_prefix, reads stats, closes it, and
// opens it once more: the first open having repaired the dir, the second must succeed.
// Errors, quarantines and a moved-aside index are all fine; a crash (SIGBUS from a mapped
// file cut short, an abort, a sanitizer report) is not. Scratch dirs live under
// $DS4_FUZZ_TMPDIR, else on /dev/shm when it is there (tmpfs: fsync is free), else under
// $TMPDIR or /tmp; each input's copy is removed after it, the whole tree at exit.
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kvstore/store.h"
#include "tests/kvstore/test_util.h"

using namespace ds4::kvstore;

namespace {

std::string g_root;                 // scratch root for this process
std::string g_base;                 // the pristine state dir
std::vector<std::string> g_files;   // its files, relative to the state dir (index first)
std::vector<int32_t> g_ckpt_tokens;
int g_iter = 0;

[[noreturn]] void die(const std::string &why) {
    std::fprintf(stderr, "fuzz_store_recovery: %s\n", why.c_str());
    std::abort();
}

void remove_tree(const std::string &p) {
    nftw(p.c_str(), [](const char *f, const struct stat *, int, struct FTW *) { return ::remove(f); }, 16,
         FTW_DEPTH | FTW_PHYS);
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

void copy_file(const std::string &from, const std::string &to) {
    const std::vector<uint8_t> b = testing::read_file(from);
    testing::write_file(to, b.data(), b.size());
}

void copy_tree(const std::string &from, const std::string &to) {
    mkdir(to.c_str(), 0700);
    DIR *d = opendir(from.c_str());
    if (!d) die("cannot list " + from);
    while (struct dirent *e = readdir(d)) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        const std::string f = from + "/" + e->d_name, t = to + "/" + e->d_name;
        struct stat st;
        if (lstat(f.c_str(), &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) copy_tree(f, t);
        else if (S_ISREG(st.st_mode)) copy_file(f, t);
    }
    closedir(d);
}

void list_tree(const std::string &dir, const std::string &rel, std::vector<std::string> *out) {
    for (const std::string &n : testing::list_files(dir)) {
        const std::string p = dir + "/" + n, r = rel.empty() ? n : rel + "/" + n;
        struct stat st;
        if (lstat(p.c_str(), &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) list_tree(p, r, out);
        else if (S_ISREG(st.st_mode) && n != "LOCK") out->push_back(r);
    }
}

StoreOptions options(const std::string &dir, bool verify) {
    StoreOptions o;
    o.state_dir = dir;
    o.io_options = {256 * 1024, 4};
    o.verify_checksums_on_open = verify;
    static const bool verbose = getenv("DS4_FUZZ_VERBOSE") != nullptr;   // the store's log lines, for triage
    o.log = [](const std::string &l) {
        if (verbose) std::fprintf(stderr, "store: %s\n", l.c_str());
    };
    return o;
}

struct Reader {
    const uint8_t *p, *end;
    size_t left() const { return size_t(end - p); }
    uint32_t u(int bytes) {
        uint32_t v = 0;
        for (int i = 0; i < bytes; ++i) v |= uint32_t(p < end ? *p++ : 0) << (8 * i);
        return v;
    }
};

void apply(const std::string &dir, Reader &in) {
    const uint32_t op = in.u(1);
    const size_t which = (op >> 3 | in.u(1) << 5) % g_files.size();
    const std::string path = dir + "/" + g_files[which];
    const int fd = ::open(path.c_str(), O_RDWR);
    if (fd < 0) return;   // deleted by an earlier op
    struct stat st;
    fstat(fd, &st);
    const uint64_t size = uint64_t(st.st_size);
    static const bool verbose = getenv("DS4_FUZZ_VERBOSE") != nullptr;   // which damage, for triage
    if (verbose) std::fprintf(stderr, "mutation %u on %s (%llu bytes)\n", op & 7, g_files[which].c_str(), (unsigned long long)size);
    switch (op & 7) {
        case 0: case 1: case 2: {
            uint64_t off = in.u(3);
            off = off < 16384 && size > 16384 ? off : size ? off % size : 0;
            uint8_t buf[16];
            const size_t n = 1 + in.u(1) % 16;
            for (size_t i = 0; i < n; ++i) buf[i] = uint8_t(in.u(1));
            if (pwrite(fd, buf, n, off_t(off)) < 0) break;
            break;
        }
        case 3:
            if (ftruncate(fd, off_t(in.u(3) % (size + 1))) != 0) break;
            break;
        case 4: {
            const uint64_t off = (uint64_t(in.u(2)) * 8) % (size ? size : 1);
            const uint32_t k = in.u(1) % 4;
            uint64_t v = k == 0 ? ~uint64_t(0) : k == 1 ? 0 : k == 2 ? 0x7fffffffffffffffull : (uint64_t(in.u(4)) << 32 | in.u(4));
            if (pwrite(fd, &v, 8, off_t(off)) < 0) break;
            break;
        }
        case 5: {
            uint8_t buf[16];
            const size_t n = 1 + in.u(1) % 16;
            for (size_t i = 0; i < n; ++i) buf[i] = uint8_t(in.u(1));
            if (pwrite(fd, buf, n, off_t(size)) < 0) break;
            break;
        }
        case 6:
            ::unlink(path.c_str());
            break;
        case 7: {
            const std::string other = dir + "/" + g_files[in.u(1) % g_files.size()];
            if (other != path && g_files[which].rfind("payloads/", 0) == 0) {
                ::close(fd);
                copy_file(other, path);
                return;
            }
            break;
        }
    }
    ::close(fd);
}

// Everything the store offers a reader, on whatever survived.
void exercise(Store &s) {
    std::vector<EntryInfo> l;
    if (s.list(&l)) {
        LoadedPayload p;
        for (const EntryInfo &e : l) {
            EntryInfo i;
            (void)s.info(e.name, &i);
            if (s.load(e.name, &p)) {
                if (p.bytes.size() != ds4::payload::total_bytes(p.header)) die("a load served a payload of the wrong size");
            }
        }
    }
    std::vector<EntryInfo> c;
    if (s.list_checkpoints(&c)) {
        LoadedPayload p;
        for (const EntryInfo &e : c) {
            PrefixMatch m;
            (void)s.find_longest_prefix(e.fingerprint, g_ckpt_tokens.data(), g_ckpt_tokens.size(), &m);
            (void)s.load_longest_prefix(e.fingerprint, g_ckpt_tokens.data(), g_ckpt_tokens.size(), &p);
        }
    }
    StoreStats st;
    (void)s.stats(&st);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    std::string base;
    struct stat st;
    if (const char *t = getenv("DS4_FUZZ_TMPDIR"); t && *t) base = t;
    else if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && access("/dev/shm", W_OK) == 0) base = "/dev/shm";
    else if (const char *t2 = getenv("TMPDIR"); t2 && *t2) base = t2;
    else base = "/tmp";
    remove_stale(base, "ds4-fuzz-store-", remove_tree);
    std::string tmpl = base + "/ds4-fuzz-store-" + std::to_string(getpid()) + "-XXXXXX";
    if (!mkdtemp(tmpl.data())) die("mkdtemp in " + base + " failed");
    g_root = tmpl;
    std::atexit([] { remove_tree(g_root); });
    g_base = g_root + "/base";

    std::unique_ptr<Store> s;
    if (Status r = Store::open(options(g_base, true), &s); !r) die("cannot create the base store: " + r.to_string());
    const char *names[] = {"a", "my chat", "proj:2024-01-02_v1.5", "x.dsv4", "z"};
    uint64_t seed = 100;
    for (const char *n : names) {
        const auto p = testing::make_payload(seed, 5 + seed % 20, 3000 + 997 * (seed % 5));
        if (!s->save(n, p.data(), p.size())) die("save failed");
        ++seed;
    }
    if (!s->pin("a", true)) die("pin failed");
    g_ckpt_tokens = testing::seeded_tokens(7, 24);
    for (size_t n : {8, 16}) {
        const auto c = testing::make_payload(
            900 + n, std::vector<int32_t>(g_ckpt_tokens.begin(), g_ckpt_tokens.begin() + long(n)), 2000);
        if (!s->save_checkpoint(c.data(), c.size())) die("save_checkpoint failed");
    }
    s.reset();
    list_tree(g_base, "", &g_files);
    // The index first: most inputs then start by damaging it.
    std::stable_partition(g_files.begin(), g_files.end(), [](const std::string &f) { return f == "index/data.mdb"; });
    if (g_files.empty() || g_files[0] != "index/data.mdb") die("the base state has no index/data.mdb");
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const std::string dir = g_root + "/w" + std::to_string(g_iter++);
    copy_tree(g_base, dir);
    Reader in{data, data + size};
    const bool verify = !(in.u(1) & 1);
    for (int ops = 0; ops < 8 && in.left() > 0; ++ops) apply(dir, in);

    bool opened = false;
    {
        std::unique_ptr<Store> s;
        if (Store::open(options(dir, verify), &s)) {
            opened = true;
            exercise(*s);
        }
    }
    if (opened) {
        std::unique_ptr<Store> s;
        const Status r = Store::open(options(dir, verify), &s);
        if (!r) die("a state dir that opened once does not open again: " + r.to_string());
        exercise(*s);
    }
    remove_tree(dir);
    return 0;
}
