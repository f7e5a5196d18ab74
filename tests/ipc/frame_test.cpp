// Frame codec: round trips, stream splitting, and every class of malformed input.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ipc/frame.h"

namespace fb = ds4::ipc::fb;
using ds4::ipc::FrameDecoder;
using ds4::ipc::FrameError;
using Status = FrameDecoder::Status;

namespace {

std::vector<uint8_t> hello_frame(uint64_t rid, const std::string &client, uint32_t version = ds4::ipc::kProtocolVersion) {
    flatbuffers::FlatBufferBuilder fbb;
    auto body = fb::CreateHelloDirect(fbb, version, client.c_str());
    ds4::ipc::finish_frame(fbb, rid, body);
    return ds4::ipc::frame_bytes(fbb);
}

std::vector<uint8_t> generate_frame(uint64_t rid, size_t n_messages, uint64_t seed) {
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<flatbuffers::Offset<fb::ChatMessage>> msgs;
    for (size_t i = 0; i < n_messages; ++i)
        msgs.push_back(fb::CreateChatMessageDirect(fbb, "user", ("message " + std::to_string(i)).c_str()));
    auto sampling = fb::CreateSampling(fbb, 0.7f, 40, 0.9f, 0.05f, seed);
    std::vector<int32_t> stops = {1, 2};
    auto body = fb::CreateGenerateDirect(fbb, 7, nullptr, nullptr, &msgs, true, false, sampling, 33, nullptr, &stops);
    ds4::ipc::finish_frame(fbb, rid, body);
    return ds4::ipc::frame_bytes(fbb);
}

std::vector<uint8_t> le32(uint32_t v) {
    return {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)};
}

void append(std::vector<uint8_t> &a, const std::vector<uint8_t> &b) { a.insert(a.end(), b.begin(), b.end()); }

}  // namespace

TEST(FrameCodec, FrameIsLittleEndianLengthThenIdentifiedFlatBuffer) {
    auto f = hello_frame(42, "test-client");
    ASSERT_GE(f.size(), 12u);
    uint32_t len = uint32_t(f[0]) | uint32_t(f[1]) << 8 | uint32_t(f[2]) << 16 | uint32_t(f[3]) << 24;
    EXPECT_EQ(len, f.size() - 4);
    EXPECT_EQ(std::memcmp(f.data() + 8, "DS4P", 4), 0);
}

TEST(FrameCodec, RoundTripKeepsRequestIdAndFields) {
    auto f = generate_frame(0xfeedbeefcafe1234ull, 3, 99);
    FrameDecoder dec;
    dec.feed(f.data(), f.size());
    ASSERT_EQ(dec.next(), Status::Frame);
    const fb::Envelope *e = dec.envelope();
    EXPECT_EQ(e->request_id(), 0xfeedbeefcafe1234ull);
    ASSERT_EQ(e->body_type(), fb::Message::Generate);
    auto g = e->body_as_Generate();
    EXPECT_EQ(g->session(), 7u);
    EXPECT_EQ(g->max_tokens(), 33u);
    ASSERT_EQ(g->messages()->size(), 3u);
    EXPECT_EQ(g->messages()->Get(2)->content()->str(), "message 2");
    EXPECT_FLOAT_EQ(g->sampling()->temperature(), 0.7f);
    EXPECT_EQ(g->sampling()->top_k(), 40);
    EXPECT_EQ(g->sampling()->seed(), 99u);
    ASSERT_EQ(g->stop_tokens()->size(), 2u);
    EXPECT_EQ(g->stop_tokens()->Get(1), 2);
    EXPECT_EQ(dec.next(), Status::NeedMore);
    EXPECT_EQ(dec.buffered(), 0u);
}

TEST(FrameCodec, DefaultsApplyToAbsentFields) {
    flatbuffers::FlatBufferBuilder fbb;
    fb::GenerateBuilder gb(fbb);
    auto body = gb.Finish();
    ds4::ipc::finish_frame(fbb, 1, body);
    FrameDecoder dec;
    dec.feed(fbb.GetBufferPointer(), fbb.GetSize());
    ASSERT_EQ(dec.next(), Status::Frame);
    auto g = dec.envelope()->body_as_Generate();
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->max_tokens(), 256u);
    EXPECT_TRUE(g->add_generation_prompt());
    EXPECT_EQ(g->sampling(), nullptr);
    EXPECT_EQ(g->text(), nullptr);
}

