// GGUF v3 writer. Everything is validated when added, so a written file always passes the
// reader. Output goes to PATH.tmp, is fsync'd and renamed, so PATH is either the old file
// or the complete new one; on any error the temp file is removed.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <unordered_set>

#include "engine/common/error.h"
#include "engine/gguf/gguf.h"

namespace ds4::gguf {

struct Writer::Pending {
    std::string name;
    Type type = Type::F32;
    std::vector<int64_t> ne;
    uint64_t nbytes = 0;
    std::vector<uint8_t> data;   // add_tensor: a copy
    FillFn fill;                 // add_tensor_fill: produced at write time (empty = hole)
    bool copied = false;
};

namespace {

constexpr int kMaxArrayDepth = 8;   // the reader's limit
constexpr size_t kFillChunk = 4u << 20;

bool valid_value_type(ValueType t) { return static_cast<uint32_t>(t) <= static_cast<uint32_t>(ValueType::F64); }

void check_value(const std::string &key, const Value &v, int depth) {
    auto range = [&](bool ok) {
        if (!ok) fail("gguf writer: key '" + key + "': value out of range for " + value_type_name(v.type));
    };
    switch (v.type) {
    case ValueType::U8: range(v.u <= UINT8_MAX); break;
    case ValueType::U16: range(v.u <= UINT16_MAX); break;
    case ValueType::U32: range(v.u <= UINT32_MAX); break;
    case ValueType::I8: range(v.i >= INT8_MIN && v.i <= INT8_MAX); break;
    case ValueType::I16: range(v.i >= INT16_MIN && v.i <= INT16_MAX); break;
    case ValueType::I32: range(v.i >= INT32_MIN && v.i <= INT32_MAX); break;
    case ValueType::U64: case ValueType::I64: case ValueType::F32: case ValueType::F64:
    case ValueType::BOOL: case ValueType::STRING:
        break;
    case ValueType::ARRAY:
        if (depth >= kMaxArrayDepth) fail("gguf writer: key '" + key + "': arrays nested too deeply");
        if (!valid_value_type(v.elem_type)) fail("gguf writer: key '" + key + "': bad array element type");
        for (const Value &e : v.arr) {
            if (e.type != v.elem_type)
                fail("gguf writer: key '" + key + "': array of " + value_type_name(v.elem_type) + " holds a " +
                     value_type_name(e.type));
            check_value(key, e, depth + 1);
        }
        break;
    default:
        fail("gguf writer: key '" + key + "': unknown value type " + std::to_string(static_cast<uint32_t>(v.type)));
    }
}

uint64_t check_tensor(const std::string &name, Type type, const std::vector<int64_t> &ne) {
    if (name.empty()) fail("gguf writer: empty tensor name");
    if (!type_known(static_cast<uint32_t>(type)))
        fail("gguf writer: tensor '" + name + "': unknown type " + std::to_string(static_cast<uint32_t>(type)));
    if (ne.empty() || ne.size() > 4)
        fail("gguf writer: tensor '" + name + "' has " + std::to_string(ne.size()) + " dimensions (must be 1 to 4)");
    int64_t nel = 1;
    for (int64_t d : ne) {
        if (d <= 0) fail("gguf writer: tensor '" + name + "': dimension " + std::to_string(d) + " is not positive");
        if (__builtin_mul_overflow(nel, d, &nel)) fail("gguf writer: tensor '" + name + "': element count overflows");
    }
    uint64_t row;
    try {
        row = row_bytes(type, ne[0]);
    } catch (const Error &e) {
        fail("gguf writer: tensor '" + name + "': " + e.what());
    }
    uint64_t total;
    if (__builtin_mul_overflow(row, static_cast<uint64_t>(nel / ne[0]), &total))
        fail("gguf writer: tensor '" + name + "': byte size overflows");
    return total;
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

void put_bytes(std::vector<uint8_t> &b, const void *p, size_t n) {
    size_t o = b.size();
    b.resize(o + n);
    if (n) std::memcpy(b.data() + o, p, n);
}
template <class T>
void put(std::vector<uint8_t> &b, T v) {
    put_bytes(b, &v, sizeof v);
}
void put_str(std::vector<uint8_t> &b, const std::string &s) {
    put<uint64_t>(b, s.size());
    put_bytes(b, s.data(), s.size());
}

void put_value(std::vector<uint8_t> &b, const Value &v) {
    switch (v.type) {
    case ValueType::U8: put<uint8_t>(b, static_cast<uint8_t>(v.u)); break;
    case ValueType::U16: put<uint16_t>(b, static_cast<uint16_t>(v.u)); break;
    case ValueType::U32: put<uint32_t>(b, static_cast<uint32_t>(v.u)); break;
    case ValueType::U64: put<uint64_t>(b, v.u); break;
    case ValueType::I8: put<int8_t>(b, static_cast<int8_t>(v.i)); break;
    case ValueType::I16: put<int16_t>(b, static_cast<int16_t>(v.i)); break;
    case ValueType::I32: put<int32_t>(b, static_cast<int32_t>(v.i)); break;
    case ValueType::I64: put<int64_t>(b, v.i); break;
    case ValueType::F32: put<float>(b, static_cast<float>(v.f)); break;
    case ValueType::F64: put<double>(b, v.f); break;
    case ValueType::BOOL: put<uint8_t>(b, v.b ? 1 : 0); break;
    case ValueType::STRING: put_str(b, v.s); break;
    case ValueType::ARRAY:
        put<uint32_t>(b, static_cast<uint32_t>(v.elem_type));
        put<uint64_t>(b, v.arr.size());
        for (const Value &e : v.arr) put_value(b, e);
        break;
    }
}

[[noreturn]] void io_fail(const std::string &what, const std::string &path, int err) {
    fail("gguf writer: " + what + " " + path + ": " + std::strerror(err));
}

void pwrite_all(int fd, const uint8_t *p, size_t n, uint64_t off, const std::string &path) {
    while (n > 0) {
        ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
        if (w < 0) {
            if (errno == EINTR) continue;
            io_fail("cannot write", path, errno);
        }
        if (w == 0) io_fail("cannot write", path, EIO);
        p += w;
        n -= static_cast<size_t>(w);
        off += static_cast<uint64_t>(w);
    }
}

void fsync_dir_of(const std::string &path) {
    size_t slash = path.rfind('/');
    std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;   // the rename itself succeeded; nothing more we can do
    int rc = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (rc != 0 && err != EINVAL && err != EROFS) io_fail("cannot fsync directory", dir, err);
}

}  // namespace

Writer::Writer(uint32_t alignment) : alignment_(alignment) {
    if (alignment == 0 || alignment > (1u << 30) || (alignment & (alignment - 1)) != 0)
        fail("gguf writer: alignment " + std::to_string(alignment) + " is not a power of two between 1 and 2^30");
    if (alignment != 32) kv_.emplace_back("general.alignment", Value::u32(alignment));
}

Writer::~Writer() = default;
Writer::Writer(Writer &&) noexcept = default;
Writer &Writer::operator=(Writer &&) noexcept = default;

void Writer::set(const std::string &key, Value v) {
    if (key.empty()) fail("gguf writer: empty metadata key");
    check_value(key, v, 0);
    if (key == "general.alignment") {
        if (v.type != ValueType::U32 || v.u == 0 || v.u > (1u << 30) || (v.u & (v.u - 1)) != 0)
            fail("gguf writer: general.alignment must be a u32 power of two between 1 and 2^30");
        alignment_ = static_cast<uint32_t>(v.u);
    }
    for (auto &kv : kv_) {
        if (kv.first == key) {
            kv.second = std::move(v);
            return;
        }
    }
    kv_.emplace_back(key, std::move(v));
}

void Writer::add_tensor(const std::string &name, Type type, std::vector<int64_t> ne, const void *data, size_t nbytes) {
    uint64_t want = check_tensor(name, type, ne);
    if (nbytes != want)
        fail("gguf writer: tensor '" + name + "' needs " + std::to_string(want) + " bytes, got " + std::to_string(nbytes));
    if (nbytes > 0 && !data) fail("gguf writer: tensor '" + name + "': null data");
    auto p = std::make_unique<Pending>();
    p->name = name;
    p->type = type;
    p->ne = std::move(ne);
    p->nbytes = want;
    const auto *c = static_cast<const uint8_t *>(data);
    p->data.assign(c, c + nbytes);
    p->copied = true;
    tensors_.push_back(std::move(p));
}

void Writer::add_tensor_fill(const std::string &name, Type type, std::vector<int64_t> ne, FillFn fill) {
    uint64_t want = check_tensor(name, type, ne);
    auto p = std::make_unique<Pending>();
    p->name = name;
    p->type = type;
    p->ne = std::move(ne);
    p->nbytes = want;
    p->fill = std::move(fill);
    tensors_.push_back(std::move(p));
}

size_t Writer::tensor_count() const { return tensors_.size(); }

void Writer::write(const std::string &path) const {
    std::unordered_set<std::string_view> names;
    for (const auto &t : tensors_)
        if (!names.insert(t->name).second) fail("gguf writer: duplicate tensor name '" + t->name + "'");

    const uint64_t a = alignment_;
    std::vector<uint8_t> hdr;
    put_bytes(hdr, "GGUF", 4);
    put<uint32_t>(hdr, 3);
    put<uint64_t>(hdr, tensors_.size());
    put<uint64_t>(hdr, kv_.size());
    for (const auto &kv : kv_) {
        put_str(hdr, kv.first);
        put<uint32_t>(hdr, static_cast<uint32_t>(kv.second.type));
        put_value(hdr, kv.second);
    }
    std::vector<uint64_t> offsets;
    uint64_t off = 0;
    for (const auto &t : tensors_) {
        put_str(hdr, t->name);
        put<uint32_t>(hdr, static_cast<uint32_t>(t->ne.size()));
        for (int64_t d : t->ne) put<int64_t>(hdr, d);
        put<uint32_t>(hdr, static_cast<uint32_t>(t->type));
        put<uint64_t>(hdr, off);
        offsets.push_back(off);
        if (t->nbytes > UINT64_MAX / 2 - off) fail("gguf writer: total tensor size overflows");
        off = align_up(off + t->nbytes, a);
    }
    const uint64_t data_start = align_up(hdr.size(), a);
    hdr.resize(data_start, 0);
    const uint64_t total = data_start + off;

    const std::string tmp = path + ".tmp";
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) io_fail("cannot create", tmp, errno);
    try {
        pwrite_all(fd, hdr.data(), hdr.size(), 0, tmp);
        std::vector<uint8_t> buf;
        for (size_t i = 0; i < tensors_.size(); i++) {
            const Pending &t = *tensors_[i];
            uint64_t base = data_start + offsets[i];
            if (t.copied) {
                pwrite_all(fd, t.data.data(), t.data.size(), base, tmp);
            } else if (t.fill) {
                buf.resize(static_cast<size_t>(std::min<uint64_t>(kFillChunk, t.nbytes)));
                for (uint64_t o = 0; o < t.nbytes; o += buf.size()) {
                    size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), t.nbytes - o));
                    t.fill(o, buf.data(), n);
                    pwrite_all(fd, buf.data(), n, base + o, tmp);
                }
            }
        }
        // Sets the size, leaving holes (unfilled tensors, padding) unallocated.
        if (::ftruncate(fd, static_cast<off_t>(total)) != 0) io_fail("cannot resize", tmp, errno);
        if (::fsync(fd) != 0) io_fail("cannot fsync", tmp, errno);
        int rc = ::close(fd);
        fd = -1;
        if (rc != 0) io_fail("cannot close", tmp, errno);
        if (::rename(tmp.c_str(), path.c_str()) != 0) io_fail("cannot rename to", path, errno);
    } catch (...) {
        if (fd >= 0) ::close(fd);
        ::unlink(tmp.c_str());
        throw;
    }
    fsync_dir_of(path);
}

}  // namespace ds4::gguf
