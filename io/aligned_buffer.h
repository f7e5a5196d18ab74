// A heap buffer aligned for O_DIRECT transfers, with capacity rounded up to the
// alignment so a direct read may overrun the logical size by less than one block.
// Large buffers are mapped directly and marked for transparent huge pages: a buffer of
// hundreds of MB would otherwise take one page fault per 4 KiB.
#pragma once
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>

namespace ds4::io {

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
    ~AlignedBuffer() { release(); }

    // Keeps the allocation when it is big enough; otherwise reallocates and discards the
    // contents.
    void resize(size_t size) {
        const size_t cap = round_up(size ? size : 1, kIoAlign);
        if (cap > cap_) {
            uint8_t *p = nullptr;
            size_t got = cap;
            bool mapped = false;
            if (cap >= kHugeThreshold) {
                got = round_up(cap, kHugePage);
                void *m = mmap(nullptr, got, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                if (m != MAP_FAILED) {
                    madvise(m, got, MADV_HUGEPAGE);  // advisory; fine if refused
                    p = static_cast<uint8_t *>(m);
                    mapped = true;
                }
            }
            if (!p) {
                got = cap;
                p = static_cast<uint8_t *>(std::aligned_alloc(kIoAlign, cap));
                if (!p) throw std::bad_alloc();
            }
            release();
            data_ = p;
            cap_ = got;
            mapped_ = mapped;
        }
        size_ = size;
    }
    void swap(AlignedBuffer &o) noexcept {
        std::swap(data_, o.data_);
        std::swap(size_, o.size_);
        std::swap(cap_, o.cap_);
        std::swap(mapped_, o.mapped_);
    }

    uint8_t *data() { return data_; }
    const uint8_t *data() const { return data_; }
    size_t size() const { return size_; }
    size_t capacity() const { return cap_; }

private:
    static constexpr size_t kHugePage = size_t(2) << 20;
    static constexpr size_t kHugeThreshold = size_t(4) << 20;

    void release() noexcept {
        if (!data_) return;
        if (mapped_) munmap(data_, cap_);
        else std::free(data_);
        data_ = nullptr;
        cap_ = size_ = 0;
        mapped_ = false;
    }

    uint8_t *data_ = nullptr;
    size_t size_ = 0;
    size_t cap_ = 0;
    bool mapped_ = false;
};

}  // namespace ds4::io
