#include "kvstore/store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>

#include "kvstore/session_name.h"
#include "kvstore/store_impl.h"
#include "kvstore/xxh64.h"

namespace ds4::kvstore {

uint64_t now_ms() {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1000000;
}

Status io_status(int neg_errno, const std::string &what) {
    const int e = -neg_errno;
    const Code c = (e == ENOSPC || e == EDQUOT) ? Code::kNoSpace : Code::kIoError;
    return {c, what + ": " + strerror(e)};
}

Status db_status(int rc, const std::string &msg) {
    if (rc == MDB_MAP_FULL || rc == ENOSPC) return {Code::kNoSpace, msg};
    if (rc == EIO) return {Code::kIoError, msg};
    return {Code::kInternal, msg};
}

namespace {

// Runs a public operation, turning any escaping exception into a Status.
template <class F>
Status guarded(const char *op, F &&f) {
    try {
        return f();
    } catch (const std::bad_alloc &) {
        return {Code::kInternal, std::string(op) + ": out of memory"};
    } catch (const std::exception &e) {
        return {Code::kInternal, std::string(op) + ": " + e.what()};
    } catch (...) {
        return {Code::kInternal, std::string(op) + ": unknown exception"};
    }
}

uint64_t random_file_id() {
    uint64_t v = 0;
    while (v == 0) {
        if (getrandom(&v, sizeof v, 0) != sizeof v) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            v = xxh64(&ts, sizeof ts, uint64_t(getpid()));
        }
    }
    return v;
}

std::string quoted(std::string_view name) { return "'" + std::string(name) + "'"; }

int get(MDB_txn *txn, MDB_dbi dbi, std::string_view key, std::string_view *val) {
    MDB_val k = mdb_val(key), v;
    const int rc = mdb_get(txn, dbi, &k, &v);
    if (rc == 0) *val = view(v);
    return rc;
}

int put(MDB_txn *txn, MDB_dbi dbi, std::string_view key, std::string_view val) {
    MDB_val k = mdb_val(key), v = mdb_val(val);
    return mdb_put(txn, dbi, &k, &v, 0);
}

int del(MDB_txn *txn, MDB_dbi dbi, std::string_view key) {
    MDB_val k = mdb_val(key);
    const int rc = mdb_del(txn, dbi, &k, nullptr);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

}  // namespace

// ---------------------------------------------------------------- Impl basics

Store::Impl::~Impl() {
    if (!touches.empty()) {
        std::string err;
        if (write([](MDB_txn *) { return 0; }, &err)) log("cannot record last-used times at close: " + err);
    }
    if (lock_fd >= 0) ::close(lock_fd);  // releases the flock
}

void Store::Impl::log(const std::string &line) const {
    if (opt.log)
        opt.log(line);
    else
        fprintf(stderr, "ds4-kvstore: %s\n", line.c_str());
}

std::string Store::Impl::file_name(const Entry &e) const {
    if (!e.rec.named_file) return payload_file_name(e.rec.file_id);
    return e.kind == EntryKind::kSession ? session_file_name(e.rec.file_id, e.key) : checkpoint_file_name(e.rec.file_id);
}

std::string Store::Impl::file_path(const Entry &e) const { return payload_dir + "/" + file_name(e); }

std::string Store::Impl::describe(const Entry &e) const {
    return e.kind == EntryKind::kSession ? "session " + quoted(e.key) : "checkpoint " + file_name(e);
}

EntryInfo Store::Impl::to_info(const Entry &e) const {
    EntryInfo i;
    i.kind = e.kind;
    if (e.kind == EntryKind::kSession) i.name = e.key;
    else i.checkpoint_id = e.rec.file_id;
    i.file = file_name(e);
    i.bytes = e.rec.bytes;
    i.checksum = e.rec.checksum;
    i.fingerprint = e.rec.fingerprint;
    i.n_tokens = e.rec.n_tokens;
    i.created_ms = e.rec.created_ms;
    i.last_used_ms = e.rec.last_used_ms;
    i.pinned = e.rec.pinned;
    return i;
}

// ---------------------------------------------------------------- index helpers

int Store::Impl::all_entries(MDB_txn *txn, std::vector<Entry> *out, int *bad) {
    out->clear();
    MDB_cursor *cur;
    for (const MDB_dbi dbi : {db.sessions(), db.prefixes()}) {
        if (const int rc = mdb_cursor_open(txn, dbi, &cur)) return rc;
        MDB_val k, v;
        int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
        for (; rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
            Entry e;
            if (dbi == db.sessions()) {
                e.kind = EntryKind::kSession;
            } else {
                PrefixKey pk;
                if (decode_prefix_key(view(k), &pk) && pk.tag == kTagSession) continue;  // alias
                e.kind = EntryKind::kCheckpoint;
            }
            e.key.assign(view(k));
            if (!decode_record(view(v), &e.rec)) {
                if (bad) ++*bad;
                continue;
            }
            out->push_back(std::move(e));
        }
        mdb_cursor_close(cur);
        if (rc != MDB_NOTFOUND) return rc;
    }
    return 0;
}

int Store::Impl::delete_entry(MDB_txn *txn, const Entry &e) {
    if (e.kind == EntryKind::kCheckpoint) return del(txn, db.prefixes(), e.key);
    if (const int rc = del(txn, db.sessions(), e.key)) return rc;
    return del(txn, db.prefixes(),
               session_alias_key(e.rec.fingerprint, e.rec.n_tokens, e.rec.prefix_hash, e.key));
}

int Store::Impl::write(const std::function<int(MDB_txn *)> &fn, std::string *err) {
    const int rc = db.write(
        [&](MDB_txn *txn) {
            for (const auto &[k, t] : touches) {
                const MDB_dbi dbi = k.first == EntryKind::kSession ? db.sessions() : db.prefixes();
                std::string_view v;
                Record rec;
                int r = get(txn, dbi, k.second, &v);
                if (r == MDB_NOTFOUND) continue;  // gone meanwhile
                if (r) return r;
                if (!decode_record(v, &rec) || rec.file_id != t.file_id || rec.last_used_seq >= t.seq) continue;
                rec.last_used_seq = t.seq;
                rec.last_used_ms = t.ms;
                if ((r = put(txn, dbi, k.second, encode_record(rec)))) return r;
            }
            if (const int r = fn(txn)) return r;
            return put(txn, db.meta(), kMetaSeqKey, encode_u64(seq));
        },
        err);
    if (rc == 0) touches.clear();
    return rc;
}

Status Store::Impl::load_seq() {
    std::string err;
    const int rc = db.read(
        [&](MDB_txn *txn) {
            std::string_view v;
            const int r = get(txn, db.meta(), kMetaSeqKey, &v);
            if (r == 0 && !decode_u64(v, &seq)) seq = 0;
            return r == MDB_NOTFOUND ? 0 : r;
        },
        &err);
    if (rc) return index_status(rc, "reading the LRU clock: " + err);
    return Status::ok();
}

int Store::Impl::evict_to_budget(MDB_txn *txn, const std::string &keep, std::vector<Entry> *evicted,
                                 const char *when) {
    if (opt.budget_bytes == 0) return 0;
    std::vector<Entry> all;
    if (const int rc = all_entries(txn, &all)) return rc;
    uint64_t total = 0;
    for (const Entry &e : all) total += e.rec.bytes;
    if (total <= opt.budget_bytes) return 0;
    std::vector<const Entry *> victims;
    for (const Entry &e : all)
        if (!e.rec.pinned && e.key != keep) victims.push_back(&e);
    std::sort(victims.begin(), victims.end(),
              [](const Entry *a, const Entry *b) { return a->rec.last_used_seq < b->rec.last_used_seq; });
    Tombstone t{now_ms(), 0, std::string(when) + ", to keep the store within its budget of " +
                                 std::to_string(opt.budget_bytes) + " bytes"};
    for (const Entry *e : victims) {
        if (total <= opt.budget_bytes) break;
        if (const int rc = delete_entry(txn, *e)) return rc;
        if (e->kind == EntryKind::kSession) {
            t.seq = next_seq();
            if (const int rc = put_tombstone(txn, e->key, t)) return rc;
        }
        total -= e->rec.bytes;
        evicted->push_back(*e);
    }
    return 0;
}

int Store::Impl::all_tombstones(MDB_txn *txn, std::vector<EvictedInfo> *out) {
    MDB_cursor *cur;
    if (const int rc = mdb_cursor_open(txn, db.meta(), &cur)) return rc;
    const std::string start(kTombstonePrefix);
    MDB_val k = mdb_val(start), v;
    std::vector<std::pair<uint64_t, EvictedInfo>> found;  // by seq
    int rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
    for (; rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        std::string_view name;
        if (!tombstone_name(view(k), &name)) break;  // past the range
        Tombstone t;
        if (decode_tombstone(view(v), &t)) found.push_back({t.seq, {std::string(name), t.evicted_ms, t.why}});
    }
    mdb_cursor_close(cur);
    if (rc != 0 && rc != MDB_NOTFOUND) return rc;
    std::sort(found.begin(), found.end(), [](const auto &a, const auto &b) { return a.first > b.first; });
    for (auto &f : found) out->push_back(std::move(f.second));
    return 0;
}

int Store::Impl::put_tombstone(MDB_txn *txn, std::string_view name, const Tombstone &t) {
    if (const int rc = put(txn, db.meta(), tombstone_key(name), encode_tombstone(t))) return rc;
    std::vector<EvictedInfo> all;
    if (const int rc = all_tombstones(txn, &all)) return rc;
    for (size_t i = kMaxTombstones; i < all.size(); ++i)  // the oldest, beyond the bound
        if (const int rc = drop_tombstone(txn, all[i].name)) return rc;
    return 0;
}

int Store::Impl::drop_tombstone(MDB_txn *txn, std::string_view name) {
    const int rc = del(txn, db.meta(), tombstone_key(name));
    return rc == MDB_NOTFOUND ? 0 : rc;
}

Status Store::Impl::pinned_bytes(std::string_view except, uint64_t *out) {
    std::string err;
    std::vector<Entry> all;
    const int rc = db.read([&](MDB_txn *txn) { return all_entries(txn, &all); }, &err);
    if (rc) return db_status(rc, "reading the index: " + err);
    *out = 0;
    for (const Entry &e : all)
        if (e.rec.pinned && !(e.kind == EntryKind::kSession && e.key == except)) *out += e.rec.bytes;
    return Status::ok();
}

void Store::Impl::unlink_files(const std::vector<Entry> &gone, const char *why) {
    for (const Entry &e : gone) {
        const int rc = io->unlink(file_path(e));
        if (rc != 0 && rc != -ENOENT)
            log("cannot unlink " + file_path(e) + ": " + strerror(-rc) + " (recovery will deal with it)");
        if (why) log(std::string(why) + " " + describe(e) + " (" + std::to_string(e.rec.bytes) + " bytes)");
    }
}

// ---------------------------------------------------------------- payload files

Status Store::Impl::write_payload_file(const uint8_t *data, size_t len, EntryKind kind, std::string_view name,
                                       uint64_t *file_id, uint64_t *checksum) {
    for (int attempt = 0; attempt < 4; ++attempt) {
        const uint64_t id = random_file_id();
        const std::string tmp = payload_dir + "/" + temp_file_name(id);
        const std::string fin =
            payload_dir + "/" + (kind == EntryKind::kSession ? session_file_name(id, name) : checkpoint_file_name(id));
        int fd = io->open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_DIRECT, 0600);
        if (fd == -EINVAL)  // no O_DIRECT here; the name is ours, so O_EXCL is not needed again
            fd = io->open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0600);
        if (fd == -EEXIST) continue;
        if (fd < 0) return io_status(fd, "cannot create " + tmp);

