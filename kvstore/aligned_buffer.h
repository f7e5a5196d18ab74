// A heap buffer aligned for O_DIRECT transfers, with capacity rounded up to the
// alignment so a direct read may overrun the logical size by less than one block.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>

namespace ds4::kvstore {

inline constexpr size_t kIoAlign = 4096;

inline size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

class AlignedBuffer {
public:
    AlignedBuffer() = default;
    // Throws std::bad_alloc.
    explicit AlignedBuffer(size_t size) { resize(size); }
    AlignedBuffer(const AlignedBuffer &) = delete;
    AlignedBuffer &operator=(const AlignedBuffer &) = delete;
    AlignedBuffer(AlignedBuffer &&o) noexcept { swap(o); }
    AlignedBuffer &operator=(AlignedBuffer &&o) noexcept {
        AlignedBuffer(std::move(o)).swap(*this);
        return *this;
    }
    ~AlignedBuffer() { std::free(data_); }

    // Discards the contents when it has to reallocate.
    void resize(size_t size) {
        const size_t cap = round_up(size ? size : 1, kIoAlign);
        if (cap > cap_) {
            void *p = std::aligned_alloc(kIoAlign, cap);
            if (!p) throw std::bad_alloc();
            std::free(data_);
            data_ = static_cast<uint8_t *>(p);
            cap_ = cap;
        }
        size_ = size;
    }
    void swap(AlignedBuffer &o) noexcept {
        std::swap(data_, o.data_);
        std::swap(size_, o.size_);
        std::swap(cap_, o.cap_);
    }

    uint8_t *data() { return data_; }
    const uint8_t *data() const { return data_; }
    size_t size() const { return size_; }
    size_t capacity() const { return cap_; }

private:
    uint8_t *data_ = nullptr;
    size_t size_ = 0;
    size_t cap_ = 0;
};

}  // namespace ds4::kvstore
