#include "kvstore/xxh64.h"

#include <cstring>

namespace ds4::kvstore {
namespace {

constexpr uint64_t P1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t P2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t P3 = 0x165667B19E3779F9ull;
constexpr uint64_t P4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t P5 = 0x27D4EB2F165667C5ull;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline uint64_t read64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    if constexpr (__BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__) v = __builtin_bswap64(v);
    return v;
}

inline uint32_t read32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    if constexpr (__BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__) v = __builtin_bswap32(v);
    return v;
}

inline uint64_t round(uint64_t acc, uint64_t lane) {
    acc += lane * P2;
    acc = rotl(acc, 31);
    return acc * P1;
}

inline uint64_t merge(uint64_t acc, uint64_t v) {
    acc ^= round(0, v);
    return acc * P1 + P4;
}

// Consumes whole 32-byte stripes; returns the bytes consumed.
inline size_t stripes(uint64_t v[4], const uint8_t *p, size_t len) {
    const uint8_t *const start = p;
    const uint8_t *const end = p + (len & ~size_t(31));
    uint64_t a = v[0], b = v[1], c = v[2], d = v[3];
    while (p < end) {
        a = round(a, read64(p));
        b = round(b, read64(p + 8));
        c = round(c, read64(p + 16));
        d = round(d, read64(p + 24));
        p += 32;
    }
    v[0] = a, v[1] = b, v[2] = c, v[3] = d;
    return size_t(p - start);
}

uint64_t finish(uint64_t h, const uint8_t *p, size_t len) {
    while (len >= 8) {
        h ^= round(0, read64(p));
        h = rotl(h, 27) * P1 + P4;
        p += 8;
        len -= 8;
    }
    if (len >= 4) {
        h ^= uint64_t(read32(p)) * P1;
        h = rotl(h, 23) * P2 + P3;
        p += 4;
        len -= 4;
    }
    while (len--) {
        h ^= uint64_t(*p++) * P5;
        h = rotl(h, 11) * P1;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

uint64_t converge(const uint64_t v[4]) {
    uint64_t h = rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18);
    for (int i = 0; i < 4; ++i) h = merge(h, v[i]);
    return h;
}

}  // namespace

uint64_t xxh64(const void *data, size_t len, uint64_t seed) {
    const uint8_t *p = static_cast<const uint8_t *>(data);
    uint64_t h;
    size_t done = 0;
    if (len >= 32) {
        uint64_t v[4] = {seed + P1 + P2, seed + P2, seed, seed - P1};
        done = stripes(v, p, len);
        h = converge(v);
    } else {
        h = seed + P5;
    }
    h += uint64_t(len);
    return finish(h, p + done, len - done);
}

void Xxh64::reset(uint64_t seed) {
    seed_ = seed;
    v_[0] = seed + P1 + P2;
    v_[1] = seed + P2;
    v_[2] = seed;
    v_[3] = seed - P1;
    total_ = 0;
    buffered_ = 0;
}

void Xxh64::update(const void *data, size_t len) {
    const uint8_t *p = static_cast<const uint8_t *>(data);
    total_ += len;
    if (buffered_) {
        const size_t take = len < 32 - buffered_ ? len : 32 - buffered_;
        memcpy(buf_ + buffered_, p, take);
        buffered_ += uint32_t(take);
        p += take;
        len -= take;
        if (buffered_ < 32) return;
        stripes(v_, buf_, 32);
        buffered_ = 0;
    }
    const size_t used = stripes(v_, p, len);
    p += used;
    len -= used;
    memcpy(buf_, p, len);
    buffered_ = uint32_t(len);
}

uint64_t Xxh64::digest() const {
    uint64_t h = total_ >= 32 ? converge(v_) : seed_ + P5;
    h += total_;
    return finish(h, buf_, buffered_);
}

}  // namespace ds4::kvstore
