#include "kvstore/index_records.h"

#include <cstdio>
#include <cstring>

#include "kvstore/xxh64.h"

namespace ds4::kvstore {
namespace {

constexpr uint8_t kRecordVersion = 1;

void put_le(std::string &s, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) s.push_back(char(uint8_t(v >> (8 * i))));
}
void put_be(std::string &s, uint64_t v, int bytes) {
    for (int i = bytes - 1; i >= 0; --i) s.push_back(char(uint8_t(v >> (8 * i))));
}
uint64_t get_le(const char *p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t(uint8_t(p[i])) << (8 * i);
    return v;
}
uint64_t get_be(const char *p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v = v << 8 | uint8_t(p[i]);
    return v;
}

constexpr char kHex[] = "0123456789abcdef";

std::string hex16(uint64_t v) {
    std::string s(16, '0');
    for (int i = 15; i >= 0; --i, v >>= 4) s[size_t(i)] = kHex[v & 15];
    return s;
}

}  // namespace

std::string encode_record(const Record &r) {
    std::string s;
    s.reserve(kRecordBytes);
    put_le(s, kRecordVersion, 1);
    put_le(s, r.pinned ? 1 : 0, 1);
    put_le(s, r.named_file ? 1 : 0, 1);
    put_le(s, 0, 1);
    put_le(s, r.n_tokens, 4);
    put_le(s, r.file_id, 8);
    put_le(s, r.bytes, 8);
    put_le(s, r.checksum, 8);
    put_le(s, r.fingerprint, 8);
    put_le(s, r.prefix_hash, 8);
    put_le(s, r.created_ms, 8);
    put_le(s, r.last_used_ms, 8);
    put_le(s, r.last_used_seq, 8);
    return s;
}

bool decode_record(std::string_view b, Record *out) {
    if (b.size() != kRecordBytes || uint8_t(b[0]) != kRecordVersion || (uint8_t(b[1]) & ~1u) != 0) return false;
    const char *p = b.data();
    Record r;
    r.pinned = b[1] & 1;
    r.named_file = b[2] & 1;
    r.n_tokens = uint32_t(get_le(p + 4, 4));
    r.file_id = get_le(p + 8, 8);
    r.bytes = get_le(p + 16, 8);
    r.checksum = get_le(p + 24, 8);
    r.fingerprint = get_le(p + 32, 8);
    r.prefix_hash = get_le(p + 40, 8);
    r.created_ms = get_le(p + 48, 8);
    r.last_used_ms = get_le(p + 56, 8);
    r.last_used_seq = get_le(p + 64, 8);
    *out = r;
    return true;
}

std::string prefix_key_head(uint64_t fingerprint, uint32_t n_tokens, uint64_t hash) {
    std::string s;
    s.reserve(kPrefixKeyHead + 9);
    put_be(s, fingerprint, 8);
    put_be(s, n_tokens, 4);
    put_be(s, hash, 8);
    return s;
}

std::string session_alias_key(uint64_t fingerprint, uint32_t n_tokens, uint64_t hash, std::string_view name) {
    std::string s = prefix_key_head(fingerprint, n_tokens, hash);
    s.push_back(kTagSession);
    s.append(name);
    return s;
}

std::string checkpoint_key(uint64_t fingerprint, uint32_t n_tokens, uint64_t hash, uint64_t file_id) {
    std::string s = prefix_key_head(fingerprint, n_tokens, hash);
    s.push_back(kTagCheckpoint);
    put_be(s, file_id, 8);
    return s;
}

bool decode_prefix_key(std::string_view key, PrefixKey *out) {
    if (key.size() < kPrefixKeyHead + 1) return false;
    PrefixKey k;
    k.fingerprint = get_be(key.data(), 8);
    k.n_tokens = uint32_t(get_be(key.data() + 8, 4));
    k.hash = get_be(key.data() + 12, 8);
    k.tag = key[kPrefixKeyHead];
    const std::string_view rest = key.substr(kPrefixKeyHead + 1);
    if (k.tag == kTagSession) {
        if (rest.empty()) return false;
        k.session = rest;
    } else if (k.tag == kTagCheckpoint) {
        if (rest.size() != 8) return false;
        k.file_id = get_be(rest.data(), 8);
    } else {
        return false;
    }
    *out = k;
    return true;
}

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token hashes assume little-endian i32 bytes");

