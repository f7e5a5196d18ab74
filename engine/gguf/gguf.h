// GGUF v3 reader and writer.
//
// The reader validates everything before handing anything out (magic, version, counts,
// string lengths, nested arrays, tensor dims/offsets/sizes against the file size,
// duplicate names, unknown types) and throws ds4::Error with a message that names the
// problem. Tensor data is mmap'd read-only. Split files (NAME-0000K-of-0000N.gguf) are
// opened together and presented as one tensor set; metadata comes from the first split.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ds4::gguf {

// GGML tensor type ids (values are fixed by the format).
enum class Type : uint32_t {
    F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
    Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
    IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
    IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
};

// Types this engine can hold. Others are rejected at open with a clear error.
bool type_supported(Type t);
const char *type_name(Type t);          // "f32", "q8_0", ... ("?" for unknown)
bool type_from_name(std::string_view name, Type *out);
bool type_known(uint32_t id);           // added: id names a GGML type (supported or not)
int64_t type_block_elems(Type t);       // elements per block (1 for plain types)
int64_t type_block_bytes(Type t);       // bytes per block
// Bytes of a row of n elements; throws when n is not a multiple of the block size.
uint64_t row_bytes(Type t, int64_t n);

enum class ValueType : uint32_t {
    U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
    STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char *value_type_name(ValueType t);   // added: "u32", "string", ... ("?" for unknown)

// One metadata value. Scalars live in u/i/f/b, strings in s, arrays in arr (elem_type
// says what they hold; nested arrays are allowed). Unsigned types use u, signed types i,
// F32/F64 f, BOOL b; the other scalar fields stay 0 (use as_int()/as_float() to read any).
struct Value {
    ValueType type = ValueType::U32;
    uint64_t u = 0;
    int64_t i = 0;
    double f = 0;
    bool b = false;
    std::string s;
    ValueType elem_type = ValueType::U32;
    std::vector<Value> arr;

    static Value u32(uint32_t v);
    static Value i32(int32_t v);
    static Value u64(uint64_t v);
    static Value f32(float v);
    static Value boolean(bool v);
    static Value str(std::string v);
    static Value array(ValueType elem, std::vector<Value> items);
    static Value u32_array(const std::vector<uint32_t> &v);
    static Value i32_array(const std::vector<int32_t> &v);
    static Value f32_array(const std::vector<float> &v);
    static Value str_array(const std::vector<std::string> &v);
    // Added: the remaining scalar types.
    static Value u8(uint8_t v);
    static Value i8(int8_t v);
    static Value u16(uint16_t v);
    static Value i16(int16_t v);
    static Value i64(int64_t v);
    static Value f64(double v);

    bool is_integer() const;       // any signed/unsigned integer type (incl. bool: no)
    int64_t as_int() const;        // integer types; throws otherwise or on overflow
    double as_float() const;       // integer or float types
};

struct TensorInfo {
    std::string name;
    std::vector<int64_t> ne;       // GGML order: ne[0] is the contiguous (fastest) dim
    Type type = Type::F32;
    uint64_t offset = 0;           // offset inside its split's data section
    uint64_t nbytes = 0;
    int split = 0;                 // which split file holds it
    const uint8_t *data = nullptr; // mmap'd bytes (nullptr for a Reader opened with map=false)

    int64_t nelements() const;
    int64_t rows() const;          // nelements / ne[0]
};

// Added: split file names as llama.cpp's gguf-split writes them. split_path("m", 2, 3) is
// "m-00002-of-00003.gguf" (k is 1-based); parse_split_path is its inverse and returns false
// for any other name (including k outside 1..n).
std::string split_path(const std::string &prefix, int k, int n);
bool parse_split_path(const std::string &path, std::string *prefix, int *k, int *n);

// A tensor table parsed by someone else (the bridge's host side): the tensors of every split
// (TensorInfo::split says which; offsets within that split's data section; data unused) and
// where each split's data section starts in its file. Reader::open with one reads only the
// metadata of each file and checks every entry as strictly as its own parse would.
struct HostDirectory {
    std::vector<TensorInfo> tensors;
    std::vector<uint64_t> data_offset;   // one per split
};

class Reader {
public:
    // Opens PATH; when it is split "-00001-of-0000N.gguf", all splits are opened.
    // map=false parses headers only (identification without touching tensor data).
    // dir: the tensor table comes from it instead of the files' own tensor sections.
    static std::unique_ptr<Reader> open(const std::string &path, bool map = true,
                                        const HostDirectory *dir = nullptr);
    // Parses a GGUF image held in memory (used by the fuzzer and tests). The buffer
    // must outlive the Reader.
    static std::unique_ptr<Reader> from_memory(const uint8_t *data, size_t size);
    ~Reader();

    uint32_t version() const;
    uint32_t alignment() const;
    int split_count() const;

    const std::vector<std::pair<std::string, Value>> &metadata() const;
    const Value *find(std::string_view key) const;          // nullptr if absent
    bool has(std::string_view key) const { return find(key) != nullptr; }
    // Typed getters throw ds4::Error naming the key if it is missing or the wrong type.
    std::string get_string(std::string_view key) const;
    int64_t get_int(std::string_view key) const;
    double get_float(std::string_view key) const;
    bool get_bool(std::string_view key) const;
    const Value &get_array(std::string_view key) const;
    // With defaults when absent (still throws on the wrong type).
    int64_t get_int(std::string_view key, int64_t dflt) const;
    double get_float(std::string_view key, double dflt) const;
    std::string get_string(std::string_view key, const std::string &dflt) const;

    const std::vector<TensorInfo> &tensors() const;
    const TensorInfo *tensor(std::string_view name) const;   // nullptr if absent
    uint64_t total_tensor_bytes() const;
    // Where a tensor's bytes lie on disk (readers opened from a path only): the file of its
    // split and the absolute offset in it. Used to read tensors without the mapping.
    const std::string &split_file(int split) const;
    uint64_t file_offset(const TensorInfo &t) const;

private:
    Reader();
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// Builds a GGUF file. Tensors are written in add order, each aligned to `alignment`.
class Writer {
public:
    explicit Writer(uint32_t alignment = 32);
    ~Writer();
    Writer(Writer &&) noexcept;
    Writer &operator=(Writer &&) noexcept;
    void set(const std::string &key, Value v);              // replaces an existing key
    // data must hold row_bytes(type, ne[0]) * rows bytes; it is copied.
    void add_tensor(const std::string &name, Type type, std::vector<int64_t> ne, const void *data, size_t nbytes);
    // A tensor whose bytes are produced at write time, in pieces, so multi-GB tensors
    // never sit in memory: fill(offset, dst, n) writes bytes [offset, offset+n) of the
    // tensor. An empty fill leaves the bytes as a hole (sparse file, reads as zeros).
    using FillFn = std::function<void(uint64_t offset, uint8_t *dst, size_t n)>;
    void add_tensor_fill(const std::string &name, Type type, std::vector<int64_t> ne, FillFn fill);
    size_t tensor_count() const;
    // Writes to path + ".tmp" then renames; throws on I/O errors (full disk included).
    void write(const std::string &path) const;

private:
    struct Pending;
    uint32_t alignment_;
    std::vector<std::pair<std::string, Value>> kv_;
    std::vector<std::unique_ptr<Pending>> tensors_;
};

}  // namespace ds4::gguf
