#include "kvstore/expert_store.h"

#include <fcntl.h>
#include <lmdb.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <set>

#include "io/aligned_buffer.h"
#include "io/extent_reader.h"
#include "kvstore/xxh64.h"

namespace ds4::kvstore {

namespace {

// Keys: 'x' | 'u', fingerprint, layer, expert (big-endian, so one model's keys are adjacent).
constexpr size_t kKeyLen = 17;
void make_key(char tag, uint64_t fp, int layer, int expert, uint8_t *k) {
    k[0] = uint8_t(tag);
    for (int i = 0; i < 8; ++i) k[1 + i] = uint8_t(fp >> (56 - 8 * i));
    for (int i = 0; i < 4; ++i) k[9 + i] = uint8_t(uint32_t(layer) >> (24 - 8 * i));
    for (int i = 0; i < 4; ++i) k[13 + i] = uint8_t(uint32_t(expert) >> (24 - 8 * i));
}
void decode_key(const uint8_t *k, int *layer, int *expert) {
    uint32_t l = 0, e = 0;
    for (int i = 0; i < 4; ++i) l = (l << 8) | k[9 + i];
    for (int i = 0; i < 4; ++i) e = (e << 8) | k[13 + i];
    *layer = int(l), *expert = int(e);
}
uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}
void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}

Status io_status(const std::string &what, int err) {
    return Status(err == ENOSPC || err == EDQUOT ? Code::kNoSpace : Code::kIoError, what + ": " + std::strerror(err));
}

uint64_t decode_fp(const uint8_t *k) {
    uint64_t fp = 0;
    for (int i = 0; i < 8; ++i) fp = (fp << 8) | k[1 + i];
    return fp;
}

std::string data_file(const std::string &dir, uint64_t fp) {
    char name[64];
    std::snprintf(name, sizeof name, "/experts-%016llx.bin", (unsigned long long)fp);
    return dir + name;
}

// DIR/lock, flocked with `op` (LOCK_SH or LOCK_EX, never waiting): open stores share it,
// compaction holds it alone. Returns the descriptor, or -1 with *st set.
int take_lock(const std::string &dir, int op, Status *st) {
    const std::string path = dir + "/lock";
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        *st = io_status("cannot open " + path, errno);
        return -1;
    }
    if (::flock(fd, op | LOCK_NB) != 0) {
        const int e = errno;
        ::close(fd);
        *st = e == EWOULDBLOCK ? Status(Code::kBusy, op == LOCK_EX ? "the expert store " + dir + " is in use by a running model"
                                                                 : "the expert store " + dir + " is being compacted")
                               : io_status("cannot lock " + path, e);
        return -1;
    }
    return fd;
}

Status mdb_status(const std::string &what, int rc) {
    return Status(rc == MDB_MAP_FULL ? Code::kNoSpace : Code::kInternal, what + ": " + mdb_strerror(rc));
}

}  // namespace

struct ExpertStore::Env {
    MDB_env *env = nullptr;
    MDB_dbi dbi = 0;
    ~Env() {
        if (env) mdb_env_close(env);
    }
    int open(const std::string &dir) {
        int rc = mdb_env_create(&env);
        if (rc) {
            env = nullptr;
            return rc;
        }
        if ((rc = mdb_env_set_mapsize(env, size_t(256) << 20))) return rc;
        // A cache of what the GGUF holds: no fsync per commit (flush() syncs).
        if ((rc = mdb_env_open(env, dir.c_str(), MDB_NOTLS | MDB_NOSYNC, 0600))) return rc;
        MDB_txn *txn = nullptr;
        if ((rc = mdb_txn_begin(env, nullptr, 0, &txn))) return rc;
        if ((rc = mdb_dbi_open(txn, nullptr, 0, &dbi))) {
            mdb_txn_abort(txn);
            return rc;
        }
        return mdb_txn_commit(txn);
    }
};

ExpertStore::~ExpertStore() {
    (void)flush();
    if (read_fd_ >= 0) ::close(read_fd_);
    if (write_fd_ >= 0) ::close(write_fd_);
    if (lock_fd_ >= 0) ::close(lock_fd_);
}

