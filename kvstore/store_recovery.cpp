// Opening a state dir: layout and lock, schema check, and start-up recovery.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <algorithm>
#include <set>

#include "kvstore/lmdb_check.h"
#include "kvstore/session_name.h"
#include "kvstore/store_impl.h"

namespace ds4::kvstore {
namespace {

// mkdir -p; then the leaf must be a real directory (a symlink could point outside).
Status make_dir(FileIo &io, const std::string &path, bool parents) {
    if (parents) {
        for (size_t i = 1; i < path.size(); ++i) {
            if (path[i] != '/') continue;
            const std::string part = path.substr(0, i);
            const int rc = io.mkdir(part, 0700);
            if (rc != 0 && rc != -EEXIST) return io_status(rc, "cannot create directory " + part);
        }
    }
    const int rc = io.mkdir(path, 0700);
    if (rc != 0 && rc != -EEXIST) return io_status(rc, "cannot create directory " + path);
    struct stat st;
    if (lstat(path.c_str(), &st) != 0) return io_status(-errno, "cannot stat " + path);
    if (!S_ISDIR(st.st_mode))
        return {Code::kInvalidArgument, path + " is not a directory (symbolic links are refused inside the state dir)"};
    return Status::ok();
}

}  // namespace

Status Store::Impl::open_layout() {
    std::string dir = opt.state_dir;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    // The state dir itself may be a symlink (the user chose it); resolve it once.
    if (Status s = make_dir(*io, dir, true); !s) {
        struct stat st;
        if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return s;
    }
    char real[PATH_MAX];
    if (!realpath(dir.c_str(), real)) return io_status(-errno, "cannot resolve state dir " + dir);
    root = real;
    index_dir = root + "/index";
    payload_dir = root + "/payloads";
    quarantine_dir = root + "/quarantine";
    for (const std::string *d : {&index_dir, &payload_dir, &quarantine_dir})
        if (Status s = make_dir(*io, *d, false); !s) return s;

    const std::string lock_path = root + "/LOCK";
    lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (lock_fd < 0) return io_status(-errno, "cannot open " + lock_path);
    if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK) return {Code::kBusy, "state dir " + root + " is in use by another ds4 process"};
        return io_status(-errno, "cannot lock " + lock_path);
    }
    return Status::ok();
}

Status Store::Impl::index_status(int rc, const std::string &msg) {
    if (lmdb_damaged(rc)) index_damaged = true;
    return db_status(rc, msg);
}

Status Store::Impl::move_index_aside(const std::string &why) {
    // The whole folder (data and lock file) is moved, never deleted: it may still hold
    // what a person wants back (pins, last-used times).
    char ts[32];
    const time_t t = time(nullptr);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(ts, sizeof ts, "%Y%m%dT%H%M%SZ", &tm);
    std::string dst = root + "/index.damaged-" + ts;
    int rc = io->rename_noreplace(index_dir, dst);
    for (int i = 1; rc == -EEXIST && i < 100; ++i)
        rc = io->rename_noreplace(index_dir, dst = root + "/index.damaged-" + ts + "-" + std::to_string(i));
    if (rc) return io_status(rc, "the index in " + index_dir + " is damaged (" + why + ") and cannot be moved aside");
    if (Status s = make_dir(*io, index_dir, false); !s) return s;
    if (const int r = io->fsync_dir(root)) log("fsync of " + root + ": " + strerror(-r));
    report.index_moved_to = dst;
    log("index is damaged: " + why + "; moved it to " + dst + " and rebuilding the index from the payload files");
    return Status::ok();
}

Status Store::Impl::open_index() {
    LmdbMetaInfo meta;
    const Status c = check_lmdb_data_file(index_dir + "/data.mdb", &meta);
    if (c.code() == Code::kCorrupt) {
        if (Status s = move_index_aside(c.message()); !s) return s;
    } else if (!c) {
        return c;
    }
    std::string err;
    int rc = db.open(index_dir, opt.map_size, opt.max_map_size, &err);
    if (rc && lmdb_damaged(rc) && report.index_moved_to.empty()) {
        // Damage the meta pages do not show (e.g. a table root that is not a table page):
        // LMDB reports it instead of crashing.
        db.close();
        if (Status s = move_index_aside(err); !s) return s;
        err.clear();
        rc = db.open(index_dir, opt.map_size, opt.max_map_size, &err);
    }
    if (rc) return db_status(rc, err);
    return Status::ok();
}