        auto fail = [&](int rc, const std::string &what, const std::string &path) {
            if (fd >= 0) io->close(fd);
            io->unlink(path);
            return io_status(rc, what);
        };
        int rc = io->preallocate(fd, len);
        if (rc != 0 && rc != -EOPNOTSUPP) return fail(rc, "cannot reserve " + std::to_string(len) + " bytes for " + tmp, tmp);
        Xxh64 h;
        rc = io->write_all(fd, data, len, [&](const uint8_t *p, size_t n) { h.update(p, n); });
        if (rc != 0) return fail(rc, "writing " + tmp, tmp);
        if ((rc = io->fsync(fd)) != 0) return fail(rc, "fsync of " + tmp, tmp);
        rc = io->close(fd);
        fd = -1;
        if (rc != 0) return fail(rc, "closing " + tmp, tmp);
        rc = io->rename_noreplace(tmp, fin);
        if (rc == -EEXIST) {
            io->unlink(tmp);
            continue;
        }
        if (rc != 0) return fail(rc, "renaming " + tmp + " to " + fin, tmp);
        if ((rc = io->fsync_dir(payload_dir)) != 0) return fail(rc, "fsync of directory " + payload_dir, fin);
        *file_id = id;
        *checksum = h.digest();
        return Status::ok();
    }
    return {Code::kInternal, "could not pick an unused payload file name in " + payload_dir};
}

