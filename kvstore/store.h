// The persistent session store (docs/ARCHITECTURE.md §5): an LMDB index plus one payload file per
// stored session or prefix checkpoint, in a state directory:
//
//   <state>/LOCK          flock'ed for the store's lifetime: one process per state dir
//   <state>/index/        LMDB environment (tables meta, sessions, prefixes)
//   <state>/payloads/     payload files named <16 hex>-<session>.dsv4 or <16 hex>.ckpt.dsv4
//                         (+ .tmp-<16 hex>.dsv4 while being written)
//   <state>/quarantine/   files that failed their checks or could not be placed, with a
//                         .why note
//   <state>/index.damaged-<time>/  an index that failed its checks, moved aside
//
// A save is durable before it is visible: temp file written (io_uring, O_DIRECT when
// possible), fsync, rename to a fresh name, directory fsync, then the LMDB commit that
// points the entry at it; the replaced file is unlinked only after the commit. A crash
// at any point therefore leaves the old or the new state, and at worst an unreferenced
// file.
//
// The index can be rebuilt: a payload file's name says what it holds (the session name,
// or "checkpoint") and its header gives the rest. Start-up recovery re-indexes any
// payload file the index does not reference (a lost, deleted or damaged index, or a
// crash between a remove and its unlink, which brings that session back), and moves to
// quarantine/ what it cannot place: files with no name in them (written by older
// builds), damaged ones, other versions of a session the index holds, links and other
// non-regular files. Only temp files of an interrupted save are deleted. Pins are not
// in the file name: a session rebuilt that way comes back unpinned.
//
// Loads read the whole file and verify its XXH64 checksum and payload header before
// returning bytes; a payload that fails is quarantined and never served.
//
// Errors: every method returns a Status; nothing throws across this API. A Store is
// thread-safe (one mutex serialises its operations).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bridge/payload_header.h"
#include "io/aligned_buffer.h"
#include "io/file_io.h"
#include "io/uring_file_io.h"
#include "kvstore/status.h"

namespace ds4::kvstore {

// Payload files move through ds4_io (io/); these names are part of the store's API.
using io::AlignedBuffer;
using io::FileIo;
using io::make_uring_file_io;
using io::UringOptions;

struct StoreOptions {
    std::string state_dir;
    uint64_t map_size = uint64_t(64) << 20;     // initial LMDB map size
    uint64_t max_map_size = uint64_t(1) << 40;  // growth (doubling on MDB_MAP_FULL) stops here
    uint64_t budget_bytes = 0;                  // payload bytes kept; 0 = unlimited
    // Recovery reads every payload and checks its checksum (otherwise only size and
    // header; loads always check the checksum).
    bool verify_checksums_on_open = true;
    UringOptions io_options;
    std::shared_ptr<FileIo> io;                        // null: make_uring_file_io(io_options)
    std::function<void(const std::string &)> log;      // null: lines go to stderr
};

enum class EntryKind { kSession, kCheckpoint };

struct EntryInfo {
    EntryKind kind = EntryKind::kSession;
    std::string name;            // session name; empty for checkpoints
    uint64_t checkpoint_id = 0;  // checkpoints only
    std::string file;            // payload file name inside <state>/payloads
    uint64_t bytes = 0;
    uint64_t checksum = 0;
    uint64_t fingerprint = 0;
    uint32_t n_tokens = 0;
    uint64_t created_ms = 0;     // wall clock, ms since the epoch
    uint64_t last_used_ms = 0;
    bool pinned = false;
};

// Loads read into `bytes`, reusing its allocation when it is large enough (keep one
// LoadedPayload around to avoid faulting in fresh memory for every load). On failure
// bytes.size() is 0.
struct LoadedPayload {
    AlignedBuffer bytes;      // the verified payload, bytes.size() long
    payload::Header header;
    EntryInfo info;
};

struct PrefixMatch {
    uint32_t n_tokens = 0;    // the stored prefix covers tokens[0, n_tokens)
    EntryInfo info;
};

// A session the store evicted to stay within its budget. The store remembers the latest
// kMaxTombstones (index_records.h) such names until they are saved or removed again.
struct EvictedInfo {
    std::string name;
    uint64_t evicted_ms = 0;  // wall clock, ms since the epoch
    std::string why;          // e.g. "at start-up, to keep the store within its budget of N bytes"
};

struct RecoveryReport {
    int temp_files_removed = 0;
    int orphan_files_removed = 0;  // always 0: unreferenced payloads are re-indexed or quarantined
    int sessions_reindexed = 0;    // payload files the index did not reference, indexed again
    int checkpoints_reindexed = 0;
    int files_quarantined = 0;     // unreferenced files moved to quarantine/ instead
    std::string index_moved_to;    // set when a damaged index was moved aside (and rebuilt)
    int entries_quarantined = 0;   // missing or corrupt payloads
    int bad_index_records = 0;     // undecodable index values, dropped
    int entries_evicted = 0;       // over a budget lowered since the last run
    std::vector<std::string> quarantined_sessions;  // names of the sessions quarantined
};

struct StoreStats {
    uint64_t sessions = 0;
    uint64_t checkpoints = 0;
    uint64_t bytes = 0;
    uint64_t pinned_bytes = 0;
    uint64_t budget_bytes = 0;
    uint64_t map_size = 0;
    int map_grows = 0;
    uint64_t evictions = 0;   // since open
    bool uring = false;       // payload I/O goes through io_uring
};

class Store {
public:
    // Creates the state dir layout when needed, takes the lock, opens the index (refusing
    // a newer schema), then runs recovery.
    static Status open(const StoreOptions &opt, std::unique_ptr<Store> *out);
    ~Store();
    Store(const Store &) = delete;
    Store &operator=(const Store &) = delete;