Status Store::Impl::open_and_recover() {
    for (int attempt = 0;; ++attempt) {
        index_damaged = false;
        Status s = open_index();
        if (s) s = check_schema();
        if (s) s = load_seq();
        if (s) s = recover();
        if (s || !index_damaged || attempt > 0 || !report.index_moved_to.empty()) return s;
        // Damage deeper in the tree shows only when a read or write reaches it.
        db.close();
        if (Status m = move_index_aside(s.message()); !m) return m;
    }
}

Status Store::Impl::check_schema() {
    std::string err;
    uint32_t version = 0;
    bool present = false, bad = false;
    int rc = db.read(
        [&](MDB_txn *txn) {
            MDB_val k = mdb_val(kMetaSchemaKey), v;
            const int r = mdb_get(txn, db.meta(), &k, &v);
            if (r == MDB_NOTFOUND) return 0;
            if (r) return r;
            present = true;
            bad = !decode_u32(view(v), &version);
            return 0;
        },
        &err);
    if (rc) return index_status(rc, "reading the index schema version: " + err);
    if (bad) return {Code::kCorrupt, "state dir " + root + ": the index schema version record is malformed"};
    if (present) {
        if (version > kSchemaVersion)
            return {Code::kSchemaTooNew, "state dir " + root + " has index schema version " + std::to_string(version) +
                                             ", newer than this build supports (" + std::to_string(kSchemaVersion) +
                                             "); use a newer ds4 or another state dir"};
        if (version < 1)
            return {Code::kCorrupt, "state dir " + root + ": invalid index schema version " + std::to_string(version)};
        return Status::ok();
    }
    rc = db.write(
        [&](MDB_txn *txn) {
            MDB_val k = mdb_val(kMetaSchemaKey);
            const std::string enc = encode_u32(kSchemaVersion);
            MDB_val v = mdb_val(enc);
            return mdb_put(txn, db.meta(), &k, &v, 0);
        },
        &err);
    if (rc) return index_status(rc, "writing the index schema version: " + err);
    return Status::ok();
}