TEST(FrameCodec, StreamSplitAtEveryByteDecodesAllFramesInOrder) {
    // Frames without 8-byte fields (request id 0 is a default and is not stored) are only
    // 4-aligned in size, so the frames after them sit at misaligned stream offsets.
    auto rid = [](int i) { return i % 4 == 1 ? uint64_t(0) : uint64_t(1000 + i); };
    std::vector<uint8_t> stream;
    std::vector<size_t> offsets;
    for (int i = 0; i < 17; ++i) {
        offsets.push_back(stream.size());
        append(stream, i % 3 == 0 ? generate_frame(rid(i), i, i) : hello_frame(rid(i), std::string(i, 'a' + i)));
    }
    bool misaligned = false;
    for (size_t o : offsets) misaligned |= (o % 8) != 0;
    ASSERT_TRUE(misaligned) << "test needs a frame at a misaligned stream offset";

    for (size_t chunk : {size_t(1), size_t(3), size_t(7), size_t(64), stream.size()}) {
        FrameDecoder dec;
        int seen = 0;
        for (size_t off = 0; off < stream.size(); off += chunk) {
            dec.feed(stream.data() + off, std::min(chunk, stream.size() - off));
            for (Status st; (st = dec.next()) != Status::NeedMore;) {
                ASSERT_EQ(st, Status::Frame) << dec.error_message();
                ASSERT_EQ(reinterpret_cast<uintptr_t>(dec.frame_data()) % 8, 0u);
                EXPECT_EQ(dec.envelope()->request_id(), rid(seen));
                if (seen % 3 == 0) {
                    auto g = dec.envelope()->body_as_Generate();
                    ASSERT_NE(g, nullptr);
                    EXPECT_EQ(g->sampling()->seed(), uint64_t(seen));
                } else {
                    auto h = dec.envelope()->body_as_Hello();
                    ASSERT_NE(h, nullptr);
                    EXPECT_EQ(h->client()->str(), std::string(seen, 'a' + seen));
                }
                ++seen;
            }
        }
        EXPECT_EQ(seen, 17) << "chunk " << chunk;
        EXPECT_EQ(dec.buffered(), 0u);
    }
}

TEST(FrameCodec, TruncatedFrameWaitsForMore) {
    auto f = hello_frame(5, "partial");
    FrameDecoder dec;
    dec.feed(f.data(), f.size() - 1);
    EXPECT_EQ(dec.next(), Status::NeedMore);
    EXPECT_EQ(dec.buffered(), f.size() - 1);
    dec.feed(f.data() + f.size() - 1, 1);
    ASSERT_EQ(dec.next(), Status::Frame);
    EXPECT_EQ(dec.envelope()->body_as_Hello()->client()->str(), "partial");
}

TEST(FrameCodec, OversizedLengthIsRejectedFromThePrefixAlone) {
    FrameDecoder dec;  // default cap: 16 MiB
    auto prefix = le32((16u << 20) + 1);
    dec.feed(prefix.data(), prefix.size());
    ASSERT_EQ(dec.next(), Status::Error);
    EXPECT_EQ(dec.error(), FrameError::TooLarge);
    EXPECT_NE(dec.error_message().find("16777217"), std::string::npos) << dec.error_message();
    EXPECT_NE(dec.error_message().find("16777216"), std::string::npos) << dec.error_message();
}

TEST(FrameCodec, LengthCapIsConfigurable) {
    auto f = generate_frame(1, 50, 0);
    ASSERT_GT(f.size(), 600u);
    ds4::ipc::Limits small;
    small.max_frame = 512;
    FrameDecoder tight(small);
    tight.feed(f.data(), f.size());
    EXPECT_EQ(tight.next(), Status::Error);
    EXPECT_EQ(tight.error(), FrameError::TooLarge);

    FrameDecoder normal;
    normal.feed(f.data(), f.size());
    EXPECT_EQ(normal.next(), Status::Frame);
}