    // Stores `data` (a complete payload: header + tokens + tail) under `name`, replacing
    // any previous version atomically. Evicts least-recently-used unpinned entries to
    // stay within the budget (an evicted session leaves a tombstone: evicted()). A pinned
    // session stays pinned.
    Status save(std::string_view name, const uint8_t *data, size_t len);
    Status load(std::string_view name, LoadedPayload *out);
    // Also forgets a tombstone of `name` (kNotFound still when no session was stored).
    Status remove(std::string_view name);
    Status pin(std::string_view name, bool pinned);
    Status info(std::string_view name, EntryInfo *out);
    // Sessions, by name.
    Status list(std::vector<EntryInfo> *out);
    // Checkpoints, by fingerprint then token count.
    Status list_checkpoints(std::vector<EntryInfo> *out);

    // Stores a payload as a prefix checkpoint of its own tokens (e.g. taken at a chunk
    // frontier during a long prefill). A checkpoint with the same tokens and model is
    // kept instead of writing another.
    Status save_checkpoint(const uint8_t *data, size_t len);
    // The longest stored payload (session or checkpoint) for this model fingerprint whose
    // tokens are a prefix of tokens[0, n) (the whole of it included). kNotFound if none.
    // Token ids are compared, not only hashes.
    Status find_longest_prefix(uint64_t fingerprint, const int32_t *tokens, size_t n, PrefixMatch *out);
    // find_longest_prefix + load, falling back to shorter prefixes when a candidate turns
    // out corrupt (it is quarantined).
    Status load_longest_prefix(uint64_t fingerprint, const int32_t *tokens, size_t n, LoadedPayload *out);

    // When and why `name` was evicted; kNotFound when it was not (or has been saved or
    // removed since).
    Status evicted(std::string_view name, EvictedInfo *out);
    // The remembered evictions, most recent first.
    Status list_evicted(std::vector<EvictedInfo> *out);

    Status stats(StoreStats *out);
    const RecoveryReport &recovery_report() const;
    const std::string &state_dir() const;

    struct Impl;

private:
    explicit Store(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace ds4::kvstore
