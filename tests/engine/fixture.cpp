#include "tests/engine/fixture.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "engine/model/model.h"
#include "engine/model/session.h"

namespace ds4test {

using namespace ds4;

std::vector<float> run_mode(const Model &m, const std::vector<int32_t> &toks, const std::string &mode, int cap) {
    Session s(m, (int)toks.size(), cap);
    std::vector<float> all, part;
    if (mode == "prefill") {
        s.sync(toks, {}, &all);
    } else if (mode == "decode") {
        s.sync(std::span<const int32_t>(toks).first(1));
        all = s.logits();
        for (size_t i = 1; i < toks.size(); ++i) {
            s.eval(toks[i]);
            all.insert(all.end(), s.logits().begin(), s.logits().end());
        }
    } else {
        const size_t n = std::stoul(mode);
        for (size_t end = std::min(n, toks.size());; end = std::min(end + n, toks.size())) {
            s.sync(std::span<const int32_t>(toks).first(end), {}, &part);
            all.insert(all.end(), part.begin(), part.end());
            if (end == toks.size()) break;
        }
    }
    return all;
}


static std::string read_all(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot read " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

RefFixture load_fixture(const std::string &name) {
    const std::string dir = std::string(DS4_SOURCE_DIR) + "/tests/fixtures/ref/" + name;
    RefFixture fx;
    fx.name = name;
    auto toks = nlohmann::json::parse(read_all(dir + "/tokens.json"));
    for (auto &t : toks) fx.tokens.push_back(t.get<int32_t>());
    auto meta = nlohmann::json::parse(read_all(dir + "/meta.json"));
    fx.vocab = meta["vocab"].get<int>();
    std::string raw = read_all(dir + "/logits.f32");
    fx.logits.resize(raw.size() / 4);
    std::memcpy(fx.logits.data(), raw.data(), raw.size());
    if (fx.logits.size() != fx.tokens.size() * fx.vocab) throw std::runtime_error("fixture " + name + ": logits size mismatch");
    return fx;
}

std::string converted_gguf(const std::string &name, const std::string &type) {
    static std::map<std::string, std::string> cache;
    const std::string key = name + "/" + type;
    if (cache.count(key)) return cache[key];
    char tmpl[] = "/tmp/ds4-engine-test-XXXXXX";
    if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    const std::string out = std::string(tmpl) + "/" + name + "." + type + ".gguf";
    const std::string cmd = std::string(DS4_CONVERT_BIN) + " " + DS4_SOURCE_DIR + "/tests/fixtures/ref/" + name + "/hf " + out +
                            " --type " + type + " --quiet 2>/dev/null";
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("conversion failed: " + cmd);
    return cache[key] = out;
}

double rel_error(const std::vector<float> &ref, const std::vector<float> &got, int vocab, size_t row0) {
    float mx = 0;
    for (float v : ref) mx = std::max(mx, std::fabs(v));
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, (double)std::fabs(got[i] - ref[row0 * vocab + i]));
    return worst / mx;
}

double argmax_agreement(const std::vector<float> &ref, const std::vector<float> &got, int vocab) {
    const size_t n = got.size() / vocab;
    size_t agree = 0;
    for (size_t t = 0; t < n; ++t) {
        auto a = std::max_element(ref.begin() + t * vocab, ref.begin() + (t + 1) * vocab) - (ref.begin() + t * vocab);
        auto b = std::max_element(got.begin() + t * vocab, got.begin() + (t + 1) * vocab) - (got.begin() + t * vocab);
        agree += a == b;
    }
    return (double)agree / n;
}

}  // namespace ds4test
