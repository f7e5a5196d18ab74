// Start-up recovery when the index is lost, damaged or out of step with the payload
// folder: the payloads are the data, so they are re-indexed or set aside, never deleted,
// and no state of the index file may crash the open. Real LMDB files, real payloads.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <map>
#include <random>

#include "kvstore/index_records.h"
#include "kvstore/store.h"
#include "tests/kvstore/test_util.h"

namespace ds4::kvstore {
namespace {

using testing::make_payload;
using testing::TempDir;

class RecoveryTest : public ::testing::Test {
protected:
    StoreOptions options() {
        StoreOptions o;
        o.state_dir = dir.sub("state");
        o.io_options = {256 * 1024, 4};
        o.log = [this](const std::string &l) { logs.push_back(l); };
        return o;
    }
    std::unique_ptr<Store> open_store(const StoreOptions &o) {
        logs.clear();
        std::unique_ptr<Store> s;
        const Status st = Store::open(o, &s);
        EXPECT_TRUE(st) << st.to_string();
        return s;
    }
    std::unique_ptr<Store> open_store() { return open_store(options()); }
    std::string payloads() const { return dir.sub("state/payloads"); }
    std::string quarantine() const { return dir.sub("state/quarantine"); }
    std::string index_file() const { return dir.sub("state/index/data.mdb"); }
    bool logged(const std::string &needle) const {
        for (const auto &l : logs)
            if (l.find(needle) != std::string::npos) return true;
        return false;
    }
    std::string file_of(Store &s, const std::string &name) {
        EntryInfo i;
        EXPECT_TRUE(s.info(name, &i)) << name;
        return payloads() + "/" + i.file;
    }

    // Sessions with awkward but valid names, a pinned one, and two checkpoints.
    void populate() {
        const std::string names[] = {"a", "my chat", "proj:2024-01-02_v1.5", "~!@#$%^&*()[]{}", "x.dsv4",
                                     "-dash", "ckpt", std::string(128, 'z')};
        uint64_t seed = 100;
        for (const auto &n : names) {
            saved[n] = make_payload(seed, 5 + seed % 40, 20000 + 997 * (seed % 7));
            ++seed;
        }
        for (char i = '0'; i < '5'; ++i) saved[std::string{'s', i}] = make_payload(seed + uint64_t(i), 30, 60000);
        auto s = open_store();
        for (const auto &[n, p] : saved) ASSERT_TRUE(s->save(n, p.data(), p.size())) << n;
        ASSERT_TRUE(s->pin("a", true));
        ckpt_tokens = testing::seeded_tokens(7, 24);
        for (size_t n : {8, 16}) {
            const auto c = make_payload(900 + n, std::vector<int32_t>(ckpt_tokens.begin(), ckpt_tokens.begin() + long(n)),
                                        4000);
            ASSERT_TRUE(s->save_checkpoint(c.data(), c.size()));
        }
        files_before = testing::list_files(payloads());
        ASSERT_EQ(files_before.size(), saved.size() + 2);
    }

    // Every saved session is listed and loads byte for byte; the checkpoints serve.
    void expect_all_back(Store &s) {
        std::vector<EntryInfo> l;
        ASSERT_TRUE(s.list(&l));
        std::vector<std::string> names;
        for (const auto &e : l) names.push_back(e.name);
        std::vector<std::string> want;
        for (const auto &[n, p] : saved) want.push_back(n);
        EXPECT_EQ(names, want);
        LoadedPayload lp;
        for (const auto &[n, p] : saved) {
            const Status st = s.load(n, &lp);
            ASSERT_TRUE(st) << n << ": " << st.to_string();
            ASSERT_EQ(lp.bytes.size(), p.size()) << n;
            EXPECT_EQ(memcmp(lp.bytes.data(), p.data(), p.size()), 0) << n;
        }
        PrefixMatch m;
        ASSERT_TRUE(s.find_longest_prefix(testing::kTestFingerprint, ckpt_tokens.data(), ckpt_tokens.size(), &m));
        EXPECT_EQ(m.n_tokens, 16u);
        EXPECT_EQ(m.info.kind, EntryKind::kCheckpoint);
        std::vector<EntryInfo> cps;
        ASSERT_TRUE(s.list_checkpoints(&cps));
        EXPECT_EQ(cps.size(), 2u);
        EXPECT_EQ(testing::list_files(payloads()), files_before) << "every payload file kept, none added";
    }

