// Device memory another process can map (ARCHITECTURE.md §5, "Shared drafter"): one CUDA VMM
// allocation (cuMemCreate with a POSIX file-descriptor handle, reserved and mapped into this
// process's address space) that the exporter fills and hands out as a descriptor, and that an
// importer maps without copying. The driver API is reached through the runtime's entry-point
// query, so binaries do not link libcuda.so.1 and still start (and fall back to the CPU) on
// machines without a driver.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "engine/backend/backend.h"

namespace ds4::cuda {

class VmmAllocation {
public:
    // An exportable allocation of at least `bytes` on the current device, mapped read-write;
    // nullptr with *why set when the driver or the device cannot (no VMM, no POSIX handles).
    static std::unique_ptr<VmmAllocation> create(uint64_t bytes, std::string *why);
    // Maps the allocation behind `fd` (borrowed: the caller closes it) that the exporter
    // described as `layout`; read-only where the driver allows it, else read-write (and never
    // written). nullptr with *why set on any mismatch (another GPU, another size) or failure.
    static std::unique_ptr<VmmAllocation> import(int fd, const DeviceWeightsLayout &layout, std::string *why);
    ~VmmAllocation();
    VmmAllocation(const VmmAllocation &) = delete;
    VmmAllocation &operator=(const VmmAllocation &) = delete;

    void *ptr() const { return reinterpret_cast<void *>(static_cast<uintptr_t>(va_)); }
    uint64_t bytes() const { return bytes_; }
    uint64_t granularity() const { return granularity_; }
    bool read_only() const { return read_only_; }
    // A new descriptor for the allocation (owned by this object, closed with it); -1 with
    // *why set when the export fails.
    int export_fd(std::string *why);

private:
    VmmAllocation() = default;
    unsigned long long handle_ = 0;   // CUmemGenericAllocationHandle
    unsigned long long va_ = 0;       // CUdeviceptr
    uint64_t bytes_ = 0, granularity_ = 0;
    bool created_ = false, reserved_ = false, mapped_ = false, read_only_ = false;
    int fd_ = -1;
};

// The current device's UUID (cudaDeviceProp::uuid); false when it cannot be read.
bool current_device_uuid(uint8_t out[16]);

}  // namespace ds4::cuda
