// ds4-tokenize-bench: encode throughput on one core.
//
//   ds4-tokenize-bench (-m MODEL.gguf | --hf-json TOKENIZER.json) --file TEXT [--mb N] [--special]
//
// The text is repeated or cut to N MB (default 1). Reports thread CPU time of the first
// encode (fresh process: tables, scratch buffers and pages are touched for the first
// time) and the best of 3 repeats, plus decode.
#include <algorithm>
#include <ctime>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "engine/common/error.h"
#include "engine/gguf/gguf.h"
#include "engine/tokenizer/tokenizer.h"
#include "ds4_version.h"

namespace {

// CPU time of this thread: what one core spends, whatever else runs on the machine.
double cpu_now() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

}  // namespace

int main(int argc, char **argv) {
    if (ds4_wants_version(argc, argv)) {
        ds4_print_version("ds4-tokenize-bench");
        return 0;
    }
    std::string model, hf_json, file;
    double mb = 1.0;
    bool special = false;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if ((a == "-m" || a == "--hf-json" || a == "--file" || a == "--mb") && i + 1 < argc) {
            std::string v = argv[++i];
            if (a == "-m") model = v;
            else if (a == "--hf-json") hf_json = v;
            else if (a == "--file") file = v;
            else mb = std::stod(v);
        } else if (a == "--special") {
            special = true;
        } else if (a == "-h" || a == "--help") {
            std::printf("usage: ds4-tokenize-bench (-m MODEL.gguf | --hf-json TOKENIZER.json) --file TEXT [--mb N] "
                        "[--special]\n");
            return 0;
        } else {
            std::fprintf(stderr, "usage: ds4-tokenize-bench (-m MODEL.gguf | --hf-json TOKENIZER.json) --file TEXT "
                                 "[--mb N] [--special]\n");
            return 2;
        }
    }
    if (model.empty() == hf_json.empty() || file.empty() || mb <= 0) {
        std::fprintf(stderr, "ds4-tokenize-bench: need one tokenizer, --file, and a positive --mb\n");
        return 2;
    }
    try {
        auto load = [&] {
            if (!hf_json.empty()) return ds4::tok::Tokenizer::from_hf_json(hf_json);
            auto r = ds4::gguf::Reader::open(model, false);
            return ds4::tok::Tokenizer::from_gguf(*r);
        };
        std::ifstream f(file, std::ios::binary);
        if (!f) ds4::fail("cannot open " + file);
        std::stringstream ss;
        ss << f.rdbuf();
        std::string seed = ss.str();
        if (seed.empty()) ds4::fail(file + " is empty");
        const size_t want = static_cast<size_t>(mb * 1024 * 1024);
        std::string text;
        while (text.size() < want) text += seed;
        text.resize(want);

        double t0 = cpu_now();
        ds4::tok::Tokenizer tok = load();
        double t_load = (cpu_now() - t0);
        auto enc = [&] { return special ? tok.encode_special(text) : tok.encode(text); };
        t0 = cpu_now();
        std::vector<int32_t> ids = enc();
        double t_cold = (cpu_now() - t0);
        double t_warm = 1e9;
        for (int k = 0; k < 3; ++k) {
            t0 = cpu_now();
            auto again = enc();
            t_warm = std::min(t_warm, (cpu_now() - t0));
            if (again != ids) ds4::fail("encoding is not deterministic");
        }
        t0 = cpu_now();
        std::string back = tok.decode(ids);
        double t_dec = (cpu_now() - t0);
        if (back != text) ds4::fail("decode(encode(text)) differs from the text");
        const double size_mb = text.size() / (1024.0 * 1024.0);
        std::printf("text %.2f MB (%s), %zu tokens (%.2f bytes/token), tokenizer load %.1f ms\n", size_mb, file.c_str(),
                    ids.size(), double(text.size()) / ids.size(), t_load * 1e3);
        std::printf("cpu time: encode first %.1f ms (%.1f MB/s), repeated %.1f ms (%.1f MB/s), decode %.1f ms\n", t_cold * 1e3,
                    size_mb / t_cold, t_warm * 1e3, size_mb / t_warm, t_dec * 1e3);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "ds4-tokenize-bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