TEST(FrameCodec, LengthBelowMinimalBufferIsRejected) {
    for (uint32_t len : {0u, 1u, 7u}) {
        auto bytes = le32(len);
        bytes.resize(bytes.size() + len, 0);
        FrameDecoder dec;
        dec.feed(bytes.data(), bytes.size());
        ASSERT_EQ(dec.next(), Status::Error) << len;
        EXPECT_EQ(dec.error(), FrameError::TooSmall);
    }
}

TEST(FrameCodec, WrongIdentifierIsRejected) {
    auto f = hello_frame(1, "x");
    std::memcpy(f.data() + 8, "NOPE", 4);
    FrameDecoder dec;
    dec.feed(f.data(), f.size());
    ASSERT_EQ(dec.next(), Status::Error);
    EXPECT_EQ(dec.error(), FrameError::BadIdentifier);
    EXPECT_NE(dec.error_message().find("NOPE"), std::string::npos) << dec.error_message();
}

TEST(FrameCodec, VerifierRejectsOutOfBoundsOffsets) {
    auto f = hello_frame(1, "some client name");
    // Root offset pointing past the end of the buffer.
    std::vector<uint8_t> bad = f;
    bad[4] = 0xf0; bad[5] = 0xff; bad[6] = 0; bad[7] = 0;
    FrameDecoder dec;
    dec.feed(bad.data(), bad.size());
    ASSERT_EQ(dec.next(), Status::Error);
    EXPECT_EQ(dec.error(), FrameError::Unverifiable);

    // A valid identifier around garbage.
    std::vector<uint8_t> garbage = le32(64);
    std::mt19937 rng(7);
    for (int i = 0; i < 64; ++i) garbage.push_back(uint8_t(rng()));
    std::memcpy(garbage.data() + 8, "DS4P", 4);
    garbage[4] = 0x40;  // root table beyond the buffer
    FrameDecoder dec2;
    dec2.feed(garbage.data(), garbage.size());
    ASSERT_EQ(dec2.next(), Status::Error);
    EXPECT_EQ(dec2.error(), FrameError::Unverifiable);
}

TEST(FrameCodec, EveryCorruptedByteOfAStringLengthIsCaught) {
    // Inflate the client string's length field: the verifier must refuse to read past the end.
    auto f = hello_frame(1, "abcdefgh");
    const char *needle = "abcdefgh";
    auto it = std::search(f.begin(), f.end(), needle, needle + 8);
    ASSERT_NE(it, f.end());
    size_t len_pos = size_t(it - f.begin()) - 4;
    auto bad = f;
    bad[len_pos] = 0xff; bad[len_pos + 1] = 0xff;
    FrameDecoder dec;
    dec.feed(bad.data(), bad.size());
    ASSERT_EQ(dec.next(), Status::Error);
    EXPECT_EQ(dec.error(), FrameError::Unverifiable);
}

TEST(FrameCodec, TableLimitRejectsOverlyWideMessages) {
    auto f = generate_frame(1, 200, 0);
    ds4::ipc::Limits few;
    few.max_tables = 50;
    FrameDecoder dec(few);
    dec.feed(f.data(), f.size());
    ASSERT_EQ(dec.next(), Status::Error);
    EXPECT_EQ(dec.error(), FrameError::Unverifiable);
    FrameDecoder ok;
    ok.feed(f.data(), f.size());
    EXPECT_EQ(ok.next(), Status::Frame);
}

TEST(FrameCodec, DepthLimitIsEnforced) {
    // Envelope -> Generate -> messages vector -> ChatMessage -> string: depth above 2.
    auto f = generate_frame(1, 1, 0);
    ds4::ipc::Limits shallow;
    shallow.max_depth = 2;
    FrameDecoder dec(shallow);
    dec.feed(f.data(), f.size());
    ASSERT_EQ(dec.next(), Status::Error);
    EXPECT_EQ(dec.error(), FrameError::Unverifiable);
}

