#include "tools/convert/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/common/error.h"
#include "engine/quant/quants.h"

namespace ds4::convert {

namespace {

constexpr uint64_t kMaxHeader = 100u << 20;   // the format's own limit

bool dtype_from_name(const std::string &s, StDtype *out) {
    static const std::pair<const char *, StDtype> names[] = {
        {"F32", StDtype::F32}, {"F16", StDtype::F16}, {"BF16", StDtype::BF16},
        {"I64", StDtype::I64}, {"I32", StDtype::I32},
    };
    for (const auto &[n, t] : names)
        if (s == n) {
            *out = t;
            return true;
        }
    return false;
}

std::string dir_join(const std::string &dir, const std::string &name) {
    if (dir.empty()) return name;
    return dir.back() == '/' ? dir + name : dir + "/" + name;
}

bool file_exists(const std::string &p) {
    struct stat st;
    return ::stat(p.c_str(), &st) == 0;
}

std::string shape_str(const std::vector<int64_t> &s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); i++) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
}

}  // namespace

const char *st_dtype_name(StDtype t) {
    switch (t) {
    case StDtype::F32: return "F32";
    case StDtype::F16: return "F16";
    case StDtype::BF16: return "BF16";
    case StDtype::I64: return "I64";
    case StDtype::I32: return "I32";
    }
    return "?";
}

int st_dtype_size(StDtype t) {
    switch (t) {
    case StDtype::F32: case StDtype::I32: return 4;
    case StDtype::F16: case StDtype::BF16: return 2;
    case StDtype::I64: return 8;
    }
    return 0;
}

int64_t StTensor::nelements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

void StTensor::read_f32(int64_t first, int64_t n, float *out) const {
    if (first < 0 || n < 0 || first + n > nelements())
        failf("safetensors: %s: element range out of bounds", name.c_str());
    switch (dtype) {
    case StDtype::F32:
        std::memcpy(out, data + first * 4, static_cast<size_t>(n) * 4);
        return;
    case StDtype::F16:
        quant::dequantize_row(gguf::Type::F16, data + first * 2, out, n);
        return;
    case StDtype::BF16:
        quant::dequantize_row(gguf::Type::BF16, data + first * 2, out, n);
        return;
    default:
        failf("safetensors: %s: dtype %s is not a float type", name.c_str(), st_dtype_name(dtype));
    }
}

std::vector<int64_t> StTensor::read_ints() const {
    const int64_t n = nelements();
    std::vector<int64_t> v(static_cast<size_t>(n));
    if (dtype == StDtype::I64) {
        std::memcpy(v.data(), data, static_cast<size_t>(n) * 8);
    } else if (dtype == StDtype::I32) {
        for (int64_t i = 0; i < n; i++) {
            int32_t x;
            std::memcpy(&x, data + i * 4, 4);
            v[static_cast<size_t>(i)] = x;
        }
    } else {
        failf("safetensors: %s: dtype %s is not an integer type", name.c_str(), st_dtype_name(dtype));
    }
    return v;
}

struct SafetensorsSet::Mapping {
    void *base = nullptr;
    size_t size = 0;
    ~Mapping() {
        if (base) ::munmap(base, size);
    }
};

SafetensorsSet::SafetensorsSet() = default;
SafetensorsSet::~SafetensorsSet() = default;
SafetensorsSet::SafetensorsSet(SafetensorsSet &&) noexcept = default;
SafetensorsSet &SafetensorsSet::operator=(SafetensorsSet &&) noexcept = default;

const StTensor *SafetensorsSet::find(const std::string &name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &tensors_[it->second];
}

uint64_t SafetensorsSet::total_bytes() const {
    uint64_t n = 0;
    for (const auto &t : tensors_) n += t.nbytes;
    return n;
}

