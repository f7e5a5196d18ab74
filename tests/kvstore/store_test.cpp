#include "kvstore/store.h"

#include <gtest/gtest.h>
#include <lmdb.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvstore/index_records.h"
#include "kvstore/session_name.h"
#include "tests/kvstore/faulty_file_io.h"
#include "tests/kvstore/test_util.h"

namespace ds4::kvstore {
namespace {

using testing::FaultyFileIo;
using testing::make_payload;
using testing::Op;
using testing::TempDir;

class StoreTest : public ::testing::Test {
protected:
    StoreOptions options() {
        StoreOptions o;
        o.state_dir = dir.sub("state");
        o.io = faulty;
        o.io_options = {256 * 1024, 4};
        o.log = [this](const std::string &l) { logs.push_back(l); };
        return o;
    }
    std::unique_ptr<Store> open_store(const StoreOptions &o) {
        std::unique_ptr<Store> s;
        const Status st = Store::open(o, &s);
        EXPECT_TRUE(st) << st.to_string();
        return s;
    }
    std::unique_ptr<Store> open_store() { return open_store(options()); }
    std::string payloads() const { return dir.sub("state/payloads"); }
    std::string quarantine() const { return dir.sub("state/quarantine"); }
    std::string file_of(Store &s, const std::string &name) {
        EntryInfo i;
        EXPECT_TRUE(s.info(name, &i));
        return payloads() + "/" + i.file;
    }
    bool logged(const std::string &needle) const {
        for (const auto &l : logs)
            if (l.find(needle) != std::string::npos) return true;
        return false;
    }
    static void expect_loads(Store &s, const std::string &name, const std::vector<uint8_t> &want) {
        LoadedPayload p;
        const Status st = s.load(name, &p);
        ASSERT_TRUE(st) << st.to_string();
        ASSERT_EQ(p.bytes.size(), want.size());
        EXPECT_EQ(memcmp(p.bytes.data(), want.data(), want.size()), 0) << name;
    }

