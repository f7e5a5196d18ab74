// Binary encodings of the LMDB index's keys and values (all integers little-endian
// except key fields that must sort numerically, which are big-endian).
//
// sessions:  key = session name
//            value = Record (kind session)
// prefixes:  key = fingerprint (u64 BE) | n_tokens (u32 BE) | prefix hash (u64 BE) | tag
//            tag 'S' + session name  → value "S": the session's payload holds this prefix
//            tag 'C' + file id (u64 BE) → value = Record (kind checkpoint)
// meta:      "schema_version" → u32, "seq" → u64 (LRU clock),
//            "evicted/" + session name → Tombstone (a session the budget evicted)
//
// The prefix hash is XXH64 of the token ids as little-endian i32 bytes. Keys sort by
// fingerprint then length, so the prefixes of one model are a contiguous range.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ds4::kvstore {

inline constexpr uint32_t kSchemaVersion = 1;
inline constexpr char kMetaSchemaKey[] = "schema_version";
inline constexpr char kMetaSeqKey[] = "seq";

// One payload file and what is known about it.
struct Record {
    uint64_t file_id = 0;
    uint64_t bytes = 0;
    uint64_t checksum = 0;     // XXH64 of the whole file
    uint64_t fingerprint = 0;  // model fingerprint from the payload header
    uint64_t prefix_hash = 0;  // XXH64 of the token ids
    uint32_t n_tokens = 0;
    bool pinned = false;
    uint64_t created_ms = 0;
    uint64_t last_used_ms = 0;
    uint64_t last_used_seq = 0;  // LRU order: larger is more recent
    // The file carries its own identity in its name (session_file_name /
    // checkpoint_file_name), so a lost index can be rebuilt from the payload folder.
    // False for files written before that (bare "<id>.dsv4"). Stored in a record byte
    // that older builds write as 0 and ignore.
    bool named_file = false;
};

inline constexpr size_t kRecordBytes = 72;

std::string encode_record(const Record &r);
// False when the bytes are not a record this build wrote.
bool decode_record(std::string_view bytes, Record *out);

inline constexpr size_t kPrefixKeyHead = 20;  // fingerprint + n_tokens + hash
inline constexpr char kTagSession = 'S';
inline constexpr char kTagCheckpoint = 'C';

// What is remembered of a session the store evicted to keep its budget, so a client that
// reopens the name can be told. Older builds never read these keys.
inline constexpr char kTombstonePrefix[] = "evicted/";
inline constexpr size_t kMaxTombstones = 64;  // the oldest go beyond this

struct Tombstone {
    uint64_t evicted_ms = 0;  // wall clock, ms since the epoch
    uint64_t seq = 0;         // the LRU clock then: orders evictions within one ms
    std::string why;
};

std::string tombstone_key(std::string_view name);
// The session name of a tombstone key; false for other meta keys.
bool tombstone_name(std::string_view key, std::string_view *name);
std::string encode_tombstone(const Tombstone &t);
bool decode_tombstone(std::string_view bytes, Tombstone *out);

std::string prefix_key_head(uint64_t fingerprint, uint32_t n_tokens, uint64_t hash);
std::string session_alias_key(uint64_t fingerprint, uint32_t n_tokens, uint64_t hash, std::string_view name);
std::string checkpoint_key(uint64_t fingerprint, uint32_t n_tokens, uint64_t hash, uint64_t file_id);

struct PrefixKey {
    uint64_t fingerprint = 0;
    uint32_t n_tokens = 0;
    uint64_t hash = 0;
    char tag = 0;
    std::string_view session;  // tag 'S'
    uint64_t file_id = 0;      // tag 'C'
};
bool decode_prefix_key(std::string_view key, PrefixKey *out);

uint64_t token_prefix_hash(const int32_t *tokens, size_t n);
// token_prefix_hash(tokens, L) for every L in `lengths` (ascending) in one pass.
void token_prefix_hashes(const int32_t *tokens, const std::vector<uint32_t> &lengths, std::vector<uint64_t> *out);

// Payload file names. The id is random and unique; what follows it says what the file
// holds, so recovery can re-index a file the index does not know:
//   "0123456789abcdef-<session name>.dsv4"   a session (names never contain '/')
//   "0123456789abcdef.ckpt.dsv4"             a prefix checkpoint
//   "0123456789abcdef.dsv4"                  bare: written by older builds, kind unknown
//   ".tmp-0123456789abcdef.dsv4"             a save in progress (never referenced)
std::string payload_file_name(uint64_t file_id);  // bare
std::string session_file_name(uint64_t file_id, std::string_view session);
std::string checkpoint_file_name(uint64_t file_id);
std::string temp_file_name(uint64_t file_id);

enum class FileKind { kBare, kSession, kCheckpoint };
struct PayloadFileName {
    FileKind kind = FileKind::kBare;
    uint64_t file_id = 0;
    std::string session;  // kSession: the name as written (not yet validated)
};
// Parses the three payload forms above; false for anything else (temp files included).
bool parse_payload_file_name(std::string_view name, PayloadFileName *out);
// Exactly temp_file_name's form: only such files are provably debris of an interrupted
// save.
bool is_temp_file_name(std::string_view name);

std::string encode_u32(uint32_t v);
std::string encode_u64(uint64_t v);
bool decode_u32(std::string_view b, uint32_t *v);
bool decode_u64(std::string_view b, uint64_t *v);

}  // namespace ds4::kvstore
