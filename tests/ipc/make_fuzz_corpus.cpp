// Writes one valid frame per message kind into a directory: the frame fuzzer's seeds.
// Usage: ds4-ipc-make-corpus DIR
#include <cstdio>
#include <string>
#include <vector>

#include "ipc/frame.h"

namespace fb = ds4::ipc::fb;

namespace {

bool write_file(const std::string &path, const flatbuffers::FlatBufferBuilder &fbb) {
    FILE *f = std::fopen(path.c_str(), "wb");
    if (!f) return false;
    bool ok = std::fwrite(fbb.GetBufferPointer(), 1, fbb.GetSize(), f) == fbb.GetSize();
    return std::fclose(f) == 0 && ok;
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    const std::string dir = argv[1];
    int failures = 0;
    auto emit = [&](const char *name, auto build) {
        flatbuffers::FlatBufferBuilder fbb;
        build(fbb);
        if (!write_file(dir + "/" + name, fbb)) {
            std::fprintf(stderr, "cannot write %s/%s\n", dir.c_str(), name);
            ++failures;
        }
    };
    emit("hello", [](auto &fbb) { ds4::ipc::finish_frame(fbb, 1, fb::CreateHelloDirect(fbb, 1, "corpus")); });
    emit("hello_ok", [](auto &fbb) {
        auto m = fb::CreateModelInfoDirect(fbb, "deepseek4", "tiny", 4, 64, 512, 4096, 4, 8, "cpu");
        ds4::ipc::finish_frame(fbb, 1, fb::CreateHelloOkDirect(fbb, 1, "ds4d", m, 2048, 16u << 20));
    });
    emit("open_session", [](auto &fbb) { ds4::ipc::finish_frame(fbb, 2, fb::CreateOpenSessionDirect(fbb, "chat", 1024)); });
    emit("generate_text", [](auto &fbb) {
        auto s = fb::CreateSampling(fbb, 0.8f, 40, 0.95f, 0.05f, 7);
        std::vector<flatbuffers::Offset<flatbuffers::String>> stops = {fbb.CreateString("\n\n")};
        std::vector<int32_t> stop_tokens = {1};
        ds4::ipc::finish_frame(fbb, 3, fb::CreateGenerateDirect(fbb, 0, "Hello there", nullptr, nullptr, true, false,
                                                                 s, 16, &stops, &stop_tokens));
    });
    emit("generate_chat", [](auto &fbb) {
        std::vector<flatbuffers::Offset<fb::ChatMessage>> msgs = {
            fb::CreateChatMessageDirect(fbb, "system", "Be brief."),
            fb::CreateChatMessageDirect(fbb, "user", "What is two plus two?")};
        ds4::ipc::finish_frame(fbb, 4, fb::CreateGenerateDirect(fbb, 9, nullptr, nullptr, &msgs));
    });
    emit("generate_tokens", [](auto &fbb) {
        std::vector<int32_t> toks = {0, 5, 17, 99, 511};
        ds4::ipc::finish_frame(fbb, 5, fb::CreateGenerateDirect(fbb, 0, nullptr, &toks));
    });
    emit("token_chunk", [](auto &fbb) {
        std::vector<int32_t> toks = {17, 18};
        ds4::ipc::finish_frame(fbb, 5, fb::CreateTokenChunkDirect(fbb, &toks, "ab"));
    });
    emit("done", [](auto &fbb) {
        ds4::ipc::finish_frame(fbb, 5, fb::CreateDone(fbb, fb::FinishReason::Length, 5, 0, 16, 1200, 3400));
    });
    emit("cancel", [](auto &fbb) { ds4::ipc::finish_frame(fbb, 6, fb::CreateCancel(fbb, 5)); });
    emit("tokenize", [](auto &fbb) { ds4::ipc::finish_frame(fbb, 7, fb::CreateTokenizeDirect(fbb, "tokens please")); });
    emit("detokenize", [](auto &fbb) {
        std::vector<int32_t> toks = {3, 4, 5};
        ds4::ipc::finish_frame(fbb, 8, fb::CreateDetokenizeDirect(fbb, &toks));
    });
    emit("stats", [](auto &fbb) { ds4::ipc::finish_frame(fbb, 9, fb::CreateStats(fbb)); });
    emit("stats_result", [](auto &fbb) {
        auto mem = fb::CreateMemoryStats(fbb, 1000, 200, 30, 0, 0);
        ds4::ipc::finish_frame(fbb, 9, fb::CreateStatsResult(fbb, 12.5, 0, 2, 1, 1, 0, 10, 100, 20, 80, 500.0, 40.0, mem));
    });
    emit("error", [](auto &fbb) {
        ds4::ipc::finish_frame(fbb, 10, fb::CreateErrorDirect(fbb, fb::ErrorCode::BadRequest, "bad", 10));
    });
    emit("close", [](auto &fbb) { ds4::ipc::finish_frame(fbb, 11, fb::CreateClose(fbb, 9)); });
    emit("session_list", [](auto &fbb) {
        std::vector<flatbuffers::Offset<fb::SessionInfo>> l = {fb::CreateSessionInfoDirect(fbb, "a", 10, 4096, 1, 2, true, false)};
        ds4::ipc::finish_frame(fbb, 12, fb::CreateSessionListDirect(fbb, &l));
    });
    emit("pin_session", [](auto &fbb) { ds4::ipc::finish_frame(fbb, 13, fb::CreatePinSessionDirect(fbb, "a", true)); });
    return failures ? 1 : 0;
}
