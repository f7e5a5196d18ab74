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

// Multiply-adds per second of that instruction on the calling thread (a chain of
// independent accumulators, so the issue rate, not the latency), best of `reps` runs of
// ~10-30 ms: by wall time, or by the thread's own CPU clock (time slices lost to other
// processes then do not count against it).
enum class PeakClock { Wall, ThreadCpu };
double int8_peak(int reps, PeakClock clock);

}  // namespace ds4::bench