Status Store::Impl::recover() {
    std::string err;
    // 1. Index: entries, undecodable records, aliases without a matching session.
    std::vector<Entry> entries;
    std::vector<std::string> bad_session_keys, bad_prefix_keys;
    int rc = db.read(
        [&](MDB_txn *txn) {
            int r = all_entries(txn, &entries);
            if (r) return r;
            for (const MDB_dbi dbi : {db.sessions(), db.prefixes()}) {
                MDB_cursor *cur;
                if ((r = mdb_cursor_open(txn, dbi, &cur))) return r;
                MDB_val k, v;
                for (r = mdb_cursor_get(cur, &k, &v, MDB_FIRST); r == 0; r = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
                    Record rec;
                    if (dbi == db.sessions()) {
                        if (!decode_record(view(v), &rec)) bad_session_keys.emplace_back(view(k));
                        continue;
                    }
                    PrefixKey pk;
                    if (!decode_prefix_key(view(k), &pk)) {
                        bad_prefix_keys.emplace_back(view(k));
                    } else if (pk.tag == kTagCheckpoint) {
                        if (!decode_record(view(v), &rec)) bad_prefix_keys.emplace_back(view(k));
                    } else {
                        MDB_val sk = mdb_val(pk.session), sv;
                        const bool ok = mdb_get(txn, db.sessions(), &sk, &sv) == 0 && decode_record(view(sv), &rec) &&
                                        rec.fingerprint == pk.fingerprint && rec.n_tokens == pk.n_tokens &&
                                        rec.prefix_hash == pk.hash;
                        if (!ok) bad_prefix_keys.emplace_back(view(k));
                    }
                }
                mdb_cursor_close(cur);
                if (r != MDB_NOTFOUND) return r;
            }
            return 0;
        },
        &err);
    if (rc) return index_status(rc, "recovery: reading the index: " + err);

    // 2. Payload files of every entry.
    std::vector<Entry> condemned;
    std::set<std::string> referenced, indexed_sessions;
    std::set<uint64_t> live;
    uint64_t oldest_live_seq = 0;  // 0: none
    for (const Entry &e : entries) {
        std::string why;
        const Status s = check_payload_file(e, opt.verify_checksums_on_open, &why);
        if (s.code() == Code::kCorrupt) {
            move_to_quarantine(file_name(e), describe(e), why, true);
            condemned.push_back(e);
            ++report.entries_quarantined;
            if (e.kind == EntryKind::kSession) report.quarantined_sessions.push_back(e.key);
            continue;
        }
        if (!s) {
            // Not proof of damage (e.g. a transient EIO): keep the entry; a load checks it
            // again and reports the error to whoever asks for it.
            log("recovery could not check " + file_name(e) + ": " + s.message());
        }
        live.insert(e.rec.file_id);
        if (oldest_live_seq == 0 || e.rec.last_used_seq < oldest_live_seq) oldest_live_seq = e.rec.last_used_seq;
        referenced.insert(file_name(e));
        if (e.kind == EntryKind::kSession) indexed_sessions.insert(e.key);
    }
    report.bad_index_records = int(bad_session_keys.size() + bad_prefix_keys.size());
    for (const std::string &k : bad_session_keys) log("dropping undecodable index record for session '" + k + "'");
    if (!bad_prefix_keys.empty())
        log("dropping " + std::to_string(bad_prefix_keys.size()) + " stale or undecodable prefix index records");

    // 3. Files no entry refers to: temp files of interrupted saves are deleted; payloads
    // are re-indexed or quarantined, never deleted.
    std::vector<Entry> adopt;
    if (Status s = adopt_unindexed_files(referenced, indexed_sessions, &adopt); !s) return s;

    uint64_t live_bytes = 0;
    for (const Entry &e : entries)
        if (live.count(e.rec.file_id)) live_bytes += e.rec.bytes;
    for (const Entry &e : adopt) live_bytes += e.rec.bytes;
    const bool index_clean = condemned.empty() && bad_session_keys.empty() && bad_prefix_keys.empty() &&
                             adopt.empty() && (opt.budget_bytes == 0 || live_bytes <= opt.budget_bytes);
    std::vector<Entry> evicted;
    rc = index_clean ? 0 : write(
        [&](MDB_txn *txn) {
            evicted.clear();
            int r = 0;
            for (const Entry &e : condemned)
                if ((r = delete_entry(txn, e))) return r;
            for (const std::string &k : bad_session_keys) {
                MDB_val kv = mdb_val(k);
                if ((r = mdb_del(txn, db.sessions(), &kv, nullptr)) && r != MDB_NOTFOUND) return r;
            }
            for (const std::string &k : bad_prefix_keys) {
                MDB_val kv = mdb_val(k);
                if ((r = mdb_del(txn, db.prefixes(), &kv, nullptr)) && r != MDB_NOTFOUND) return r;
            }
            // Oldest first, so the LRU order follows the files' modification times. Beside
            // entries the index kept, re-indexed files rank below all of them: there they
            // are leftovers (a remove or eviction cut off before its unlink), the first to
            // go when over budget.
            const uint64_t n = adopt.size();
            for (uint64_t i = 0; i < n; ++i) {
                Entry &e = adopt[size_t(i)];
                if (oldest_live_seq == 0) e.rec.last_used_seq = next_seq();
                else e.rec.last_used_seq = oldest_live_seq > n ? oldest_live_seq - n + i : 0;
                const std::string rec = encode_record(e.rec);
                MDB_val k = mdb_val(e.key), v = mdb_val(rec);
                if (e.kind == EntryKind::kCheckpoint) {
                    if ((r = mdb_put(txn, db.prefixes(), &k, &v, 0))) return r;
                    continue;
                }
                if ((r = mdb_put(txn, db.sessions(), &k, &v, 0))) return r;
                if (e.rec.n_tokens == 0) continue;
                const std::string alias =
                    session_alias_key(e.rec.fingerprint, e.rec.n_tokens, e.rec.prefix_hash, e.key);
                MDB_val ak = mdb_val(alias), av = mdb_val(std::string_view("S", 1));
                if ((r = mdb_put(txn, db.prefixes(), &ak, &av, 0))) return r;
            }
            return evict_to_budget(txn, std::string(), &evicted, "at start-up");
        },
        &err);
    if (rc) return index_status(rc, "recovery: updating the index: " + err);
    report.entries_evicted = int(evicted.size());
    evictions += evicted.size();
    unlink_files(evicted, "evicted (over budget at start-up)");

    if (report.temp_files_removed)
        log("recovery removed " + std::to_string(report.temp_files_removed) + " temp files of interrupted saves");
    if (!adopt.empty() || report.files_quarantined)
        log("recovery re-indexed " + std::to_string(report.sessions_reindexed) + " sessions and " +
            std::to_string(report.checkpoints_reindexed) + " checkpoints from payload files the index did not list" +
            (report.files_quarantined ? ", and moved " + std::to_string(report.files_quarantined) +
                                            " files it could not place to " + quarantine_dir
                                      : std::string()));
    if (report.temp_files_removed || report.entries_quarantined || report.files_quarantined || report.entries_evicted) {
        if (const int r = io->fsync_dir(payload_dir)) log("fsync of " + payload_dir + ": " + strerror(-r));
        if (const int r = io->fsync_dir(quarantine_dir)) log("fsync of " + quarantine_dir + ": " + strerror(-r));
    }
    return Status::ok();
}

