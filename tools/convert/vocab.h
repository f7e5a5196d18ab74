// The tokenizer.ggml.* part of a converted or generated GGUF: the model's own BPE
// vocabulary when tokenizer.json is there, else a byte-level fallback of n_vocab tokens,
// plus the BOS/EOS ids config.json names and the chat template (chat_template.jinja, else
// tokenizer_config.json's chat_template) when the model has one: its presence is what tells
// ds4 a chat model from a plain completion model (ds4 run's default). The tokenizer code itself is engine/tokenizer's.
#pragma once
#include <string>
#include <vector>

#include "engine/gguf/gguf.h"

namespace ds4::convert {

// hf_dir may be empty (generated models: fallback vocabulary). bos/eos < 0: not given.
void write_vocabulary(gguf::Writer &w, const std::string &hf_dir, int n_vocab, int bos, int eos,
                      std::vector<std::string> *warnings);

}  // namespace ds4::convert
