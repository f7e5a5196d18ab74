// The DeepSeek-V4 layer schedule: what the model computes, in order, for one batch-first
// step, written once above the backends (backend.h). Shapes come from ModelConfig.
#pragma once
#include <span>

#include "engine/backend/backend.h"

namespace ds4 {

class Model;

// Runs the step laid out by `lay` on `ex`; writes the logits of the listed rows (in that
// order, n_vocab each) to `logits`. Throws ds4::Error; the states the layout names are
// then in an unknown state.
void run_step(const Model &m, Executor &ex, const StepLayout &lay, std::span<const int> logit_rows, float *logits);

}  // namespace ds4
