// Internals of Store shared by store.cpp (operations) and store_recovery.cpp (open-time
// recovery). Not part of the public API.
#pragma once
#include <lmdb.h>

#include <map>
#include <mutex>
#include <set>
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
    // The payload file of an entry: its name inside payload_dir, and its path.
    std::string file_name(const Entry &e) const;
    std::string file_path(const Entry &e) const;
    // "session 'x'" or "checkpoint <file>", for logs and notes.
    std::string describe(const Entry &e) const;

    Status open_layout();
    // open_index, check_schema, load_seq, recover. When LMDB reports damage on the way
    // (index_damaged), the index is moved aside and it all runs once more on a fresh one,
    // which recovery fills from the payload files.
    Status open_and_recover();
    // Opens the LMDB index. A data file that fails the meta-page check, or that LMDB
    // refuses as corrupt, is moved aside and a fresh index created.
    Status open_index();
    // Renames index/ to index.damaged-<UTC time> and creates an empty index/.
    Status move_index_aside(const std::string &why);
    Status check_schema();
    Status recover();
    // db_status, noting LMDB's damage codes in index_damaged (open-time reads only).
    Status index_status(int rc, const std::string &msg);
    bool index_damaged = false;

    // Writes a payload file durably (temp, fsync, rename, dir fsync) under the name an
    // entry of this kind and name gets. On failure nothing is left behind.
    Status write_payload_file(const uint8_t *data, size_t len, EntryKind kind, std::string_view name,
                              uint64_t *file_id, uint64_t *checksum);
    // Reads a whole file into buf, hashing it on the way. kCorrupt (with *why) when it is
    // missing, not a regular file (a symlink is never followed), or, when want_bytes is
    // non-null, not that long.
    Status read_whole_file(const std::string &path, const uint64_t *want_bytes, AlignedBuffer *buf,
                           uint64_t *checksum, std::string *why);
    // Reads and fully verifies an entry's payload. kCorrupt (with *why) when the file is
    // missing, the wrong size, fails its checksum or its header disagrees with the index.
    Status read_payload_file(const Entry &e, AlignedBuffer *buf, payload::Header *hdr, std::string *why);
    // Recovery's check: size and header always, the checksum when `full`.
    Status check_payload_file(const Entry &e, bool full, std::string *why);
    // The token ids stored in an entry's payload header (no checksum of the tail).
    bool read_payload_tokens(const Entry &e, std::vector<int32_t> *tokens);

    // Moves an entry's file to quarantine/ with a note, then drops the entry.
    void quarantine(const Entry &e, const std::string &why);
    // Moves payloads/<file> (whatever it is; links are moved, not followed) to
    // quarantine/ with a <file>.why note saying who and why. If it cannot be moved it is
    // deleted when unlink_if_stuck, else left in place.
    void move_to_quarantine(const std::string &file, const std::string &who, const std::string &why,
                            bool unlink_if_stuck);
    // Recovery of payload files the index does not reference: re-indexes those whose name
    // and header say what they are, quarantines the rest. Fills *adopt with the entries
    // to add; `indexed` holds the session names the index keeps.
    Status adopt_unindexed_files(const std::set<std::string> &referenced, const std::set<std::string> &indexed,
                                 std::vector<Entry> *adopt);

    // Index helpers, run inside a transaction.
    int all_entries(MDB_txn *txn, std::vector<Entry> *out, int *bad = nullptr);
    int delete_entry(MDB_txn *txn, const Entry &e);
    uint64_t next_seq() { return ++seq; }
    // db.write plus the pending LRU notes and the clock, for every index change.
    int write(const std::function<int(MDB_txn *)> &fn, std::string *err);
    Status load_seq();
    // Evicts least-recently-used unpinned entries (never `keep`) until the payload bytes
    // fit the budget; the files to unlink after commit are appended to `evicted`. Each
    // evicted session leaves a tombstone saying `when` it happened.
    int evict_to_budget(MDB_txn *txn, const std::string &keep, std::vector<Entry> *evicted,
                        const char *when);
    // Tombstones (index_records.h): put one, bounded to kMaxTombstones; drop one.
    int put_tombstone(MDB_txn *txn, std::string_view name, const Tombstone &t);
    int drop_tombstone(MDB_txn *txn, std::string_view name);
    int all_tombstones(MDB_txn *txn, std::vector<EvictedInfo> *out);
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