Status Store::Impl::adopt_unindexed_files(const std::set<std::string> &referenced,
                                          const std::set<std::string> &indexed, std::vector<Entry> *adopt) {
    std::vector<std::string> names;
    if (const int rc = io->list_dir(payload_dir, &names)) return io_status(rc, "recovery: listing " + payload_dir);
    std::sort(names.begin(), names.end());
    struct Found {
        Entry e;
        std::string file;
        int64_t mtime_ns;
    };
    std::vector<Found> found;
    AlignedBuffer buf;
    for (const std::string &n : names) {
        const std::string path = payload_dir + "/" + n;
        if (is_temp_file_name(n)) {
            if (io->unlink(path) == 0) ++report.temp_files_removed;
            continue;
        }
        PayloadFileName pf;
        if (!parse_payload_file_name(n, &pf)) {
            log("ignoring unexpected file " + path);
            continue;
        }
        if (referenced.count(n)) continue;
        auto set_aside = [&](const std::string &why) {
            move_to_quarantine(n, "unindexed file " + n, why, false);
            ++report.files_quarantined;
        };
        if (pf.kind == FileKind::kBare) {
            set_aside("no index entry refers to it and its name does not say which session it holds "
                      "(written by an older ds4); rename it to <id>-<session>.dsv4 in payloads/ to restore it");
            continue;
        }
        if (pf.kind == FileKind::kSession && !validate_session_name(pf.session)) {
            set_aside("no index entry refers to it and the session name in its file name is not valid");
            continue;
        }
        uint64_t sum = 0;
        std::string why;
        const Status rs = read_whole_file(path, nullptr, &buf, &sum, &why);
        if (rs.code() == Code::kCorrupt) {
            set_aside(why);
            continue;
        }
        if (!rs) {
            log("recovery could not read unindexed file " + path + " (left in place): " + rs.message());
            continue;
        }
        payload::Header h;
        std::vector<int32_t> tokens;
        std::string err;
        if (!payload::decode_payload(buf.data(), buf.size(), &h, &tokens, &err)) {
            set_aside("no index entry refers to it and it is not a valid payload: " + err);
            continue;
        }
        struct stat st;
        if (lstat(path.c_str(), &st) != 0) continue;
        Found f;
        f.file = n;
        f.mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
        f.e.kind = pf.kind == FileKind::kSession ? EntryKind::kSession : EntryKind::kCheckpoint;
        Record &r = f.e.rec;
        r.file_id = pf.file_id;
        r.named_file = true;
        r.bytes = buf.size();
        r.checksum = sum;
        r.fingerprint = h.fingerprint;
        r.n_tokens = h.n_tokens;
        r.prefix_hash = token_prefix_hash(tokens.data(), tokens.size());
        r.created_ms = r.last_used_ms = uint64_t(f.mtime_ns / 1000000);
        f.e.key = f.e.kind == EntryKind::kSession ? pf.session
                                                  : checkpoint_key(r.fingerprint, r.n_tokens, r.prefix_hash, r.file_id);
        found.push_back(std::move(f));
    }
    // Newest first, so the first file seen for a session name is the one kept.
    std::sort(found.begin(), found.end(), [](const Found &a, const Found &b) {
        return a.mtime_ns != b.mtime_ns ? a.mtime_ns > b.mtime_ns : a.file > b.file;
    });
    std::set<std::string> taken = indexed;
    for (Found &f : found) {
        if (f.e.kind == EntryKind::kSession) {
            if (taken.count(f.e.key)) {
                // The index (or a newer file) holds this session: this is a replaced version
                // whose unlink or a save whose commit a crash cut off. Kept aside, not lost.
                move_to_quarantine(f.file, "session '" + f.e.key + "'",
                                   "another version of this session is indexed (" +
                                       std::string(indexed.count(f.e.key) ? "by the index" : "a newer file") +
                                       "); this one is unreferenced",
                                   false);
                ++report.files_quarantined;
                continue;
            }
            taken.insert(f.e.key);
            ++report.sessions_reindexed;
            log("recovery re-indexed session '" + f.e.key + "' from " + payload_dir + "/" + f.file + " (" +
                std::to_string(f.e.rec.bytes) + " bytes, " + std::to_string(f.e.rec.n_tokens) + " tokens; unpinned)");
        } else {
            ++report.checkpoints_reindexed;
        }
        adopt->push_back(std::move(f.e));
    }
    std::reverse(adopt->begin(), adopt->end());  // oldest first: the LRU order
    return Status::ok();
}

}  // namespace ds4::kvstore
