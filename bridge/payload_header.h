// Host-side codec for the header and token ids of a session payload (docs/ARCHITECTURE.md §4).
// Shared by the bridge (which appends the engine tail) and the kvstore (which reads a
// payload's tokens and fingerprint without an engine). No engine types here.
//
// Layout, all little-endian:
//
//   offset  size            field
//   0       13 × u32        header
//             word 0          magic            0x34565344, the bytes "DSV4"
//             word 1          version          3
//             word 2          ctx_size         context size of the saved session
//             word 3          n_tokens         token ids that follow (<= ctx_size)
//             word 4          n_layer          model layer count
//             word 5          n_embd           model width
//             word 6          n_vocab          vocabulary size, <= INT32_MAX (every token id < n_vocab)
//             word 7          head_dim         attention head width
//             word 8, 9       fingerprint      64-bit model fingerprint, low word first
//             word 10, 11     tail_bytes       engine tail size in bytes, low word first
//             word 12         header_crc       CRC-32C of words 0..11 and the token bytes
//   52      n_tokens × i32  token ids
//   52+4n   tail_bytes      engine tail (opaque here)
//
// A payload occupies a byte range exactly: 52 + 4·n_tokens + tail_bytes must equal the
// range length (no trailing bytes). The fingerprint is computed by the bridge from the
// GGUF; this codec only carries it.
//
// Error reporting: functions return false and set *err (when err is non-null) to a
// message naming the problem. They never throw (allocation failure is an error too).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ds4::payload {

inline constexpr uint32_t kMagic = 0x34565344u;  // "DSV4" read as a little-endian u32
inline constexpr uint32_t kVersion = 3;
inline constexpr size_t kHeaderWords = 13;
inline constexpr size_t kHeaderBytes = kHeaderWords * 4;

struct Header {
    uint32_t ctx_size = 0;
    uint32_t n_tokens = 0;
    uint32_t n_layer = 0;
    uint32_t n_embd = 0;
    uint32_t n_vocab = 0;
    uint32_t head_dim = 0;
    uint64_t fingerprint = 0;
    uint64_t tail_bytes = 0;
};

// CRC-32C (Castagnoli, reflected, init/xorout 0xFFFFFFFF). Chainable: pass the previous
// result as `crc` to continue over more bytes; crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void *data, size_t len, uint32_t crc = 0);

// Bytes taken by the header plus n_tokens token ids.
inline uint64_t prefix_bytes(uint64_t n_tokens) { return kHeaderBytes + 4 * n_tokens; }

// Total payload length the header describes: header + tokens + tail.
inline uint64_t total_bytes(const Header &h) { return prefix_bytes(h.n_tokens) + h.tail_bytes; }

// Writes header + token ids (prefix_bytes(n_tokens) bytes) to `out`, which must hold at
// least that many. h.n_tokens must equal n_tokens; every token must be in [0, n_vocab).
bool encode_prefix(const Header &h, const int32_t *tokens, size_t n_tokens, uint8_t *out,
                   size_t out_cap, std::string *err);

// Same, returning a new vector.
bool encode_prefix(const Header &h, const int32_t *tokens, size_t n_tokens,
                   std::vector<uint8_t> *out, std::string *err);

// Validates the header and token ids at `data` for a payload occupying a byte range of
// `range_len` bytes. `avail` is how many bytes of that range are present at `data`; it
// must cover at least the header and tokens (the tail is not read). Checks magic,
// version, field sanity, n_tokens <= ctx_size, token ids < n_vocab, the CRC, and that
// the described length equals range_len exactly.
bool decode_prefix(const uint8_t *data, size_t avail, uint64_t range_len, Header *out,
                   std::string *err);

// decode_prefix on a whole payload held in memory (avail == range_len == len), also
// returning the token ids when `tokens` is non-null.
bool decode_payload(const uint8_t *data, size_t len, Header *out, std::vector<int32_t> *tokens,
                    std::string *err);

// Copies the n_tokens token ids that follow a header at `data` (already validated by
// decode_prefix) into `tokens`.
bool read_tokens(const uint8_t *data, size_t avail, const Header &h, std::vector<int32_t> *tokens,
                 std::string *err);

// Reads and validates the header and tokens of the payload stored in the byte range
// [offset, offset + length) of the file at `path`, without an engine.
bool read_file_prefix(const char *path, uint64_t offset, uint64_t length, Header *out,
                      std::vector<int32_t> *tokens, std::string *err);

}  // namespace ds4::payload