Status Store::Impl::read_whole_file(const std::string &path, const uint64_t *want_bytes, AlignedBuffer *buf,
                                    uint64_t *checksum, std::string *why) {
    // Checked before opening: a symlink must not be followed (O_NOFOLLOW below refuses it
    // anyway) and opening a FIFO would block.
    struct stat st;
    if (lstat(path.c_str(), &st) != 0) {
        if (errno != ENOENT) return io_status(-errno, "cannot stat " + path);
        *why = "payload file " + path + " is missing";
        return {Code::kCorrupt, *why};
    }
    if (!S_ISREG(st.st_mode)) {
        *why = "payload file " + path + (S_ISLNK(st.st_mode) ? " is a symbolic link" : " is not a regular file");
        return {Code::kCorrupt, *why};
    }
    int fd = io->open(path, O_RDONLY | O_NOFOLLOW | O_DIRECT, 0);
    if (fd == -EINVAL) fd = io->open(path, O_RDONLY | O_NOFOLLOW, 0);
    if (fd == -ENOENT || fd == -ELOOP) {  // replaced since the lstat
        *why = "payload file " + path + (fd == -ENOENT ? " is missing" : " is a symbolic link");
        return {Code::kCorrupt, *why};
    }
    if (fd < 0) return io_status(fd, "cannot open " + path);
    struct Closer {
        FileIo *io;
        int fd;
        ~Closer() { io->close(fd); }
    } closer{io.get(), fd};
    uint64_t size = 0;
    if (const int rc = io->file_size(fd, &size)) return io_status(rc, "cannot stat " + path);
    if (want_bytes && size != *want_bytes) {
        *why = "payload file " + path + " is " + std::to_string(size) + " bytes, the index says " +
               std::to_string(*want_bytes);
        return {Code::kCorrupt, *why};
    }
    buf->resize(size_t(size));
    Xxh64 h;
    const int64_t got = io->read_all(fd, buf->data(), buf->size(), [&](const uint8_t *p, size_t n) { h.update(p, n); });
    if (got < 0) return io_status(int(got), "reading " + path);
    if (uint64_t(got) != size) {
        *why = "payload file " + path + " ended after " + std::to_string(got) + " of " + std::to_string(size) + " bytes";
        return {Code::kCorrupt, *why};
    }
    *checksum = h.digest();
    return Status::ok();
}

