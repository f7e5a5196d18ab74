// GGUF reader: validates a whole image before exposing any of it, maps tensor data, and
// merges split files into one tensor set.
//
// Hostile input is the design case: every read is bounds-checked against the image, every
// count is checked against the bytes left before anything is allocated from it, and all
// size arithmetic is overflow-checked.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstdarg>
#include <cstring>
#include <unordered_map>

#include "engine/common/error.h"
#include "engine/gguf/gguf.h"

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

namespace ds4::gguf {
namespace {

constexpr int kMaxArrayDepth = 8;
// Caps the Values built from metadata arrays: each costs ~100 B of memory while a u8
// element costs 1 B of file, so a count check against the file size alone still lets a
// large hostile file ask for ~100x its size. Real tokenizers need well under 1M.
constexpr uint64_t kMaxArrayElems = 32ull << 20;
constexpr uint32_t kDefaultAlignment = 32;
// Smallest encodings, used to reject counts the remaining bytes cannot possibly hold.
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;              // key len, 1-char key, type, u8
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;  // name len, name, n_dims, ne, type, offset

std::string strf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
std::string strf(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

// Names come from untrusted files: quote, escape and shorten them for messages.
std::string show(std::string_view s) {
    std::string out = "'";
    size_t n = std::min<size_t>(s.size(), 80);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        if (c >= 0x20 && c < 0x7f && c != '\'') {
            out += static_cast<char>(c);
        } else {
            out += strf("\\x%02x", c);
        }
    }
    if (s.size() > n) out += "...";
    out += "'";
    return out;
}

using ull = unsigned long long;
using ll = long long;

[[noreturn]] void bad(const std::string &src, const std::string &msg) { throw Error(src + ": " + msg); }

struct Cursor {
    const uint8_t *p;
    uint64_t size;
    uint64_t pos = 0;
    const std::string &src;

    uint64_t left() const { return size - pos; }
    void need(uint64_t n, const char *what) const {
        if (n > left())
            bad(src, strf("truncated file: reading %s at offset %llu needs %llu bytes, only %llu left",
                          what, (ull)pos, (ull)n, (ull)left()));
    }
    template <class T>
    T rd(const char *what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, p + pos, sizeof(T));
        pos += sizeof(T);
        return v;
    }
    std::string str(const char *what) {
        uint64_t at = pos;
        uint64_t len = rd<uint64_t>(what);
        if (len > left())
            bad(src, strf("%s at offset %llu has length %llu, beyond the end of the file (%llu bytes left)",
                          what, (ull)at, (ull)len, (ull)left()));
        std::string s(reinterpret_cast<const char *>(p + pos), len);
        pos += len;
        return s;
    }
};

uint64_t min_value_bytes(ValueType t) {
    switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    case ValueType::STRING: return 8;
    case ValueType::ARRAY: return 12;
    }
    return 1;
}

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::F64); }

struct Parsed {
    uint32_t version = 0;
    uint32_t alignment = kDefaultAlignment;
    std::vector<std::pair<std::string, Value>> kv;
    std::unordered_map<std::string, size_t> kv_index;
    std::vector<TensorInfo> tensors;
    uint64_t data_start = 0;
};

class Parser {
public:
    Parser(const uint8_t *p, uint64_t size, const std::string &src) : cur_{p, size, 0, src}, src_(src) {}

    // host: this split's entries of a HostDirectory and its data section offset; the file's
    // own tensor table is then skipped, and each entry gets the checks read_tensor_infos makes.
    Parsed run(const std::vector<TensorInfo> *host = nullptr, uint64_t host_data_start = 0) {
        Parsed out;
        cur_.need(4, "magic");
        const uint8_t *m = cur_.p;
        if (std::memcmp(m, "GGUF", 4) != 0)
            bad(src_, strf("bad magic %02x %02x %02x %02x (not a GGUF file)", m[0], m[1], m[2], m[3]));
        cur_.pos = 4;
        out.version = cur_.rd<uint32_t>("version");
        if (out.version != 2 && out.version != 3)
            bad(src_, strf("unsupported GGUF version %u (this reader handles 2 and 3)", out.version));
        uint64_t n_tensors = cur_.rd<uint64_t>("tensor count");
        uint64_t n_kv = cur_.rd<uint64_t>("metadata count");
        if (n_kv > cur_.left() / kMinKvBytes)
            bad(src_, strf("metadata count %llu is more than the file can hold (%llu bytes left)", (ull)n_kv, (ull)cur_.left()));
        if (n_tensors > cur_.left() / kMinTensorInfoBytes)
            bad(src_, strf("tensor count %llu is more than the file can hold (%llu bytes left)", (ull)n_tensors, (ull)cur_.left()));

        read_metadata(out, n_kv);
        read_alignment(out);
        if (host) {
            use_host_tensors(out, n_tensors, *host, host_data_start);
            return out;
        }
        read_tensor_infos(out, n_tensors);
        place_tensors(out);
        return out;
    }

private:
    Cursor cur_;
    const std::string &src_;
    uint64_t array_elems_ = 0;

