// libFuzzer target for the GGUF reader: any input must either parse or throw ds4::Error,
// and whatever a successful parse hands out must lie inside the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "engine/common/error.h"
#include "engine/gguf/gguf.h"

using namespace ds4::gguf;

static uint64_t touch(const Value &v) {
    uint64_t h = static_cast<uint64_t>(v.type) + v.u + static_cast<uint64_t>(v.i) + v.s.size();
    for (const Value &e : v.arr) h += touch(e);
    return h;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    try {
        auto r = Reader::from_memory(data, size);
        volatile uint64_t h = r->version() + r->alignment();
        for (const auto &kv : r->metadata()) h = h + kv.first.size() + touch(kv.second);
        uint64_t total = 0;
        for (const TensorInfo &t : r->tensors()) {
            if (t.data < data || t.nbytes > size || t.data + t.nbytes > data + size) std::abort();
            if (t.nbytes != row_bytes(t.type, t.ne[0]) * static_cast<uint64_t>(t.rows())) std::abort();
            if (r->tensor(t.name) != &t) std::abort();
            // First and last byte: ASan flags any read outside the input.
            h = h + t.data[0] + t.data[t.nbytes - 1];
            total += t.nbytes;
        }
        if (total != r->total_tensor_bytes()) std::abort();
        (void)r->get_int("general.alignment", 32);
    } catch (const ds4::Error &) {
    }
    return 0;
}
