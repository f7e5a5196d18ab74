// Development helper for tools/reference/tokenizer/diff_fuzz.py: encodes every text of a
// JSON array on both paths and prints [{"plain": [...], "special": [...]}, ...].
//   tokenizer_batch TOKENIZER_JSON TEXTS_JSON
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/tokenizer/tokenizer.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        std::cerr << "usage: tokenizer_batch TOKENIZER_JSON TEXTS_JSON\n";
        return 2;
    }
    try {
        auto tok = ds4::tok::Tokenizer::from_hf_json(argv[1]);
        std::ifstream f(argv[2], std::ios::binary);
        std::stringstream ss;
        ss << f.rdbuf();
        nlohmann::json texts = nlohmann::json::parse(ss.str()), out = nlohmann::json::array();
        for (const auto &t : texts) {
            std::string s = t.get<std::string>();
            out.push_back({{"plain", tok.encode(s)}, {"special", tok.encode_special(s)}});
        }
        std::cout << out.dump();
    } catch (const std::exception &e) {
        std::cerr << "tokenizer_batch: " << e.what() << "\n";
        return 1;
    }
    return 0;
}