    void read_metadata(Parsed &out, uint64_t n_kv) {
        out.kv.reserve(n_kv);
        for (uint64_t i = 0; i < n_kv; i++) {
            uint64_t at = cur_.pos;
            std::string key = cur_.str("metadata key");
            if (key.empty()) bad(src_, strf("metadata key %llu at offset %llu is empty", (ull)i, (ull)at));
            uint32_t vt = cur_.rd<uint32_t>("metadata value type");
            if (!valid_value_type(vt)) bad(src_, strf("metadata key %s has unknown value type %u", show(key).c_str(), vt));
            Value v = read_value(static_cast<ValueType>(vt), key, 0);
            if (out.kv_index.count(key)) bad(src_, "duplicate metadata key " + show(key));
            out.kv_index.emplace(key, out.kv.size());
            out.kv.emplace_back(std::move(key), std::move(v));
        }
    }

    Value read_value(ValueType t, const std::string &key, int depth) {
        Value v;
        v.type = t;
        switch (t) {
        case ValueType::U8: v.u = cur_.rd<uint8_t>("u8 value"); break;
        case ValueType::U16: v.u = cur_.rd<uint16_t>("u16 value"); break;
        case ValueType::U32: v.u = cur_.rd<uint32_t>("u32 value"); break;
        case ValueType::U64: v.u = cur_.rd<uint64_t>("u64 value"); break;
        case ValueType::I8: v.i = cur_.rd<int8_t>("i8 value"); break;
        case ValueType::I16: v.i = cur_.rd<int16_t>("i16 value"); break;
        case ValueType::I32: v.i = cur_.rd<int32_t>("i32 value"); break;
        case ValueType::I64: v.i = cur_.rd<int64_t>("i64 value"); break;
        case ValueType::F32: v.f = cur_.rd<float>("f32 value"); break;
        case ValueType::F64: v.f = cur_.rd<double>("f64 value"); break;
        case ValueType::BOOL: {
            uint64_t at = cur_.pos;
            uint8_t b = cur_.rd<uint8_t>("bool value");
            if (b > 1) bad(src_, strf("metadata key %s: bool at offset %llu is %u (must be 0 or 1)", show(key).c_str(), (ull)at, b));
            v.b = b != 0;
            break;
        }
        case ValueType::STRING: v.s = cur_.str("string value"); break;
        case ValueType::ARRAY: {
            if (depth >= kMaxArrayDepth)
                bad(src_, strf("metadata key %s: arrays nested deeper than %d levels", show(key).c_str(), kMaxArrayDepth));
            uint32_t et = cur_.rd<uint32_t>("array element type");
            if (!valid_value_type(et)) bad(src_, strf("metadata key %s: array has unknown element type %u", show(key).c_str(), et));
            v.elem_type = static_cast<ValueType>(et);
            uint64_t at = cur_.pos;
            uint64_t count = cur_.rd<uint64_t>("array length");
            if (count > cur_.left() / min_value_bytes(v.elem_type))
                bad(src_, strf("metadata key %s: array length %llu at offset %llu is beyond the end of the file (%llu bytes left)",
                               show(key).c_str(), (ull)count, (ull)at, (ull)cur_.left()));
            if (count > kMaxArrayElems - array_elems_)
                bad(src_, strf("metadata key %s: metadata arrays hold more than %llu elements in total",
                               show(key).c_str(), (ull)kMaxArrayElems));
            array_elems_ += count;
            v.arr.reserve(count);
            for (uint64_t j = 0; j < count; j++) v.arr.push_back(read_value(v.elem_type, key, depth + 1));
            break;
        }
        }
        return v;
    }

