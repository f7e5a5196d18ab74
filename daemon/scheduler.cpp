#include "daemon/scheduler.h"

#include <algorithm>

namespace ds4::daemon {

std::vector<PlannedSegment> plan_step(const std::vector<StepCandidate> &cands, const StepLimits &lim) {
    std::vector<PlannedSegment> out;
    const uint32_t max_batch = std::max<uint32_t>(1, lim.max_batch);
    std::vector<size_t> prefills;
    for (size_t i = 0; i < cands.size(); ++i)
        if (!cands[i].decoding && cands[i].prefill_left > 0 && cands[i].cap > 0) prefills.push_back(i);
    std::stable_sort(prefills.begin(), prefills.end(),
                     [&](size_t a, size_t b) { return cands[a].arrival < cands[b].arrival; });

    const bool decoders = std::any_of(cands.begin(), cands.end(), [](const StepCandidate &c) { return c.decoding; });
    // A prompt's chunk: prefill_chunk while others decode (they wait on the step), else the
    // solo chunk, by default the session's cap.
    auto chunk = [&](const StepCandidate &c) {
        const uint32_t lim_chunk = decoders ? std::max<uint32_t>(1, lim.prefill_chunk) : lim.solo_prefill_chunk;
        return std::min({c.prefill_left, c.cap, lim_chunk ? lim_chunk : c.cap});
    };
    uint32_t budget = std::max<uint32_t>(1, lim.step_tokens);
    if (!decoders && !prefills.empty()) budget = std::max(budget, chunk(cands[prefills[0]]));
    if (max_batch == 1) {
        // No batching: the old time slicing, one request per step in round-robin order.
        for (size_t i = 0; i < cands.size(); ++i) {
            const StepCandidate &c = cands[i];
            if (c.decoding) return {{i, std::max<uint32_t>(1, std::min(c.decode_rows, budget))}};
            if (c.prefill_left > 0 && c.cap > 0) return {{i, decoders ? std::min(chunk(c), budget) : chunk(c)}};
        }
        return out;
    }
    // Decode rows, leaving one segment and at least one budget row for a waiting prompt.
    const bool reserve = !prefills.empty();
    const uint32_t decode_slots = max_batch - (reserve ? 1 : 0);
    uint32_t decode_budget = reserve ? (budget > 1 ? budget - 1 : 0) : budget;
    for (size_t i = 0; i < cands.size() && out.size() < decode_slots && decode_budget > 0; ++i) {
        if (!cands[i].decoding) continue;
        out.push_back({i, 1});
        --decode_budget;
        --budget;
    }
    for (PlannedSegment &sg : out) {
        const uint32_t want = cands[sg.candidate].decode_rows > 1 ? cands[sg.candidate].decode_rows - 1 : 0;
        const uint32_t extra = std::min(want, decode_budget);
        sg.rows += extra;
        decode_budget -= extra;
        budget -= extra;
    }
    for (size_t i : prefills) {
        if (out.size() >= max_batch || budget == 0) break;
        const uint32_t n = std::min(chunk(cands[i]), budget);
        out.push_back({i, n});
        budget -= n;
    }
    return out;
}

}  // namespace ds4::daemon
