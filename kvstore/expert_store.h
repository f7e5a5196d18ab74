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
// bytes stay in the data file until compact() rewrites it.
//
// Each model may record the GGUF it was filled from (set_source: path and size), so that
// compact() can drop the models no longer present. An open store holds a shared lock on
// DIR/lock; compact() takes it exclusively, so it never runs under a live store.
//
// Thread-safe. Knows nothing of models beyond the fingerprint and the source's path.
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

// What the store holds for one model (ExpertStore::list).
struct ExpertStoreModel {
    uint64_t fingerprint = 0;
    std::string source;           // the GGUF it was filled from; empty when never recorded
    uint64_t source_bytes = 0;    // its size then
    bool source_present = false;  // a file of that size is at `source` now
    uint64_t records = 0, record_bytes = 0;  // indexed records and their bytes
    uint64_t file_bytes = 0;      // the data file's size: record_bytes plus holes
    uint64_t used_experts = 0;    // experts with use counts
};

struct ExpertStoreCompaction {
    std::vector<uint64_t> keep;   // fingerprints kept whatever their source says
    bool drop_unknown = false;    // also drop models whose source was never recorded
};

struct ExpertStoreCompactReport {
    uint64_t models_kept = 0, models_removed = 0;
    uint64_t records_kept = 0, records_corrupt = 0;  // corrupt: failed their checksum, dropped
    uint64_t bytes_before = 0, bytes_after = 0;      // all data files
    uint64_t files_removed = 0;   // data files of no indexed model, leftovers, moved-aside indexes
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
    // Records the GGUF this model's experts come from (its path and current size).
    Status set_source(const std::string &gguf_path);

    // Every model the store in `dir` holds. Reads the index without locking the store.
    static Status list(const std::string &dir, std::vector<ExpertStoreModel> *out);
    // Drops the models whose recorded source is gone (a missing file, another size) unless
    // kept, then rewrites each kept model's data file with its indexed records back to back
    // (each checked against its checksum; one that fails is dropped, to be read from the
    // GGUF again), keeping the use counts; removes data files no index entry refers to,
    // leftovers of an interrupted compaction and moved-aside damaged indexes. kBusy when a
    // store in `dir` is open. A crash part way leaves records that fail their checksum or
    // lie past the end of the file: they are read from the GGUF again, never used.
    static Status compact(const std::string &dir, const ExpertStoreCompaction &opt, ExpertStoreCompactReport *out);
    const std::string &data_path() const { return data_path_; }

private:
    ExpertStore() = default;
    static uint64_t key(int layer, int expert) { return (uint64_t(uint32_t(layer)) << 32) | uint32_t(expert); }

    mutable std::mutex mu_;
    std::string dir_, data_path_;
    uint64_t fp_ = 0;
    struct Env;
    std::unique_ptr<Env> env_;
    int read_fd_ = -1, write_fd_ = -1, lock_fd_ = -1;
    uint64_t end_ = 0;  // next free aligned offset in the data file
    std::unordered_map<uint64_t, ExpertRecord> index_;
    std::unordered_map<uint64_t, uint64_t> usage_;
};

}  // namespace ds4::kvstore