    void read_alignment(Parsed &out) {
        auto it = out.kv_index.find("general.alignment");
        if (it == out.kv_index.end()) return;
        const Value &v = out.kv[it->second].second;
        if (!v.is_integer()) bad(src_, strf("general.alignment is a %s, expected an integer", value_type_name(v.type)));
        bool is_unsigned = v.type == ValueType::U8 || v.type == ValueType::U16 || v.type == ValueType::U32 || v.type == ValueType::U64;
        int64_t a = is_unsigned ? static_cast<int64_t>(std::min<uint64_t>(v.u, uint64_t(1) << 40)) : v.i;
        if (a <= 0 || a > (int64_t(1) << 30) || (a & (a - 1)) != 0)
            bad(src_, strf("general.alignment %lld is not a power of two between 1 and 2^30", (ll)a));
        out.alignment = static_cast<uint32_t>(a);
    }

    void read_tensor_infos(Parsed &out, uint64_t n_tensors) {
        out.tensors.reserve(n_tensors);
        std::unordered_map<std::string_view, size_t> names;
        names.reserve(n_tensors);
        for (uint64_t i = 0; i < n_tensors; i++) {
            TensorInfo ti;
            uint64_t at = cur_.pos;
            ti.name = cur_.str("tensor name");
            if (ti.name.empty()) bad(src_, strf("tensor %llu at offset %llu has an empty name", (ull)i, (ull)at));
            const std::string nm = show(ti.name);
            uint32_t nd = cur_.rd<uint32_t>("tensor dimension count");
            if (nd == 0 || nd > 4) bad(src_, strf("tensor %s has %u dimensions (must be 1 to 4)", nm.c_str(), nd));
            int64_t nel = 1;
            for (uint32_t d = 0; d < nd; d++) {
                int64_t e = cur_.rd<int64_t>("tensor dimension");
                if (e <= 0) bad(src_, strf("tensor %s: dimension %u is %lld (must be positive)", nm.c_str(), d, (ll)e));
                if (__builtin_mul_overflow(nel, e, &nel))
                    bad(src_, strf("tensor %s: element count overflows (dimension %u is %lld)", nm.c_str(), d, (ll)e));
                ti.ne.push_back(e);
            }
            uint32_t tid = cur_.rd<uint32_t>("tensor type");
            if (!type_known(tid)) bad(src_, strf("unknown tensor type %u in tensor %s", tid, nm.c_str()));
            ti.type = static_cast<Type>(tid);
            if (!type_supported(ti.type))
                bad(src_, strf("unsupported tensor type %s in tensor %s", type_name(ti.type), nm.c_str()));
            ti.offset = cur_.rd<uint64_t>("tensor data offset");
            int64_t be = type_block_elems(ti.type);
            if (ti.ne[0] % be != 0)
                bad(src_, strf("tensor %s: row length %lld is not a multiple of the %s block size %lld",
                               nm.c_str(), (ll)ti.ne[0], type_name(ti.type), (ll)be));
            uint64_t rowb = static_cast<uint64_t>(ti.ne[0] / be) * static_cast<uint64_t>(type_block_bytes(ti.type));
            if (__builtin_mul_overflow(rowb, static_cast<uint64_t>(nel / ti.ne[0]), &ti.nbytes))
                bad(src_, strf("tensor %s: byte size overflows", nm.c_str()));
            if (names.count(ti.name)) bad(src_, "duplicate tensor name " + nm);
            out.tensors.push_back(std::move(ti));
            // string_view keys point into the stored names; reserve() keeps them stable.
            names.emplace(out.tensors.back().name, i);
        }
    }