Status Store::Impl::read_payload_file(const Entry &e, AlignedBuffer *buf, payload::Header *hdr, std::string *why) {
    const std::string path = file_path(e);
    const Record &rec = e.rec;
    uint64_t sum = 0;
    if (Status s = read_whole_file(path, &rec.bytes, buf, &sum, why); !s) return s;
    if (sum != rec.checksum) {
        char b[160];
        snprintf(b, sizeof b, " fails its checksum (xxh64 %016" PRIx64 ", index says %016" PRIx64 ")", sum,
                 rec.checksum);
        *why = "payload file " + path + b;
        return {Code::kCorrupt, *why};
    }
    std::string err;
    payload::Header hh;
    if (!payload::decode_prefix(buf->data(), buf->size(), buf->size(), &hh, &err)) {
        *why = "payload file " + path + ": " + err;
        return {Code::kCorrupt, *why};
    }
    if (hh.fingerprint != rec.fingerprint || hh.n_tokens != rec.n_tokens) {
        *why = "payload file " + path + " header (fingerprint, token count) disagrees with the index";
        return {Code::kCorrupt, *why};
    }
    if (hdr) *hdr = hh;
    return Status::ok();
}

Status Store::Impl::check_payload_file(const Entry &e, bool full, std::string *why) {
    if (full) {
        AlignedBuffer buf;
        return read_payload_file(e, &buf, nullptr, why);
    }
    const Record &rec = e.rec;
    const std::string path = file_path(e);
    struct stat st;
    if (lstat(path.c_str(), &st) != 0) {
        if (errno != ENOENT) return io_status(-errno, "cannot stat " + path);
        *why = "payload file " + path + " is missing";
        return {Code::kCorrupt, *why};
    }
    if (!S_ISREG(st.st_mode)) {
        *why = "payload file " + path + (S_ISLNK(st.st_mode) ? " is a symbolic link" : " is not a regular file");
        return {Code::kCorrupt, *why};
    }
    if (uint64_t(st.st_size) != rec.bytes) {
        *why = "payload file " + path + " is " + std::to_string(st.st_size) + " bytes, the index says " +
               std::to_string(rec.bytes);
        return {Code::kCorrupt, *why};
    }
    payload::Header h;
    std::string err;
    if (!payload::read_file_prefix(path.c_str(), 0, rec.bytes, &h, nullptr, &err)) {
        *why = err;
        return {Code::kCorrupt, *why};
    }
    if (h.fingerprint != rec.fingerprint || h.n_tokens != rec.n_tokens) {
        *why = "payload file " + path + " header (fingerprint, token count) disagrees with the index";
        return {Code::kCorrupt, *why};
    }
    return Status::ok();
}

bool Store::Impl::read_payload_tokens(const Entry &e, std::vector<int32_t> *tokens) {
    payload::Header h;
    std::string err;
    return payload::read_file_prefix(file_path(e).c_str(), 0, e.rec.bytes, &h, tokens, &err) &&
           h.fingerprint == e.rec.fingerprint && h.n_tokens == e.rec.n_tokens;
}

void Store::Impl::move_to_quarantine(const std::string &file, const std::string &who, const std::string &why,
                                     bool unlink_if_stuck) {
    const std::string src = payload_dir + "/" + file;
    std::string dst = quarantine_dir + "/" + file;
    struct stat st;
    if (lstat(src.c_str(), &st) == 0) {
        int rc = io->rename_noreplace(src, dst);
        for (int i = 1; rc == -EEXIST && i < 100; ++i) {
            dst = quarantine_dir + "/" + file + "." + std::to_string(i);
            rc = io->rename_noreplace(src, dst);
        }
        if (rc != 0) {
            // An entry's file proven bad is deleted: left in place, the next recovery could
            // re-index it with a fresh checksum (a damaged tail shows only against the
            // index's). Anything else stays where it is.
            log("cannot move " + src + " to quarantine: " + strerror(-rc) +
                (unlink_if_stuck ? "; deleting it" : "; left in place"));
            if (unlink_if_stuck) io->unlink(src);
            dst.clear();
        }
    } else {
        dst.clear();
    }
    if (!dst.empty()) {
        const std::string note = who + ": " + why + "\n";
        const int fd = io->open(dst + ".why", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0600);
        if (fd >= 0) {
            io->write_all(fd, note.data(), note.size(), nullptr);
            io->close(fd);
        }
    }
    log("quarantined " + who + ": " + why + (dst.empty() ? "" : " (file moved to " + dst + ")"));
}

void Store::Impl::quarantine(const Entry &e, const std::string &why) {
    const std::string who = describe(e);
    // File first: if the index update is lost the entry points at nothing and the next
    // recovery drops it; it can never be served from the bad file.
    move_to_quarantine(file_name(e), who, why, true);
    std::string err;
    const int rc = write([&](MDB_txn *txn) { return delete_entry(txn, e); }, &err);
    if (rc) log("cannot drop quarantined " + who + " from the index: " + err);
}

// ---------------------------------------------------------------- operations

void Store::Impl::touch(const Entry &e) {
    touches[{e.kind, e.key}] = Touch{e.rec.file_id, next_seq(), now_ms()};
}

