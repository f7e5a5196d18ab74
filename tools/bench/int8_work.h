// What a prefill's int8 products ask of the machine and what it can give, for the share of
// the int8 multiply-add peak that ds4-bench (and ds4-bench-quant) report.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/gguf/gguf.h"
#include "engine/model/config.h"

namespace ds4::bench {

// Multiply-adds a prefilled token costs in the layers' Q8_0 weight products: every Q8_0
// matrix of a block once, the routed experts n_expert_used times one expert's, the router
// only on score-routed layers (hash layers route by table). The token embedding (a lookup)
// and the output head (run for the last token only) are left out.
double q8_0_macs_per_token(const std::vector<gguf::TensorInfo> &tensors, const ModelConfig &c);

// The int8 instruction the Q8_0 tile runs (quant::q8_0_tile_isa), in words.
const char *int8_peak_instruction();

// Multiply-adds per second of that instruction on `threads` threads at once (each a chain of
// independent accumulators, so the issue rate, not the latency), best of `reps`, wall time.
double int8_peak(int threads, int reps = 3);

// The same on the calling thread, timed by its own CPU clock (a shared machine's other
// processes then do not count against it).
double int8_peak_thread_cpu(int reps = 3);

}  // namespace ds4::bench
