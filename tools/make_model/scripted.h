// The "scripted" preset: a real DeepSeek-V4 model (one sliding-window layer, run by the
// real engine) whose weights make greedy decoding follow a fixed script, for end-to-end
// tests whose output must be known (the HTTP front's tool-call round trip).
//
// How: the layer's FFN and attention queries are zero, so the residual stream is the
// token's embedding plus one attention signal. Every query scores every key 0, so the
// attention averages the window's values with weight ~e^-sink each; the only non-zero
// value belongs to the marker token <tool_result>, so the signal counts tool results in
// the window. The output head maps each script token's own embedding direction to its
// successor; after "</think>" two rows tie but for that signal: without a tool result the
// model writes a DSML call, get_weather(city="Paris", days=3); with one it answers
// "It is sunny in Paris.". Script pieces are user-defined tokens of the vocabulary (on top
// of the byte-level fallback), so each has one successor.
#pragma once
#include <string>
#include <vector>

#include "engine/model/config.h"
#include "engine/tokenizer/vocab.h"
#include "tools/convert/layout.h"

namespace ds4::make_model {

// The texts the scripted model produces after a chat generation prompt (ending in
// "</think>"): without and with a <tool_result> in its window, and after a plain ">".
extern const char *const kScriptToolCall;
extern const char *const kScriptAnswer;

ModelConfig scripted_config();
tok::Vocab scripted_vocab(int n_vocab);
// All elements of SPEC (f32, GGML order).
std::vector<float> scripted_values(const convert::TensorSpec &spec, const ModelConfig &c);

}  // namespace ds4::make_model
