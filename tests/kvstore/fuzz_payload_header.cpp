// Fuzzes the payload header codec: decoding never crashes, and whatever decodes
// re-encodes to the same header and token bytes.
#include <cstring>
#include <vector>

#include "bridge/payload_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    using namespace ds4::payload;
    Header h;
    std::vector<int32_t> toks;
    std::string err;
    if (!decode_payload(data, size, &h, &toks, &err)) {
        if (err.empty()) __builtin_trap();
        return 0;
    }
    std::vector<uint8_t> again;
    if (!encode_prefix(h, toks.data(), toks.size(), &again, &err)) __builtin_trap();
    if (again.size() > size || memcmp(again.data(), data, again.size()) != 0) __builtin_trap();
    if (total_bytes(h) != size) __builtin_trap();
    // The range form over a prefix of the same bytes agrees.
    Header h2;
    if (!decode_prefix(data, again.size(), size, &h2, &err) || h2.tail_bytes != h.tail_bytes) __builtin_trap();
    return 0;
}
