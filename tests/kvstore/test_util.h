// Helpers shared by the kvstore tests: scratch directories and synthetic payloads whose
// every byte is derived from a seed, so a loaded payload can be checked independently.
#pragma once
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bridge/payload_header.h"

namespace ds4::kvstore::testing {

inline uint64_t splitmix64(uint64_t &s) {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

inline constexpr uint32_t kTestVocab = 1000;
inline constexpr uint64_t kTestFingerprint = 0x0123456789ABCDEFull;

inline std::vector<int32_t> seeded_tokens(uint64_t seed, size_t n) {
    std::vector<int32_t> t(n);
    uint64_t s = seed ^ 0x5555;
    for (auto &x : t) x = int32_t(splitmix64(s) % kTestVocab);
    return t;
}

// A valid payload: header, `tokens`, then a tail whose first 8 bytes are `seed` and the
// rest a splitmix64 stream of it.
inline std::vector<uint8_t> make_payload(uint64_t seed, const std::vector<int32_t> &tokens, size_t tail_bytes,
                                         uint64_t fingerprint = kTestFingerprint) {
    payload::Header h;
    h.ctx_size = uint32_t(tokens.size() + 4096);
    h.n_tokens = uint32_t(tokens.size());
    h.n_layer = 4;
    h.n_embd = 64;
    h.n_vocab = kTestVocab;
    h.head_dim = 16;
    h.fingerprint = fingerprint;
    h.tail_bytes = tail_bytes;
    std::vector<uint8_t> out;
    std::string err;
    if (!payload::encode_prefix(h, tokens.data(), tokens.size(), &out, &err)) abort();
    const size_t at = out.size();
    out.resize(at + tail_bytes);
    uint64_t s = seed;
    for (size_t i = 0; i < tail_bytes; i += 8) {
        const uint64_t v = i == 0 ? seed : splitmix64(s);
        memcpy(out.data() + at + i, &v, tail_bytes - i < 8 ? tail_bytes - i : 8);
    }
    return out;
}

inline std::vector<uint8_t> make_payload(uint64_t seed, size_t n_tokens, size_t tail_bytes,
                                         uint64_t fingerprint = kTestFingerprint) {
    return make_payload(seed, seeded_tokens(seed, n_tokens), tail_bytes, fingerprint);
}

class TempDir {
public:
    TempDir() {
        const char *base = getenv("TMPDIR");
        std::string tmpl = std::string(base && *base ? base : "/tmp") + "/ds4-kvstore-test-XXXXXX";
        if (!mkdtemp(tmpl.data())) abort();
        path_ = tmpl;
    }
    ~TempDir() { remove_tree(path_); }
    const std::string &path() const { return path_; }
    std::string sub(const std::string &name) const { return path_ + "/" + name; }

    static void remove_tree(const std::string &p) {
        nftw(
            p.c_str(), [](const char *f, const struct stat *, int, struct FTW *) { return ::remove(f); }, 16,
            FTW_DEPTH | FTW_PHYS);
    }

private:
    std::string path_;
};

inline std::vector<std::string> list_files(const std::string &dir) {
    std::vector<std::string> out;
    if (DIR *d = opendir(dir.c_str())) {
        while (struct dirent *e = readdir(d))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) out.emplace_back(e->d_name);
        closedir(d);
    }
    std::sort(out.begin(), out.end());
    return out;
}

inline void flip_byte(const std::string &path, uint64_t offset) {
    const int fd = ::open(path.c_str(), O_RDWR);
    if (fd < 0) abort();
    uint8_t b;
    if (pread(fd, &b, 1, off_t(offset)) != 1) abort();
    b ^= 0x40;
    if (pwrite(fd, &b, 1, off_t(offset)) != 1) abort();
    ::close(fd);
}

inline void write_file(const std::string &path, const void *data, size_t len) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) abort();
    if (len && ::write(fd, data, len) != ssize_t(len)) abort();
    ::close(fd);
}

inline std::vector<uint8_t> read_file(const std::string &path) {
    std::vector<uint8_t> out;
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return out;
    uint8_t buf[65536];
    ssize_t r;
    while ((r = ::read(fd, buf, sizeof buf)) > 0) out.insert(out.end(), buf, buf + r);
    ::close(fd);
    return out;
}

}  // namespace ds4::kvstore::testing