    void use_host_tensors(Parsed &out, uint64_t n_tensors, const std::vector<TensorInfo> &host, uint64_t data_start) {
        if (host.size() != n_tensors)
            bad(src_, strf("host tensor directory lists %llu tensors for this file, its header says %llu", (ull)host.size(),
                           (ull)n_tensors));
        // The tensor table lies between the metadata and the data section.
        if (data_start < cur_.pos || data_start > cur_.size)
            bad(src_, strf("host tensor directory: data section offset %llu is outside [%llu, %llu] (after the metadata, "
                           "inside the file)", (ull)data_start, (ull)cur_.pos, (ull)cur_.size));
        if (data_start % out.alignment != 0)
            bad(src_, strf("host tensor directory: data section offset %llu is not a multiple of the alignment %u",
                           (ull)data_start, out.alignment));
        std::unordered_map<std::string_view, size_t> names;
        out.tensors.reserve(host.size());
        for (const TensorInfo &h : host) {
            if (h.name.empty()) bad(src_, "host tensor directory: a tensor has an empty name");
            const std::string nm = show(h.name);
            if (h.ne.empty() || h.ne.size() > 4) bad(src_, strf("tensor %s has %zu dimensions (must be 1 to 4)", nm.c_str(), h.ne.size()));
            int64_t nel = 1;
            for (size_t d = 0; d < h.ne.size(); d++) {
                if (h.ne[d] <= 0) bad(src_, strf("tensor %s: dimension %zu is %lld (must be positive)", nm.c_str(), d, (ll)h.ne[d]));
                if (__builtin_mul_overflow(nel, h.ne[d], &nel)) bad(src_, strf("tensor %s: element count overflows", nm.c_str()));
            }
            if (!type_known(static_cast<uint32_t>(h.type))) bad(src_, strf("unknown tensor type %u in tensor %s", (uint32_t)h.type, nm.c_str()));
            if (!type_supported(h.type)) bad(src_, strf("unsupported tensor type %s in tensor %s", type_name(h.type), nm.c_str()));
            const int64_t be = type_block_elems(h.type);
            if (h.ne[0] % be != 0)
                bad(src_, strf("tensor %s: row length %lld is not a multiple of the %s block size %lld", nm.c_str(), (ll)h.ne[0],
                               type_name(h.type), (ll)be));
            uint64_t nbytes;
            const uint64_t rowb = static_cast<uint64_t>(h.ne[0] / be) * static_cast<uint64_t>(type_block_bytes(h.type));
            if (__builtin_mul_overflow(rowb, static_cast<uint64_t>(nel / h.ne[0]), &nbytes))
                bad(src_, strf("tensor %s: byte size overflows", nm.c_str()));
            if (nbytes != h.nbytes)
                bad(src_, strf("host tensor directory: tensor %s says %llu bytes, its type and shape make %llu", nm.c_str(),
                               (ull)h.nbytes, (ull)nbytes));
            if (names.count(h.name)) bad(src_, "duplicate tensor name " + nm);
            out.tensors.push_back(h);
            out.tensors.back().data = nullptr;
            names.emplace(out.tensors.back().name, out.tensors.size() - 1);
        }
        place_tensors(out, data_start);
    }

    void place_tensors(Parsed &out, uint64_t host_data_start = UINT64_MAX) {
        uint64_t a = out.alignment;
        uint64_t pos = cur_.pos;
        uint64_t pad = (a - pos % a) % a;
        out.data_start = host_data_start != UINT64_MAX ? host_data_start : pos + pad;   // pos <= size < 2^63
        if (out.tensors.empty()) return;
        if (out.data_start > cur_.size)
            bad(src_, strf("tensor data section would start at offset %llu, beyond the end of the file (%llu bytes)",
                           (ull)out.data_start, (ull)cur_.size));
        uint64_t avail = cur_.size - out.data_start;
        for (const TensorInfo &ti : out.tensors) {
            const std::string nm = show(ti.name);
            if (ti.offset % a != 0)
                bad(src_, strf("tensor %s: data offset %llu is not a multiple of the alignment %llu", nm.c_str(), (ull)ti.offset, (ull)a));
            if (ti.offset > avail || ti.nbytes > avail - ti.offset)
                bad(src_, strf("tensor %s: data [%llu, +%llu) lies outside the file (data section holds %llu bytes)",
                               nm.c_str(), (ull)ti.offset, (ull)ti.nbytes, (ull)avail));
        }
        std::vector<size_t> order(out.tensors.size());
        for (size_t i = 0; i < order.size(); i++) order[i] = i;
        std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
            return out.tensors[x].offset < out.tensors[y].offset;
        });
        for (size_t i = 1; i < order.size(); i++) {
            const TensorInfo &p = out.tensors[order[i - 1]], &q = out.tensors[order[i]];
            if (q.offset < p.offset + p.nbytes)
                bad(src_, strf("tensor %s data at offset %llu overlaps tensor %s ending at %llu",
                               show(q.name).c_str(), (ull)q.offset, show(p.name).c_str(), (ull)(p.offset + p.nbytes)));
        }
        for (TensorInfo &ti : out.tensors) ti.data = cur_.p + out.data_start + ti.offset;
    }
};