Status ExpertStore::open(const std::string &dir, uint64_t fingerprint, std::unique_ptr<ExpertStore> *out) {
    try {
        std::unique_ptr<ExpertStore> s(new ExpertStore());
        s->dir_ = dir;
        s->fp_ = fingerprint;
        if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return io_status("cannot create " + dir, errno);
        Status locked;
        if ((s->lock_fd_ = take_lock(dir, LOCK_SH, &locked)) < 0) return locked;
        const std::string idx = dir + "/index";
        if (::mkdir(idx.c_str(), 0700) != 0 && errno != EEXIST) return io_status("cannot create " + idx, errno);
        s->data_path_ = data_file(dir, fingerprint);

        s->env_ = std::make_unique<Env>();
        int rc = s->env_->open(idx);
        if (rc) {
            // Everything here can be rebuilt: a damaged index is moved aside, not repaired.
            s->env_.reset();
            const std::string aside = idx + ".damaged-" + std::to_string((long long)std::time(nullptr));
            if (std::rename(idx.c_str(), aside.c_str()) != 0) return io_status("cannot move aside " + idx, errno);
            if (::mkdir(idx.c_str(), 0700) != 0) return io_status("cannot create " + idx, errno);
            s->env_ = std::make_unique<Env>();
            if ((rc = s->env_->open(idx)))
                return Status(Code::kInternal, std::string("expert store index: ") + mdb_strerror(rc));
        }
        s->write_fd_ = ::open(s->data_path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        if (s->write_fd_ < 0) return io_status("cannot open " + s->data_path_, errno);
        bool direct = false;
        s->read_fd_ = io::open_for_direct_read(s->data_path_, &direct);
        if (s->read_fd_ < 0) return io_status("cannot open " + s->data_path_, -s->read_fd_);
        struct stat st;
        if (fstat(s->write_fd_, &st) != 0) return io_status("cannot stat " + s->data_path_, errno);
        s->end_ = io::round_up(uint64_t(st.st_size), io::kIoAlign);

        // Load this model's entries; records pointing past the data file (a lost tail) are dropped.
        MDB_txn *txn = nullptr;
        if ((rc = mdb_txn_begin(s->env_->env, nullptr, MDB_RDONLY, &txn)))
            return Status(Code::kInternal, std::string("expert store index: ") + mdb_strerror(rc));
        MDB_cursor *cur = nullptr;
        if ((rc = mdb_cursor_open(txn, s->env_->dbi, &cur))) {
            mdb_txn_abort(txn);
            return Status(Code::kInternal, std::string("expert store index: ") + mdb_strerror(rc));
        }
        for (char tag : {'x', 'u'}) {
            uint8_t k0[kKeyLen];
            make_key(tag, fingerprint, 0, 0, k0);
            MDB_val k{kKeyLen, k0}, v;
            for (int op = MDB_SET_RANGE; mdb_cursor_get(cur, &k, &v, MDB_cursor_op(op)) == 0; op = MDB_NEXT) {
                if (k.mv_size != kKeyLen || std::memcmp(k.mv_data, k0, 9) != 0) break;
                int layer, expert;
                decode_key(static_cast<const uint8_t *>(k.mv_data), &layer, &expert);
                const uint8_t *p = static_cast<const uint8_t *>(v.mv_data);
                if (tag == 'x' && v.mv_size == 24) {
                    ExpertRecord r{get_u64(p), get_u64(p + 8), get_u64(p + 16)};
                    if (r.offset % io::kIoAlign == 0 && r.offset + r.length <= uint64_t(st.st_size))
                        s->index_[key(layer, expert)] = r;
                } else if (tag == 'u' && v.mv_size == 8) {
                    s->usage_[key(layer, expert)] = get_u64(p);
                }
            }
        }
        mdb_cursor_close(cur);
        mdb_txn_abort(txn);
        *out = std::move(s);
        return Status::ok();
    } catch (const std::exception &e) {
        return Status(Code::kInternal, std::string("expert store: ") + e.what());
    }
}

bool ExpertStore::find(int layer, int expert, ExpertRecord *out) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = index_.find(key(layer, expert));
    if (it == index_.end()) return false;
    *out = it->second;
    return true;
}

bool ExpertStore::verify(const ExpertRecord &rec, const uint8_t *data, uint64_t length) {
    return length == rec.length && xxh64(data, length) == rec.checksum;
}

