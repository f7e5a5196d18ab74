#include "cuda/cuda_vmm.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>

namespace ds4::cuda {

namespace {

// The driver calls used here, looked up once through the runtime (no link to libcuda).
struct Driver {
    CUresult (*get_error_name)(CUresult, const char **) = nullptr;
    CUresult (*device_get)(CUdevice *, int) = nullptr;
    CUresult (*device_get_attribute)(int *, CUdevice_attribute, CUdevice) = nullptr;
    CUresult (*granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags) = nullptr;
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long) = nullptr;
    CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
    CUresult (*address_free)(CUdeviceptr, size_t) = nullptr;
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
    CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t) = nullptr;
    CUresult (*export_handle)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long) = nullptr;
    CUresult (*import_handle)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType) = nullptr;
    CUresult (*get_prop)(CUmemAllocationProp *, CUmemGenericAllocationHandle) = nullptr;
    std::string missing;   // the first symbol the driver did not give
};

template <class F> void lookup(Driver &d, F &fn, const char *name) {
    void *p = nullptr;
    cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
    const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q);
#else
    const cudaError_t e = cudaGetDriverEntryPoint(name, &p, cudaEnableDefault, &q);
#endif
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !p) {
        if (d.missing.empty()) d.missing = name;
        return;
    }
    fn = reinterpret_cast<F>(p);
}

const Driver &driver() {
    static Driver d;
    static std::once_flag once;
    std::call_once(once, [] {
        lookup(d, d.get_error_name, "cuGetErrorName");
        lookup(d, d.device_get, "cuDeviceGet");
        lookup(d, d.device_get_attribute, "cuDeviceGetAttribute");
        lookup(d, d.granularity, "cuMemGetAllocationGranularity");
        lookup(d, d.create, "cuMemCreate");
        lookup(d, d.release, "cuMemRelease");
        lookup(d, d.reserve, "cuMemAddressReserve");
        lookup(d, d.address_free, "cuMemAddressFree");
        lookup(d, d.map, "cuMemMap");
        lookup(d, d.unmap, "cuMemUnmap");
        lookup(d, d.set_access, "cuMemSetAccess");
        lookup(d, d.export_handle, "cuMemExportToShareableHandle");
        lookup(d, d.import_handle, "cuMemImportFromShareableHandle");
        lookup(d, d.get_prop, "cuMemGetAllocationPropertiesFromHandle");
    });
    return d;
}

std::string cu_error(const std::string &call, CUresult r) {
    const char *name = nullptr;
    if (driver().get_error_name) driver().get_error_name(r, &name);
    return call + " failed: " + (name ? name : ("CUresult " + std::to_string(int(r))));
}

// The current device, with VMM and POSIX-descriptor handles checked; false with *why.
bool vmm_device(CUdevice *dev, int *ordinal, std::string *why) {
    const Driver &d = driver();
    if (!d.missing.empty()) {
        *why = "the CUDA driver lacks " + d.missing;
        return false;
    }
    if (cudaGetDevice(ordinal) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {   // the primary context
        *why = "no current CUDA device";
        return false;
    }
    CUresult r = d.device_get(dev, *ordinal);
    if (r != CUDA_SUCCESS) return *why = cu_error("cuDeviceGet", r), false;
    int vmm = 0, posix = 0;
    d.device_get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, *dev);
    d.device_get_attribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, *dev);
    if (!vmm) return *why = "the GPU does not support virtual memory management (cuMemCreate)", false;
    if (!posix) return *why = "the GPU does not support POSIX file-descriptor memory handles", false;
    return true;
}

CUmemAllocationProp device_prop(int ordinal) {
    CUmemAllocationProp p{};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = ordinal;
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return p;
}

}  // namespace

bool current_device_uuid(uint8_t out[16]) {
    int dev = 0;
    cudaDeviceProp p{};
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess) return false;
    static_assert(sizeof p.uuid.bytes == 16);
    std::memcpy(out, p.uuid.bytes, 16);
    return true;
}