Status Store::Impl::load_entry(const Entry &e, LoadedPayload *out) {
    std::string why;
    payload::Header hdr;
    // Straight into the caller's buffer, reusing its allocation when it is big enough.
    Status st = read_payload_file(e, &out->bytes, &hdr, &why);
    if (!st) out->bytes.resize(0);
    const std::string who = describe(e);
    if (st.code() == Code::kCorrupt) {
        quarantine(e, why);
        return {Code::kCorrupt, who + " cannot be loaded: " + why + "; it was quarantined"};
    }
    if (!st) return {st.code(), who + ": " + st.message()};
    touch(e);
    out->header = hdr;
    out->info = to_info(e);
    return Status::ok();
}

Status Store::Impl::save_locked(std::string_view name, const uint8_t *data, size_t len) {
    if (Status s = validate_session_name(name); !s) return s;
    payload::Header hdr;
    std::string err;
    if (!payload::decode_prefix(data, len, len, &hdr, &err))
        return {Code::kInvalidArgument, "session " + quoted(name) + ": not a valid payload: " + err};
    if (opt.budget_bytes) {
        uint64_t pinned = 0;
        if (Status s = pinned_bytes(name, &pinned); !s) return s;
        if (pinned + len > opt.budget_bytes)
            return {Code::kBudgetExceeded, "session " + quoted(name) + ": payload of " + std::to_string(len) +
                                               " bytes does not fit the budget of " + std::to_string(opt.budget_bytes) +
                                               " bytes (" + std::to_string(pinned) + " pinned)"};
    }
    uint64_t file_id = 0, checksum = 0;
    if (Status s = write_payload_file(data, len, EntryKind::kSession, name, &file_id, &checksum); !s)
        return {s.code(), "saving session " + quoted(name) + ": " + s.message() + " (previous version kept)"};

    const std::string key(name);
    Record rec;
    rec.file_id = file_id;
    rec.named_file = true;
    rec.bytes = len;
    rec.checksum = checksum;
    rec.fingerprint = hdr.fingerprint;
    rec.n_tokens = hdr.n_tokens;
    rec.prefix_hash = token_prefix_hash(reinterpret_cast<const int32_t *>(data + payload::kHeaderBytes), hdr.n_tokens);
    const uint64_t ms = now_ms();
    std::vector<Entry> gone;
    const int rc = write(
        [&](MDB_txn *txn) {
            gone.clear();
            std::string_view v;
            Record old;
            bool had_old = false;
            int r = get(txn, db.sessions(), key, &v);
            if (r == 0) had_old = decode_record(v, &old);
            else if (r != MDB_NOTFOUND) return r;
            rec.pinned = had_old && old.pinned;
            rec.created_ms = had_old ? old.created_ms : ms;
            rec.last_used_ms = ms;
            rec.last_used_seq = next_seq();
            if (had_old) {
                Entry e{EntryKind::kSession, key, old};
                if ((r = delete_entry(txn, e))) return r;
                gone.push_back(e);
            }
            if ((r = put(txn, db.sessions(), key, encode_record(rec)))) return r;
            if ((r = drop_tombstone(txn, key))) return r;  // the name is stored again
            if (rec.n_tokens > 0 &&
                (r = put(txn, db.prefixes(), session_alias_key(rec.fingerprint, rec.n_tokens, rec.prefix_hash, key),
                         std::string_view("S", 1))))
                return r;
            return evict_to_budget(txn, key, &gone, ("while saving session " + quoted(name)).c_str());
        },
        &err);
    if (rc) {
        io->unlink(payload_dir + "/" + session_file_name(file_id, key));
        return db_status(rc, "saving session " + quoted(name) + ": index update failed: " + err + " (previous version kept)");
    }
    if (!gone.empty() && gone.front().kind == EntryKind::kSession && gone.front().key == key) {
        unlink_files({gone.front()}, nullptr);
        gone.erase(gone.begin());
    }
    evictions += gone.size();
    unlink_files(gone, "evicted");
    return Status::ok();
}

