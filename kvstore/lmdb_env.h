// The LMDB environment behind the store's index: three named tables (meta, sessions,
// prefixes) and write transactions that grow the map when it fills up.
#pragma once
#include <lmdb.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace ds4::kvstore {

class LmdbEnv {
public:
    LmdbEnv() = default;
    LmdbEnv(const LmdbEnv &) = delete;
    LmdbEnv &operator=(const LmdbEnv &) = delete;
    ~LmdbEnv();

    // Opens (creating when absent) the environment in directory `dir`. map_size is the
    // initial map size; growth doubles it up to max_map_size. Returns an LMDB or errno
    // code, with *err set.
    int open(const std::string &dir, uint64_t map_size, uint64_t max_map_size, std::string *err);
    // Closes the environment (after a failed open too), so open can be called again.
    void close();

    // Runs fn in a write transaction and commits when it returns 0. On MDB_MAP_FULL
    // (from fn or from the commit) the transaction is aborted, the map doubled and fn run
    // again, so fn must not have side effects outside the transaction. Any other nonzero
    // return aborts and is passed back.
    int write(const std::function<int(MDB_txn *)> &fn, std::string *err);
    // Runs fn in a read-only transaction.
    int read(const std::function<int(MDB_txn *)> &fn, std::string *err);

    MDB_dbi meta() const { return meta_; }
    MDB_dbi sessions() const { return sessions_; }
    MDB_dbi prefixes() const { return prefixes_; }
    uint64_t map_size() const;
    int grow_count() const { return grows_; }

private:
    int grow(std::string *err);

    MDB_env *env_ = nullptr;
    MDB_dbi meta_ = 0, sessions_ = 0, prefixes_ = 0;
    uint64_t max_map_size_ = 0;
    int grows_ = 0;
};

inline MDB_val mdb_val(std::string_view s) { return MDB_val{s.size(), const_cast<char *>(s.data())}; }
inline std::string_view view(const MDB_val &v) { return {static_cast<const char *>(v.mv_data), v.mv_size}; }

// "what: LMDB message".
std::string lmdb_error(const char *what, int rc);

// LMDB codes that mean the data or lock file is not one this LMDB can use.
inline bool lmdb_damaged(int rc) {
    return rc == MDB_INVALID || rc == MDB_CORRUPTED || rc == MDB_VERSION_MISMATCH || rc == MDB_PAGE_NOTFOUND;
}

}  // namespace ds4::kvstore