TEST(FrameCodec, KnownBodyTypeWithoutBodyIsRejected) {
    // The FlatBuffers verifier accepts a union type with no value; the codec must not.
    flatbuffers::FlatBufferBuilder fbb;
    fb::EnvelopeBuilder eb(fbb);
    eb.add_request_id(3);
    eb.add_body_type(fb::Message::StatsResult);
    fb::FinishSizePrefixedEnvelopeBuffer(fbb, eb.Finish());
    FrameDecoder dec;
    dec.feed(fbb.GetBufferPointer(), fbb.GetSize());
    ASSERT_EQ(dec.next(), Status::Error);
    EXPECT_EQ(dec.error(), FrameError::MissingBody);
    EXPECT_NE(dec.error_message().find("StatsResult"), std::string::npos) << dec.error_message();
}

TEST(FrameCodec, UnknownBodyTypePassesToTheReceiver) {
    // A newer peer's message: verifiable, and the receiver decides (ds4d answers Protocol).
    flatbuffers::FlatBufferBuilder fbb;
    auto body = fb::CreateStats(fbb);
    auto env = fb::CreateEnvelope(fbb, 4, static_cast<fb::Message>(200), body.Union());
    fb::FinishSizePrefixedEnvelopeBuffer(fbb, env);
    FrameDecoder dec;
    dec.feed(fbb.GetBufferPointer(), fbb.GetSize());
    ASSERT_EQ(dec.next(), Status::Frame);
    EXPECT_EQ(static_cast<int>(dec.envelope()->body_type()), 200);
}

TEST(FrameCodec, DecoderStaysFailedAfterAnError) {
    auto good = hello_frame(2, "ok");
    auto bad = hello_frame(1, "x");
    std::memcpy(bad.data() + 8, "XXXX", 4);
    FrameDecoder dec;
    dec.feed(bad.data(), bad.size());
    dec.feed(good.data(), good.size());
    EXPECT_EQ(dec.next(), Status::Error);
    EXPECT_EQ(dec.next(), Status::Error);
    dec.feed(good.data(), good.size());
    EXPECT_EQ(dec.next(), Status::Error);
}

TEST(FrameCodec, RandomBytesNeverYieldAFrame) {
    // Complete random frames behind a plausible length: a typed error, never a crash and
    // (with overwhelming probability for random data) never an accepted frame.
    std::mt19937_64 rng(12345);
    int errors = 0;
    for (int iter = 0; iter < 2000; ++iter) {
        uint32_t len = 8 + uint32_t(rng() % 400);
        std::vector<uint8_t> bytes(4 + len);
        for (auto &b : bytes) b = uint8_t(rng());
        std::memcpy(bytes.data(), le32(len).data(), 4);
        if (iter % 2) std::memcpy(bytes.data() + 8, "DS4P", 4);
        FrameDecoder dec;
        // Half whole, half split: a complete frame must be judged either way.
        if (iter % 4 < 2) {
            dec.feed(bytes.data(), bytes.size());
        } else {
            dec.feed(bytes.data(), 5);
            ASSERT_EQ(dec.next(), Status::NeedMore);
            dec.feed(bytes.data() + 5, bytes.size() - 5);
        }
        auto st = dec.next();
        ASSERT_NE(st, Status::Frame) << "iteration " << iter;
        errors += st == Status::Error;
    }
    EXPECT_EQ(errors, 2000);
}

TEST(FrameCodec, VerifyFrameChecksExactSize) {
    auto f = hello_frame(1, "abc");
    std::vector<uint64_t> store((f.size() + 16) / 8);
    auto p = reinterpret_cast<uint8_t *>(store.data());
    std::memcpy(p, f.data(), f.size());
    EXPECT_EQ(ds4::ipc::verify_frame(p, f.size(), {}), FrameError::None);
    EXPECT_NE(ds4::ipc::verify_frame(p, f.size() - 1, {}), FrameError::None);
    EXPECT_NE(ds4::ipc::verify_frame(p, f.size() + 4, {}), FrameError::None);
    EXPECT_EQ(ds4::ipc::verify_frame(p, 3, {}), FrameError::TooSmall);
}

TEST(FrameCodec, NamesForCodesAndReasons) {
    EXPECT_STREQ(ds4::ipc::error_code_name(fb::ErrorCode::FrameTooLarge), "FrameTooLarge");
    EXPECT_STREQ(ds4::ipc::error_code_name(static_cast<fb::ErrorCode>(999)), "UnknownError");
    EXPECT_STREQ(ds4::ipc::finish_reason_name(fb::FinishReason::Length), "Length");
}
