// Shared helpers for the tokenizer tests: fixture paths, JSON loading, scratch dirs,
// GGUF round trips of a vocabulary.
#pragma once
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "engine/gguf/gguf.h"
#include "engine/tokenizer/tokenizer.h"

namespace ds4::tok::test {

inline std::string fixture(const std::string &rel) { return std::string(DS4_TOK_FIXTURES) + "/" + rel; }

inline std::string read_text(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot open " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

inline nlohmann::json load_json(const std::string &path) { return nlohmann::json::parse(read_text(path)); }

class TempDir {
public:
    TempDir() {
        char tmpl[] = "/tmp/ds4_tok_test_XXXXXX";
        char *p = mkdtemp(tmpl);
        if (!p) std::abort();
        path_ = p;
    }
    ~TempDir() { std::filesystem::remove_all(path_); }
    std::string file(const std::string &name) const { return path_ + "/" + name; }

private:
    std::string path_;
};

// Writes the tokenizer of an HF tokenizer.json into a GGUF the way the converter does and
// loads it back through the GGUF reader.
inline Tokenizer via_gguf(const std::string &tokenizer_json, int n_vocab, const TempDir &dir) {
    gguf::Writer w;
    w.set("general.architecture", gguf::Value::str("deepseek4"));
    write_tokenizer_from_hf_json(w, tokenizer_json, n_vocab);
    std::string path = dir.file("tok.gguf");
    w.write(path);
    auto r = gguf::Reader::open(path, false);
    return Tokenizer::from_gguf(*r);
}

inline std::vector<int32_t> ids_of(const nlohmann::json &j) { return j.get<std::vector<int32_t>>(); }

}  // namespace ds4::tok::test