struct Mapping {
    void *addr = nullptr;
    size_t len = 0;
    Mapping() = default;
    Mapping(const Mapping &) = delete;
    Mapping &operator=(const Mapping &) = delete;
    ~Mapping() {
        if (addr) munmap(addr, len);
    }
};

std::unique_ptr<Mapping> map_file(const std::string &path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(path + ": cannot open: " + std::strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        ::close(fd);
        fail(path + ": cannot stat: " + std::strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        fail(path + ": not a regular file");
    }
    auto m = std::make_unique<Mapping>();
    m->len = static_cast<size_t>(st.st_size);
    if (m->len > 0) {
        void *p = mmap(nullptr, m->len, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            ::close(fd);
            fail(path + ": cannot mmap: " + std::strerror(e));
        }
        m->addr = p;
        // Weights are streamed front to back on every token: ask for huge pages where the
        // page cache can provide them (fewer TLB misses) and no read-around guessing.
        madvise(p, m->len, MADV_HUGEPAGE);
    }
    ::close(fd);
    return m;
}

Parsed parse(const uint8_t *p, uint64_t size, const std::string &src) {
    static const uint8_t empty = 0;
    return Parser(p ? p : &empty, p ? size : 0, src).run();
}

// Reads an integer metadata key of one split; nullopt-like -1 when absent.
int64_t split_key(const Parsed &ps, const char *key, const std::string &src) {
    auto it = ps.kv_index.find(key);
    if (it == ps.kv_index.end()) return -1;
    const Value &v = ps.kv[it->second].second;
    if (!v.is_integer()) bad(src, strf("%s is a %s, expected an integer", key, value_type_name(v.type)));
    if ((v.type == ValueType::U64 && v.u > (uint64_t)INT64_MAX)) bad(src, strf("%s is out of range", key));
    int64_t x = v.as_int();
    if (x < 0) bad(src, strf("%s is negative (%lld)", key, (ll)x));
    return x;
}

}  // namespace

std::string split_path(const std::string &prefix, int k, int n) {
    char buf[64];
    snprintf(buf, sizeof buf, "-%05d-of-%05d.gguf", k, n);
    return prefix + buf;
}

bool parse_split_path(const std::string &path, std::string *prefix, int *k, int *n) {
    // "-00001-of-00003.gguf" is 20 characters.
    static constexpr size_t kTail = 20;
    if (path.size() < kTail) return false;
    std::string_view t(path.data() + path.size() - kTail, kTail);
    auto digits = [&](size_t from, int *out) {
        int v = 0;
        for (size_t i = from; i < from + 5; i++) {
            if (t[i] < '0' || t[i] > '9') return false;
            v = v * 10 + (t[i] - '0');
        }
        *out = v;
        return true;
    };
    int kk, nn;
    if (t[0] != '-' || t.substr(6, 4) != "-of-" || t.substr(15) != ".gguf") return false;
    if (!digits(1, &kk) || !digits(10, &nn)) return false;
    if (nn < 1 || kk < 1 || kk > nn) return false;
    if (prefix) *prefix = path.substr(0, path.size() - kTail);
    if (k) *k = kk;
    if (n) *n = nn;
    return true;
}

struct Reader::Impl {
    uint32_t version = 0;
    uint32_t alignment = kDefaultAlignment;
    int split_count = 1;
    std::vector<std::pair<std::string, Value>> kv;
    std::unordered_map<std::string, size_t> kv_index;
    std::vector<TensorInfo> tensors;
    std::unordered_map<std::string, size_t> tensor_index;
    uint64_t total_bytes = 0;
    std::vector<std::unique_ptr<Mapping>> maps;
    std::vector<std::string> split_paths;
    std::vector<uint64_t> split_data_start;

