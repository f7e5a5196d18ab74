// ds4-tokenize: encodes text with a model's tokenizer (or decodes ids).
//
//   ds4-tokenize -m MODEL.gguf [--special] (--text STR | --file PATH) [--decode]
//   ds4-tokenize --hf-json tokenizer.json ...      (an HF tokenizer.json instead of a GGUF)
//
// Encoding prints the ids of the whole input space-separated on one line. --special
// matches special tokens (rendered chat text); without it they are ordinary text.
// --decode reads whitespace-separated ids and writes the decoded bytes exactly, with no
// newline added.
#include <cstdio>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "engine/common/error.h"
#include "engine/gguf/gguf.h"
#include "engine/tokenizer/tokenizer.h"
#include "ds4_version.h"

namespace {

const char *kUsage =
    "usage: ds4-tokenize (-m MODEL.gguf | --hf-json TOKENIZER.json) [--special] (--text STR | --file PATH) [--decode]\n";

std::string read_file(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) ds4::fail("cannot open " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    if (f.bad()) ds4::fail("cannot read " + path);
    return ss.str();
}

std::vector<int32_t> parse_ids(const std::string &s) {
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i < s.size()) {
        while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
        if (i == s.size()) break;
        size_t j = i;
        while (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j]))) ++j;
        std::string tok = s.substr(i, j - i);
        char *end = nullptr;
        errno = 0;
        long long v = std::strtoll(tok.c_str(), &end, 10);
        if (*end != '\0' || errno != 0 || v < 0 || v > 0x7FFFFFFF) ds4::fail("not a token id: '" + tok + "'");
        ids.push_back(static_cast<int32_t>(v));
        i = j;
    }
    return ids;
}

}  // namespace

int main(int argc, char **argv) {
    if (ds4_wants_version(argc, argv)) {
        ds4_print_version("ds4-tokenize");
        return 0;
    }
    std::string model, hf_json, text, file;
    bool have_text = false, have_file = false, special = false, decode = false;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto value = [&](const char *name) -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "ds4-tokenize: %s needs a value\n%s", name, kUsage);
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "-m" || a == "--model") model = value("-m");
        else if (a == "--hf-json") hf_json = value("--hf-json");
        else if (a == "--text") text = value("--text"), have_text = true;
        else if (a == "--file") file = value("--file"), have_file = true;
        else if (a == "--special") special = true;
        else if (a == "--decode") decode = true;
        else if (a == "-h" || a == "--help") {
            std::fputs(kUsage, stdout);
            return 0;
        } else {
            std::fprintf(stderr, "ds4-tokenize: unknown argument '%s'\n%s", a.c_str(), kUsage);
            return 2;
        }
    }
    if (model.empty() && hf_json.empty() && std::getenv("DS4_MODEL")) model = std::getenv("DS4_MODEL");  // --model default
    if (model.empty() == hf_json.empty() || have_text == have_file) {
        std::fputs(kUsage, stderr);
        return 2;
    }
    try {
        ds4::tok::Tokenizer tok = [&] {
            if (!hf_json.empty()) return ds4::tok::Tokenizer::from_hf_json(hf_json);
            auto reader = ds4::gguf::Reader::open(model, /*map=*/false);
            return ds4::tok::Tokenizer::from_gguf(*reader);
        }();
        std::string input = have_file ? read_file(file) : text;
        if (decode) {
            std::string out = tok.decode(parse_ids(input));
            std::fwrite(out.data(), 1, out.size(), stdout);
        } else {
            std::vector<int32_t> ids = special ? tok.encode_special(input) : tok.encode(input);
            std::string line;
            line.reserve(ids.size() * 6);
            for (size_t k = 0; k < ids.size(); ++k) {
                if (k) line += ' ';
                line += std::to_string(ids[k]);
            }
            line += '\n';
            std::fwrite(line.data(), 1, line.size(), stdout);
        }
        if (std::fflush(stdout) != 0) ds4::fail("cannot write the output");
    } catch (const std::exception &e) {
        std::fprintf(stderr, "ds4-tokenize: %s\n", e.what());
        return 1;
    }
    return 0;
}
