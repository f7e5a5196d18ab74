#include "daemon/replies.h"

#include "ipc/frame.h"

namespace ds4::daemon {

namespace fb = ipc::fb;

namespace {

template <class T> Frame finish(flatbuffers::FlatBufferBuilder &fbb, uint64_t rid, flatbuffers::Offset<T> body) {
    ipc::finish_frame(fbb, rid, body);
    return ipc::frame_bytes(fbb);
}

flatbuffers::Offset<flatbuffers::String> sv(flatbuffers::FlatBufferBuilder &fbb, std::string_view s) {
    return fbb.CreateString(s.data(), s.size());
}

// Absent rather than empty: a reader sees "no error" either way, the frame stays smaller.
flatbuffers::Offset<flatbuffers::String> opt_sv(flatbuffers::FlatBufferBuilder &fbb, std::string_view s) {
    return s.empty() ? flatbuffers::Offset<flatbuffers::String>() : sv(fbb, s);
}

flatbuffers::Offset<fb::ModelInfo> model_info(flatbuffers::FlatBufferBuilder &fbb, const ModelSummary &m) {
    return fb::CreateModelInfo(fbb, sv(fbb, m.family), sv(fbb, m.name), m.n_layer, m.n_embd, m.n_vocab, m.n_ctx_max,
                               m.n_head, m.n_expert, sv(fbb, m.backend), m.chat_template);
}

}  // namespace

Frame error_frame(uint64_t rid, fb::ErrorCode code, std::string_view message) {
    flatbuffers::FlatBufferBuilder fbb(128 + message.size());
    return finish(fbb, rid, fb::CreateError(fbb, code, sv(fbb, message), rid));
}

Frame hello_ok_frame(uint64_t rid, const ModelSummary &m, uint32_t default_ctx, uint32_t max_frame) {
    flatbuffers::FlatBufferBuilder fbb(256);
    auto mi = model_info(fbb, m);
    return finish(fbb, rid, fb::CreateHelloOk(fbb, ipc::kProtocolVersion, fbb.CreateString("ds4d"), mi, default_ctx, max_frame));
}

Frame session_opened_frame(uint64_t rid, uint64_t session, std::string_view name, uint32_t ctx, uint32_t n_tokens,
                           bool created, std::string_view save_error, std::string_view evicted) {
    flatbuffers::FlatBufferBuilder fbb(128 + save_error.size() + evicted.size());
    auto nm = sv(fbb, name);
    auto se = opt_sv(fbb, save_error);
    auto ev = opt_sv(fbb, evicted);
    return finish(fbb, rid, fb::CreateSessionOpened(fbb, session, nm, ctx, n_tokens, created, se, ev));
}

Frame ok_frame(uint64_t rid) {
    flatbuffers::FlatBufferBuilder fbb(64);
    return finish(fbb, rid, fb::CreateOk(fbb));
}

Frame progress_frame(uint64_t rid, uint32_t current, uint32_t total) {
    flatbuffers::FlatBufferBuilder fbb(64);
    return finish(fbb, rid, fb::CreateProgress(fbb, current, total));
}

Frame token_chunk_frame(uint64_t rid, std::span<const int32_t> tokens, std::string_view text, const TokenLogprob *lp) {
    flatbuffers::FlatBufferBuilder fbb(96 + tokens.size() * 4 + text.size() + (lp ? 32 + lp->top.size() * 8 : 0));
    auto tv = fbb.CreateVector(tokens.data(), tokens.size());
    auto tx = sv(fbb, text);
    flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::Logprob>>> lv = 0;
    if (lp) {
        std::vector<fb::TopLogprob> top;
        top.reserve(lp->top.size());
        for (const auto &[t, v] : lp->top) top.emplace_back(t, v);
        auto l = fb::CreateLogprob(fbb, lp->logprob, fbb.CreateVectorOfStructs(top));
        lv = fbb.CreateVector(&l, 1);
    }
    return finish(fbb, rid, fb::CreateTokenChunk(fbb, tv, tx, lv));
}

Frame done_frame(uint64_t rid, const DoneFields &d) {
    flatbuffers::FlatBufferBuilder fbb(128);
    return finish(fbb, rid,
                  fb::CreateDone(fbb, d.reason, d.prompt_tokens, d.cached_tokens, d.generated_tokens, d.prefill_us,
                                 d.decode_us, d.stop_token));
}

Frame tokenize_result_frame(uint64_t rid, std::span<const int32_t> tokens) {
    flatbuffers::FlatBufferBuilder fbb(64 + tokens.size() * 4);
    return finish(fbb, rid, fb::CreateTokenizeResult(fbb, fbb.CreateVector(tokens.data(), tokens.size())));
}

Frame detokenize_result_frame(uint64_t rid, std::string_view text) {
    flatbuffers::FlatBufferBuilder fbb(64 + text.size());
    return finish(fbb, rid, fb::CreateDetokenizeResult(fbb, sv(fbb, text)));
}

Frame stats_result_frame(uint64_t rid, const ModelSummary &m, const StatsFields &s) {
    flatbuffers::FlatBufferBuilder fbb(512);
    auto mi = model_info(fbb, m);
    auto mem = fb::CreateMemoryStats(fbb, s.memory.weights_bytes, s.memory.cache_bytes, s.memory.scratch_bytes,
                                     s.memory.device_free, s.memory.device_total, sv(fbb, s.memory.device),
                                     s.memory.device_weights_bytes, s.memory.drafter_bytes, s.memory.shared_bytes,
                                     s.memory.private_bytes);
    flatbuffers::Offset<fb::DrafterSharing> sharing = 0;
    if (s.drafter.offered) {
        std::vector<flatbuffers::Offset<fb::DrafterImporter>> imp;
        for (const DrafterImporter &i : s.drafter.importers)
            imp.push_back(fb::CreateDrafterImporter(fbb, i.pid, i.uid, i.first_unix, i.last_unix, i.shares, i.bytes, i.mapped));
        sharing = fb::CreateDrafterSharing(fbb, s.drafter.bytes, s.drafter.shares, fbb.CreateVector(imp));
    }
    flatbuffers::Offset<fb::ExpertStats> experts = 0;
    if (s.streaming) {
        const ds4_bridge_expert_stats_t &e = s.experts;
        experts = fb::CreateExpertStats(fbb, e.acquired, e.misses, e.late, e.prefetched, e.prefetch_used, e.bytes_read,
                                        e.store_reads, e.store_corrupt, double(e.wait_ns) * 1e-9,
                                        double(e.io_busy_ns) * 1e-9, e.resident, e.capacity, e.capacity_bytes);
    }
    std::vector<flatbuffers::Offset<fb::StreamStats>> st;
    for (const auto &x : s.streams)
        st.push_back(fb::CreateStreamStats(fbb, x.request_id, sv(fbb, x.session), x.prefilling, x.prompt_tokens,
                                           x.prefilled, x.generated, x.tok_s, x.drafted, x.accepted));
    auto streams = fbb.CreateVector(st);
    return finish(fbb, rid,
                  fb::CreateStatsResult(fbb, s.uptime_s, mi, s.sessions, s.connections, s.active_requests,
                                        s.queued_requests, s.requests_total, s.tokens_in, s.tokens_cached,
                                        s.tokens_out, s.prefill_tok_s, s.decode_tok_s, mem, s.saves_failed, s.steps,
                                        s.step_rows, s.step_requests, s.step_seconds, s.max_batch, s.step_tokens,
                                        streams, s.draft_max, s.spec_trials, s.spec_drafted, s.spec_accepted,
                                        s.spec_fallbacks, s.spec_tokens, s.spec_solo_tokens, s.spec_solo_seconds, s.solo_steps,
                                        s.solo_seconds, s.kv_budget, s.kv_in_use, s.kv_waiting, s.slot_waiting,
                                        s.kv_refused, sharing, experts));
}

Frame session_list_frame(uint64_t rid, const std::vector<SessionListEntry> &entries,
                         const std::vector<EvictedEntry> &evicted) {
    flatbuffers::FlatBufferBuilder fbb(128 + entries.size() * 64);
    std::vector<flatbuffers::Offset<fb::SessionInfo>> v;
    for (const auto &e : entries) {
        auto nm = sv(fbb, e.name);
        auto se = opt_sv(fbb, e.save_error);
        v.push_back(fb::CreateSessionInfo(fbb, nm, e.n_tokens, e.bytes, e.created_unix, e.last_used_unix, e.pinned,
                                          e.live, e.stored_tokens, se));
    }
    auto sessions = fbb.CreateVector(v);
    flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::EvictedSession>>> ev;
    if (!evicted.empty()) {
        std::vector<flatbuffers::Offset<fb::EvictedSession>> e;
        for (const auto &x : evicted)
            e.push_back(fb::CreateEvictedSession(fbb, sv(fbb, x.name), x.evicted_unix, sv(fbb, x.reason)));
        ev = fbb.CreateVector(e);
    }
    return finish(fbb, rid, fb::CreateSessionList(fbb, sessions, ev));
}

Frame session_saved_frame(uint64_t rid, std::string_view name, uint32_t n_tokens, uint64_t bytes) {
    flatbuffers::FlatBufferBuilder fbb(128);
    return finish(fbb, rid, fb::CreateSessionSaved(fbb, sv(fbb, name), n_tokens, bytes));
}

}  // namespace ds4::daemon
