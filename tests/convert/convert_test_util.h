// Helpers for the converter tests: scratch directories and a test-side safetensors
// reader/writer (independent of the converter's own reader) for building damaged or
// re-spelled copies of the committed fixtures.
#pragma once
#include "tests/common/scratch.h"
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#ifndef DS4_SOURCE_DIR
#error "DS4_SOURCE_DIR must be defined"
#endif

namespace ds4::convert::test {

inline std::string fixture_dir(const std::string &name) {
    return std::string(DS4_SOURCE_DIR) + "/tests/fixtures/ref/" + name + "/hf";
}

using ds4test::TempDir;
inline std::vector<uint8_t> read_bytes(const std::string &path) { return ds4test::read_file_bytes(path); }
inline void write_bytes(const std::string &path, const std::vector<uint8_t> &b) { ds4test::write_file_bytes(path, b); }

inline nlohmann::json read_json(const std::string &path) {
    std::ifstream f(path);
    return nlohmann::json::parse(f);
}

inline void write_json(const std::string &path, const nlohmann::json &j) {
    std::ofstream f(path);
    f << j.dump(1);
}

// One tensor of a safetensors file, as plain data.
struct RawTensor {
    std::string dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
};
using RawFile = std::map<std::string, RawTensor>;   // sorted by name, like the real writer

inline RawFile read_safetensors(const std::string &path) {
    std::vector<uint8_t> b = read_bytes(path);
    uint64_t n;
    std::memcpy(&n, b.data(), 8);
    nlohmann::json h = nlohmann::json::parse(b.begin() + 8, b.begin() + 8 + static_cast<std::ptrdiff_t>(n));
    RawFile out;
    for (auto it = h.begin(); it != h.end(); ++it) {
        if (it.key() == "__metadata__") continue;
        RawTensor t;
        t.dtype = it.value()["dtype"];
        t.shape = it.value()["shape"].get<std::vector<int64_t>>();
        uint64_t s = it.value()["data_offsets"][0], e = it.value()["data_offsets"][1];
        t.bytes.assign(b.begin() + static_cast<std::ptrdiff_t>(8 + n + s), b.begin() + static_cast<std::ptrdiff_t>(8 + n + e));
        out[it.key()] = std::move(t);
    }
    return out;
}

inline void write_safetensors(const std::string &path, const RawFile &f) {
    nlohmann::json h = nlohmann::json::object();
    h["__metadata__"] = {{"format", "pt"}};
    uint64_t off = 0;
    for (const auto &[name, t] : f) {
        h[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
        off += t.bytes.size();
    }
    std::string hs = h.dump();
    while (hs.size() % 8) hs += ' ';
    std::vector<uint8_t> out(8);
    uint64_t n = hs.size();
    std::memcpy(out.data(), &n, 8);
    out.insert(out.end(), hs.begin(), hs.end());
    for (const auto &[name, t] : f) out.insert(out.end(), t.bytes.begin(), t.bytes.end());
    write_bytes(path, out);
}

// Copies a fixture's config.json into DIR and writes the given tensors as model.safetensors.
inline void write_model_dir(const std::string &dir, const std::string &fixture, const RawFile &f) {
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(fixture_dir(fixture) + "/config.json", dir + "/config.json",
                               std::filesystem::copy_options::overwrite_existing);
    write_safetensors(dir + "/model.safetensors", f);
}

inline float f32_at(const RawTensor &t, size_t i) {
    float v;
    std::memcpy(&v, t.bytes.data() + i * 4, 4);
    return v;
}

}  // namespace ds4::convert::test
