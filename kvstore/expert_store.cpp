#include "kvstore/expert_store.h"

#include <fcntl.h>
#include <lmdb.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

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
}

Status ExpertStore::open(const std::string &dir, uint64_t fingerprint, std::unique_ptr<ExpertStore> *out) {
    try {
        std::unique_ptr<ExpertStore> s(new ExpertStore());
        s->dir_ = dir;
        s->fp_ = fingerprint;
        if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return io_status("cannot create " + dir, errno);
        const std::string idx = dir + "/index";
        if (::mkdir(idx.c_str(), 0700) != 0 && errno != EEXIST) return io_status("cannot create " + idx, errno);
        char name[64];
        std::snprintf(name, sizeof name, "/experts-%016llx.bin", (unsigned long long)fingerprint);
        s->data_path_ = dir + name;

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