std::unique_ptr<VmmAllocation> VmmAllocation::create(uint64_t bytes, std::string *why) {
    CUdevice dev{};
    int ordinal = 0;
    if (!vmm_device(&dev, &ordinal, why)) return nullptr;
    const Driver &d = driver();
    const CUmemAllocationProp prop = device_prop(ordinal);
    size_t gran = 0;
    CUresult r = d.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS || gran == 0) return *why = cu_error("cuMemGetAllocationGranularity", r), nullptr;
    std::unique_ptr<VmmAllocation> a(new VmmAllocation());
    a->granularity_ = gran;
    a->bytes_ = (std::max<uint64_t>(bytes, 1) + gran - 1) / gran * gran;
    CUmemGenericAllocationHandle h{};
    if ((r = d.create(&h, a->bytes_, &prop, 0)) != CUDA_SUCCESS) return *why = cu_error("cuMemCreate", r), nullptr;
    a->handle_ = h, a->created_ = true;
    CUdeviceptr va{};
    if ((r = d.reserve(&va, a->bytes_, gran, 0, 0)) != CUDA_SUCCESS) return *why = cu_error("cuMemAddressReserve", r), nullptr;
    a->va_ = va, a->reserved_ = true;
    if ((r = d.map(va, a->bytes_, 0, h, 0)) != CUDA_SUCCESS) return *why = cu_error("cuMemMap", r), nullptr;
    a->mapped_ = true;
    CUmemAccessDesc acc{};
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = ordinal;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if ((r = d.set_access(va, a->bytes_, &acc, 1)) != CUDA_SUCCESS) return *why = cu_error("cuMemSetAccess", r), nullptr;
    return a;
}

std::unique_ptr<VmmAllocation> VmmAllocation::import(int fd, const DeviceWeightsLayout &layout, std::string *why) {
    CUdevice dev{};
    int ordinal = 0;
    if (!vmm_device(&dev, &ordinal, why)) return nullptr;
    uint8_t uuid[16];
    if (!current_device_uuid(uuid)) return *why = "cannot read this GPU's UUID", nullptr;
    if (std::memcmp(uuid, layout.uuid, 16) != 0) return *why = "the exporter's weights are on another GPU", nullptr;
    const Driver &d = driver();
    const CUmemAllocationProp prop = device_prop(ordinal);
    size_t gran = 0;
    CUresult r = d.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS || gran == 0) return *why = cu_error("cuMemGetAllocationGranularity", r), nullptr;
    if (layout.granularity != gran || layout.bytes == 0 || layout.bytes % gran != 0)
        return *why = "the descriptor's size " + std::to_string(layout.bytes) + " / granularity " +
                      std::to_string(layout.granularity) + " do not fit this GPU's granularity " + std::to_string(gran),
               nullptr;
    std::unique_ptr<VmmAllocation> a(new VmmAllocation());
    a->granularity_ = gran;
    a->bytes_ = layout.bytes;
    CUmemGenericAllocationHandle h{};
    r = d.import_handle(&h, reinterpret_cast<void *>(static_cast<uintptr_t>(fd)), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS) return *why = cu_error("cuMemImportFromShareableHandle", r), nullptr;
    a->handle_ = h, a->created_ = true;
    // The allocation must be what the descriptor says: on this device, and big enough
    // (mapping more than it holds fails in cuMemMap below).
    CUmemAllocationProp got{};
    if (d.get_prop(&got, h) == CUDA_SUCCESS &&
        (got.location.type != CU_MEM_LOCATION_TYPE_DEVICE || got.location.id != ordinal))
        return *why = "the imported allocation is not on this GPU", nullptr;
    CUdeviceptr va{};
    if ((r = d.reserve(&va, a->bytes_, gran, 0, 0)) != CUDA_SUCCESS) return *why = cu_error("cuMemAddressReserve", r), nullptr;
    a->va_ = va, a->reserved_ = true;
    if ((r = d.map(va, a->bytes_, 0, h, 0)) != CUDA_SUCCESS)
        return *why = cu_error("cuMemMap of the imported allocation (" + std::to_string(a->bytes_) + " bytes)", r), nullptr;
    a->mapped_ = true;
    CUmemAccessDesc acc{};
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = ordinal;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
    if (d.set_access(va, a->bytes_, &acc, 1) == CUDA_SUCCESS) {
        a->read_only_ = true;
    } else {
        // Drivers that only grant read-write: the weights are still never written here.
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        if ((r = d.set_access(va, a->bytes_, &acc, 1)) != CUDA_SUCCESS) return *why = cu_error("cuMemSetAccess", r), nullptr;
    }
    return a;
}

int VmmAllocation::export_fd(std::string *why) {
    if (fd_ >= 0) return fd_;
    int fd = -1;
    const CUresult r = driver().export_handle(&fd, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (r != CUDA_SUCCESS) return *why = cu_error("cuMemExportToShareableHandle", r), -1;
    return fd_ = fd;
}

VmmAllocation::~VmmAllocation() {
    const Driver &d = driver();
    if (mapped_) {
        cudaDeviceSynchronize();   // no kernel may still read the range being unmapped
        d.unmap(va_, bytes_);
    }
    if (reserved_) d.address_free(va_, bytes_);
    if (created_) d.release(handle_);
    if (fd_ >= 0) ::close(fd_);
}

}  // namespace ds4::cuda