    // Takes the metadata of the first split and the tensors of every split.
    void assemble(std::vector<Parsed> &splits, const std::vector<std::string> &srcs) {
        Parsed &first = splits[0];
        version = first.version;
        alignment = first.alignment;
        split_count = static_cast<int>(splits.size());
        std::unordered_map<std::string, int> owner;
        for (size_t s = 0; s < splits.size(); s++) {
            for (TensorInfo &ti : splits[s].tensors) {
                ti.split = static_cast<int>(s);
                auto [it, fresh] = owner.emplace(ti.name, static_cast<int>(s));
                if (!fresh)
                    bad(srcs[s], "duplicate tensor name " + show(ti.name) + " (also in " + srcs[it->second] + ")");
                total_bytes += ti.nbytes;
                tensor_index.emplace(ti.name, tensors.size());
                tensors.push_back(std::move(ti));
            }
        }
        kv = std::move(first.kv);
        kv_index = std::move(first.kv_index);
    }
};

Reader::Reader() : impl_(std::make_unique<Impl>()) {}
Reader::~Reader() = default;

std::unique_ptr<Reader> Reader::from_memory(const uint8_t *data, size_t size) {
    std::vector<Parsed> ps;
    std::vector<std::string> srcs{"<memory>"};
    // One image, even when it is one split of a set: split sets are opened from files.
    ps.push_back(parse(data, size, srcs[0]));
    std::unique_ptr<Reader> r(new Reader());
    r->impl_->assemble(ps, srcs);
    return r;
}

std::unique_ptr<Reader> Reader::open(const std::string &path, bool map, const HostDirectory *dir) {
    std::string prefix;
    int k = 0, n = 1;
    std::vector<std::string> paths;
    if (parse_split_path(path, &prefix, &k, &n) && n > 1) {
        for (int i = 1; i <= n; i++) paths.push_back(split_path(prefix, i, n));
    } else {
        n = 1;
        paths.push_back(path);
    }

    std::vector<std::vector<TensorInfo>> host;   // the directory's entries per split
    if (dir) {
        if (dir->data_offset.size() != paths.size())
            bad(path, strf("host tensor directory describes %zu splits, the file name says %zu", dir->data_offset.size(),
                           paths.size()));
        host.resize(paths.size());
        for (const TensorInfo &t : dir->tensors) {
            if (t.split < 0 || static_cast<size_t>(t.split) >= paths.size())
                bad(path, strf("host tensor directory: tensor %s is in split %d of %zu", show(t.name).c_str(), t.split, paths.size()));
            host[t.split].push_back(t);
        }
    }

    std::unique_ptr<Reader> r(new Reader());
    std::vector<Parsed> ps;
    for (size_t s = 0; s < paths.size(); s++) {
        const std::string &p = paths[s];
        auto m = map_file(p);
        const uint8_t *base = static_cast<const uint8_t *>(m->addr);
        static const uint8_t empty = 0;
        if (dir) ps.push_back(Parser(base ? base : &empty, base ? m->len : 0, p).run(&host[s], dir->data_offset[s]));
        else ps.push_back(parse(base, m->len, p));
        if (!map) {
            for (TensorInfo &ti : ps.back().tensors) ti.data = nullptr;
        } else {
            r->impl_->maps.push_back(std::move(m));
        }
    }

    for (int s = 0; s < n; s++) {
        int64_t count = split_key(ps[s], "split.count", paths[s]);
        int64_t no = split_key(ps[s], "split.no", paths[s]);
        if (n == 1) {
            if (count > 1)
                bad(paths[s], strf("split.count is %lld but the file name is not NAME-0000K-of-%05lld.gguf", (ll)count, (ll)count));
            if (no > 0) bad(paths[s], strf("split.no is %lld in an unsplit file", (ll)no));
            continue;
        }
        if (count < 0) bad(paths[s], strf("split file has no split.count key (expected %d)", n));
        if (count != n) bad(paths[s], strf("split.count is %lld but the file name says %d splits", (ll)count, n));
        if (no < 0) bad(paths[s], strf("split file has no split.no key (expected %d)", s));
        if (no != s) bad(paths[s], strf("split.no is %lld but the file name says split %d (split.no counts from 0)", (ll)no, s));
    }
    int64_t want = split_key(ps[0], "split.tensors.count", paths[0]);
    if (want >= 0) {
        uint64_t have = 0;
        for (const Parsed &p : ps) have += p.tensors.size();
        if (static_cast<uint64_t>(want) != have)
            bad(paths[0], strf("split.tensors.count is %lld but the splits hold %llu tensors", (ll)want, (ull)have));
    }
    r->impl_->assemble(ps, paths);
    r->impl_->split_paths = paths;
    for (const Parsed &p : ps) r->impl_->split_data_start.push_back(p.data_start);
    return r;
}

