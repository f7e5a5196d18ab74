// The disk's raw sequential bandwidth, for the store benchmarks to compare against. Every
// figure bypasses the page cache (O_DIRECT), so what is measured is the device (or, in a
// VM, whatever the hypervisor puts behind the virtual disk).
//
// Two read figures, because on a VM they differ a lot:
//   dd-like:     4 MiB requests into ONE reused 4 MiB buffer (`dd iflag=direct bs=4M
//                of=/dev/null`). The destination stays in the CPU cache, which flatters a
//                disk that is really the host's page cache.
//   into memory: the same requests, each into its own place in a file-sized buffer (what
//                loading a file into memory has to do: every byte lands in DRAM).
//   queued:      the same requests into a file-sized buffer, N of them in flight at once
//                (N threads issuing preads, as `fio --iodepth=N` would): what the device
//                gives when it is kept busy. This is the strictest ceiling, because the
//                store keeps several io_uring requests in flight too.
// A store load has to keep the bytes, so "into memory" and "queued" are its like-for-like
// ceilings; the benchmarks report all three and judge the store against the best.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ds4::bench {

// MiB/s for reading the first `bytes` of `path` with O_DIRECT, 4 MiB at a time (one
// request for smaller files). dst == nullptr: the dd-like pass into one reused buffer;
// otherwise into dst[0, bytes) (dst 4096-aligned, bytes rounded up to 4096 readable).
// Returns a negative value (-errno) when the file cannot be opened or read.
double raw_read_mibs(const std::string &path, uint8_t *dst, size_t bytes);

// MiB/s for writing src[0, bytes) as the whole of `path` with O_DIRECT, 4 MiB at a time,
// then fsync (dd oflag=direct conv=fsync). src 4096-aligned. -errno on failure.
// MiB/s for reading the first `bytes` of `path` into dst with O_DIRECT, 4 MiB requests,
// `depth` of them in flight (one thread each, chunk i read by thread i % depth). Same
// buffer rules as raw_read_mibs. -errno on failure.
double raw_read_queued_mibs(const std::string &path, uint8_t *dst, size_t bytes, unsigned depth);

double raw_write_mibs(const std::string &path, const uint8_t *src, size_t bytes);

double median(std::vector<double> v);

inline double mibs(uint64_t bytes, double seconds) { return seconds > 0 ? double(bytes) / (1 << 20) / seconds : 0; }

double now_s();

}  // namespace ds4::bench
