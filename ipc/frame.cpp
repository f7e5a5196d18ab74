#include "ipc/frame.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace ds4::ipc {
namespace {

constexpr size_t kPrefix = sizeof(uint32_t);
// Root offset + file identifier: the smallest buffer that can name its root.
constexpr size_t kMinPayload = 8;

uint32_t load_le32(const uint8_t *p) {
    return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

size_t effective_cap(const Limits &limits) { return std::min(limits.max_frame, kMaxFrameCeiling); }

}  // namespace

std::string describe_frame_error(FrameError e, const uint8_t *frame, size_t size, const Limits &limits) {
    const size_t len = size >= kPrefix ? load_le32(frame) : 0;
    switch (e) {
    case FrameError::None: return "no error";
    case FrameError::TooSmall:
        return "frame length " + std::to_string(len) + " is below the minimal FlatBuffer size of " +
               std::to_string(kMinPayload) + " bytes";
    case FrameError::TooLarge:
        return "frame length " + std::to_string(len) + " exceeds the limit of " +
               std::to_string(effective_cap(limits)) + " bytes";
    case FrameError::BadIdentifier: {
        std::string id;
        for (size_t i = 0; i < 4 && kPrefix + 4 + i < size; ++i) {
            const char c = char(frame[kPrefix + 4 + i]);
            char hex[8];
            std::snprintf(hex, sizeof hex, "\\x%02x", unsigned(uint8_t(c)));
            id += (c >= 0x20 && c < 0x7f) ? std::string(1, c) : std::string(hex);
        }
        return "frame identifier is \"" + id + "\", expected \"" + kFileIdentifier + "\"";
    }
    case FrameError::Unverifiable:
        return "frame of " + std::to_string(len) + " bytes failed FlatBuffers verification as a ds4 Envelope";
    case FrameError::MissingBody: {
        const auto type = fb::GetSizePrefixedEnvelope(frame)->body_type();
        return std::string("frame names a ") + fb::EnumNameMessage(type) + " body but carries none";
    }
    }
    return "unknown frame error";
}

FrameError verify_frame(const uint8_t *frame, size_t size, const Limits &limits) {
    if (size < kPrefix + kMinPayload) return FrameError::TooSmall;
    const size_t len = load_le32(frame);
    if (len > effective_cap(limits)) return FrameError::TooLarge;
    if (len < kMinPayload) return FrameError::TooSmall;
    if (len != size - kPrefix) return FrameError::Unverifiable;
    if (!fb::SizePrefixedEnvelopeBufferHasIdentifier(frame)) return FrameError::BadIdentifier;
    flatbuffers::Verifier::Options opts;
    opts.max_depth = limits.max_depth;
    opts.max_tables = limits.max_tables;
    opts.check_alignment = true;
    flatbuffers::Verifier v(frame, size, opts);
    if (!fb::VerifySizePrefixedEnvelopeBuffer(v)) return FrameError::Unverifiable;
    const fb::Envelope *env = fb::GetSizePrefixedEnvelope(frame);
    const auto type = env->body_type();
    if (type != fb::Message::NONE && type <= fb::Message::MAX && env->body() == nullptr)
        return FrameError::MissingBody;
    return FrameError::None;
}

FrameDecoder::FrameDecoder(Limits limits) : limits_(limits) {}

void FrameDecoder::feed(const uint8_t *data, size_t n) {
    if (error_ != FrameError::None || n == 0) return;
    // Drop consumed bytes before growing, so the buffer holds at most one partial frame
    // plus whatever the last read brought.
    if (rpos_ > 0) {
        buf_.erase(buf_.begin(), buf_.begin() + ptrdiff_t(rpos_));
        rpos_ = 0;
    }
    buf_.insert(buf_.end(), data, data + n);
}

FrameDecoder::Status FrameDecoder::fail(FrameError e, const uint8_t *frame, size_t size) {
    error_ = e;
    error_message_ = describe_frame_error(e, frame, size, limits_);
    env_ = nullptr;
    frame_ = nullptr;
    frame_size_ = 0;
    return Status::Error;
}

FrameDecoder::Status FrameDecoder::next() {
    env_ = nullptr;
    frame_ = nullptr;
    frame_size_ = 0;
    if (error_ != FrameError::None) return Status::Error;
    const size_t avail = buf_.size() - rpos_;
    if (avail < kPrefix) return Status::NeedMore;
    const uint8_t *p = buf_.data() + rpos_;
    const size_t len = load_le32(p);
    if (len > effective_cap(limits_)) return fail(FrameError::TooLarge, p, avail);
    if (len < kMinPayload) return fail(FrameError::TooSmall, p, avail);
    if (avail < kPrefix + len) return Status::NeedMore;

    const size_t size = kPrefix + len;
    const uint8_t *frame = p;
    if (reinterpret_cast<uintptr_t>(p) % alignof(uint64_t) != 0) {
        aligned_.resize((size + 7) / 8);
        std::memcpy(aligned_.data(), p, size);
        frame = reinterpret_cast<const uint8_t *>(aligned_.data());
    }
    rpos_ += size;
    const FrameError e = verify_frame(frame, size, limits_);
    if (e != FrameError::None) return fail(e, frame, size);
    frame_ = frame;
    frame_size_ = size;
    env_ = fb::GetSizePrefixedEnvelope(frame);
    return Status::Frame;
}

const char *error_code_name(fb::ErrorCode code) {
    const char *n = fb::EnumNameErrorCode(code);
    return (n && *n) ? n : "UnknownError";
}

const char *finish_reason_name(fb::FinishReason reason) {
    const char *n = fb::EnumNameFinishReason(reason);
    return (n && *n) ? n : "unknown";
}

}  // namespace ds4::ipc
