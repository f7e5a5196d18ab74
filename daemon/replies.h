// Response frames, built as complete byte vectors ready to write.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/bridge_host.h"
#include "daemon/drafter_export.h"
#include "daemon/sampling.h"
#include "ipc/protocol.h"

namespace ds4::daemon {

using Frame = std::vector<uint8_t>;

struct DoneFields {
    ipc::fb::FinishReason reason = ipc::fb::FinishReason::Stop;
    uint32_t prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
    uint64_t prefill_us = 0, decode_us = 0;
    int32_t stop_token = -1;
};

struct StatsFields {
    double uptime_s = 0;
    uint32_t sessions = 0, connections = 0, active_requests = 0, queued_requests = 0;
    uint64_t requests_total = 0, tokens_in = 0, tokens_cached = 0, tokens_out = 0;
    double prefill_tok_s = 0, decode_tok_s = 0;
    MemorySnapshot memory;
    uint64_t saves_failed = 0;
    uint64_t steps = 0, step_rows = 0, step_requests = 0;
    double step_seconds = 0;
    uint32_t max_batch = 0, step_tokens = 0;
    uint64_t kv_budget = 0, kv_in_use = 0, kv_refused = 0;
    uint32_t kv_waiting = 0, slot_waiting = 0;
    struct Stream {
        uint64_t request_id = 0;
        std::string session;
        bool prefilling = false;
        uint32_t prompt_tokens = 0, prefilled = 0, generated = 0;
        double tok_s = 0;
        uint64_t drafted = 0, accepted = 0;
    };
    std::vector<Stream> streams;
    // Speculative decoding (ds4.fbs StatsResult says what each is).
    uint32_t draft_max = 0;
    uint64_t spec_trials = 0, spec_drafted = 0, spec_accepted = 0, spec_fallbacks = 0, spec_tokens = 0;
    uint64_t spec_solo_tokens = 0;
    double spec_solo_seconds = 0;
    uint64_t solo_steps = 0;
    double solo_seconds = 0;
    DrafterSharing drafter;           // offered = false: none
    bool streaming = false;           // SSD expert streaming: the counters below
    ds4_bridge_expert_stats_t experts{};
};

struct SessionListEntry {
    std::string name;
    uint32_t n_tokens = 0;
    uint64_t bytes = 0;
    uint64_t created_unix = 0, last_used_unix = 0;
    bool pinned = false, live = false;
    uint32_t stored_tokens = 0;  // 0 when not stored
    std::string save_error;      // the latest save of this name failed: why
};

struct EvictedEntry {
    std::string name;
    uint64_t evicted_unix = 0;
    std::string reason;
};

Frame error_frame(uint64_t rid, ipc::fb::ErrorCode code, std::string_view message);
Frame hello_ok_frame(uint64_t rid, const ModelSummary &m, uint32_t default_ctx, uint32_t max_frame);
Frame session_opened_frame(uint64_t rid, uint64_t session, std::string_view name, uint32_t ctx, uint32_t n_tokens,
                           bool created, std::string_view save_error = {}, std::string_view evicted = {});
Frame ok_frame(uint64_t rid);
Frame progress_frame(uint64_t rid, uint32_t current, uint32_t total);
// lp: the log-probabilities of the chunk's one token (Generate.logprobs), or null.
Frame token_chunk_frame(uint64_t rid, std::span<const int32_t> tokens, std::string_view text,
                        const TokenLogprob *lp = nullptr);
Frame done_frame(uint64_t rid, const DoneFields &d);
Frame tokenize_result_frame(uint64_t rid, std::span<const int32_t> tokens);
Frame detokenize_result_frame(uint64_t rid, std::string_view text);
Frame stats_result_frame(uint64_t rid, const ModelSummary &m, const StatsFields &s);
Frame session_list_frame(uint64_t rid, const std::vector<SessionListEntry> &entries,
                         const std::vector<EvictedEntry> &evicted = {});
Frame session_saved_frame(uint64_t rid, std::string_view name, uint32_t n_tokens, uint64_t bytes);

}  // namespace ds4::daemon
