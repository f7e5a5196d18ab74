// Shared helpers for the GGUF tests: a scratch directory and a raw GGUF byte builder that,
// unlike Writer, can produce any (also invalid) header.
#pragma once
#include "tests/common/scratch.h"
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace ds4::gguf::test {

using ds4test::TempDir;
inline std::vector<uint8_t> read_all(const std::string &path) { return ds4test::read_file_bytes(path); }
inline void write_all(const std::string &path, const std::vector<uint8_t> &b) { ds4test::write_file_bytes(path, b); }

// Little-endian byte builder for hand-made GGUF images.
struct Raw {
    std::vector<uint8_t> b;
    Raw &bytes(const void *p, size_t n) {
        const auto *c = static_cast<const uint8_t *>(p);
        b.insert(b.end(), c, c + n);
        return *this;
    }
    Raw &u8(uint8_t v) { return bytes(&v, 1); }
    Raw &u16(uint16_t v) { return bytes(&v, 2); }
    Raw &u32(uint32_t v) { return bytes(&v, 4); }
    Raw &u64(uint64_t v) { return bytes(&v, 8); }
    Raw &i64(int64_t v) { return bytes(&v, 8); }
    Raw &str(const std::string &s) { return u64(s.size()).bytes(s.data(), s.size()); }
    Raw &header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
        return bytes("GGUF", 4).u32(version).u64(n_tensors).u64(n_kv);
    }
    // A u32 key/value pair.
    Raw &kv_u32(const std::string &key, uint32_t v) { return str(key).u32(4).u32(v); }
    Raw &kv_str(const std::string &key, const std::string &v) { return str(key).u32(8).str(v); }
    Raw &tensor(const std::string &name, std::vector<int64_t> ne, uint32_t type, uint64_t offset) {
        str(name).u32(static_cast<uint32_t>(ne.size()));
        for (int64_t d : ne) i64(d);
        return u32(type).u64(offset);
    }
    Raw &pad(size_t align) {
        while (b.size() % align) b.push_back(0);
        return *this;
    }
    Raw &zeros(size_t n) {
        b.insert(b.end(), n, 0);
        return *this;
    }
};

}  // namespace ds4::gguf::test
