#include "tools/convert/vocab.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "engine/common/error.h"

namespace ds4::convert {

void write_vocabulary(gguf::Writer &w, const std::string &hf_dir, int n_vocab, int bos, int eos,
                      std::vector<std::string> *warnings) {
    std::string tok_path;
    if (!hf_dir.empty()) {
        tok_path = hf_dir + (hf_dir.back() == '/' ? "" : "/") + "tokenizer.json";
        struct stat st;
        if (::stat(tok_path.c_str(), &st) != 0) tok_path.clear();
    }
    // TOKENIZER CALL SITE: engine/tokenizer is to provide
    //   write_tokenizer_from_hf_json(gguf::Writer&, const std::string &tokenizer_json, int n_vocab)
    //   write_fallback_vocab(gguf::Writer&, int n_vocab)
    // Until it does, no tokenizer.ggml.* keys are written.
    if (warnings)
        warnings->push_back(tok_path.empty() ? "no tokenizer written: the fallback vocabulary writer is not available yet"
                                             : "tokenizer.json not imported: the tokenizer writer is not available yet");
    (void)n_vocab;
    // config.json's ids are the model's; they take precedence over whatever the tokenizer guessed.
    if (bos >= 0) w.set("tokenizer.ggml.bos_token_id", gguf::Value::u32(static_cast<uint32_t>(bos)));
    if (eos >= 0) w.set("tokenizer.ggml.eos_token_id", gguf::Value::u32(static_cast<uint32_t>(eos)));
}

}  // namespace ds4::convert
