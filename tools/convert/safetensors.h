// Read-only safetensors access: one file, or a sharded set described by
// model.safetensors.index.json. Files are mmap'd; every header field is validated
// (lengths, dtypes, shapes, offsets inside the data section, no overlaps) before any
// tensor is handed out, and errors name the file and tensor.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace ds4::convert {

enum class StDtype { F32, F16, BF16, I64, I32 };
const char *st_dtype_name(StDtype t);
int st_dtype_size(StDtype t);

struct StTensor {
    std::string name;
    StDtype dtype = StDtype::F32;
    std::vector<int64_t> shape;   // torch order: shape.back() is contiguous
    const uint8_t *data = nullptr;
    uint64_t nbytes = 0;
    std::string file;             // which file holds it (for messages)

    int64_t nelements() const;
    // Elements [first, first + n) converted to f32 (float dtypes only).
    void read_f32(int64_t first, int64_t n, float *out) const;
    // Every element as int64 (integer dtypes only).
    std::vector<int64_t> read_ints() const;
};

class SafetensorsSet {
public:
    // DIR/model.safetensors.index.json when present (sharded), else DIR/model.safetensors.
    static SafetensorsSet open_dir(const std::string &dir);
    // One file.
    static SafetensorsSet open_file(const std::string &path);

    SafetensorsSet();
    ~SafetensorsSet();
    SafetensorsSet(SafetensorsSet &&) noexcept;
    SafetensorsSet &operator=(SafetensorsSet &&) noexcept;

    const std::vector<StTensor> &tensors() const { return tensors_; }
    const StTensor *find(const std::string &name) const;
    uint64_t total_bytes() const;

private:
    struct Mapping;
    void add_file(const std::string &path, const std::string &display);
    std::vector<std::unique_ptr<Mapping>> maps_;
    std::vector<StTensor> tensors_;
    std::unordered_map<std::string, size_t> index_;
};

}  // namespace ds4::convert