Status Store::Impl::prefix_candidates(uint64_t fingerprint, const int32_t *tokens, size_t n, std::vector<Entry> *out) {
    out->clear();
    if (n == 0) return Status::ok();
    if (!tokens) return {Code::kInvalidArgument, "prefix lookup: token array is NULL"};
    struct Cand {
        PrefixKey pk;
        std::string key;
        std::string_view value;
    };
    std::string err;
    const int rc = db.read(
        [&](MDB_txn *txn) {
            MDB_cursor *cur;
            if (int r = mdb_cursor_open(txn, db.prefixes(), &cur)) return r;
            std::string start = prefix_key_head(fingerprint, 1, 0);
            MDB_val k = mdb_val(start), v;
            std::vector<Cand> cands;
            int r = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
            for (; r == 0; r = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
                PrefixKey pk;
                if (!decode_prefix_key(view(k), &pk)) continue;
                if (pk.fingerprint != fingerprint || pk.n_tokens > n) break;  // sorted: fp, then length
                cands.push_back({pk, std::string(view(k)), view(v)});
            }
            mdb_cursor_close(cur);
            if (r != 0 && r != MDB_NOTFOUND) return r;
            std::vector<uint32_t> lens;
            for (const Cand &c : cands)
                if (lens.empty() || lens.back() != c.pk.n_tokens) lens.push_back(c.pk.n_tokens);
            std::vector<uint64_t> hashes;
            token_prefix_hashes(tokens, lens, &hashes);
            std::map<uint32_t, uint64_t> hash_of;
            for (size_t i = 0; i < lens.size(); ++i) hash_of[lens[i]] = hashes[i];
            for (auto it = cands.rbegin(); it != cands.rend(); ++it) {
                if (hash_of[it->pk.n_tokens] != it->pk.hash) continue;
                Entry e;
                if (it->pk.tag == kTagCheckpoint) {
                    e.kind = EntryKind::kCheckpoint;
                    e.key = it->key;
                    if (!decode_record(it->value, &e.rec)) continue;
                } else {
                    e.kind = EntryKind::kSession;
                    e.key.assign(it->pk.session);
                    std::string_view sv;
                    if (get(txn, db.sessions(), e.key, &sv) != 0 || !decode_record(sv, &e.rec)) continue;
                    if (e.rec.fingerprint != fingerprint || e.rec.n_tokens != it->pk.n_tokens ||
                        e.rec.prefix_hash != it->pk.hash)
                        continue;  // stale alias
                }
                out->push_back(std::move(e));
            }
            return 0;
        },
        &err);
    if (rc) return db_status(rc, "prefix lookup: " + err);
    // A hash match is not proof: compare the token ids stored in each payload.
    std::vector<Entry> verified;
    std::vector<int32_t> stored;
    for (Entry &e : *out) {
        if (!read_payload_tokens(e, &stored) || stored.size() != e.rec.n_tokens) continue;
        if (std::equal(stored.begin(), stored.end(), tokens)) verified.push_back(std::move(e));
    }
    *out = std::move(verified);
    return Status::ok();
}

Status Store::Impl::save_checkpoint_locked(const uint8_t *data, size_t len) {
    payload::Header hdr;
    std::string err;
    if (!payload::decode_prefix(data, len, len, &hdr, &err))
        return {Code::kInvalidArgument, "checkpoint: not a valid payload: " + err};
    if (hdr.n_tokens == 0) return {Code::kInvalidArgument, "checkpoint: payload holds no tokens"};
    std::vector<int32_t> tokens;
    if (!payload::read_tokens(data, len, hdr, &tokens, &err)) return {Code::kInvalidArgument, "checkpoint: " + err};
    std::vector<Entry> same;
    if (Status s = prefix_candidates(hdr.fingerprint, tokens.data(), tokens.size(), &same); !s) return s;
    for (const Entry &e : same) {
        if (e.kind == EntryKind::kCheckpoint && e.rec.n_tokens == hdr.n_tokens) {
            touch(e);
            return Status::ok();
        }
    }
    if (opt.budget_bytes) {
        uint64_t pinned = 0;
        if (Status s = pinned_bytes({}, &pinned); !s) return s;
        if (pinned + len > opt.budget_bytes)
            return {Code::kBudgetExceeded, "checkpoint of " + std::to_string(len) + " bytes does not fit the budget of " +
                                               std::to_string(opt.budget_bytes) + " bytes (" + std::to_string(pinned) +
                                               " pinned)"};
    }
    uint64_t file_id = 0, checksum = 0;
    if (Status s = write_payload_file(data, len, EntryKind::kCheckpoint, {}, &file_id, &checksum); !s)
        return {s.code(), "saving checkpoint: " + s.message()};
    Record rec;
    rec.file_id = file_id;
    rec.named_file = true;
    rec.bytes = len;
    rec.checksum = checksum;
    rec.fingerprint = hdr.fingerprint;
    rec.n_tokens = hdr.n_tokens;
    rec.prefix_hash = token_prefix_hash(tokens.data(), tokens.size());
    rec.created_ms = rec.last_used_ms = now_ms();
    const std::string key = checkpoint_key(rec.fingerprint, rec.n_tokens, rec.prefix_hash, file_id);
    std::vector<Entry> gone;
    const int rc = write(
        [&](MDB_txn *txn) {
            gone.clear();
            rec.last_used_seq = next_seq();
            int r = put(txn, db.prefixes(), key, encode_record(rec));
            if (r == 0) r = evict_to_budget(txn, key, &gone, "while saving a prefix checkpoint");
            return r;
        },
        &err);
    if (rc) {
        io->unlink(payload_dir + "/" + checkpoint_file_name(file_id));
        return db_status(rc, "saving checkpoint: index update failed: " + err);
    }
    evictions += gone.size();
    unlink_files(gone, "evicted");
    return Status::ok();
}

// ---------------------------------------------------------------- Store