    TempDir dir;
    std::vector<std::string> logs;
    std::map<std::string, std::vector<uint8_t>> saved;
    std::vector<int32_t> ckpt_tokens;
    std::vector<std::string> files_before;
};

// ---------------------------------------------------------------- lost index

TEST_F(RecoveryTest, DeletedIndexIsRebuiltFromThePayloadFiles) {
    populate();
    ASSERT_EQ(unlink(index_file().c_str()), 0);
    ASSERT_EQ(unlink(dir.sub("state/index/lock.mdb").c_str()), 0);
    {
        auto s = open_store();
        const RecoveryReport &r = s->recovery_report();
        EXPECT_EQ(r.sessions_reindexed, int(saved.size()));
        EXPECT_EQ(r.checkpoints_reindexed, 2);
        EXPECT_EQ(r.files_quarantined, 0);
        EXPECT_EQ(r.orphan_files_removed, 0);
        EXPECT_TRUE(logged("re-indexed session 'my chat'"));
        EXPECT_TRUE(logged("recovery re-indexed 13 sessions and 2 checkpoints"));
        expect_all_back(*s);
        EntryInfo i;
        ASSERT_TRUE(s->info("a", &i));
        EXPECT_FALSE(i.pinned) << "pins live only in the index";
        EXPECT_GT(i.created_ms, 0u);
        EXPECT_TRUE(testing::list_files(quarantine()).empty());
    }
    // The rebuilt index is an ordinary one: nothing more to do at the next open.
    auto s = open_store();
    EXPECT_EQ(s->recovery_report().sessions_reindexed, 0);
    EXPECT_EQ(s->recovery_report().checkpoints_reindexed, 0);
    expect_all_back(*s);
}

TEST_F(RecoveryTest, DeletedDataFileAloneIsRebuiltToo) {
    populate();
    ASSERT_EQ(unlink(index_file().c_str()), 0);  // lock.mdb stays
    auto s = open_store();
    EXPECT_EQ(s->recovery_report().sessions_reindexed, int(saved.size()));
    expect_all_back(*s);
}

TEST_F(RecoveryTest, DeletedIndexFolderIsRebuiltToo) {
    populate();
    TempDir::remove_tree(dir.sub("state/index"));
    auto s = open_store();
    EXPECT_EQ(s->recovery_report().sessions_reindexed, int(saved.size()));
    expect_all_back(*s);
}

TEST_F(RecoveryTest, RebuiltSessionsKeepTheirRecencyOrder) {
    // Oldest file first in the LRU: with a budget for two, a save evicts the oldest.
    const auto p1 = make_payload(1, 10, 50000), p2 = make_payload(2, 10, 50000), p3 = make_payload(3, 10, 50000);
    {
        auto s = open_store();
        ASSERT_TRUE(s->save("old", p1.data(), p1.size()));
        ASSERT_TRUE(s->save("mid", p2.data(), p2.size()));
        auto set_mtime = [&](const std::string &name, time_t t) {
            const struct timespec ts[2] = {{t, 0}, {t, 0}};
            ASSERT_EQ(utimensat(AT_FDCWD, file_of(*s, name).c_str(), ts, AT_SYMLINK_NOFOLLOW), 0);
        };
        set_mtime("old", 1000000);
        set_mtime("mid", 2000000);
    }
    ASSERT_EQ(unlink(index_file().c_str()), 0);
    auto o = options();
    o.budget_bytes = 2 * p1.size() + 100;
    auto s = open_store(o);
    ASSERT_TRUE(s->save("new", p3.data(), p3.size()));
    LoadedPayload lp;
    EXPECT_EQ(s->load("old", &lp).code(), Code::kNotFound);
    EXPECT_TRUE(s->load("mid", &lp));
    EntryInfo i;
    ASSERT_TRUE(s->info("mid", &i));
    EXPECT_EQ(i.created_ms, 2000000000u);
}

TEST_F(RecoveryTest, LeftoversBesideAnIntactIndexAreTheFirstToBeEvicted) {
    // A remove cut off before its unlink: the file comes back at the next open, but ranks
    // below every session the index kept, so a budget takes it first.
    const auto keep = make_payload(1, 10, 50000), gone = make_payload(2, 10, 50000);
    {
        auto s = open_store();
        ASSERT_TRUE(s->save("keep", keep.data(), keep.size()));
        ASSERT_TRUE(s->save("gone", gone.data(), gone.size()));
        const std::string f = file_of(*s, "gone");
        const auto bytes = testing::read_file(f);
        ASSERT_TRUE(s->remove("gone"));
        testing::write_file(f, bytes.data(), bytes.size());
    }
    auto o = options();
    o.budget_bytes = keep.size() + 100;
    auto s = open_store(o);
    EXPECT_EQ(s->recovery_report().sessions_reindexed, 1);
    EXPECT_EQ(s->recovery_report().entries_evicted, 1);
    LoadedPayload lp;
    EXPECT_TRUE(s->load("keep", &lp));
    EXPECT_EQ(s->load("gone", &lp).code(), Code::kNotFound);
}

TEST_F(RecoveryTest, TwoUnindexedVersionsOfASessionKeepTheNewerAndSetTheOtherAside) {
    const auto v1 = make_payload(1, 10, 5000), v2 = make_payload(2, 12, 5000);
    std::string f1;
    {
        auto s = open_store();
        ASSERT_TRUE(s->save("chat", v1.data(), v1.size()));
        f1 = file_of(*s, "chat");
    }
    const auto v1_file = testing::read_file(f1);
    {
        auto s = open_store();
        ASSERT_TRUE(s->save("chat", v2.data(), v2.size()));  // unlinks v1's file
        const struct timespec ts[2] = {{1000, 0}, {1000, 0}};
        testing::write_file(f1, v1_file.data(), v1_file.size());  // as if the unlink was cut off
        ASSERT_EQ(utimensat(AT_FDCWD, f1.c_str(), ts, 0), 0);
    }
    ASSERT_EQ(unlink(index_file().c_str()), 0);
    auto s = open_store();
    EXPECT_EQ(s->recovery_report().sessions_reindexed, 1);
    EXPECT_EQ(s->recovery_report().files_quarantined, 1);
    LoadedPayload lp;
    ASSERT_TRUE(s->load("chat", &lp));
    EXPECT_EQ(lp.bytes.size(), v2.size());
    EXPECT_EQ(memcmp(lp.bytes.data(), v2.data(), v2.size()), 0);
    const auto q = testing::list_files(quarantine());
    ASSERT_EQ(q.size(), 2u);  // v1's file and its note
    EXPECT_EQ(testing::read_file(quarantine() + "/" + q[0]), v1_file);
}

TEST_F(RecoveryTest, UnreferencedOldVersionBesideAnIntactIndexIsSetAsideNotServed) {
    const auto v1 = make_payload(1, 10, 5000), v2 = make_payload(2, 12, 5000);
    auto s = open_store();
    ASSERT_TRUE(s->save("chat", v1.data(), v1.size()));
    const std::string f1 = file_of(*s, "chat");
    const auto v1_file = testing::read_file(f1);
    ASSERT_TRUE(s->save("chat", v2.data(), v2.size()));
    s.reset();
    testing::write_file(f1, v1_file.data(), v1_file.size());
    s = open_store();
    EXPECT_EQ(s->recovery_report().sessions_reindexed, 0);
    EXPECT_EQ(s->recovery_report().files_quarantined, 1);
    EXPECT_TRUE(logged("another version of this session is indexed"));
    LoadedPayload lp;
    ASSERT_TRUE(s->load("chat", &lp));
    EXPECT_EQ(lp.bytes.size(), v2.size());
}

TEST_F(RecoveryTest, UnplaceableFilesAreQuarantinedNeverDeleted) {
    const auto a = make_payload(1, 10, 5000);
    { auto s = open_store(); }
    auto bad = a;
    bad[20] ^= 1;  // header CRC fails
    struct Case {
        std::string file;
        std::vector<uint8_t> bytes;
        const char *why;
    };
    const Case cases[] = {
        {"00000000000000bb.dsv4", a, "does not say which session"},  // older builds' bare name
        {"00000000000000cc-damaged.dsv4", bad, "not a valid payload"},
        {"00000000000000dd-a..b.dsv4", a, "not valid"},  // a name validate_session_name refuses
        {"00000000000000ee.ckpt.dsv4", std::vector<uint8_t>(a.begin(), a.begin() + 30), "not a valid payload"},
    };
    for (const Case &c : cases) testing::write_file(payloads() + "/" + c.file, c.bytes.data(), c.bytes.size());
    testing::write_file(payloads() + "/.tmp-00000000000000aa.dsv4", "partial", 7);
    testing::write_file(payloads() + "/.tmp-notours", "keep", 4);
    testing::write_file(payloads() + "/notes.txt", "keep", 4);
    auto s = open_store();
    const RecoveryReport &r = s->recovery_report();
    EXPECT_EQ(r.temp_files_removed, 1);
    EXPECT_EQ(r.orphan_files_removed, 0);
    EXPECT_EQ(r.files_quarantined, 4);
    EXPECT_EQ(r.sessions_reindexed, 0);
    EXPECT_EQ(testing::list_files(payloads()), (std::vector<std::string>{".tmp-notours", "notes.txt"}))
        << "files that are not ours are left alone";
    for (const Case &c : cases) {
        EXPECT_EQ(testing::read_file(quarantine() + "/" + c.file), c.bytes) << c.file;
        const auto note = testing::read_file(quarantine() + "/" + c.file + ".why");
        EXPECT_NE(std::string(note.begin(), note.end()).find(c.why), std::string::npos) << c.file;
    }
    std::vector<EntryInfo> l;
    ASSERT_TRUE(s->list(&l));
    EXPECT_TRUE(l.empty());
}

// ---------------------------------------------------------------- damaged index

// The index file after populate(), for the damage tests.
class DamagedIndexTest : public RecoveryTest {
protected:
    void damage_and_reopen(const std::function<void(const std::string &)> &damage, bool expect_moved = true,
                           const char *expect_logged = "index is damaged") {
        populate();
        damage(index_file());
        auto s = open_store();
        ASSERT_TRUE(s);
        const RecoveryReport &r = s->recovery_report();
        if (expect_moved) {
            EXPECT_TRUE(logged(expect_logged)) << expect_logged;
            EXPECT_FALSE(r.index_moved_to.empty());
            EXPECT_TRUE(logged("index is damaged")) << (logs.empty() ? "" : logs.front());
            EXPECT_TRUE(logged("moved it to " + r.index_moved_to));
            struct stat st;
            EXPECT_EQ(lstat((r.index_moved_to + "/data.mdb").c_str(), &st), 0) << "the damaged file is kept";
        }
        EXPECT_EQ(r.sessions_reindexed, int(saved.size()));
        expect_all_back(*s);
        s.reset();
        s = open_store();  // and the fresh index is sound
        EXPECT_TRUE(s->recovery_report().index_moved_to.empty());
        expect_all_back(*s);
    }
    static uint64_t size_of(const std::string &path) {
        struct stat st;
        return stat(path.c_str(), &st) == 0 ? uint64_t(st.st_size) : 0;
    }
    static void overwrite(const std::string &path, uint64_t off, const std::vector<uint8_t> &bytes) {
        const int fd = ::open(path.c_str(), O_WRONLY);
        ASSERT_GE(fd, 0);
        ASSERT_EQ(pwrite(fd, bytes.data(), bytes.size(), off_t(off)), ssize_t(bytes.size()));
        ::close(fd);
    }
    static std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
        std::vector<uint8_t> b(n);
        std::mt19937_64 rng(seed);
        for (auto &x : b) x = uint8_t(rng());
        return b;
    }
};

TEST_F(DamagedIndexTest, CutShortOfItsLastPage) {
    // One page short: LMDB maps it anyway and faults (SIGBUS) on the missing page.
    damage_and_reopen([](const std::string &f) {
        const uint64_t size = size_of(f);
        ASSERT_GT(size, 4 * 4096u) << "the test wants an index of several pages";
        ASSERT_EQ(truncate(f.c_str(), off_t(size - 4096)), 0);
    });
}

TEST_F(DamagedIndexTest, CutToItsMetaPages) {
    damage_and_reopen([](const std::string &f) { ASSERT_EQ(truncate(f.c_str(), 2 * 4096), 0); });
}

TEST_F(DamagedIndexTest, CutInsideTheMetaPages) {
    for (const off_t at : {off_t(100), off_t(4096), off_t(4096 + 50)}) {
        SCOPED_TRACE(at);
        TempDir::remove_tree(dir.sub("state"));
        saved.clear();
        damage_and_reopen([at](const std::string &f) { ASSERT_EQ(truncate(f.c_str(), at), 0); });
    }
}

TEST_F(DamagedIndexTest, CutToNothing) {
    // LMDB starts an empty file afresh; the payloads fill it again.
    damage_and_reopen([](const std::string &f) { ASSERT_EQ(truncate(f.c_str(), 0), 0); }, false);
}

TEST_F(DamagedIndexTest, MetaPagesOverwrittenWithRandomBytes) {
    damage_and_reopen([](const std::string &f) { overwrite(f, 0, random_bytes(2 * 4096, 1)); });
}

TEST_F(DamagedIndexTest, SecondMetaPageOverwrittenWithRandomBytes) {
    damage_and_reopen([](const std::string &f) { overwrite(f, 4096, random_bytes(4096, 2)); });
}

TEST_F(DamagedIndexTest, NewestMetaPointsPastTheEnd) {
    // A sane-looking meta whose last page lies beyond the file: the newer of the two
    // (by txnid) is the one LMDB would trust.
    damage_and_reopen([](const std::string &f) {
        for (const uint64_t page : {0u, 4096u}) {
            std::vector<uint8_t> last(8);
            const uint64_t far = 1 << 20;
            memcpy(last.data(), &far, 8);
            overwrite(f, page + 16 + 120, last);
        }
    });
}

TEST_F(DamagedIndexTest, TableRootPageZeroed) {
    // Meta pages intact, the main table's root page wiped: the pre-check's tree walk finds
    // it (LMDB itself would report MDB_CORRUPTED from mdb_dbi_open).
    damage_and_reopen([](const std::string &f) {
        const auto bytes = testing::read_file(f);
        ASSERT_GE(bytes.size(), 2 * 4096u);
        uint64_t best_txn = 0, root = 0;
        for (const size_t page : {size_t(0), size_t(4096)}) {
            uint64_t txn, r;
            memcpy(&txn, bytes.data() + page + 16 + 128, 8);  // mm_txnid
            memcpy(&r, bytes.data() + page + 16 + 24 + 48 + 40, 8);  // mm_dbs[MAIN_DBI].md_root
            if (page == 0 || txn > best_txn) best_txn = txn, root = r;
        }
        ASSERT_GE(root, 2u);
        ASSERT_LE((root + 1) * 4096, bytes.size());
        overwrite(f, root * 4096, std::vector<uint8_t>(4096, 0));
    }, true, "is labelled as another page");
}

// The newest meta's page (0 or 1) and its free-list and main table roots.
static void newest_meta(const std::vector<uint8_t> &bytes, uint64_t *free_root, uint64_t *main_root) {
    uint64_t best_txn = 0;
    for (const size_t page : {size_t(0), size_t(4096)}) {
        uint64_t txn, fr, mr;
        memcpy(&txn, bytes.data() + page + 16 + 128, 8);
        memcpy(&fr, bytes.data() + page + 16 + 24 + 40, 8);
        memcpy(&mr, bytes.data() + page + 16 + 24 + 48 + 40, 8);
        if (page == 0 || txn > best_txn) best_txn = txn, *free_root = fr, *main_root = mr;
    }
}

TEST_F(DamagedIndexTest, NodeOffsetsPastTheirPage) {
    // Found by fuzz_store_recovery: node offsets of a live page pointing past the page made
    // LMDB read past the end of the mapped file (SIGBUS) during the open. The pre-check
    // now walks every page the newest meta reaches.
    damage_and_reopen([](const std::string &f) {
        const auto bytes = testing::read_file(f);
        uint64_t free_root, root;
        newest_meta(bytes, &free_root, &root);
        ASSERT_GE(root, 2u);
        ASSERT_LE((root + 1) * 4096, bytes.size());
        overwrite(f, root * 4096 + 16, std::vector<uint8_t>(8, 0xff));
    }, true, "has a node outside the page");
}

TEST_F(DamagedIndexTest, NodeSizeThatOverlapsTheNextNode) {
    // Found by fuzz_store_recovery: a sessions-table node claiming a value 2 bytes longer
    // than it holds passed the bounds checks; the first write (recovery dropping a stale
    // record) let LMDB shift the page's other nodes by that size, and the next read went
    // past the end of the file (SIGBUS). Nodes must tile their page exactly.
    damage_and_reopen([](const std::string &f) {
        const auto bytes = testing::read_file(f);
        uint64_t free_root, root;
        newest_meta(bytes, &free_root, &root);
        ASSERT_GE(root, 2u);
        ASSERT_LE((root + 1) * 4096, bytes.size());
        // The main table's root is a leaf holding the table records; find "sessions".
        const uint8_t *page = bytes.data() + root * 4096;
        uint16_t lower, table = 0;
        memcpy(&lower, page + 12, 2);
        uint64_t sessions_root = ~uint64_t(0);
        for (uint16_t i = 0; i < (lower - 16) / 2; ++i) {
            uint16_t off, ksize;
            memcpy(&off, page + 16 + 2 * i, 2);
            memcpy(&ksize, page + off + 6, 2);
            if (std::string(reinterpret_cast<const char *>(page + off + 8), ksize) == "sessions")
                memcpy(&sessions_root, page + off + 8 + ksize + 40, 8), table = off;
        }
        ASSERT_NE(table, 0) << "no sessions table record";
        ASSERT_LE((sessions_root + 1) * 4096, bytes.size());
        const uint8_t *leaf = bytes.data() + sessions_root * 4096;
        uint16_t flags, off, dlo;
        memcpy(&flags, leaf + 10, 2);
        ASSERT_EQ(flags & 0x02, 0x02) << "the sessions table fits one leaf page";
        memcpy(&off, leaf + 16, 2);
        memcpy(&dlo, leaf + off, 2);
        dlo = uint16_t(dlo + 2);
        std::vector<uint8_t> v(2);
        memcpy(v.data(), &dlo, 2);
        overwrite(f, sessions_root * 4096 + off, v);
    }, true, "has nodes that overlap or leave gaps");
}

TEST_F(DamagedIndexTest, TableDepthThatIsNotTheTrees) {
    // Found by fuzz_store_recovery: a main table recorded with depth 65535 opened fine, and
    // LMDB, which sizes its page spilling by that depth, leaked 1 MiB per write transaction.
    damage_and_reopen([](const std::string &f) {
        const auto bytes = testing::read_file(f);
        uint64_t best_txn = 0;
        size_t newest = 0;
        for (const size_t page : {size_t(0), size_t(4096)}) {
            uint64_t txn;
            memcpy(&txn, bytes.data() + page + 16 + 128, 8);
            if (page == 0 || txn > best_txn) best_txn = txn, newest = page;
        }
        overwrite(f, newest + 16 + 24 + 48 + 6, {0xff, 0xff});  // mm_dbs[MAIN_DBI].md_depth
    }, true, "levels but is recorded with 65535");
}

TEST_F(DamagedIndexTest, FreeListFlaggedWithDuplicateKeys) {
    // Found by fuzz_store_recovery: the free list's record flagged DUPSORT opened, and the
    // first delete during recovery aborted in LMDB ("Assertion 'mx != NULL' failed in
    // mdb_cursor_init").
    damage_and_reopen([](const std::string &f) {
        const auto bytes = testing::read_file(f);
        uint64_t best_txn = 0;
        size_t newest = 0;
        for (const size_t page : {size_t(0), size_t(4096)}) {
            uint64_t txn;
            memcpy(&txn, bytes.data() + page + 16 + 128, 8);
            if (page == 0 || txn > best_txn) best_txn = txn, newest = page;
        }
        const uint8_t flags = uint8_t(bytes[newest + 16 + 24 + 4] | 0x04);   // mm_dbs[FREE_DBI].md_flags |= DUPSORT
        overwrite(f, newest + 16 + 24 + 4, {flags});
    }, true, "records the free list with duplicate keys");
}

TEST_F(DamagedIndexTest, FreeListNamesAPageInUse) {
    // Found by fuzz_store_recovery: a free list naming a live page went unnoticed, and LMDB
    // handed that page out again on a later write (the fuzzer hit "Assertion 'mp->mp_pgno
    // != pgno' failed in mdb_page_touch", an abort, when the store closed).
    damage_and_reopen([](const std::string &f) {
        const auto bytes = testing::read_file(f);
        uint64_t free_root, root;
        newest_meta(bytes, &free_root, &root);
        ASSERT_GE(root, 2u);
        ASSERT_NE(free_root, ~uint64_t(0)) << "populate() leaves freed pages behind";
        ASSERT_LE((free_root + 1) * 4096, bytes.size());
        const uint8_t *page = bytes.data() + free_root * 4096;
        uint16_t flags, off, ksize;
        memcpy(&flags, page + 10, 2);
        ASSERT_EQ(flags & 0x02, 0x02) << "the free list fits one leaf page";
        memcpy(&off, page + 16, 2);
        memcpy(&ksize, page + off + 6, 2);
        uint64_t count;
        memcpy(&count, page + off + 8 + ksize, 8);
        ASSERT_GE(count, 1u);
        std::vector<uint8_t> pg(8);
        memcpy(pg.data(), &root, 8);
        overwrite(f, free_root * 4096 + off + 8 + ksize + 8, pg);
    }, true, "is both free and in use");
}

TEST_F(DamagedIndexTest, OlderMetaWithAWrappingTransactionId) {
    // Found by fuzz_store_recovery seed 1 (kvstore/fuzz_store_recovery_crashes): the older
    // meta page's txnid set to all ones made it the newest, its (older, sound) tree passed
    // the walk, and the next write ran as txnid 0: LMDB handed a page out twice and aborted
    // ("Assertion 'rc == 0' failed in mdb_page_dirty") when recovery quarantined a payload.
    damage_and_reopen([](const std::string &f) {
        const auto bytes = testing::read_file(f);
        uint64_t txn[2];
        for (int i = 0; i < 2; ++i) memcpy(&txn[i], bytes.data() + i * 4096 + 16 + 128, 8);
        ASSERT_NE(txn[0], txn[1]);
        const size_t older = txn[0] < txn[1] ? 0 : 4096;
        overwrite(f, older + 16 + 128, std::vector<uint8_t>(8, 0xff));
    }, true, "transaction id");
}

TEST_F(DamagedIndexTest, MetaWithATransactionIdOnTheWrongPage) {
    // An id of the right size on the wrong page: LMDB writes transaction t into page t % 2.
    damage_and_reopen([](const std::string &f) {
        const auto bytes = testing::read_file(f);
        uint64_t txn[2];
        for (int i = 0; i < 2; ++i) memcpy(&txn[i], bytes.data() + i * 4096 + 16 + 128, 8);
        const size_t older = txn[0] < txn[1] ? 0 : 4096;
        const uint64_t bumped = std::max(txn[0], txn[1]) + 2;   // newest now, parity of the other page
        std::vector<uint8_t> v(8);
        memcpy(v.data(), &bumped, 8);
        overwrite(f, older + 16 + 128, v);
    }, true, "which LMDB never writes to this page");
}

TEST_F(DamagedIndexTest, EveryPageButTheMetasAndMainRootZeroed) {
    // The tables open (their records sit in the main root) but reading any of them
    // fails: LMDB reports it on the first read, and that is handled the same way.
    damage_and_reopen([](const std::string &f) {
        const auto bytes = testing::read_file(f);
        uint64_t best_txn = 0, root = 0;
        for (const size_t page : {size_t(0), size_t(4096)}) {
            uint64_t txn, r;
            memcpy(&txn, bytes.data() + page + 16 + 128, 8);
            memcpy(&r, bytes.data() + page + 16 + 24 + 48 + 40, 8);
            if (page == 0 || txn > best_txn) best_txn = txn, root = r;
        }
        for (uint64_t p = 2; (p + 1) * 4096 <= bytes.size(); ++p)
            if (p != root) overwrite(f, p * 4096, std::vector<uint8_t>(4096, 0));
    });
}

TEST_F(DamagedIndexTest, ZeroedFile) {
    damage_and_reopen([](const std::string &f) { overwrite(f, 0, std::vector<uint8_t>(size_of(f), 0)); });
}

// ---------------------------------------------------------------- links and oddities

TEST_F(RecoveryTest, PayloadReplacedBySymlinkIsQuarantinedAtRecovery) {
    for (const bool full : {true, false}) {
        SCOPED_TRACE(full ? "full check" : "quick check");
        TempDir::remove_tree(dir.sub("state"));
        TempDir elsewhere;
        const auto a = make_payload(1, 10, 50000), b = make_payload(2, 10, 50000);
        std::string fa;
        {
            auto s = open_store();
            ASSERT_TRUE(s->save("a", a.data(), a.size()));
            ASSERT_TRUE(s->save("b", b.data(), b.size()));
            fa = file_of(*s, "a");
        }
        // The same bytes, behind a link: still refused (the store never follows links).
        const std::string target = elsewhere.sub("target");
        testing::write_file(target, a.data(), a.size());
        ASSERT_EQ(unlink(fa.c_str()), 0);
        ASSERT_EQ(symlink(target.c_str(), fa.c_str()), 0);
        auto o = options();
        o.verify_checksums_on_open = full;
        auto s = open_store(o);
        EXPECT_EQ(s->recovery_report().entries_quarantined, 1);
        EXPECT_EQ(s->recovery_report().quarantined_sessions, std::vector<std::string>{"a"});
        EXPECT_TRUE(logged("quarantined session 'a'"));
        EXPECT_TRUE(logged("is a symbolic link"));
        LoadedPayload lp;
        EXPECT_EQ(s->load("a", &lp).code(), Code::kNotFound);
        EXPECT_TRUE(s->load("b", &lp));
        // The link itself was moved; its target is untouched.
        const std::string moved = quarantine() + "/" + fa.substr(fa.rfind('/') + 1);
        struct stat st;
        ASSERT_EQ(lstat(moved.c_str(), &st), 0);
        EXPECT_TRUE(S_ISLNK(st.st_mode));
        EXPECT_EQ(testing::read_file(target), a);
    }
}

TEST_F(RecoveryTest, PayloadReplacedBySymlinkIsQuarantinedAtLoad) {
    TempDir elsewhere;
    const auto a = make_payload(1, 10, 50000);
    auto s = open_store();
    ASSERT_TRUE(s->save("a", a.data(), a.size()));
    const std::string fa = file_of(*s, "a");
    const std::string target = elsewhere.sub("target");
    testing::write_file(target, a.data(), a.size());
    ASSERT_EQ(unlink(fa.c_str()), 0);
    ASSERT_EQ(symlink(target.c_str(), fa.c_str()), 0);
    LoadedPayload lp;
    const Status st = s->load("a", &lp);
    EXPECT_EQ(st.code(), Code::kCorrupt) << st.to_string();
    EXPECT_NE(st.message().find("symbolic link"), std::string::npos) << st.to_string();
    EXPECT_EQ(s->load("a", &lp).code(), Code::kNotFound);
    EXPECT_EQ(testing::read_file(target), a);
}

TEST_F(RecoveryTest, PayloadReplacedByAFifoDoesNotHangTheOpen) {
    const auto a = make_payload(1, 10, 5000);
    std::string fa;
    {
        auto s = open_store();
        ASSERT_TRUE(s->save("a", a.data(), a.size()));
        fa = file_of(*s, "a");
    }
    ASSERT_EQ(unlink(fa.c_str()), 0);
    ASSERT_EQ(mkfifo(fa.c_str(), 0600), 0);
    auto s = open_store();
    EXPECT_EQ(s->recovery_report().entries_quarantined, 1);
    EXPECT_TRUE(logged("is not a regular file"));
}

TEST_F(RecoveryTest, UnindexedLinksAndFifosAreSetAsideNotFollowed) {
    TempDir elsewhere;
    const auto a = make_payload(1, 10, 5000);
    { auto s = open_store(); }
    const std::string target = elsewhere.sub("target");
    testing::write_file(target, a.data(), a.size());
    ASSERT_EQ(symlink(target.c_str(), (payloads() + "/00000000000000aa-linked.dsv4").c_str()), 0);
    ASSERT_EQ(mkfifo((payloads() + "/00000000000000bb.ckpt.dsv4").c_str(), 0600), 0);
    auto s = open_store();
    EXPECT_EQ(s->recovery_report().sessions_reindexed, 0);
    EXPECT_EQ(s->recovery_report().checkpoints_reindexed, 0);
    EXPECT_EQ(s->recovery_report().files_quarantined, 2);
    EXPECT_TRUE(logged("is a symbolic link"));
    EntryInfo i;
    EXPECT_EQ(s->info("linked", &i).code(), Code::kNotFound);
    EXPECT_TRUE(testing::list_files(payloads()).empty());
    EXPECT_EQ(testing::read_file(target), a);
}

// ---------------------------------------------------------------- file names

TEST(PayloadFileNames, SayWhatTheFileHolds) {
    PayloadFileName p;
    ASSERT_TRUE(parse_payload_file_name(session_file_name(0xabc, "my chat.dsv4"), &p));
    EXPECT_EQ(p.kind, FileKind::kSession);
    EXPECT_EQ(p.file_id, 0xabcu);
    EXPECT_EQ(p.session, "my chat.dsv4");
    ASSERT_TRUE(parse_payload_file_name(checkpoint_file_name(0xfedcba9876543210), &p));
    EXPECT_EQ(p.kind, FileKind::kCheckpoint);
    EXPECT_EQ(p.file_id, 0xfedcba9876543210u);
    ASSERT_TRUE(parse_payload_file_name(payload_file_name(7), &p));
    EXPECT_EQ(p.kind, FileKind::kBare);
    EXPECT_EQ(payload_file_name(7), "0000000000000007.dsv4");
    for (const char *bad : {"", ".dsv4", "000000000000007.dsv4", "000000000000000G.dsv4", "000000000000000A.dsv4",
                            "0000000000000007-.dsv4", "0000000000000007.ckpt", "0000000000000007.dsv", "0000000000000007x.dsv4",
                            ".tmp-0000000000000007.dsv4", "notes.txt"})
        EXPECT_FALSE(parse_payload_file_name(bad, &p)) << bad;
    EXPECT_TRUE(is_temp_file_name(temp_file_name(7)));
    for (const char *other : {".tmp-notours", ".tmp-0000000000000007.dsv4.x", ".tmp-000000000000000Z.dsv4",
                              "0000000000000007.dsv4"})
        EXPECT_FALSE(is_temp_file_name(other)) << other;
}

TEST(IndexRecord, NamedFileFlagRoundTripsInAByteOlderBuildsIgnore) {
    Record r;
    r.file_id = 9;
    r.named_file = true;
    r.pinned = true;
    const std::string enc = encode_record(r);
    Record back;
    ASSERT_TRUE(decode_record(enc, &back));
    EXPECT_TRUE(back.named_file);
    EXPECT_TRUE(back.pinned);
    EXPECT_EQ(uint8_t(enc[1]), 1) << "byte 1 (checked by every build) holds only the pin";
    EXPECT_EQ(uint8_t(enc[2]), 1);
    r.named_file = false;
    ASSERT_TRUE(decode_record(encode_record(r), &back));
    EXPECT_FALSE(back.named_file);
}

}  // namespace
}  // namespace ds4::kvstore
