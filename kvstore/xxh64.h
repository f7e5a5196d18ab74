// XXH64 (Yann Collet's 64-bit xxHash, format as specified by the xxHash project),
// written from the specification. Used for payload file checksums and token-prefix keys.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ds4::kvstore {

uint64_t xxh64(const void *data, size_t len, uint64_t seed = 0);

// Streaming form: update() any number of times, digest() at any point (digest does not
// change the state, so a copy-free prefix digest is possible).
class Xxh64 {
public:
    explicit Xxh64(uint64_t seed = 0) { reset(seed); }
    void reset(uint64_t seed = 0);
    void update(const void *data, size_t len);
    uint64_t digest() const;

private:
    uint64_t v_[4];
    uint64_t seed_;
    uint64_t total_;
    uint8_t buf_[32];
    uint32_t buffered_;
};

}  // namespace ds4::kvstore
