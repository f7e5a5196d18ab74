#include "bridge/payload_header.h"

#include <cerrno>
#include <cstdarg>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <new>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace ds4::payload {
namespace {

bool set_err(std::string *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool set_err(std::string *err, const char *fmt, ...) {
    if (err) {
        char buf[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
        try {
            *err = buf;
        } catch (...) {
        }
    }
    return false;
}

inline uint32_t load_u32(const uint8_t *p) {
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

inline void store_u32(uint8_t *p, uint32_t v) {
    p[0] = uint8_t(v);
    p[1] = uint8_t(v >> 8);
    p[2] = uint8_t(v >> 16);
    p[3] = uint8_t(v >> 24);
}

#if !defined(__SSE4_2__)
struct Crc32cTable {
    uint32_t t[256];
    Crc32cTable() {
        for (uint32_t i = 0; i < 256; ++i) {
            uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            t[i] = c;
        }
    }
};
const Crc32cTable kCrcTable;
#endif

// Header words 0..11 as they are (or will be) stored.
void header_words(const Header &h, uint8_t out[kHeaderBytes - 4]) {
    const uint32_t w[12] = {kMagic,
                            kVersion,
                            h.ctx_size,
                            h.n_tokens,
                            h.n_layer,
                            h.n_embd,
                            h.n_vocab,
                            h.head_dim,
                            uint32_t(h.fingerprint),
                            uint32_t(h.fingerprint >> 32),
                            uint32_t(h.tail_bytes),
                            uint32_t(h.tail_bytes >> 32)};
    for (int i = 0; i < 12; ++i) store_u32(out + 4 * i, w[i]);
}

bool check_fields(const Header &h, std::string *err) {
    if (h.ctx_size == 0) return set_err(err, "payload header: ctx_size is 0");
    if (h.n_tokens > h.ctx_size)
        return set_err(err, "payload header: n_tokens %" PRIu32 " exceeds ctx_size %" PRIu32,
                       h.n_tokens, h.ctx_size);
    if (h.n_layer == 0) return set_err(err, "payload header: n_layer is 0");
    if (h.n_embd == 0) return set_err(err, "payload header: n_embd is 0");
    if (h.n_vocab == 0) return set_err(err, "payload header: n_vocab is 0");
    // Token ids are int32: a larger vocabulary would let ids through that read back negative
    // (and that the encoder refuses), so a payload would not re-encode to its own bytes.
    if (h.n_vocab > uint32_t(INT32_MAX))
        return set_err(err, "payload header: n_vocab %" PRIu32 " exceeds the int32 token id range", h.n_vocab);
    if (h.head_dim == 0) return set_err(err, "payload header: head_dim is 0");
    // 52 + 4·n_tokens is far below 2^64, so only the tail can overflow the total.
    if (h.tail_bytes > UINT64_MAX - prefix_bytes(h.n_tokens))
        return set_err(err, "payload header: tail_bytes %" PRIu64 " overflows the payload length",
                       h.tail_bytes);
    return true;
}

}  // namespace

uint32_t crc32c(const void *data, size_t len, uint32_t crc) {
    const uint8_t *p = static_cast<const uint8_t *>(data);
    uint32_t c = ~crc;
#if defined(__SSE4_2__)
    uint64_t c64 = c;
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c64 = _mm_crc32_u64(c64, v);
        p += 8;
        len -= 8;
    }
    c = uint32_t(c64);
    while (len--) c = _mm_crc32_u8(c, *p++);
#else
    while (len--) c = kCrcTable.t[(c ^ *p++) & 0xFF] ^ (c >> 8);
#endif
    return ~c;
}

bool encode_prefix(const Header &h, const int32_t *tokens, size_t n_tokens, uint8_t *out,
                   size_t out_cap, std::string *err) {
    if (n_tokens != h.n_tokens)
        return set_err(err, "payload encode: %zu token ids given but header says n_tokens %" PRIu32,
                       n_tokens, h.n_tokens);
    if (n_tokens > 0 && !tokens) return set_err(err, "payload encode: token array is NULL");
    if (!out) return set_err(err, "payload encode: output buffer is NULL");
    if (!check_fields(h, err)) return false;
    const uint64_t need = prefix_bytes(n_tokens);
    if (out_cap < need)
        return set_err(err, "payload encode: output buffer holds %zu bytes, need %" PRIu64,
                       out_cap, need);
    for (size_t i = 0; i < n_tokens; ++i) {
        if (tokens[i] < 0 || uint32_t(tokens[i]) >= h.n_vocab)
            return set_err(err,
                           "payload encode: token %zu has id %" PRId32
                           " outside the vocabulary [0, %" PRIu32 ")",
                           i, tokens[i], h.n_vocab);
    }
    header_words(h, out);
    uint8_t *tok = out + kHeaderBytes;
    for (size_t i = 0; i < n_tokens; ++i) store_u32(tok + 4 * i, uint32_t(tokens[i]));
    uint32_t crc = crc32c(out, kHeaderBytes - 4);
    crc = crc32c(tok, 4 * n_tokens, crc);
    store_u32(out + kHeaderBytes - 4, crc);
    return true;
}

bool encode_prefix(const Header &h, const int32_t *tokens, size_t n_tokens,
                   std::vector<uint8_t> *out, std::string *err) {
    if (!out) return set_err(err, "payload encode: output vector is NULL");
    try {
        out->assign(prefix_bytes(n_tokens), 0);
    } catch (...) {
        return set_err(err, "payload encode: out of memory for %zu token ids", n_tokens);
    }
    return encode_prefix(h, tokens, n_tokens, out->data(), out->size(), err);
}

// Everything that can be checked from the 52 header bytes alone (not the CRC).
static bool parse_header(const uint8_t *data, uint64_t range_len, Header *out, std::string *err) {
    const uint32_t magic = load_u32(data);
    if (magic != kMagic)
        return set_err(err, "payload has bad magic 0x%08" PRIx32 " (expected 0x%08" PRIx32 " 'DSV4')",
                       magic, kMagic);
    const uint32_t version = load_u32(data + 4);
    if (version != kVersion)
        return set_err(err, "payload has unsupported version %" PRIu32 " (this build reads %" PRIu32 ")",
                       version, kVersion);
    Header h;
    h.ctx_size = load_u32(data + 8);
    h.n_tokens = load_u32(data + 12);
    h.n_layer = load_u32(data + 16);
    h.n_embd = load_u32(data + 20);
    h.n_vocab = load_u32(data + 24);
    h.head_dim = load_u32(data + 28);
    h.fingerprint = uint64_t(load_u32(data + 32)) | uint64_t(load_u32(data + 36)) << 32;
    h.tail_bytes = uint64_t(load_u32(data + 40)) | uint64_t(load_u32(data + 44)) << 32;
    if (!check_fields(h, err)) return false;
    const uint64_t total = total_bytes(h);
    if (total != range_len) {
        if (range_len > total)
            return set_err(err,
                           "payload has %" PRIu64 " trailing bytes: header describes %" PRIu64
                           " bytes (%zu header + %" PRIu32 " tokens + %" PRIu64
                           " tail), range is %" PRIu64,
                           range_len - total, total, kHeaderBytes, h.n_tokens, h.tail_bytes,
                           range_len);
        return set_err(err,
                       "payload truncated: header describes %" PRIu64 " bytes (%zu header + %" PRIu32
                       " tokens + %" PRIu64 " tail), range is %" PRIu64,
                       total, kHeaderBytes, h.n_tokens, h.tail_bytes, range_len);
    }
    *out = h;
    return true;
}

bool decode_prefix(const uint8_t *data, size_t avail, uint64_t range_len, Header *out,
                   std::string *err) {
    if (!data && avail > 0) return set_err(err, "payload decode: data is NULL");
    if (avail > range_len)
        return set_err(err, "payload decode: %zu bytes present but the range is only %" PRIu64,
                       avail, range_len);
    if (range_len < kHeaderBytes)
        return set_err(err, "payload too short: %" PRIu64 " bytes, the header alone is %zu",
                       range_len, kHeaderBytes);
    if (avail < kHeaderBytes)
        return set_err(err, "payload decode: only %zu bytes present, the header is %zu", avail,
                       kHeaderBytes);
    Header h;
    if (!parse_header(data, range_len, &h, err)) return false;
    const uint64_t pre = prefix_bytes(h.n_tokens);
    if (avail < pre)
        return set_err(err, "payload decode: only %zu bytes present, header and tokens take %" PRIu64,
                       avail, pre);
    const uint8_t *tok = data + kHeaderBytes;
    uint32_t crc = crc32c(data, kHeaderBytes - 4);
    crc = crc32c(tok, 4 * size_t(h.n_tokens), crc);
    const uint32_t stored = load_u32(data + kHeaderBytes - 4);
    if (crc != stored)
        return set_err(err, "payload header checksum mismatch: stored 0x%08" PRIx32 ", computed 0x%08" PRIx32,
                       stored, crc);
    for (uint32_t i = 0; i < h.n_tokens; ++i) {
        const uint32_t t = load_u32(tok + 4 * size_t(i));
        if (t >= h.n_vocab)
            return set_err(err,
                           "payload token %" PRIu32 " has id %" PRId32
                           " outside the vocabulary [0, %" PRIu32 ")",
                           i, int32_t(t), h.n_vocab);
    }
    if (out) *out = h;
    return true;
}

bool decode_payload(const uint8_t *data, size_t len, Header *out, std::vector<int32_t> *tokens,
                    std::string *err) {
    Header h;
    if (!decode_prefix(data, len, len, &h, err)) return false;
    if (tokens && !read_tokens(data, len, h, tokens, err)) return false;
    if (out) *out = h;
    return true;
}

bool read_tokens(const uint8_t *data, size_t avail, const Header &h, std::vector<int32_t> *tokens,
                 std::string *err) {
    if (!tokens) return set_err(err, "payload read_tokens: output vector is NULL");
    const uint64_t pre = prefix_bytes(h.n_tokens);
    if (!data || avail < pre)
        return set_err(err, "payload read_tokens: %zu bytes present, header and tokens take %" PRIu64,
                       data ? avail : 0, pre);
    try {
        tokens->resize(h.n_tokens);
    } catch (...) {
        return set_err(err, "payload read_tokens: out of memory for %" PRIu32 " token ids", h.n_tokens);
    }
    const uint8_t *tok = data + kHeaderBytes;
    for (uint32_t i = 0; i < h.n_tokens; ++i) (*tokens)[i] = int32_t(load_u32(tok + 4 * size_t(i)));
    return true;
}

bool read_file_prefix(const char *path, uint64_t offset, uint64_t length, Header *out,
                      std::vector<int32_t> *tokens, std::string *err) {
    if (!path) return set_err(err, "payload read: path is NULL");
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return set_err(err, "payload read: cannot open %s: %s", path, strerror(errno));
    struct FdCloser {
        int fd;
        ~FdCloser() { ::close(fd); }
    } closer{fd};
    struct stat st;
    if (fstat(fd, &st) != 0) return set_err(err, "payload read: cannot stat %s: %s", path, strerror(errno));
    const uint64_t fsize = uint64_t(st.st_size);
    if (offset > fsize || length > fsize - offset)
        return set_err(err,
                       "payload read: range [%" PRIu64 ", +%" PRIu64 ") lies outside %s (%" PRIu64 " bytes)",
                       offset, length, path, fsize);
    auto pread_all = [&](uint8_t *dst, size_t n, uint64_t off) -> bool {
        size_t done = 0;
        while (done < n) {
            const ssize_t r = ::pread(fd, dst + done, n - done, off_t(off + done));
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) return set_err(err, "payload read: %s: %s", path, strerror(errno));
            if (r == 0) return set_err(err, "payload read: %s ended early at offset %" PRIu64, path, off + done);
            done += size_t(r);
        }
        return true;
    };
    if (length < kHeaderBytes)
        return set_err(err, "%s: payload too short: %" PRIu64 " bytes, the header alone is %zu", path,
                       length, kHeaderBytes);
    uint8_t head[kHeaderBytes];
    if (!pread_all(head, kHeaderBytes, offset)) return false;
    Header h;
    std::string herr;
    if (!parse_header(head, length, &h, &herr)) {
        return set_err(err, "%s: %s", path, herr.c_str());
    }
    std::vector<uint8_t> buf;
    try {
        buf.resize(prefix_bytes(h.n_tokens));
    } catch (...) {
        return set_err(err, "payload read: out of memory for %" PRIu32 " token ids", h.n_tokens);
    }
    memcpy(buf.data(), head, kHeaderBytes);
    if (!pread_all(buf.data() + kHeaderBytes, buf.size() - kHeaderBytes, offset + kHeaderBytes)) return false;
    if (!decode_prefix(buf.data(), buf.size(), length, &h, &herr)) {
        return set_err(err, "%s: %s", path, herr.c_str());
    }
    if (tokens && !read_tokens(buf.data(), buf.size(), h, tokens, err)) return false;
    if (out) *out = h;
    return true;
}

}  // namespace ds4::payload
