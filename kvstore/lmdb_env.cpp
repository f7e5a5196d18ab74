#include "kvstore/lmdb_env.h"

#include <cstring>

namespace ds4::kvstore {

std::string lmdb_error(const char *what, int rc) { return std::string(what) + ": " + mdb_strerror(rc); }

LmdbEnv::~LmdbEnv() { close(); }

void LmdbEnv::close() {
    if (env_) mdb_env_close(env_);
    env_ = nullptr;
    meta_ = sessions_ = prefixes_ = 0;
    grows_ = 0;
}

int LmdbEnv::open(const std::string &dir, uint64_t map_size, uint64_t max_map_size, std::string *err) {
    close();
    max_map_size_ = max_map_size < map_size ? map_size : max_map_size;
    int rc = mdb_env_create(&env_);
    if (rc) {
        env_ = nullptr;
        *err = lmdb_error("mdb_env_create", rc);
        return rc;
    }
    if ((rc = mdb_env_set_maxdbs(env_, 4)) || (rc = mdb_env_set_mapsize(env_, size_t(map_size)))) {
        *err = lmdb_error("mdb_env_set_mapsize", rc);
        return rc;
    }
    // MDB_NOTLS: read transactions are not tied to a thread (callers serialise anyway).
    if ((rc = mdb_env_open(env_, dir.c_str(), MDB_NOTLS, 0600))) {
        *err = lmdb_error(("cannot open LMDB index in " + dir).c_str(), rc);
        return rc;
    }
    std::string werr;
    rc = write(
        [&](MDB_txn *txn) {
            int r;
            if ((r = mdb_dbi_open(txn, "meta", MDB_CREATE, &meta_))) return r;
            if ((r = mdb_dbi_open(txn, "sessions", MDB_CREATE, &sessions_))) return r;
            return mdb_dbi_open(txn, "prefixes", MDB_CREATE, &prefixes_);
        },
        &werr);
    if (rc) *err = "cannot open the tables of the LMDB index in " + dir + ": " + werr;
    return rc;
}

uint64_t LmdbEnv::map_size() const {
    MDB_envinfo info;
    if (!env_ || mdb_env_info(env_, &info)) return 0;
    return info.me_mapsize;
}

int LmdbEnv::grow(std::string *err) {
    const uint64_t cur = map_size();
    if (cur >= max_map_size_) {
        *err = "LMDB index map is full at its maximum size (" + std::to_string(cur) + " bytes)";
        return MDB_MAP_FULL;
    }
    const uint64_t next = cur * 2 > max_map_size_ ? max_map_size_ : cur * 2;
    if (const int rc = mdb_env_set_mapsize(env_, size_t(next))) {
        *err = lmdb_error("mdb_env_set_mapsize", rc);
        return rc;
    }
    ++grows_;
    return 0;
}

int LmdbEnv::write(const std::function<int(MDB_txn *)> &fn, std::string *err) {
    for (;;) {
        MDB_txn *txn = nullptr;
        int rc = mdb_txn_begin(env_, nullptr, 0, &txn);
        if (rc == MDB_MAP_RESIZED) {
            // Another process grew it; adopt the new size.
            if ((rc = mdb_env_set_mapsize(env_, 0)) == 0) continue;
        }
        if (rc) {
            *err = lmdb_error("mdb_txn_begin", rc);
            return rc;
        }
        rc = fn(txn);
        if (rc == 0) {
            rc = mdb_txn_commit(txn);
            if (rc == 0) return 0;
            if (rc != MDB_MAP_FULL) {
                *err = lmdb_error("mdb_txn_commit", rc);
                return rc;
            }
        } else {
            mdb_txn_abort(txn);
            if (rc != MDB_MAP_FULL) {
                if (err->empty()) *err = lmdb_error("LMDB write", rc);
                return rc;
            }
        }
        if (const int g = grow(err)) return g;
    }
}

int LmdbEnv::read(const std::function<int(MDB_txn *)> &fn, std::string *err) {
    MDB_txn *txn = nullptr;
    int rc = mdb_txn_begin(env_, nullptr, MDB_RDONLY, &txn);
    if (rc) {
        *err = lmdb_error("mdb_txn_begin", rc);
        return rc;
    }
    rc = fn(txn);
    mdb_txn_abort(txn);
    if (rc && err->empty()) *err = lmdb_error("LMDB read", rc);
    return rc;
}

}  // namespace ds4::kvstore
