// Opening a state dir: layout and lock, schema check, and start-up recovery.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <set>

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
    if (rc) return db_status(rc, "reading the index schema version: " + err);
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
    if (rc) return db_status(rc, "writing the index schema version: " + err);
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
    if (rc) return db_status(rc, "recovery: reading the index: " + err);

    // 2. Payload files of every entry.
    std::vector<Entry> condemned;
    std::set<uint64_t> live;
    for (const Entry &e : entries) {
        std::string why;
        const Status s = check_payload_file(e.rec, opt.verify_checksums_on_open, &why);
        if (s.code() == Code::kCorrupt) {
            const std::string who = e.kind == EntryKind::kSession ? "session '" + e.key + "'"
                                                                  : "checkpoint " + payload_file_name(e.rec.file_id);
            move_to_quarantine(e.rec.file_id, who, why);
            condemned.push_back(e);
            ++report.entries_quarantined;
            if (e.kind == EntryKind::kSession) report.quarantined_sessions.push_back(e.key);
        } else if (!s) {
            // Not proof of damage (e.g. a transient EIO): keep the entry; a load checks it
            // again and reports the error to whoever asks for it.
            log("recovery could not check " + payload_file_name(e.rec.file_id) + ": " + s.message());
            live.insert(e.rec.file_id);
        } else {
            live.insert(e.rec.file_id);
        }
    }
    report.bad_index_records = int(bad_session_keys.size() + bad_prefix_keys.size());
    for (const std::string &k : bad_session_keys) log("dropping undecodable index record for session '" + k + "'");
    if (!bad_prefix_keys.empty())
        log("dropping " + std::to_string(bad_prefix_keys.size()) + " stale or undecodable prefix index records");
    uint64_t live_bytes = 0;
    for (const Entry &e : entries)
        if (live.count(e.rec.file_id)) live_bytes += e.rec.bytes;
    const bool index_clean = condemned.empty() && bad_session_keys.empty() && bad_prefix_keys.empty() &&
                             (opt.budget_bytes == 0 || live_bytes <= opt.budget_bytes);
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
            return evict_to_budget(txn, std::string(), &evicted);
        },
        &err);
    if (rc) return db_status(rc, "recovery: updating the index: " + err);
    for (const Entry &e : evicted) live.erase(e.rec.file_id);
    report.entries_evicted = int(evicted.size());
    evictions += evicted.size();
    unlink_files(evicted, "evicted (over budget at start-up)");

    // 3. Files no entry refers to: interrupted saves (temp files) and replaced or evicted
    // payloads whose unlink did not happen before a crash.
    std::vector<std::string> names;
    if ((rc = io->list_dir(payload_dir, &names)) != 0) return io_status(rc, "recovery: listing " + payload_dir);
    for (const std::string &n : names) {
        uint64_t id = 0;
        const std::string path = payload_dir + "/" + n;
        if (is_temp_file_name(n)) {
            if (io->unlink(path) == 0) ++report.temp_files_removed;
        } else if (parse_payload_file_name(n, &id)) {
            if (!live.count(id) && io->unlink(path) == 0) ++report.orphan_files_removed;
        } else {
            log("ignoring unexpected file " + path);
        }
    }
    if (report.temp_files_removed || report.orphan_files_removed)
        log("recovery removed " + std::to_string(report.temp_files_removed) + " temp and " +
            std::to_string(report.orphan_files_removed) + " orphan payload files");
    if (report.temp_files_removed || report.orphan_files_removed || report.entries_quarantined) {
        if (const int r = io->fsync_dir(payload_dir)) log("fsync of " + payload_dir + ": " + strerror(-r));
    }
    return Status::ok();
}

}  // namespace ds4::kvstore
