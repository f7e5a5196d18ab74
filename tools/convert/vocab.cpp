#include "tools/convert/vocab.h"

#include <sys/stat.h>

#include "engine/common/error.h"
#include "engine/tokenizer/vocab.h"

namespace ds4::convert {

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
    tok::write_vocab(w, v);
}

}  // namespace ds4::convert
