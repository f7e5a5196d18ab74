// A drafter shared read-only across processes (ARCHITECTURE.md §5, "Shared drafter"): ds4d
// copies the drafter's GGUF into a sealed memfd, opens its own drafter from that memfd (so
// its pages are the ones importers map: one copy in RAM however many processes use it) and
// hands the descriptor to peers that send GetDrafter. The fd passes in the ancillary data of
// the reply's first byte (SCM_RIGHTS); ds4d keeps only its one descriptor.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ds4::daemon {

// A process that received the drafter, by its connection's peer credentials.
struct DrafterImporter {
    int32_t pid = 0;
    uint32_t uid = 0;
    uint64_t first_unix = 0, last_unix = 0;  // its first and latest share
    uint32_t shares = 0;                     // descriptors it received
    uint64_t bytes = 0;
    bool mapped = false;  // maps the memfd now (filled in by sharing())
};

struct DrafterSharing {
    bool offered = false;  // a drafter is shared (ds4d --drafter without --no-share-drafter)
    uint64_t bytes = 0;
    uint64_t shares = 0;   // descriptors passed since start
    std::vector<DrafterImporter> importers;  // most recent first
};

class DrafterExport {
public:
    // Copies PATH into a new memfd and seals it (write, shrink, grow, seal). Throws
    // std::runtime_error naming the step that failed.
    static std::unique_ptr<DrafterExport> create(const std::string &path);
    ~DrafterExport();
    DrafterExport(const DrafterExport &) = delete;
    DrafterExport &operator=(const DrafterExport &) = delete;

    // The path the bridge opens the drafter from (/proc/self/fd/N of the memfd).
    std::string open_path() const;
    uint64_t bytes() const { return bytes_; }

    // The drafter's identity once the bridge has opened it; nothing is offered before.
    void set_identity(uint64_t fingerprint, uint32_t n_vocab);
    bool ready() const { return ready_; }

    // The drafter's weights in GPU memory (ds4d --drafter on the CUDA backend): `fd` is the
    // bridge's exportable handle (ds4_bridge_drafter_device), duplicated here. Throws
    // std::runtime_error when it cannot be duplicated.
    struct Device {
        uint64_t bytes = 0, granularity = 0, layout_hash = 0;
        uint8_t uuid[16] = {};
    };
    void set_device(int fd, const Device &d);
    bool has_device() const { return device_fd_ >= 0; }
    const Device &device() const { return device_; }

    // The DrafterShare reply for request `rid` (a complete frame), with the device
    // descriptor when `device` (and has_device()).
    std::vector<uint8_t> share_frame(uint64_t rid, bool device = false) const;
    // Writes `frame` to the connected socket `sock` without blocking, the memfd (and with
    // `device`, the device handle after it) attached to its first byte. Returns the bytes
    // written (the rest, if any, is the caller's to write in order) or -1 with errno set
    // (nothing written, no descriptor passed).
    long send_share(int sock, const std::vector<uint8_t> &frame, bool device = false) const;

    // Records a descriptor passed to the process `pid` of user `uid` (the loop thread's).
    // The latest kImportersKept processes are kept; an older one is forgotten first.
    void record_share(int32_t pid, uint32_t uid);
    // The shares so far, each importer marked by whether it maps the memfd now (its
    // /proc/PID/maps lists the memfd's device and inode; a pid reused by another program
    // does not). Reads one small procfs file per importer.
    DrafterSharing sharing() const;
    static constexpr size_t kImportersKept = 64;

private:
    DrafterExport() = default;
    int fd_ = -1;
    uint64_t dev_ = 0, ino_ = 0;  // the memfd's identity, as /proc/PID/maps shows it
    uint64_t shares_ = 0;
    std::vector<DrafterImporter> importers_;  // oldest first
    uint64_t bytes_ = 0;
    uint64_t fingerprint_ = 0;
    uint32_t n_vocab_ = 0;
    bool ready_ = false;
    int device_fd_ = -1;
    Device device_;
};

// Exports a connection may ask for: each one puts a descriptor in the peer's table, so a
// client asking in a loop is refused past this.
inline constexpr int kDrafterSharesPerConnection = 4;

}  // namespace ds4::daemon
