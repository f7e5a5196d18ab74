// Internals of Store shared by store.cpp (operations) and store_recovery.cpp (open-time
// recovery). Not part of the public API.
#pragma once
#include <lmdb.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kvstore/index_records.h"
#include "kvstore/lmdb_env.h"
#include "kvstore/store.h"

namespace ds4::kvstore {

// One index entry that owns a payload file.
struct Entry {
    EntryKind kind = EntryKind::kSession;
    std::string key;  // sessions: the name; checkpoints: the prefixes-table key
    Record rec;
};

struct Store::Impl {
    StoreOptions opt;
    std::string root, index_dir, payload_dir, quarantine_dir;
    int lock_fd = -1;
    LmdbEnv db;
    std::shared_ptr<FileIo> io;
    std::mutex mu;
    RecoveryReport report;
    uint64_t evictions = 0;
    // LRU clock. Loads only note their use here; the notes reach the index with the next
    // write transaction (or at close), so a load never waits for a commit. A crash loses
    // at most those LRU updates.
    uint64_t seq = 0;
    struct Touch {
        uint64_t file_id, seq, ms;
    };
    std::map<std::pair<EntryKind, std::string>, Touch> touches;

    ~Impl();

    void log(const std::string &line) const;
    std::string payload_path(uint64_t file_id) const;

    Status open_layout();
    Status check_schema();
    Status recover();

    // Writes a payload file durably (temp, fsync, rename, dir fsync). On failure nothing
    // is left behind.
    Status write_payload_file(const uint8_t *data, size_t len, uint64_t *file_id, uint64_t *checksum);
    // Reads and fully verifies an entry's payload. kCorrupt (with *why) when the file is
    // missing, the wrong size, fails its checksum or its header disagrees with the index.
    Status read_payload_file(const Record &rec, AlignedBuffer *buf, payload::Header *hdr, std::string *why);
    // Recovery's check: size and header always, the checksum when `full`.
    Status check_payload_file(const Record &rec, bool full, std::string *why);
    // The token ids stored in an entry's payload header (no checksum of the tail).
    bool read_payload_tokens(const Record &rec, std::vector<int32_t> *tokens);

    // Moves an entry's file to quarantine/ with a note, then drops the entry.
    void quarantine(const Entry &e, const std::string &why);
    void move_to_quarantine(uint64_t file_id, const std::string &who, const std::string &why);

    // Index helpers, run inside a transaction.
    int all_entries(MDB_txn *txn, std::vector<Entry> *out, int *bad = nullptr);
    int delete_entry(MDB_txn *txn, const Entry &e);
    uint64_t next_seq() { return ++seq; }
    // db.write plus the pending LRU notes and the clock, for every index change.
    int write(const std::function<int(MDB_txn *)> &fn, std::string *err);
    Status load_seq();
    // Evicts least-recently-used unpinned entries (never `keep`) until the payload bytes
    // fit the budget; the files to unlink after commit are appended to `doomed`.
    int evict_to_budget(MDB_txn *txn, const std::string &keep, std::vector<Entry> *evicted);
    // Bytes of pinned sessions other than `except`, for the pre-write budget check.
    Status pinned_bytes(std::string_view except, uint64_t *out);
    // Unlinks the files of entries removed by a committed transaction.
    void unlink_files(const std::vector<Entry> &gone, const char *why);

    void touch(const Entry &e);
    Status load_entry(const Entry &e, LoadedPayload *out);
    Status save_locked(std::string_view name, const uint8_t *data, size_t len);
    Status save_checkpoint_locked(const uint8_t *data, size_t len);
    // Verified prefix candidates, longest first.
    Status prefix_candidates(uint64_t fingerprint, const int32_t *tokens, size_t n, std::vector<Entry> *out);
    EntryInfo to_info(const Entry &e) const;
};

uint64_t now_ms();
Status io_status(int neg_errno, const std::string &what);
Status db_status(int rc, const std::string &msg);

}  // namespace ds4::kvstore