Status ExpertStore::put(int layer, int expert, const uint8_t *data, uint64_t length) {
    if (length == 0 || length % io::kIoAlign)
        return Status(Code::kInvalidArgument, "expert record length must be a positive multiple of 4096");
    try {
        const uint64_t sum = xxh64(data, length);
        std::lock_guard<std::mutex> lk(mu_);
        const uint64_t off = end_;
        for (uint64_t done = 0; done < length;) {
            const ssize_t w = ::pwrite(write_fd_, data + done, length - done, off_t(off + done));
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) return io_status("cannot write " + data_path_, w < 0 ? errno : EIO);
            done += uint64_t(w);
        }
        end_ = off + length;
        uint8_t k[kKeyLen], v[24];
        make_key('x', fp_, layer, expert, k);
        put_u64(v, off), put_u64(v + 8, length), put_u64(v + 16, sum);
        MDB_txn *txn = nullptr;
        int rc = mdb_txn_begin(env_->env, nullptr, 0, &txn);
        MDB_val kv{kKeyLen, k}, vv{24, v};
        if (!rc && (rc = mdb_put(txn, env_->dbi, &kv, &vv, 0))) mdb_txn_abort(txn);
        else if (!rc) rc = mdb_txn_commit(txn);
        if (rc) return Status(rc == MDB_MAP_FULL ? Code::kNoSpace : Code::kInternal, std::string("expert store index: ") + mdb_strerror(rc));
        index_[key(layer, expert)] = ExpertRecord{off, length, sum};
        return Status::ok();
    } catch (const std::exception &e) {
        return Status(Code::kInternal, std::string("expert store: ") + e.what());
    }
}

Status ExpertStore::add_usage(const std::vector<uint32_t> &counts, int n_expert) {
    if (n_expert <= 0) return Status(Code::kInvalidArgument, "n_expert must be positive");
    try {
        std::lock_guard<std::mutex> lk(mu_);
        MDB_txn *txn = nullptr;
        int rc = mdb_txn_begin(env_->env, nullptr, 0, &txn);
        for (size_t i = 0; !rc && i < counts.size(); ++i) {
            if (!counts[i]) continue;
            const int layer = int(i / n_expert), expert = int(i % n_expert);
            uint64_t &u = usage_[key(layer, expert)];
            u += counts[i];
            uint8_t k[kKeyLen], v[8];
            make_key('u', fp_, layer, expert, k);
            put_u64(v, u);
            MDB_val kv{kKeyLen, k}, vv{8, v};
            rc = mdb_put(txn, env_->dbi, &kv, &vv, 0);
        }
        if (rc) {
            if (txn) mdb_txn_abort(txn);
            return Status(Code::kInternal, std::string("expert store usage: ") + mdb_strerror(rc));
        }
        if ((rc = mdb_txn_commit(txn))) return Status(Code::kInternal, std::string("expert store usage: ") + mdb_strerror(rc));
        return Status::ok();
    } catch (const std::exception &e) {
        return Status(Code::kInternal, std::string("expert store: ") + e.what());
    }
}

