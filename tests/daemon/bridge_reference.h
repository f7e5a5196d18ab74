// What the daemon tests compare ds4d's streams with: the same prompt decoded alone through
// the in-process bridge, and the Python-looking prompts they send.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "bridge/ds4.hpp"

namespace e2e {

// Prompt text i: Python-looking, different for every i (and of different lengths).
inline std::string python_like_prompt(int i) {
    static const char *heads[] = {"def ", "class ", "import ", "    return ", "for ", "if ", "with open(", "# "};
    static const char *names[] = {"parse", "value", "items", "self", "path", "data", "result", "config"};
    std::string s = std::string(heads[i % 8]) + names[(i / 8) % 8] + "_" + std::to_string(i);
    for (int k = 0; k < i % 5; ++k) s += std::string(" = ") + names[(i + k) % 8] + "(" + std::to_string(k) + ")\n";
    return s;
}

// The tokens alone in a fresh session of `model` (no drafter), greedy, through a stop token
// or max_tokens.
inline std::vector<int32_t> greedy_alone(ds4::bridge::Model &model, int ctx, const std::vector<int32_t> &p,
                                         uint32_t max_tokens) {
    ds4::bridge::Session s(model, ctx);
    s.sync(p);
    std::vector<int32_t> out;
    for (;;) {
        const int32_t t = s.argmax();
        if (model.is_stop(t) || out.size() >= max_tokens) break;
        out.push_back(t);
        if (out.size() >= max_tokens) break;
        s.eval(t);
    }
    return out;
}

}  // namespace e2e
