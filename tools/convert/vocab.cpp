#include "tools/convert/vocab.h"

#include <sys/stat.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/common/error.h"
#include "engine/tokenizer/vocab.h"

namespace ds4::convert {
namespace {

bool read_file(const std::string &path, std::string *out) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return false;
    std::ostringstream ss;
    ss << f.rdbuf();
    *out = ss.str();
    return true;
}

// transformers keeps a model's template in chat_template.jinja (newer) or as tokenizer_config.json's
// "chat_template": a string, or a list of {name, template} (the "default" one, else the first).
std::string read_chat_template(const std::string &dir, std::vector<std::string> *warnings) {
    std::string s;
    if (read_file(dir + "chat_template.jinja", &s) && !s.empty()) return s;
    if (!read_file(dir + "tokenizer_config.json", &s)) return {};
    try {
        const nlohmann::json cfg = nlohmann::json::parse(s);
        const auto it = cfg.find("chat_template");
        if (it == cfg.end()) return {};
        if (it->is_string()) return it->get<std::string>();
        if (it->is_array()) {
            std::string first;
            for (const auto &e : *it) {
                if (!e.is_object() || !e.contains("template") || !e["template"].is_string()) continue;
                if (e.value("name", "") == "default") return e["template"].get<std::string>();
                if (first.empty()) first = e["template"].get<std::string>();
            }
            return first;
        }
    } catch (const std::exception &e) {
        if (warnings) warnings->push_back(dir + "tokenizer_config.json: not read (" + e.what() + "); no chat template written");
    }
    return {};
}

}  // namespace

void write_vocabulary(gguf::Writer &w, const std::string &hf_dir, int n_vocab, int bos, int eos,
                      std::vector<std::string> *warnings) {
    std::string tok_path;
    if (!hf_dir.empty()) {
        tok_path = hf_dir + (hf_dir.back() == '/' ? "" : "/") + "tokenizer.json";
        struct stat st;
        if (::stat(tok_path.c_str(), &st) != 0) tok_path.clear();
    }
    tok::Vocab v;
    if (!tok_path.empty()) {
        v = tok::read_vocab_hf_json(tok_path, n_vocab);
    } else if (n_vocab >= 259) {
        v = tok::fallback_vocab(n_vocab);
    } else {
        // Too small for the 256 byte tokens: the model still runs on token ids.
        if (warnings)
            warnings->push_back("vocab_size " + std::to_string(n_vocab) +
                                " is too small for the byte-level fallback vocabulary (259+); no tokenizer written");
        return;
    }
    // config.json's ids are the model's; say so when the tokenizer files disagree.
    auto reconcile = [&](int cfg_id, int32_t &tok_id, const char *what) {
        if (cfg_id < 0) return;
        if (tok_id >= 0 && tok_id != cfg_id && warnings)
            warnings->push_back(std::string(what) + " token: config.json says " + std::to_string(cfg_id) +
                                ", the tokenizer " + std::to_string(tok_id) + "; using config.json's");
        tok_id = cfg_id;
    };
    reconcile(bos, v.bos, "BOS");
    reconcile(eos, v.eos, "EOS");
    if (!hf_dir.empty()) v.chat_template = read_chat_template(hf_dir + (hf_dir.back() == '/' ? "" : "/"), warnings);
    tok::write_vocab(w, v);
}

}  // namespace ds4::convert
