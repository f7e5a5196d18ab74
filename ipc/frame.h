// Frame codec: a frame is a size-prefixed FlatBuffer (u32 little-endian byte count, then
// one Envelope with identifier "DS4P"). Received frames are length-capped and verified
// before any field is read.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ipc/protocol.h"

namespace ds4::ipc {

// Wraps `body` in an Envelope and finishes `fbb` as one frame: the bytes to send are
// fbb.GetBufferPointer() / fbb.GetSize().
template <class T>
void finish_frame(flatbuffers::FlatBufferBuilder &fbb, uint64_t request_id, flatbuffers::Offset<T> body) {
    auto env = fb::CreateEnvelope(fbb, request_id, fb::MessageTraits<T>::enum_value, body.Union());
    fb::FinishSizePrefixedEnvelopeBuffer(fbb, env);
}

inline std::vector<uint8_t> frame_bytes(const flatbuffers::FlatBufferBuilder &fbb) {
    const uint8_t *p = fbb.GetBufferPointer();
    return std::vector<uint8_t>(p, p + fbb.GetSize());
}

enum class FrameError {
    None,
    TooSmall,
    TooLarge,
    BadIdentifier,
    Unverifiable,
    MissingBody,   // a known body type with no body table (the verifier lets this through)
};

// The frame's problem as a sentence (for Error.message and logs).
std::string describe_frame_error(FrameError e, const uint8_t *frame, size_t size, const Limits &limits);

// Checks one complete frame, length prefix included. `frame` must be 8-byte aligned.
// On success every field of the envelope may be read, and a known body type has its body;
// an unknown body type (a newer peer) is left for the receiver to refuse.
FrameError verify_frame(const uint8_t *frame, size_t size, const Limits &limits);

// Incremental decoder for a byte stream that may split or join frames arbitrarily.
// After an error it stays failed: the stream cannot be resynchronised.
class FrameDecoder {
public:
    enum class Status { NeedMore, Frame, Error };

    explicit FrameDecoder(Limits limits = {});

    void feed(const uint8_t *data, size_t n);

    // Extracts the next complete frame. On Frame, envelope()/frame_data() stay valid until
    // the next feed() or next(). On Error, error()/error_message() say why. A length prefix
    // above the cap is reported as soon as its four bytes arrive.
    Status next();

    const fb::Envelope *envelope() const { return env_; }
    const uint8_t *frame_data() const { return frame_; }
    size_t frame_size() const { return frame_size_; }
    FrameError error() const { return error_; }
    const std::string &error_message() const { return error_message_; }
    size_t buffered() const { return buf_.size() - rpos_; }
    const Limits &limits() const { return limits_; }

private:
    Status fail(FrameError e, const uint8_t *frame, size_t size);

    Limits limits_;
    std::vector<uint8_t> buf_;
    size_t rpos_ = 0;
    std::vector<uint64_t> aligned_;   // holds a frame whose position in buf_ is misaligned
    const uint8_t *frame_ = nullptr;
    size_t frame_size_ = 0;
    const fb::Envelope *env_ = nullptr;
    FrameError error_ = FrameError::None;
    std::string error_message_;
};

}  // namespace ds4::ipc
