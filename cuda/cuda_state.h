// A session's caches in device memory, laid out like the CPU backend's (rings by absolute
// position, entry arrays), with the trial journal kept on the device too.
#pragma once
#include <vector>

#include "cuda/cuda_buffer.h"
#include "engine/backend/session_state.h"

namespace ds4::cuda {

struct DevComp {
    CompGeometry g;
    DeviceBuffer<float> kv, gate, entries;   // entries: grown by need_entries (session_state.h)
};

struct DevLayer {
    int cap_kv = 0;
    DeviceBuffer<float> kv;
    DevComp comp, icomp;
};

class CudaSessionState final : public SessionState {
public:
    explicit CudaSessionState(const CacheGeometry &g);
    std::vector<DevLayer> layers;

    // Called before a step overwrites ring rows [n0, n0 + n) of (ring, cap, width): with the
    // journal on, the rows' old contents are copied aside on `stream` first.
    void will_write(float *ring, int cap, int width, int64_t n0, int n, cudaStream_t stream);

    // Room for entries [0, n) of c, contents kept. Waits for `stream` first when it grows:
    // kernels queued there may still use the old array.
    void need_entries(DevComp &c, int n, cudaStream_t stream);

    uint64_t memory_bytes() const override;
    void read(int layer, Cache which, int64_t first, int64_t n, float *dst) const override;
    void write(int layer, Cache which, int64_t first, int64_t n, const float *src) override;
    void journal_begin() override;
    void journal_undo_from(int64_t pos) override;
    void journal_end() override;

private:
    struct Saved {
        float *row;
        int64_t pos;
        size_t off;
        int width;
    };
    bool journaling_ = false;
    std::vector<Saved> journal_;
    DeviceBuffer<float> saved_;
    size_t saved_used_ = 0;
};

}  // namespace ds4::cuda