void SafetensorsSet::add_file(const std::string &path, const std::string &display) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) failf("safetensors: cannot open %s: %s", path.c_str(), std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0) {
        int e = errno;
        ::close(fd);
        failf("safetensors: cannot stat %s: %s", path.c_str(), std::strerror(e));
    }
    const uint64_t fsize = static_cast<uint64_t>(st.st_size);
    if (fsize < 8) {
        ::close(fd);
        failf("safetensors: %s: truncated (%llu bytes, no header length)", display.c_str(),
              static_cast<unsigned long long>(fsize));
    }
    auto m = std::make_unique<Mapping>();
    m->size = static_cast<size_t>(fsize);
    m->base = ::mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    int merr = errno;
    ::close(fd);
    if (m->base == MAP_FAILED) {
        m->base = nullptr;
        failf("safetensors: cannot mmap %s: %s", path.c_str(), std::strerror(merr));
    }
    const auto *bytes = static_cast<const uint8_t *>(m->base);

    uint64_t hlen = 0;
    std::memcpy(&hlen, bytes, 8);   // little-endian host (x86-64)
    if (hlen > kMaxHeader || hlen > fsize - 8)
        failf("safetensors: %s: header length %llu exceeds the file (%llu bytes): truncated or not a safetensors file",
              display.c_str(), static_cast<unsigned long long>(hlen), static_cast<unsigned long long>(fsize));
    const uint64_t data_start = 8 + hlen;
    const uint64_t data_size = fsize - data_start;

    nlohmann::json h;
    try {
        h = nlohmann::json::parse(reinterpret_cast<const char *>(bytes + 8), reinterpret_cast<const char *>(bytes + data_start));
    } catch (const std::exception &e) {
        failf("safetensors: %s: header is not valid JSON: %s", display.c_str(), e.what());
    }
    if (!h.is_object()) failf("safetensors: %s: header is not a JSON object", display.c_str());

    struct Range {
        uint64_t begin, end;
        size_t idx;
    };
    std::vector<Range> ranges;
    for (auto it = h.begin(); it != h.end(); ++it) {
        const std::string &name = it.key();
        if (name == "__metadata__") continue;
        const auto &e = it.value();
        auto bad = [&](const std::string &why) {
            failf("safetensors: %s: tensor %s: %s", display.c_str(), name.c_str(), why.c_str());
        };
        if (!e.is_object()) bad("entry is not an object");
        if (!e.contains("dtype") || !e["dtype"].is_string()) bad("missing dtype");
        if (!e.contains("shape") || !e["shape"].is_array()) bad("missing shape");
        if (!e.contains("data_offsets") || !e["data_offsets"].is_array() || e["data_offsets"].size() != 2)
            bad("missing data_offsets");
        StTensor t;
        t.name = name;
        t.file = display;
        const std::string dt = e["dtype"].get<std::string>();
        if (!dtype_from_name(dt, &t.dtype))
            bad("unsupported dtype " + dt + " (supported: F32, F16, BF16, I64, I32)");
        if (e["shape"].size() > 8) bad("too many dimensions");
        int64_t nel = 1;
        for (const auto &d : e["shape"]) {
            if (!d.is_number_integer() || d.get<int64_t>() < 0) bad("shape entries must be non-negative integers");
            int64_t v = d.get<int64_t>();
            if (__builtin_mul_overflow(nel, v, &nel)) bad("element count overflows");
            t.shape.push_back(v);
        }
        const auto &off = e["data_offsets"];
        if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
            bad("data_offsets must be non-negative integers");
        const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
        if (b > en || en > data_size)
            bad("data_offsets [" + std::to_string(b) + ", " + std::to_string(en) + ") outside the data section (" +
                std::to_string(data_size) + " bytes): file truncated?");
        uint64_t want;
        if (__builtin_mul_overflow(static_cast<uint64_t>(nel), static_cast<uint64_t>(st_dtype_size(t.dtype)), &want))
            bad("byte size overflows");
        if (en - b != want)
            bad("holds " + std::to_string(en - b) + " bytes but " + dt + " " + shape_str(t.shape) + " needs " +
                std::to_string(want));
        t.data = bytes + data_start + b;
        t.nbytes = want;
        if (index_.count(name)) bad("appears in more than one file");
        ranges.push_back({b, en, tensors_.size()});
        index_.emplace(name, tensors_.size());
        tensors_.push_back(std::move(t));
    }
    std::sort(ranges.begin(), ranges.end(), [](const Range &a, const Range &b) { return a.begin < b.begin; });
    for (size_t i = 1; i < ranges.size(); i++)
        if (ranges[i].begin < ranges[i - 1].end && ranges[i].begin != ranges[i].end)
            failf("safetensors: %s: tensors %s and %s overlap", display.c_str(), tensors_[ranges[i - 1].idx].name.c_str(),
                  tensors_[ranges[i].idx].name.c_str());
    ::madvise(m->base, m->size, MADV_SEQUENTIAL);
    maps_.push_back(std::move(m));
}

SafetensorsSet SafetensorsSet::open_file(const std::string &path) {
    SafetensorsSet s;
    s.add_file(path, path);
    return s;
}

SafetensorsSet SafetensorsSet::open_dir(const std::string &dir) {
    SafetensorsSet s;
    const std::string index_path = dir_join(dir, "model.safetensors.index.json");
    if (!file_exists(index_path)) {
        const std::string single = dir_join(dir, "model.safetensors");
        if (!file_exists(single))
            failf("safetensors: %s has neither model.safetensors nor model.safetensors.index.json", dir.c_str());
        s.add_file(single, "model.safetensors");
        return s;
    }
    nlohmann::json idx;
    try {
        std::ifstream f(index_path);
        if (!f) failf("safetensors: cannot read %s", index_path.c_str());
        idx = nlohmann::json::parse(f);
    } catch (const nlohmann::json::exception &e) {
        failf("safetensors: %s is not valid JSON: %s", index_path.c_str(), e.what());
    }
    if (!idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object())
        failf("safetensors: %s has no weight_map object", index_path.c_str());
    std::vector<std::string> files;
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
        if (!it.value().is_string())
            failf("safetensors: %s: weight_map entry for %s is not a file name", index_path.c_str(), it.key().c_str());
        std::string f = it.value().get<std::string>();
        if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
            failf("safetensors: %s: weight_map entry for %s names '%s', not a file in the directory",
                  index_path.c_str(), it.key().c_str(), f.c_str());
        if (std::find(files.begin(), files.end(), f) == files.end()) files.push_back(f);
    }
    for (const auto &f : files) s.add_file(dir_join(dir, f), f);
    // The index and the shards must agree, or a tensor would be silently dropped or doubled.
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
        const StTensor *t = s.find(it.key());
        if (!t)
            failf("safetensors: %s lists tensor %s in %s, but that file does not hold it", index_path.c_str(),
                  it.key().c_str(), it.value().get<std::string>().c_str());
        if (t->file != it.value().get<std::string>())
            failf("safetensors: tensor %s is in %s, but the index says %s", it.key().c_str(), t->file.c_str(),
                  it.value().get<std::string>().c_str());
    }
    for (const auto &t : s.tensors_)
        if (!idx["weight_map"].contains(t.name))
            failf("safetensors: tensor %s in %s is not listed in model.safetensors.index.json", t.name.c_str(),
                  t.file.c_str());
    return s;
}

}  // namespace ds4::convert