uint32_t Reader::version() const { return impl_->version; }
uint32_t Reader::alignment() const { return impl_->alignment; }
int Reader::split_count() const { return impl_->split_count; }
const std::vector<std::pair<std::string, Value>> &Reader::metadata() const { return impl_->kv; }
const std::vector<TensorInfo> &Reader::tensors() const { return impl_->tensors; }
uint64_t Reader::total_tensor_bytes() const { return impl_->total_bytes; }

const std::string &Reader::split_file(int s) const {
    if (s < 0 || s >= (int)impl_->split_paths.size()) fail(strf("gguf: split %d has no file", s));
    return impl_->split_paths[s];
}

uint64_t Reader::file_offset(const TensorInfo &t) const {
    if (t.split < 0 || t.split >= (int)impl_->split_data_start.size()) fail("gguf: tensor " + t.name + " has no file");
    return impl_->split_data_start[t.split] + t.offset;
}

const Value *Reader::find(std::string_view key) const {
    auto it = impl_->kv_index.find(std::string(key));
    return it == impl_->kv_index.end() ? nullptr : &impl_->kv[it->second].second;
}

const TensorInfo *Reader::tensor(std::string_view name) const {
    auto it = impl_->tensor_index.find(std::string(name));
    return it == impl_->tensor_index.end() ? nullptr : &impl_->tensors[it->second];
}

namespace {
const Value &need_key(const Reader &r, std::string_view key) {
    const Value *v = r.find(key);
    if (!v) fail("gguf: missing metadata key '" + std::string(key) + "'");
    return *v;
}
[[noreturn]] void wrong_type(std::string_view key, const Value &v, const char *want) {
    fail("gguf: metadata key '" + std::string(key) + "' is " + value_type_name(v.type) + ", expected " + want);
}
std::string string_of(std::string_view key, const Value &v) {
    if (v.type != ValueType::STRING) wrong_type(key, v, "a string");
    return v.s;
}
int64_t int_of(std::string_view key, const Value &v) {
    if (!v.is_integer()) wrong_type(key, v, "an integer");
    if (v.type == ValueType::U64 && v.u > static_cast<uint64_t>(INT64_MAX))
        fail("gguf: metadata key '" + std::string(key) + "' value " + std::to_string(v.u) + " does not fit in int64");
    return v.as_int();
}
double float_of(std::string_view key, const Value &v) {
    if (!v.is_integer() && v.type != ValueType::F32 && v.type != ValueType::F64) wrong_type(key, v, "a number");
    return v.as_float();
}
}  // namespace

std::string Reader::get_string(std::string_view key) const { return string_of(key, need_key(*this, key)); }
int64_t Reader::get_int(std::string_view key) const { return int_of(key, need_key(*this, key)); }
double Reader::get_float(std::string_view key) const { return float_of(key, need_key(*this, key)); }

bool Reader::get_bool(std::string_view key) const {
    const Value &v = need_key(*this, key);
    if (v.type != ValueType::BOOL) wrong_type(key, v, "a bool");
    return v.b;
}

const Value &Reader::get_array(std::string_view key) const {
    const Value &v = need_key(*this, key);
    if (v.type != ValueType::ARRAY) wrong_type(key, v, "an array");
    return v;
}

int64_t Reader::get_int(std::string_view key, int64_t dflt) const {
    const Value *v = find(key);
    return v ? int_of(key, *v) : dflt;
}

double Reader::get_float(std::string_view key, double dflt) const {
    const Value *v = find(key);
    return v ? float_of(key, *v) : dflt;
}

std::string Reader::get_string(std::string_view key, const std::string &dflt) const {
    const Value *v = find(key);
    return v ? string_of(key, *v) : dflt;
}

}  // namespace ds4::gguf