uint64_t token_prefix_hash(const int32_t *tokens, size_t n) { return xxh64(tokens, 4 * n); }

void token_prefix_hashes(const int32_t *tokens, const std::vector<uint32_t> &lengths, std::vector<uint64_t> *out) {
    out->clear();
    Xxh64 h;
    uint32_t at = 0;
    for (const uint32_t len : lengths) {
        h.update(tokens + at, 4 * size_t(len - at));
        at = len;
        out->push_back(h.digest());
    }
}

std::string payload_file_name(uint64_t file_id) { return hex16(file_id) + ".dsv4"; }
std::string session_file_name(uint64_t file_id, std::string_view session) {
    return hex16(file_id) + "-" + std::string(session) + ".dsv4";
}
std::string checkpoint_file_name(uint64_t file_id) { return hex16(file_id) + ".ckpt.dsv4"; }
std::string temp_file_name(uint64_t file_id) { return ".tmp-" + hex16(file_id) + ".dsv4"; }

namespace {

constexpr std::string_view kSuffix = ".dsv4";

bool parse_hex16(std::string_view s, uint64_t *v) {
    if (s.size() < 16) return false;
    uint64_t x = 0;
    for (size_t i = 0; i < 16; ++i) {
        const char *c = s[i] ? strchr(kHex, s[i]) : nullptr;
        if (!c) return false;
        x = x << 4 | uint64_t(c - kHex);
    }
    *v = x;
    return true;
}

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

bool parse_payload_file_name(std::string_view name, PayloadFileName *out) {
    PayloadFileName p;
    if (!ends_with(name, kSuffix) || !parse_hex16(name, &p.file_id)) return false;
    const std::string_view mid = name.substr(16, name.size() - 16 - kSuffix.size());
    if (mid.empty()) {
        p.kind = FileKind::kBare;
    } else if (mid == ".ckpt") {
        p.kind = FileKind::kCheckpoint;
    } else if (mid.size() >= 2 && mid[0] == '-') {
        p.kind = FileKind::kSession;
        p.session.assign(mid.substr(1));
    } else {
        return false;
    }
    *out = std::move(p);
    return true;
}

bool is_temp_file_name(std::string_view name) {
    uint64_t id;
    return name.size() == 5 + 16 + kSuffix.size() && name.substr(0, 5) == ".tmp-" && parse_hex16(name.substr(5), &id) &&
           ends_with(name, kSuffix);
}

std::string tombstone_key(std::string_view name) { return std::string(kTombstonePrefix) + std::string(name); }

bool tombstone_name(std::string_view key, std::string_view *name) {
    const std::string_view prefix(kTombstonePrefix);
    if (key.size() <= prefix.size() || key.substr(0, prefix.size()) != prefix) return false;
    *name = key.substr(prefix.size());
    return true;
}

std::string encode_tombstone(const Tombstone &t) {
    std::string s;
    put_le(s, t.evicted_ms, 8);
    put_le(s, t.seq, 8);
    s += t.why;
    return s;
}

bool decode_tombstone(std::string_view bytes, Tombstone *out) {
    if (bytes.size() < 16) return false;
    out->evicted_ms = get_le(bytes.data(), 8);
    out->seq = get_le(bytes.data() + 8, 8);
    out->why.assign(bytes.substr(16));
    return true;
}

std::string encode_u32(uint32_t v) {
    std::string s;
    put_le(s, v, 4);
    return s;
}
std::string encode_u64(uint64_t v) {
    std::string s;
    put_le(s, v, 8);
    return s;
}
bool decode_u32(std::string_view b, uint32_t *v) {
    if (b.size() != 4) return false;
    *v = uint32_t(get_le(b.data(), 4));
    return true;
}
bool decode_u64(std::string_view b, uint64_t *v) {
    if (b.size() != 8) return false;
    *v = get_le(b.data(), 8);
    return true;
}

}  // namespace ds4::kvstore