    TempDir dir;
    std::vector<std::string> logs;
    std::shared_ptr<FaultyFileIo> faulty =
        std::make_shared<FaultyFileIo>(std::shared_ptr<FileIo>(make_uring_file_io({256 * 1024, 4})));
};

TEST_F(StoreTest, SaveLoadRoundTripSurvivesReopen) {
    const auto p = make_payload(1, 100, 700000 + 3);  // several chunks, unaligned size
    {
        auto s = open_store();
        ASSERT_TRUE(s->save("chat", p.data(), p.size()));
        expect_loads(*s, "chat", p);
        EntryInfo i;
        ASSERT_TRUE(s->info("chat", &i));
        EXPECT_EQ(i.bytes, p.size());
        EXPECT_EQ(i.n_tokens, 100u);
        EXPECT_EQ(i.fingerprint, testing::kTestFingerprint);
        EXPECT_FALSE(i.pinned);
        EXPECT_GT(i.created_ms, 0u);
    }
    auto s = open_store();
    EXPECT_EQ(s->recovery_report().entries_quarantined, 0);
    expect_loads(*s, "chat", p);
    LoadedPayload lp;
    ASSERT_TRUE(s->load("chat", &lp));
    EXPECT_EQ(lp.header.n_tokens, 100u);
    EXPECT_EQ(lp.info.name, "chat");
    EXPECT_EQ(testing::list_files(payloads()).size(), 1u);
}

TEST_F(StoreTest, MissingSessionIsNotFound) {
    auto s = open_store();
    LoadedPayload p;
    EXPECT_EQ(s->load("nobody", &p).code(), Code::kNotFound);
    EXPECT_EQ(s->remove("nobody").code(), Code::kNotFound);
    EXPECT_EQ(s->pin("nobody", true).code(), Code::kNotFound);
}

TEST_F(StoreTest, OverwriteReplacesAndDeletesTheOldFile) {
    auto s = open_store();
    const auto v1 = make_payload(1, 10, 5000), v2 = make_payload(2, 20, 9000);
    ASSERT_TRUE(s->save("a", v1.data(), v1.size()));
    EntryInfo before;
    ASSERT_TRUE(s->info("a", &before));
    ASSERT_TRUE(s->pin("a", true));
    ASSERT_TRUE(s->save("a", v2.data(), v2.size()));
    expect_loads(*s, "a", v2);
    EntryInfo after;
    ASSERT_TRUE(s->info("a", &after));
    EXPECT_NE(after.file, before.file);
    EXPECT_TRUE(after.pinned) << "pin survives an overwrite";
    EXPECT_EQ(after.created_ms, before.created_ms);
    EXPECT_EQ(testing::list_files(payloads()), std::vector<std::string>{after.file});
    ASSERT_TRUE(s->remove("a"));
    EXPECT_TRUE(testing::list_files(payloads()).empty());
}

TEST_F(StoreTest, RejectsInvalidPayloadsWithoutWriting) {
    auto s = open_store();
    auto p = make_payload(1, 10, 100);
    p.push_back(0);  // trailing byte
    const Status st = s->save("x", p.data(), p.size());
    EXPECT_EQ(st.code(), Code::kInvalidArgument);
    EXPECT_NE(st.message().find("trailing"), std::string::npos) << st.to_string();
    const uint8_t junk[10] = {};
    EXPECT_EQ(s->save("x", junk, sizeof junk).code(), Code::kInvalidArgument);
    EXPECT_TRUE(testing::list_files(payloads()).empty());
}

struct Fault {
    const char *name;
    Op op;
    int err;
    int skip;
    size_t after_bytes;
    Code code;
};

class StoreFaultTest : public StoreTest, public ::testing::WithParamInterface<Fault> {};

TEST_P(StoreFaultTest, FailedSaveKeepsThePreviousVersion) {
    const Fault f = GetParam();
    const auto old = make_payload(1, 50, 300000), neu = make_payload(2, 60, 1200000);
    {
        auto s = open_store();
        ASSERT_TRUE(s->save("chat", old.data(), old.size()));
        const auto files_before = testing::list_files(payloads());
        faulty->fail(f.op, f.err, f.skip, f.after_bytes);
        const Status st = s->save("chat", neu.data(), neu.size());
        faulty->clear();
        EXPECT_EQ(st.code(), f.code) << st.to_string();
        EXPECT_NE(st.message().find("previous version kept"), std::string::npos) << st.to_string();
        expect_loads(*s, "chat", old);
        EXPECT_EQ(testing::list_files(payloads()), files_before) << "nothing left behind";
        // The store still works after the failure.
        ASSERT_TRUE(s->save("other", neu.data(), neu.size()));
    }
    auto s = open_store();
    expect_loads(*s, "chat", old);
    expect_loads(*s, "other", neu);
}

INSTANTIATE_TEST_SUITE_P(
    Faults, StoreFaultTest,
    ::testing::Values(Fault{"EnospcMidWrite", Op::kWrite, ENOSPC, 0, 512 * 1024, Code::kNoSpace},
                      Fault{"EnospcOnReserve", Op::kPreallocate, ENOSPC, 0, 0, Code::kNoSpace},
                      Fault{"EioOnWrite", Op::kWrite, EIO, 0, 0, Code::kIoError},
                      Fault{"EioOnFsync", Op::kFsync, EIO, 0, 0, Code::kIoError},
                      Fault{"EioOnClose", Op::kClose, EIO, 0, 0, Code::kIoError},
                      Fault{"EioOnRename", Op::kRename, EIO, 0, 0, Code::kIoError},
                      Fault{"EioOnDirFsync", Op::kFsyncDir, EIO, 0, 0, Code::kIoError},
                      Fault{"EmfileOnOpen", Op::kOpen, EMFILE, 0, 0, Code::kIoError}),
    [](const auto &i) { return std::string(i.param.name); });

TEST_F(StoreTest, CorruptPayloadIsDetectedAtLoadAndQuarantined) {
    auto s = open_store();
    const auto p = make_payload(3, 10, 100000);
    ASSERT_TRUE(s->save("c", p.data(), p.size()));
    const std::string f = file_of(*s, "c");
    testing::flip_byte(f, p.size() - 1000);  // in the tail: only the file checksum sees it
    LoadedPayload lp;
    const Status st = s->load("c", &lp);
    EXPECT_EQ(st.code(), Code::kCorrupt);
    EXPECT_NE(st.message().find("checksum"), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find("quarantined"), std::string::npos) << st.to_string();
    EXPECT_EQ(lp.bytes.size(), 0u) << "no bytes handed out";
    EXPECT_EQ(s->load("c", &lp).code(), Code::kNotFound) << "never served again";
    const auto q = testing::list_files(quarantine());
    ASSERT_EQ(q.size(), 2u);  // the file and its .why note
    EXPECT_TRUE(testing::list_files(payloads()).empty());
    const auto note = testing::read_file(quarantine() + "/" + q[1]);
    EXPECT_NE(std::string(note.begin(), note.end()).find("session 'c'"), std::string::npos);
    EXPECT_TRUE(logged("quarantined session 'c'"));
}

TEST_F(StoreTest, TruncatedPayloadIsDetectedAtLoad) {
    auto s = open_store();
    const auto p = make_payload(4, 10, 100000);
    ASSERT_TRUE(s->save("t", p.data(), p.size()));
    ASSERT_EQ(truncate(file_of(*s, "t").c_str(), off_t(p.size() / 2)), 0);
    LoadedPayload lp;
    const Status st = s->load("t", &lp);
    EXPECT_EQ(st.code(), Code::kCorrupt);
    EXPECT_NE(st.message().find("the index says"), std::string::npos) << st.to_string();
}

TEST_F(StoreTest, RecoveryQuarantinesCorruptTruncatedAndMissingPayloads) {
    const auto a = make_payload(1, 10, 50000), b = make_payload(2, 10, 50000), c = make_payload(3, 10, 50000),
               d = make_payload(4, 10, 50000);
    std::string fa, fb, fc;
    {
        auto s = open_store();
        for (auto [n, p] : {std::pair{"a", &a}, {"b", &b}, {"c", &c}, {"d", &d}})
            ASSERT_TRUE(s->save(n, p->data(), p->size()));
        fa = file_of(*s, "a"), fb = file_of(*s, "b"), fc = file_of(*s, "c");
    }
    testing::flip_byte(fa, 30000);
    ASSERT_EQ(truncate(fb.c_str(), 1000), 0);
    ASSERT_EQ(unlink(fc.c_str()), 0);
    auto s = open_store();
    EXPECT_EQ(s->recovery_report().entries_quarantined, 3);
    LoadedPayload lp;
    for (const char *n : {"a", "b", "c"}) EXPECT_EQ(s->load(n, &lp).code(), Code::kNotFound) << n;
    expect_loads(*s, "d", d);
    EXPECT_EQ(testing::list_files(quarantine()).size(), 4u);  // a and b, each with a note
    EXPECT_TRUE(logged("quarantined session 'a'"));
    EXPECT_TRUE(logged("quarantined session 'b'"));
    EXPECT_TRUE(logged("quarantined session 'c'"));
    EXPECT_TRUE(logged("missing"));
}

TEST_F(StoreTest, QuickRecoveryLeavesTailDamageToTheLoadCheck) {
    const auto a = make_payload(1, 10, 50000);
    std::string fa;
    {
        auto s = open_store();
        ASSERT_TRUE(s->save("a", a.data(), a.size()));
        fa = file_of(*s, "a");
    }
    testing::flip_byte(fa, 40000);
    auto o = options();
    o.verify_checksums_on_open = false;
    auto s = open_store(o);
    EXPECT_EQ(s->recovery_report().entries_quarantined, 0);
    LoadedPayload lp;
    EXPECT_EQ(s->load("a", &lp).code(), Code::kCorrupt);
}

TEST_F(StoreTest, ReadErrorDuringRecoveryIsNotTakenForCorruption) {
    const auto a = make_payload(1, 10, 50000);
    {
        auto s = open_store();
        ASSERT_TRUE(s->save("a", a.data(), a.size()));
    }
    faulty->fail(Op::kRead, EIO);
    auto s = open_store();
    EXPECT_EQ(faulty->calls(Op::kRead), 1);
    EXPECT_EQ(s->recovery_report().entries_quarantined, 0);
    EXPECT_TRUE(logged("could not check"));
    faulty->fail(Op::kRead, EIO);
    LoadedPayload lp;
    EXPECT_EQ(s->load("a", &lp).code(), Code::kIoError);
    expect_loads(*s, "a", a);  // the entry was kept and serves once the disk reads again
}

TEST_F(StoreTest, RecoveryRemovesTempFilesAndSetsOrphansAside) {
    const auto a = make_payload(1, 10, 5000);
    {
        auto s = open_store();
        ASSERT_TRUE(s->save("a", a.data(), a.size()));
    }
    testing::write_file(payloads() + "/.tmp-00000000000000aa.dsv4", "partial", 7);
    // An unreferenced payload whose name does not say which session it is: quarantined,
    // never deleted (tests/kvstore/recovery_test.cpp covers the cases).
    testing::write_file(payloads() + "/00000000000000bb.dsv4", a.data(), a.size());
    testing::write_file(payloads() + "/notes.txt", "keep", 4);
    auto s = open_store();
    EXPECT_EQ(s->recovery_report().temp_files_removed, 1);
    EXPECT_EQ(s->recovery_report().orphan_files_removed, 0);
    EXPECT_EQ(s->recovery_report().files_quarantined, 1);
    EXPECT_EQ(testing::read_file(quarantine() + "/00000000000000bb.dsv4"), a);
    const auto left = testing::list_files(payloads());
    EXPECT_EQ(left.size(), 2u);
    EXPECT_TRUE(std::find(left.begin(), left.end(), "notes.txt") != left.end()) << "unknown files are not ours";
    expect_loads(*s, "a", a);
}

TEST_F(StoreTest, EvictionKeepsTheBudgetAndSparesPinnedAndRecentlyUsed) {
    const size_t sz = 100000;
    std::vector<std::vector<uint8_t>> p;
    for (int i = 0; i < 8; ++i) p.push_back(make_payload(uint64_t(i), 10, sz - 92));
    ASSERT_EQ(p[0].size(), sz);
    auto o = options();
    o.budget_bytes = 3 * sz + sz / 2;  // room for three
    auto s = open_store(o);
    auto names = [&] {
        std::vector<EntryInfo> l;
        EXPECT_TRUE(s->list(&l));
        std::vector<std::string> n;
        for (auto &e : l) n.push_back(e.name);
        return n;
    };
    auto check_budget = [&] {
        StoreStats st;
        ASSERT_TRUE(s->stats(&st));
        EXPECT_LE(st.bytes, o.budget_bytes);
        uint64_t on_disk = 0;
        for (const auto &f : testing::list_files(payloads())) {
            struct stat sb;
            ASSERT_EQ(stat((payloads() + "/" + f).c_str(), &sb), 0);
            on_disk += uint64_t(sb.st_size);
        }
        EXPECT_EQ(on_disk, st.bytes) << "evicted files are deleted";
    };
    ASSERT_TRUE(s->save("s0", p[0].data(), sz));
    ASSERT_TRUE(s->save("s1", p[1].data(), sz));
    ASSERT_TRUE(s->save("s2", p[2].data(), sz));
    ASSERT_TRUE(s->pin("s0", true));
    ASSERT_TRUE(s->save("s3", p[3].data(), sz));  // evicts s1: s0 is pinned
    check_budget();
    EXPECT_EQ(names(), (std::vector<std::string>{"s0", "s2", "s3"}));
    expect_loads(*s, "s2", p[2]);                  // s2 now more recent than s3
    ASSERT_TRUE(s->save("s4", p[4].data(), sz));  // evicts s3
    check_budget();
    EXPECT_EQ(names(), (std::vector<std::string>{"s0", "s2", "s4"}));
    ASSERT_TRUE(s->save("s5", p[5].data(), sz));  // evicts s2
    EXPECT_EQ(names(), (std::vector<std::string>{"s0", "s4", "s5"}));
    EXPECT_TRUE(logged("evicted session 's1'"));
    StoreStats st;
    ASSERT_TRUE(s->stats(&st));
    EXPECT_EQ(st.evictions, 3u);
    EXPECT_EQ(st.pinned_bytes, sz);
    expect_loads(*s, "s0", p[0]);

    // Pinned bytes plus the new payload over the budget: refused, nothing evicted.
    ASSERT_TRUE(s->pin("s4", true));
    ASSERT_TRUE(s->pin("s5", true));
    const Status full = s->save("s6", p[6].data(), sz);
    EXPECT_EQ(full.code(), Code::kBudgetExceeded) << full.to_string();
    EXPECT_EQ(names(), (std::vector<std::string>{"s0", "s4", "s5"}));
    // Overwriting a pinned session only counts the new version.
    ASSERT_TRUE(s->save("s5", p[7].data(), sz));
    expect_loads(*s, "s5", p[7]);
    check_budget();
}

TEST_F(StoreTest, LoweredBudgetIsEnforcedAtOpen) {
    const auto a = make_payload(1, 10, 50000), b = make_payload(2, 10, 50000);
    {
        auto s = open_store();
        ASSERT_TRUE(s->save("old", a.data(), a.size()));
        ASSERT_TRUE(s->save("new", b.data(), b.size()));
    }
    auto o = options();
    o.budget_bytes = b.size() + 10;
    auto s = open_store(o);
    EXPECT_EQ(s->recovery_report().entries_evicted, 1);
    LoadedPayload lp;
    EXPECT_EQ(s->load("old", &lp).code(), Code::kNotFound);
    expect_loads(*s, "new", b);
}

// An evicted session leaves a tombstone (when, why) so a client reopening the name can be
// told; it survives a reopen, goes when the name is saved or removed again, and only the
// latest kMaxTombstones are kept.
TEST_F(StoreTest, EvictedSessionsLeaveABoundedTombstone) {
    const auto a = make_payload(1, 10, 50000), b = make_payload(2, 10, 50000);
    auto o = options();
    o.budget_bytes = a.size() + a.size() / 2;  // room for one
    {
        auto s = open_store(o);
        EvictedInfo ev;
        EXPECT_EQ(s->evicted("a", &ev).code(), Code::kNotFound);
        ASSERT_TRUE(s->save("a", a.data(), a.size()));
        ASSERT_TRUE(s->save("b", b.data(), b.size()));  // evicts a
        const Status st = s->evicted("a", &ev);
        ASSERT_TRUE(st) << st.to_string();
        EXPECT_EQ(ev.name, "a");
        EXPECT_NE(ev.why.find("budget"), std::string::npos) << ev.why;
        EXPECT_NE(ev.why.find("while saving session 'b'"), std::string::npos) << ev.why;
        EXPECT_GT(ev.evicted_ms, 0u);
    }
    auto s = open_store(o);
    EvictedInfo ev;
    ASSERT_TRUE(s->evicted("a", &ev)) << "the tombstone did not survive a reopen";
    ASSERT_TRUE(s->save("a", a.data(), a.size()));  // stored again (evicts b)
    EXPECT_EQ(s->evicted("a", &ev).code(), Code::kNotFound);
    ASSERT_TRUE(s->evicted("b", &ev));
    EXPECT_EQ(s->remove("b").code(), Code::kNotFound) << "b is not stored";
    EXPECT_EQ(s->evicted("b", &ev).code(), Code::kNotFound) << "remove keeps the tombstone";

    // Many evictions: the latest kMaxTombstones are listed, most recent first.
    const size_t n = kMaxTombstones + 5;
    auto name = [](size_t i) {   // not "s" + to_string: GCC 12 warns (-Wrestrict) inside it
        std::string r = "s";
        r += std::to_string(i);
        return r;
    };
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(s->save(name(i), b.data(), b.size()));
    std::vector<EvictedInfo> list;
    ASSERT_TRUE(s->list_evicted(&list));
    ASSERT_EQ(list.size(), kMaxTombstones);
    for (size_t i = 1; i < list.size(); ++i) EXPECT_GE(list[i - 1].evicted_ms, list[i].evicted_ms);
    EXPECT_EQ(list.front().name, name(n - 2));
    EXPECT_EQ(list.back().name, "s4");
    EXPECT_EQ(s->evicted("a", &ev).code(), Code::kNotFound) << "the oldest tombstone was kept";
    EXPECT_EQ(s->evicted("s3", &ev).code(), Code::kNotFound) << "the oldest tombstone was kept";
}

TEST_F(StoreTest, EvictionAtOpenLeavesATombstone) {
    const auto a = make_payload(1, 10, 50000), b = make_payload(2, 10, 50000);
    {
        auto s = open_store();
        ASSERT_TRUE(s->save("old", a.data(), a.size()));
        ASSERT_TRUE(s->save("new", b.data(), b.size()));
    }
    auto o = options();
    o.budget_bytes = b.size() + 10;
    auto s = open_store(o);
    EvictedInfo ev;
    ASSERT_TRUE(s->evicted("old", &ev));
    EXPECT_NE(ev.why.find("at start-up"), std::string::npos) << ev.why;
}

TEST_F(StoreTest, SessionNamesAreValidated) {
    auto s = open_store();
    const auto p = make_payload(1, 4, 100);
    const std::string bad[] = {"", "a/b", "/etc/passwd", "..", "a..b", "x\\y", std::string("nul\0x", 5),
                               "tab\there", "new\nline", "\x7f", "caf\xc3\xa9", " lead", "trail ",
                               std::string(129, 'a')};
    for (const auto &n : bad) {
        const Status st = s->save(n, p.data(), p.size());
        EXPECT_EQ(st.code(), Code::kInvalidArgument) << "name accepted: " << n;
        LoadedPayload lp;
        EXPECT_EQ(s->load(n, &lp).code(), Code::kInvalidArgument) << n;
    }
    EXPECT_TRUE(testing::list_files(payloads()).empty());
    const std::string good[] = {"a", "my chat", "proj:2024-01-02_v1.5", std::string(128, 'z'), "~!@#$%^&*()[]{}"};
    for (const auto &n : good) {
        ASSERT_TRUE(s->save(n, p.data(), p.size())) << n;
        expect_loads(*s, n, p);
    }
    // Nothing outside the state dir's own folders appeared.
    EXPECT_EQ(testing::list_files(dir.path()), std::vector<std::string>{"state"});
    EXPECT_EQ(testing::list_files(dir.sub("state")),
              (std::vector<std::string>{"LOCK", "index", "payloads", "quarantine"}));
}

TEST_F(StoreTest, NewerSchemaIsRefused) {
    { auto s = open_store(); }
    MDB_env *env;
    ASSERT_EQ(mdb_env_create(&env), 0);
    ASSERT_EQ(mdb_env_set_maxdbs(env, 4), 0);
    ASSERT_EQ(mdb_env_open(env, dir.sub("state/index").c_str(), 0, 0600), 0);
    MDB_txn *txn;
    MDB_dbi dbi;
    ASSERT_EQ(mdb_txn_begin(env, nullptr, 0, &txn), 0);
    ASSERT_EQ(mdb_dbi_open(txn, "meta", 0, &dbi), 0);
    const char key[] = "schema_version";
    const uint8_t v2[4] = {2, 0, 0, 0};
    MDB_val k{sizeof key - 1, const_cast<char *>(key)}, v{4, const_cast<uint8_t *>(v2)};
    ASSERT_EQ(mdb_put(txn, dbi, &k, &v, 0), 0);
    ASSERT_EQ(mdb_txn_commit(txn), 0);
    mdb_env_close(env);

    std::unique_ptr<Store> s;
    const Status st = Store::open(options(), &s);
    EXPECT_EQ(st.code(), Code::kSchemaTooNew);
    EXPECT_NE(st.message().find("schema version 2"), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find("newer"), std::string::npos) << st.to_string();
    EXPECT_EQ(s, nullptr);
}

TEST_F(StoreTest, SecondOpenOfTheSameStateDirIsBusy) {
    auto s = open_store();
    std::unique_ptr<Store> t;
    EXPECT_EQ(Store::open(options(), &t).code(), Code::kBusy);
}

TEST_F(StoreTest, StateDirMustNotContainSymlinkedFolders) {
    TempDir elsewhere;
    ASSERT_EQ(mkdir(dir.sub("state").c_str(), 0700), 0);
    ASSERT_EQ(symlink(elsewhere.path().c_str(), dir.sub("state/payloads").c_str()), 0);
    std::unique_ptr<Store> s;
    const Status st = Store::open(options(), &s);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.to_string();
}

constexpr int kMapSessions = 60;  // ~350 index bytes each: well past a 32 KiB map

TEST_F(StoreTest, IndexMapGrowsWhenFull) {
    auto o = options();
    o.map_size = 32 * 1024;
    auto s = open_store(o);
    const auto p = make_payload(1, 4, 16);
    for (int i = 0; i < kMapSessions; ++i) {
        const std::string name = std::to_string(i) + std::string(120, 'n');
        ASSERT_TRUE(s->save(name, p.data(), p.size())) << i;
    }
    StoreStats st;
    ASSERT_TRUE(s->stats(&st));
    EXPECT_EQ(st.sessions, uint64_t(kMapSessions));
    EXPECT_GT(st.map_grows, 0);
    EXPECT_GT(st.map_size, 32u * 1024);
    expect_loads(*s, "0" + std::string(120, 'n'), p);
}

TEST_F(StoreTest, LongestPrefixIsFoundAndLoaded) {
    auto s = open_store();
    const auto toks = testing::seeded_tokens(99, 40);
    auto prefix = [&](size_t n) { return std::vector<int32_t>(toks.begin(), toks.begin() + long(n)); };
    const auto c4 = make_payload(4, prefix(4), 3000), c8 = make_payload(8, prefix(8), 3000),
               c16 = make_payload(16, prefix(16), 3000), s12 = make_payload(12, prefix(12), 3000);
    ASSERT_TRUE(s->save_checkpoint(c4.data(), c4.size()));
    ASSERT_TRUE(s->save_checkpoint(c8.data(), c8.size()));
    ASSERT_TRUE(s->save_checkpoint(c16.data(), c16.size()));
    ASSERT_TRUE(s->save("sess", s12.data(), s12.size()));
    // Another model's checkpoint of the same tokens never matches.
    const auto other = make_payload(30, prefix(30), 3000, 0xBAD);
    ASSERT_TRUE(s->save_checkpoint(other.data(), other.size()));

    PrefixMatch m;
    ASSERT_TRUE(s->find_longest_prefix(testing::kTestFingerprint, toks.data(), 40, &m));
    EXPECT_EQ(m.n_tokens, 16u);
    EXPECT_EQ(m.info.kind, EntryKind::kCheckpoint);
    ASSERT_TRUE(s->find_longest_prefix(testing::kTestFingerprint, toks.data(), 14, &m));
    EXPECT_EQ(m.n_tokens, 12u);
    EXPECT_EQ(m.info.kind, EntryKind::kSession);
    EXPECT_EQ(m.info.name, "sess");
    ASSERT_TRUE(s->find_longest_prefix(testing::kTestFingerprint, toks.data(), 8, &m));
    EXPECT_EQ(m.n_tokens, 8u) << "a prefix equal to the whole query counts";
    auto diverged = toks;
    diverged[6] = (diverged[6] + 1) % int32_t(testing::kTestVocab);
    ASSERT_TRUE(s->find_longest_prefix(testing::kTestFingerprint, diverged.data(), 40, &m));
    EXPECT_EQ(m.n_tokens, 4u);
    EXPECT_EQ(s->find_longest_prefix(testing::kTestFingerprint, toks.data(), 3, &m).code(), Code::kNotFound);
    EXPECT_EQ(s->find_longest_prefix(0x1234, toks.data(), 40, &m).code(), Code::kNotFound);

    LoadedPayload lp;
    ASSERT_TRUE(s->load_longest_prefix(testing::kTestFingerprint, toks.data(), 40, &lp));
    ASSERT_EQ(lp.bytes.size(), c16.size());
    EXPECT_EQ(memcmp(lp.bytes.data(), c16.data(), c16.size()), 0);

    // Saving the same checkpoint again keeps the one file.
    ASSERT_TRUE(s->save_checkpoint(c16.data(), c16.size()));
    std::vector<EntryInfo> cps;
    ASSERT_TRUE(s->list_checkpoints(&cps));
    EXPECT_EQ(cps.size(), 4u);

    // A corrupt longest candidate is quarantined and the next one served.
    std::string f16;
    for (const auto &c : cps)
        if (c.n_tokens == 16) f16 = payloads() + "/" + c.file;
    testing::flip_byte(f16, c16.size() - 10);
    ASSERT_TRUE(s->load_longest_prefix(testing::kTestFingerprint, toks.data(), 40, &lp));
    EXPECT_EQ(lp.header.n_tokens, 12u);
    EXPECT_EQ(lp.info.name, "sess");

    // Overwriting the session with other tokens drops its old prefix.
    const auto unrelated = make_payload(77, 12, 3000);
    ASSERT_TRUE(s->save("sess", unrelated.data(), unrelated.size()));
    ASSERT_TRUE(s->find_longest_prefix(testing::kTestFingerprint, toks.data(), 14, &m));
    EXPECT_EQ(m.n_tokens, 8u);
}

TEST_F(StoreTest, PrefixIndexSurvivesReopen) {
    const auto toks = testing::seeded_tokens(5, 20);
    const auto c = make_payload(1, std::vector<int32_t>(toks.begin(), toks.begin() + 10), 500);
    {
        auto s = open_store();
        ASSERT_TRUE(s->save_checkpoint(c.data(), c.size()));
    }
    auto s = open_store();
    PrefixMatch m;
    ASSERT_TRUE(s->find_longest_prefix(testing::kTestFingerprint, toks.data(), toks.size(), &m));
    EXPECT_EQ(m.n_tokens, 10u);
}

TEST(SessionName, Validation) {
    EXPECT_TRUE(validate_session_name("ok name"));
    EXPECT_NE(validate_session_name("a/b").message().find("separator"), std::string::npos);
    EXPECT_NE(validate_session_name(std::string(200, 'x')).message().find("limit is 128"), std::string::npos);
    EXPECT_NE(validate_session_name(std::string("a\0b", 3)).message().find("0x00"), std::string::npos);
}

}  // namespace
}  // namespace ds4::kvstore
