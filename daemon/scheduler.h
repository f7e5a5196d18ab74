// Forms one forward step from the requests that are ready (continuous batching). Pure: it
// sees only what each request needs next, so its fairness rules are tested on their own.
//
// Rules, in order:
//  - Every generating request contributes one decode row per step while at most
//    max_batch requests run. Beyond that they rotate: candidates come in round-robin order
//    (the worker moves those that ran to the back), so each waits a bounded number of steps.
//  - While prompts wait to be prefilled, decode rows leave room for one prefill segment,
//    so a long prompt always advances and new requests get a first token however many
//    others decode.
//  - Prefills are served oldest first, each a chunk of at most prefill_chunk tokens (and
//    the session's cap), from what the token budget leaves after the decode rows: the
//    oldest prompt finishes soonest instead of every prompt crawling.
//  - When no request decodes, nobody waits on a prompt's step: chunks are solo_prefill_chunk
//    (0: the session's cap, the engine's own step size, which reads each weight once for
//    more tokens), and the step's budget grows to the oldest prompt's chunk if it is larger.
//  - A decoder that speculates (decode_rows > 1: pending plus drafts) gets its extra rows
//    after every chosen decoder has its one row, in candidate order, from the decode budget;
//    one that gets none decodes plainly.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ds4::daemon {

struct StepLimits {
    uint32_t max_batch = 16;      // requests (sessions) per step
    uint32_t step_tokens = 512;   // rows per step: decode tokens + prefill tokens
    uint32_t prefill_chunk = 256; // prefill tokens of one request per step while others decode
    uint32_t solo_prefill_chunk = 0; // ... and when none decodes (0: the session's cap)
};

struct StepCandidate {
    bool decoding = false;       // else prefilling
    uint32_t prefill_left = 0;   // tokens still to prefill (prefilling only)
    uint32_t cap = 0;            // the session's rows-per-step limit (prefill cap)
    uint64_t arrival = 0;        // request order, for oldest-first prefill
    uint32_t decode_rows = 1;    // rows a decode step of it would use (speculation: 1 + drafts)
};

struct PlannedSegment {
    size_t candidate;  // index into the candidates given
    uint32_t rows;     // decode: 1, or up to decode_rows when speculating; prefill: the chunk
};

// Candidates in round-robin order. Returns the segments of one step (decode rows first, in
// candidate order, then prefill chunks oldest first); empty when there is nothing to run.
std::vector<PlannedSegment> plan_step(const std::vector<StepCandidate> &candidates, const StepLimits &limits);

}  // namespace ds4::daemon
