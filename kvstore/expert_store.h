// The expert store: a model's routed experts re-laid out for aligned direct reads, for SSD
// expert streaming (ARCHITECTURE.md §5, §7). Records are opaque byte blocks (the engine
// decides their layout) appended at aligned offsets of one data file per model; an LMDB
// index maps (model fingerprint, layer, expert) to (offset, length, XXH64 checksum) and
// keeps per-expert use counts, so a restart can load the hot set first.
//
// Everything in it can be rebuilt from the GGUF, so it favours speed over durability: the
// index is written without fsync (MDB_NOSYNC), a damaged or unreadable index is moved aside
// and started afresh, and every record is checked against its checksum when read (the
// caller reads it, then calls verify()). A record that fails is replaced by put(); the old
// bytes stay in the data file until it is removed (no compaction yet).
//
// Thread-safe. Knows nothing of models beyond the fingerprint.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvstore/status.h"

namespace ds4::kvstore {

struct ExpertRecord {
    uint64_t offset = 0;  // aligned to 4096
    uint64_t length = 0;
    uint64_t checksum = 0;  // XXH64 of the bytes
};

class ExpertStore {
public:
    ~ExpertStore();
    // Opens (creating) the store in `dir` for the model with this fingerprint.
    static Status open(const std::string &dir, uint64_t fingerprint, std::unique_ptr<ExpertStore> *out);

    bool find(int layer, int expert, ExpertRecord *out) const;
    // The data file, opened for O_DIRECT reads where the file system allows.
    int read_fd() const { return read_fd_; }
    static bool verify(const ExpertRecord &rec, const uint8_t *data, uint64_t length);
    // Appends the record at the next aligned offset and indexes it (replacing any older one).
    // `length` must be a multiple of 4096 (so O_DIRECT reads of it are legal).
    Status put(int layer, int expert, const uint8_t *data, uint64_t length);
    // counts[layer * n_expert + e] are added to the persisted use counts.
    Status add_usage(const std::vector<uint32_t> &counts, int n_expert);
    // (layer, expert) by use count, most used first, at most `max`.
    std::vector<std::pair<int, int>> hot_set(size_t max) const;
    uint64_t use_count(int layer, int expert) const;
    size_t records() const;
    // Makes the data file and the index durable (done on close too).
    Status flush();
    const std::string &data_path() const { return data_path_; }

private:
    ExpertStore() = default;
    static uint64_t key(int layer, int expert) { return (uint64_t(uint32_t(layer)) << 32) | uint32_t(expert); }

    mutable std::mutex mu_;
    std::string dir_, data_path_;
    uint64_t fp_ = 0;
    struct Env;
    std::unique_ptr<Env> env_;
    int read_fd_ = -1, write_fd_ = -1;
    uint64_t end_ = 0;  // next free aligned offset in the data file
    std::unordered_map<uint64_t, ExpertRecord> index_;
    std::unordered_map<uint64_t, uint64_t> usage_;
};

}  // namespace ds4::kvstore