std::vector<std::pair<int, int>> ExpertStore::hot_set(size_t max) const {
    std::vector<std::pair<uint64_t, uint64_t>> v;  // (count, key)
    {
        std::lock_guard<std::mutex> lk(mu_);
        for (const auto &[k, c] : usage_) v.push_back({c, k});
    }
    std::sort(v.begin(), v.end(), [](auto &a, auto &b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
    if (v.size() > max) v.resize(max);
    std::vector<std::pair<int, int>> out;
    for (const auto &[c, k] : v) out.push_back({int(k >> 32), int(k & 0xffffffffu)});
    return out;
}

uint64_t ExpertStore::use_count(int layer, int expert) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = usage_.find(key(layer, expert));
    return it == usage_.end() ? 0 : it->second;
}

size_t ExpertStore::records() const {
    std::lock_guard<std::mutex> lk(mu_);
    return index_.size();
}

Status ExpertStore::set_source(const std::string &gguf_path) {
    struct stat st;
    if (::stat(gguf_path.c_str(), &st) != 0) return io_status("cannot stat " + gguf_path, errno);
    std::vector<uint8_t> v(8 + gguf_path.size());
    put_u64(v.data(), uint64_t(st.st_size));
    std::memcpy(v.data() + 8, gguf_path.data(), gguf_path.size());
    uint8_t k[kKeyLen];
    make_key('m', fp_, 0, 0, k);
    std::lock_guard<std::mutex> lk(mu_);
    MDB_txn *txn = nullptr;
    int rc = mdb_txn_begin(env_->env, nullptr, 0, &txn);
    MDB_val kv{kKeyLen, k}, vv{v.size(), v.data()};
    if (!rc && (rc = mdb_put(txn, env_->dbi, &kv, &vv, 0))) mdb_txn_abort(txn);
    else if (!rc) rc = mdb_txn_commit(txn);
    return rc ? mdb_status("expert store index", rc) : Status::ok();
}

namespace {

// One model's entries in the index.
struct ModelEntries {
    std::vector<std::pair<uint64_t, ExpertRecord>> records;  // (layer << 32 | expert, record)
    uint64_t used = 0;
    bool has_source = false;
    std::string source;
    uint64_t source_bytes = 0;
};

// Every entry of the index in `env`, by fingerprint.
int scan(MDB_env *env, MDB_dbi dbi, std::map<uint64_t, ModelEntries> *out) {
    MDB_txn *txn = nullptr;
    int rc = mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn);
    if (rc) return rc;
    MDB_cursor *cur = nullptr;
    if ((rc = mdb_cursor_open(txn, dbi, &cur))) {
        mdb_txn_abort(txn);
        return rc;
    }
    MDB_val k, v;
    for (int op = MDB_FIRST; mdb_cursor_get(cur, &k, &v, MDB_cursor_op(op)) == 0; op = MDB_NEXT) {
        if (k.mv_size != kKeyLen) continue;
        const uint8_t *kp = static_cast<const uint8_t *>(k.mv_data), *p = static_cast<const uint8_t *>(v.mv_data);
        ModelEntries &m = (*out)[decode_fp(kp)];
        int layer, expert;
        decode_key(kp, &layer, &expert);
        const uint64_t le = (uint64_t(uint32_t(layer)) << 32) | uint32_t(expert);
        if (kp[0] == 'x' && v.mv_size == 24) m.records.push_back({le, ExpertRecord{get_u64(p), get_u64(p + 8), get_u64(p + 16)}});
        else if (kp[0] == 'u' && v.mv_size == 8) m.used += 1;
        else if (kp[0] == 'm' && v.mv_size >= 8) {
            m.has_source = true;
            m.source_bytes = get_u64(p);
            m.source.assign(reinterpret_cast<const char *>(p + 8), v.mv_size - 8);
        }
    }
    mdb_cursor_close(cur);
    mdb_txn_abort(txn);
    return 0;
}

bool source_present(const ModelEntries &m) {
    struct stat st;
    return m.has_source && ::stat(m.source.c_str(), &st) == 0 && S_ISREG(st.st_mode) && uint64_t(st.st_size) == m.source_bytes;
}

uint64_t file_size_or_0(const std::string &path) {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 ? uint64_t(st.st_size) : 0;
}

// Copies the model's records into `tmp` back to back, in file order, checking each; fills
// `moved` with the records' new places and `dropped` with the keys of those that failed.
Status rewrite_records(const std::string &src, const std::string &tmp, std::vector<std::pair<uint64_t, ExpertRecord>> recs,
                       std::vector<std::pair<uint64_t, ExpertRecord>> *moved, std::vector<uint64_t> *dropped) {
    std::sort(recs.begin(), recs.end(), [](auto &a, auto &b) { return a.second.offset < b.second.offset; });
    const int in = ::open(src.c_str(), O_RDONLY | O_CLOEXEC);
    const int out = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (out < 0) {
        if (in >= 0) ::close(in);
        return io_status("cannot create " + tmp, errno);
    }
    std::vector<uint8_t> buf;
    uint64_t at = 0;
    Status st;
    for (const auto &[le, r] : recs) {
        bool good = in >= 0 && r.length > 0 && r.length % io::kIoAlign == 0;
        if (good) {
            buf.resize(r.length);
            uint64_t done = 0;
            while (done < r.length) {
                const ssize_t n = ::pread(in, buf.data() + done, r.length - done, off_t(r.offset + done));
                if (n < 0 && errno == EINTR) continue;
                if (n <= 0) break;
                done += uint64_t(n);
            }
            good = done == r.length && ExpertStore::verify(r, buf.data(), r.length);
        }
        if (!good) {
            dropped->push_back(le);
            continue;
        }
        for (uint64_t done = 0; done < r.length;) {
            const ssize_t w = ::pwrite(out, buf.data() + done, r.length - done, off_t(at + done));
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                st = io_status("cannot write " + tmp, w < 0 ? errno : EIO);
                break;
            }
            done += uint64_t(w);
        }
        if (!st) break;
        moved->push_back({le, ExpertRecord{at, r.length, r.checksum}});
        at += r.length;
    }
    if (st && ::fdatasync(out) != 0) st = io_status("cannot sync " + tmp, errno);
    if (in >= 0) {
        (void)::posix_fadvise(in, 0, 0, POSIX_FADV_DONTNEED);
        ::close(in);
    }
    ::close(out);
    return st;
}

}  // namespace

