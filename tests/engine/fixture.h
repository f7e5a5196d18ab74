// Loads a committed HF reference fixture (tests/fixtures/ref/NAME) and converts it to GGUF
// with the real ds4-convert, so engine tests check the whole path the user takes.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ds4 {
class Model;
}

namespace ds4test {

struct RefFixture {
    std::string name;
    std::vector<int32_t> tokens;
    std::vector<float> logits;   // n_tokens x vocab
    int vocab = 0;
};

RefFixture load_fixture(const std::string &name);
// Converts the fixture's hf/ dir with `ds4-convert --type TYPE` into a temp file (cached
// per process) and returns its path.
std::string converted_gguf(const std::string &name, const std::string &type);

// max_t max_v |a - b| / max |ref| over the rows [row0, row0 + n).
double rel_error(const std::vector<float> &ref, const std::vector<float> &got, int vocab, size_t row0 = 0);
// Logits of every position of toks on m, the way a mode feeds them: "prefill" (one sync),
// "decode" (one token at a time) or "N" (syncs of growing prefixes, N more each time).
// cap: the session's prefill cap (0 = default).
std::vector<float> run_mode(const ds4::Model &m, const std::vector<int32_t> &toks, const std::string &mode, int cap = 0);

double argmax_agreement(const std::vector<float> &ref, const std::vector<float> &got, int vocab);

}  // namespace ds4test
