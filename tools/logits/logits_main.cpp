// ds4-logits: writes the logits after every token of a sequence, for parity checks
// against the reference. Output: n_tokens x n_vocab little-endian float32, row i = the
// logits after token i.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/common/error.h"
#include "engine/model/model.h"
#include "engine/model/session.h"
#include "tools/backend_option.h"
#include "ds4_version.h"

namespace {

const char *kUsage =
    "usage: ds4-logits -m MODEL.gguf --tokens 1,2,3,... [--mode prefill|decode|chunk:N]\n"
    "                  [--threads N] [--ctx N] [--backend auto|cpu|cuda] --out FILE\n"
    "  prefill   one sync of all tokens (internally chunked by the prefill cap)\n"
    "  decode    sync of the first token, then one eval per token\n"
    "  chunk:N   sync in growing prefixes of N tokens\n"
    "%s"
    "Writes n_tokens x n_vocab float32 (little-endian); row i = logits after token i.\n";

std::vector<int32_t> parse_tokens(const std::string &s) {
    std::vector<int32_t> out;
    size_t i = 0;
    while (i < s.size()) {
        char *end = nullptr;
        errno = 0;
        long v = std::strtol(s.c_str() + i, &end, 10);
        if (end == s.c_str() + i || errno || v < INT32_MIN || v > INT32_MAX)
            throw ds4::Error("--tokens: bad number at offset " + std::to_string(i));
        out.push_back((int32_t)v);
        i = end - s.c_str();
        if (i < s.size()) {
            if (s[i] != ',') throw ds4::Error("--tokens: expected ',' at offset " + std::to_string(i));
            ++i;
        }
    }
    return out;
}

}  // namespace

int main(int argc, char **argv) {
    if (ds4_wants_version(argc, argv)) {
        ds4_print_version("ds4-logits");
        return 0;
    }
    std::string model, tokens_arg, mode = "prefill", out;
    int threads = 0, ctx = 0;
    ds4::BackendKind backend = ds4::BackendKind::Auto;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "ds4-logits: %s needs a value\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "-m" || a == "--model") model = val();
        else if (a == "--tokens") tokens_arg = val();
        else if (a == "--mode") mode = val();
        else if (a == "--threads") threads = std::atoi(val().c_str());
        else if (a == "--backend") backend = ds4::tools::backend_arg("ds4-logits", val());
        else if (a == "--ctx") ctx = std::atoi(val().c_str());
        else if (a == "--out" || a == "-o") out = val();
        else if (a == "-h" || a == "--help") {
            std::printf(kUsage, ds4::tools::kBackendHelp);
            return 0;
        } else {
            std::fprintf(stderr, "ds4-logits: unknown argument %s\n", a.c_str());
            return 2;
        }
    }
    if (model.empty() && std::getenv("DS4_MODEL")) model = std::getenv("DS4_MODEL");  // --model default
    if (model.empty() || tokens_arg.empty() || out.empty()) {
        std::fprintf(stderr, kUsage, ds4::tools::kBackendHelp);
        return 2;
    }
    try {
        std::vector<int32_t> toks = parse_tokens(tokens_arg);
        if (toks.empty()) throw ds4::Error("--tokens: no tokens");
        auto m = ds4::Model::open(model, ds4::tools::model_options(threads, backend));
        ds4::tools::say_backend("ds4-logits", *m);
        ds4::Session s(*m, ctx > 0 ? ctx : (int)toks.size());
        const size_t V = m->config().n_vocab;
        std::vector<float> all;
        if (mode == "prefill") {
            s.sync(toks, {}, &all);
        } else if (mode == "decode") {
            s.sync(std::span<const int32_t>(toks).first(1));
            all = s.logits();
            for (size_t i = 1; i < toks.size(); ++i) {
                s.eval(toks[i]);
                all.insert(all.end(), s.logits().begin(), s.logits().end());
            }
        } else if (mode.rfind("chunk:", 0) == 0) {
            const int n = std::atoi(mode.c_str() + 6);
            if (n <= 0) throw ds4::Error("--mode chunk:N needs N > 0");
            std::vector<float> part;
            for (size_t end = std::min<size_t>(n, toks.size());; end = std::min(end + n, toks.size())) {
                s.sync(std::span<const int32_t>(toks).first(end), {}, &part);
                all.insert(all.end(), part.begin(), part.end());
                if (end == toks.size()) break;
            }
        } else {
            throw ds4::Error("unknown --mode " + mode);
        }
        if (all.size() != toks.size() * V) throw ds4::Error("internal: wrong number of logit rows");
        FILE *f = std::fopen(out.c_str(), "wb");
        if (!f) throw ds4::Error("cannot open " + out + ": " + std::strerror(errno));
        bool ok = std::fwrite(all.data(), sizeof(float), all.size(), f) == all.size();
        ok = (std::fclose(f) == 0) && ok;
        if (!ok) throw ds4::Error("writing " + out + " failed: " + std::strerror(errno));
    } catch (const std::exception &e) {
        std::fprintf(stderr, "ds4-logits: %s\n", e.what());
        return 1;
    }
    return 0;
}