Status ExpertStore::list(const std::string &dir, std::vector<ExpertStoreModel> *out) {
    out->clear();
    const std::string idx = dir + "/index";
    struct stat st;
    if (::stat((idx + "/data.mdb").c_str(), &st) != 0) return Status::ok();  // nothing stored yet
    try {
        Env env;
        if (const int rc = env.open(idx)) return mdb_status("expert store index " + idx, rc);
        std::map<uint64_t, ModelEntries> models;
        if (const int rc = scan(env.env, env.dbi, &models)) return mdb_status("expert store index " + idx, rc);
        for (const auto &[fp, m] : models) {
            ExpertStoreModel x;
            x.fingerprint = fp;
            x.source = m.source;
            x.source_bytes = m.source_bytes;
            x.source_present = source_present(m);
            x.records = m.records.size();
            for (const auto &[le, r] : m.records) x.record_bytes += r.length;
            x.file_bytes = file_size_or_0(data_file(dir, fp));
            x.used_experts = m.used;
            out->push_back(std::move(x));
        }
        return Status::ok();
    } catch (const std::exception &e) {
        return Status(Code::kInternal, std::string("expert store: ") + e.what());
    }
}

Status ExpertStore::compact(const std::string &dir, const ExpertStoreCompaction &opt, ExpertStoreCompactReport *out) {
    *out = {};
    struct stat dst;
    if (::stat(dir.c_str(), &dst) != 0) return errno == ENOENT ? Status::ok() : io_status("cannot stat " + dir, errno);
    Status locked;
    const int lock = take_lock(dir, LOCK_EX, &locked);
    if (lock < 0) return locked;
    struct Unlock {
        int fd;
        ~Unlock() { ::close(fd); }
    } unlock{lock};
    try {
        namespace fs = std::filesystem;
        for (const auto &e : fs::directory_iterator(dir)) {
            const std::string n = e.path().filename().string();
            if (n.rfind("experts-", 0) == 0 && n.size() > 4 && n.compare(n.size() - 4, 4, ".bin") == 0)
                out->bytes_before += file_size_or_0(e.path().string());
        }
        const std::string idx = dir + "/index";
        std::map<uint64_t, ModelEntries> models;
        std::unique_ptr<Env> env;
        if (::stat((idx + "/data.mdb").c_str(), &dst) == 0) {
            env = std::make_unique<Env>();
            if (const int rc = env->open(idx)) return mdb_status("expert store index " + idx, rc);
            if (const int rc = scan(env->env, env->dbi, &models)) return mdb_status("expert store index " + idx, rc);
        }
        std::set<uint64_t> kept_files;
        for (auto &entry : models) {
            const uint64_t fp = entry.first;  // not a structured binding: the lambdas below capture it
            ModelEntries &m = entry.second;
            const bool keep = std::find(opt.keep.begin(), opt.keep.end(), fp) != opt.keep.end() ||
                              (m.has_source ? source_present(m) : !opt.drop_unknown);
            const std::string data = data_file(dir, fp);
            // The index changes of this model, in one transaction: its keys deleted, or its
            // records moved and the corrupt ones deleted.
            std::vector<std::pair<uint64_t, ExpertRecord>> moved;
            std::vector<uint64_t> dropped;
            if (keep) {
                const std::string tmp = data + ".compact";
                Status st = rewrite_records(data, tmp, m.records, &moved, &dropped);
                if (!st) {
                    ::unlink(tmp.c_str());
                    return st;
                }
                if (std::rename(tmp.c_str(), data.c_str()) != 0) return io_status("cannot rename " + tmp, errno);
                const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                if (dfd >= 0) {
                    (void)::fsync(dfd);
                    ::close(dfd);
                }
                kept_files.insert(fp);
                out->models_kept += 1;
                out->records_kept += moved.size();
                out->records_corrupt += dropped.size();
            } else {
                out->models_removed += 1;
            }
            MDB_txn *txn = nullptr;
            int rc = mdb_txn_begin(env->env, nullptr, 0, &txn);
            auto del = [&](char tag, uint64_t le) {
                uint8_t k[kKeyLen];
                make_key(tag, fp, int(le >> 32), int(le & 0xffffffffu), k);
                MDB_val kv{kKeyLen, k};
                const int r = mdb_del(txn, env->dbi, &kv, nullptr);
                return r == MDB_NOTFOUND ? 0 : r;
            };
            if (!keep && !rc) {
                // Every key of this fingerprint: records, use counts, source.
                std::vector<std::vector<uint8_t>> keys;
                MDB_cursor *cur = nullptr;
                if (!(rc = mdb_cursor_open(txn, env->dbi, &cur))) {
                    MDB_val k, v;
                    for (int op = MDB_FIRST; mdb_cursor_get(cur, &k, &v, MDB_cursor_op(op)) == 0; op = MDB_NEXT)
                        if (k.mv_size == kKeyLen && decode_fp(static_cast<const uint8_t *>(k.mv_data)) == fp)
                            keys.emplace_back(static_cast<const uint8_t *>(k.mv_data), static_cast<const uint8_t *>(k.mv_data) + kKeyLen);
                    mdb_cursor_close(cur);
                }
                for (auto &key : keys) {
                    MDB_val kv{kKeyLen, key.data()};
                    if (!rc && (rc = mdb_del(txn, env->dbi, &kv, nullptr)) == MDB_NOTFOUND) rc = 0;
                }
            }
            for (uint64_t le : dropped)
                if (!rc) rc = del('x', le);
            for (const auto &[le, r] : moved) {
                if (rc) break;
                uint8_t k[kKeyLen], v[24];
                make_key('x', fp, int(le >> 32), int(le & 0xffffffffu), k);
                put_u64(v, r.offset), put_u64(v + 8, r.length), put_u64(v + 16, r.checksum);
                MDB_val kv{kKeyLen, k}, vv{24, v};
                rc = mdb_put(txn, env->dbi, &kv, &vv, 0);
            }
            if (rc) {
                if (txn) mdb_txn_abort(txn);
                return mdb_status("expert store index", rc);
            }
            if ((rc = mdb_txn_commit(txn))) return mdb_status("expert store index", rc);
        }
        if (env && env->env) {
            if (const int rc = mdb_env_sync(env->env, 1)) return mdb_status("expert store index sync", rc);
        }
        // Data files no kept model refers to, leftovers of an interrupted compaction, and
        // damaged indexes moved aside at open.
        for (const auto &e : fs::directory_iterator(dir)) {
            const std::string n = e.path().filename().string();
            bool remove = false;
            if (n.rfind("index.damaged-", 0) == 0) remove = true;
            else if (n.rfind("experts-", 0) == 0 && n.size() > 12 && n.compare(n.size() - 8, 8, ".compact") == 0) remove = true;
            else if (n.rfind("experts-", 0) == 0 && n.size() == 8 + 16 + 4 && n.compare(n.size() - 4, 4, ".bin") == 0) {
                const uint64_t fp = std::strtoull(n.substr(8, 16).c_str(), nullptr, 16);
                remove = !kept_files.count(fp);
            }
            if (!remove) continue;
            std::error_code ec;
            fs::remove_all(e.path(), ec);
            if (ec) return Status(Code::kIoError, "cannot remove " + e.path().string() + ": " + ec.message());
            out->files_removed += 1;
        }
        for (uint64_t fp : kept_files) out->bytes_after += file_size_or_0(data_file(dir, fp));
        return Status::ok();
    } catch (const std::exception &e) {
        return Status(Code::kInternal, std::string("expert store: ") + e.what());
    }
}

Status ExpertStore::flush() {
    std::lock_guard<std::mutex> lk(mu_);
    if (write_fd_ >= 0 && ::fdatasync(write_fd_) != 0) return io_status("cannot sync " + data_path_, errno);
    if (env_ && env_->env) {
        if (const int rc = mdb_env_sync(env_->env, 1))
            return Status(Code::kIoError, std::string("expert store index sync: ") + mdb_strerror(rc));
    }
    return Status::ok();
}

}  // namespace ds4::kvstore