Store::Store(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Store::~Store() = default;

const RecoveryReport &Store::recovery_report() const { return impl_->report; }
const std::string &Store::state_dir() const { return impl_->root; }

Status Store::open(const StoreOptions &opt, std::unique_ptr<Store> *out) {
    return guarded("kvstore open", [&]() -> Status {
        if (!out) return {Code::kInvalidArgument, "kvstore open: output pointer is NULL"};
        if (opt.state_dir.empty()) return {Code::kInvalidArgument, "kvstore open: state dir is empty"};
        auto impl = std::make_unique<Impl>();
        impl->opt = opt;
        impl->io = opt.io ? opt.io : std::shared_ptr<FileIo>(make_uring_file_io(opt.io_options));
        if (Status s = impl->open_layout(); !s) return s;
        if (Status s = impl->open_and_recover(); !s) return s;
        out->reset(new Store(std::move(impl)));
        return Status::ok();
    });
}

Status Store::save(std::string_view name, const uint8_t *data, size_t len) {
    return guarded("kvstore save", [&]() -> Status {
        if (!data && len) return {Code::kInvalidArgument, "save: data is NULL"};
        std::lock_guard lk(impl_->mu);
        return impl_->save_locked(name, data, len);
    });
}

Status Store::load(std::string_view name, LoadedPayload *out) {
    return guarded("kvstore load", [&]() -> Status {
        if (!out) return {Code::kInvalidArgument, "load: output is NULL"};
        if (Status s = validate_session_name(name); !s) return s;
        std::lock_guard lk(impl_->mu);
        Entry e{EntryKind::kSession, std::string(name), {}};
        std::string err;
        bool found = false, bad = false;
        const int rc = impl_->db.read(
            [&](MDB_txn *txn) {
                std::string_view v;
                const int r = get(txn, impl_->db.sessions(), e.key, &v);
                if (r == MDB_NOTFOUND) return 0;
                if (r) return r;
                found = true;
                bad = !decode_record(v, &e.rec);
                return 0;
            },
            &err);
        if (rc) return db_status(rc, "load " + quoted(name) + ": " + err);
        if (!found) return {Code::kNotFound, "no session named " + quoted(name)};
        if (bad) return {Code::kCorrupt, "session " + quoted(name) + " has an undecodable index record"};
        return impl_->load_entry(e, out);
    });
}

Status Store::remove(std::string_view name) {
    return guarded("kvstore remove", [&]() -> Status {
        if (Status s = validate_session_name(name); !s) return s;
        std::lock_guard lk(impl_->mu);
        std::string err;
        std::vector<Entry> gone;
        const std::string key(name);
        bool found = false;
        const int rc = impl_->write(
            [&](MDB_txn *txn) {
                gone.clear();
                std::string_view v;
                int r = impl_->drop_tombstone(txn, key);
                if (r == 0) r = get(txn, impl_->db.sessions(), key, &v);
                found = r == 0;
                if (r) return r == MDB_NOTFOUND ? 0 : r;  // commit the dropped tombstone
                Entry e{EntryKind::kSession, key, {}};
                if (!decode_record(v, &e.rec)) return del(txn, impl_->db.sessions(), key);
                if ((r = impl_->delete_entry(txn, e))) return r;
                gone.push_back(e);
                return 0;
            },
            &err);
        if (rc) return db_status(rc, "remove " + quoted(name) + ": " + err);
        if (!found) return {Code::kNotFound, "no session named " + quoted(name)};
        impl_->unlink_files(gone, nullptr);
        return Status::ok();
    });
}

Status Store::pin(std::string_view name, bool pinned) {
    return guarded("kvstore pin", [&]() -> Status {
        if (Status s = validate_session_name(name); !s) return s;
        std::lock_guard lk(impl_->mu);
        std::string err;
        const std::string key(name);
        bool bad = false;
        const int rc = impl_->write(
            [&](MDB_txn *txn) {
                std::string_view v;
                int r = get(txn, impl_->db.sessions(), key, &v);
                if (r) return r;
                Record rec;
                if (!decode_record(v, &rec)) {
                    bad = true;
                    return MDB_INCOMPATIBLE;
                }
                rec.pinned = pinned;
                return put(txn, impl_->db.sessions(), key, encode_record(rec));
            },
            &err);
        if (rc == MDB_NOTFOUND) return {Code::kNotFound, "no session named " + quoted(name)};
        if (bad) return {Code::kCorrupt, "session " + quoted(name) + " has an undecodable index record"};
        if (rc) return db_status(rc, "pin " + quoted(name) + ": " + err);
        return Status::ok();
    });
}

Status Store::info(std::string_view name, EntryInfo *out) {
    return guarded("kvstore info", [&]() -> Status {
        if (!out) return {Code::kInvalidArgument, "info: output is NULL"};
        if (Status s = validate_session_name(name); !s) return s;
        std::lock_guard lk(impl_->mu);
        std::string err;
        Entry e{EntryKind::kSession, std::string(name), {}};
        bool bad = false;
        const int rc = impl_->db.read(
            [&](MDB_txn *txn) {
                std::string_view v;
                const int r = get(txn, impl_->db.sessions(), e.key, &v);
                if (r == 0) bad = !decode_record(v, &e.rec);
                return r;
            },
            &err);
        if (rc == MDB_NOTFOUND) return {Code::kNotFound, "no session named " + quoted(name)};
        if (rc) return db_status(rc, "info " + quoted(name) + ": " + err);
        if (bad) return {Code::kCorrupt, "session " + quoted(name) + " has an undecodable index record"};
        *out = impl_->to_info(e);
        return Status::ok();
    });
}

// Sessions and checkpoints share one table; a listing is that table filtered by kind.
static Status list_kind(Store::Impl &impl, EntryKind kind, const char *what, std::vector<EntryInfo> *out) {
    if (!out) return {Code::kInvalidArgument, std::string(what) + ": output is NULL"};
    std::lock_guard lk(impl.mu);
    std::vector<Entry> all;
    std::string err;
    const int rc = impl.db.read([&](MDB_txn *txn) { return impl.all_entries(txn, &all); }, &err);
    if (rc) return db_status(rc, std::string(what) + ": " + err);
    out->clear();
    for (const Entry &e : all)
        if (e.kind == kind) out->push_back(impl.to_info(e));
    return Status::ok();
}

Status Store::list(std::vector<EntryInfo> *out) {
    return guarded("kvstore list", [&]() -> Status { return list_kind(*impl_, EntryKind::kSession, "list", out); });
}

Status Store::list_checkpoints(std::vector<EntryInfo> *out) {
    return guarded("kvstore list_checkpoints",
                   [&]() -> Status { return list_kind(*impl_, EntryKind::kCheckpoint, "list_checkpoints", out); });
}

Status Store::save_checkpoint(const uint8_t *data, size_t len) {
    return guarded("kvstore save_checkpoint", [&]() -> Status {
        if (!data && len) return {Code::kInvalidArgument, "save_checkpoint: data is NULL"};
        std::lock_guard lk(impl_->mu);
        return impl_->save_checkpoint_locked(data, len);
    });
}

Status Store::find_longest_prefix(uint64_t fingerprint, const int32_t *tokens, size_t n, PrefixMatch *out) {
    return guarded("kvstore find_longest_prefix", [&]() -> Status {
        if (!out) return {Code::kInvalidArgument, "find_longest_prefix: output is NULL"};
        std::lock_guard lk(impl_->mu);
        std::vector<Entry> cands;
        if (Status s = impl_->prefix_candidates(fingerprint, tokens, n, &cands); !s) return s;
        if (cands.empty()) return {Code::kNotFound, "no stored prefix of these tokens for this model"};
        out->n_tokens = cands.front().rec.n_tokens;
        out->info = impl_->to_info(cands.front());
        return Status::ok();
    });
}

Status Store::load_longest_prefix(uint64_t fingerprint, const int32_t *tokens, size_t n, LoadedPayload *out) {
    return guarded("kvstore load_longest_prefix", [&]() -> Status {
        if (!out) return {Code::kInvalidArgument, "load_longest_prefix: output is NULL"};
        std::lock_guard lk(impl_->mu);
        std::vector<Entry> cands;
        if (Status s = impl_->prefix_candidates(fingerprint, tokens, n, &cands); !s) return s;
        for (const Entry &e : cands) {
            Status s = impl_->load_entry(e, out);
            if (s.code() == Code::kCorrupt) continue;  // quarantined; try a shorter one
            return s;
        }
        return {Code::kNotFound, "no stored prefix of these tokens for this model"};
    });
}

Status Store::evicted(std::string_view name, EvictedInfo *out) {
    return guarded("kvstore evicted", [&]() -> Status {
        if (!out) return {Code::kInvalidArgument, "evicted: output is NULL"};
        if (Status s = validate_session_name(name); !s) return s;
        std::lock_guard lk(impl_->mu);
        std::string err;
        Tombstone t;
        bool bad = false;
        const int rc = impl_->db.read(
            [&](MDB_txn *txn) {
                std::string_view v;
                const int r = get(txn, impl_->db.meta(), tombstone_key(name), &v);
                if (r == 0) bad = !decode_tombstone(v, &t);
                return r;
            },
            &err);
        if (rc == MDB_NOTFOUND || bad) return {Code::kNotFound, "no eviction of " + quoted(name) + " remembered"};
        if (rc) return db_status(rc, "evicted " + quoted(name) + ": " + err);
        *out = EvictedInfo{std::string(name), t.evicted_ms, t.why};
        return Status::ok();
    });
}

Status Store::list_evicted(std::vector<EvictedInfo> *out) {
    return guarded("kvstore list_evicted", [&]() -> Status {
        if (!out) return {Code::kInvalidArgument, "list_evicted: output is NULL"};
        std::lock_guard lk(impl_->mu);
        std::string err;
        out->clear();
        const int rc = impl_->db.read([&](MDB_txn *txn) { return impl_->all_tombstones(txn, out); }, &err);
        if (rc) return db_status(rc, "list_evicted: " + err);
        return Status::ok();
    });
}

Status Store::stats(StoreStats *out) {
    return guarded("kvstore stats", [&]() -> Status {
        if (!out) return {Code::kInvalidArgument, "stats: output is NULL"};
        std::lock_guard lk(impl_->mu);
        std::vector<Entry> all;
        std::string err;
        const int rc = impl_->db.read([&](MDB_txn *txn) { return impl_->all_entries(txn, &all); }, &err);
        if (rc) return db_status(rc, "stats: " + err);
        *out = StoreStats{};
        for (const Entry &e : all) {
            (e.kind == EntryKind::kSession ? out->sessions : out->checkpoints)++;
            out->bytes += e.rec.bytes;
            if (e.rec.pinned) out->pinned_bytes += e.rec.bytes;
        }
        out->budget_bytes = impl_->opt.budget_bytes;
        out->map_size = impl_->db.map_size();
        out->map_grows = impl_->db.grow_count();
        out->evictions = impl_->evictions;
        out->uring = uses_uring(*impl_->io);
        return Status::ok();
    });
}

}  // namespace ds4::kvstore
