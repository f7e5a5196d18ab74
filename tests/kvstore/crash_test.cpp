// Crash consistency: a child process saves in a loop and is SIGKILLed at random moments;
// after each kill the store must open, and every index entry must load, verify and be a
// payload the child wrote, no older than the last save the child saw succeed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <random>

#include "kvstore/store.h"
#include "tests/kvstore/test_util.h"

namespace ds4::kvstore {
namespace {

using testing::make_payload;
using testing::TempDir;

constexpr int kIterations = 60;
constexpr int kNames = 3;
// Room for the three pinned sessions (<= 300 KiB each) and a few checkpoints, so
// checkpoint saves evict.
constexpr uint64_t kBudget = 1600 * 1024;

// Seeds encode (iteration, save number, name) so the parent can tell which save a
// payload came from and in which order.
uint64_t seed_of(int iter, int save) { return uint64_t(iter) << 32 | uint64_t(save); }

size_t tail_for(uint64_t seed) { return 8 + size_t(testing::splitmix64(seed) % (300 * 1024)); }

std::string session_name(int i) {
    std::string n = "s";
    n += char('0' + i);
    return n;
}

struct Report {
    int32_t name;
    uint64_t seed;
};

[[noreturn]] void child(const std::string &dir, int iter, int fd) {
    StoreOptions o;
    o.state_dir = dir;
    o.budget_bytes = kBudget;
    o.verify_checksums_on_open = false;  // the parent's open does the full check
    o.log = [](const std::string &) {};
    std::unique_ptr<Store> s;
    if (!Store::open(o, &s)) _exit(3);
    const char ready = 'r';
    if (write(fd, &ready, 1) != 1) _exit(4);
    for (int save = 0;; ++save) {
        const uint64_t seed = seed_of(iter, save);
        const int name = save % kNames;
        const auto p = make_payload(seed, 8 + size_t(seed % 50), tail_for(seed));
        Status st = (save % 5 == 4) ? s->save_checkpoint(p.data(), p.size())
                                    : s->save(session_name(name), p.data(), p.size());
        if (!st) _exit(5);
        const Report r{(save % 5 == 4) ? -1 : name, seed};
        if (write(fd, &r, sizeof r) != ssize_t(sizeof r)) _exit(6);
    }
}

// The payload must be exactly what make_payload produces for the seed in its tail.
void expect_genuine(const LoadedPayload &lp, uint64_t *seed_out) {
    ASSERT_GE(lp.header.tail_bytes, 8u);
    uint64_t seed;
    memcpy(&seed, lp.bytes.data() + payload::prefix_bytes(lp.header.n_tokens), 8);
    const auto want = make_payload(seed, 8 + size_t(seed % 50), tail_for(seed));
    ASSERT_EQ(lp.bytes.size(), want.size());
    ASSERT_EQ(memcmp(lp.bytes.data(), want.data(), want.size()), 0);
    *seed_out = seed;
}

TEST(KvstoreCrash, RandomKillsDuringSavesNeverLeaveABadEntry) {
    TempDir tmp;
    const std::string dir = tmp.sub("state");
    std::mt19937 rng(12345);
    std::map<int, uint64_t> committed;  // name -> seed of the last save reported done
    int total_saves = 0, kills_mid_write = 0;
    {
        // The sessions are pinned (pins survive overwrites) so eviction, which the
        // checkpoints trigger, never takes them: every committed save must stay visible.
        StoreOptions o;
        o.state_dir = dir;
        o.log = [](const std::string &) {};
        std::unique_ptr<Store> s;
        ASSERT_TRUE(Store::open(o, &s));
        for (int name = 0; name < kNames; ++name) {
            const uint64_t seed = seed_of(0, name);
            const auto p = make_payload(seed, 8 + size_t(seed % 50), tail_for(seed));
            ASSERT_TRUE(s->save(session_name(name), p.data(), p.size()));
            ASSERT_TRUE(s->pin(session_name(name), true));
            committed[name] = seed;
        }
    }
    for (int iter = 1; iter <= kIterations; ++iter) {
        int pfd[2];
        ASSERT_EQ(pipe2(pfd, O_CLOEXEC), 0);
        const pid_t pid = fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            close(pfd[0]);
            child(dir, iter, pfd[1]);
        }
        close(pfd[1]);
        char ready = 0;
        ASSERT_EQ(read(pfd[0], &ready, 1), 1) << "child failed to open the store (iteration " << iter << ")";
        // Wait for one save to complete, so every iteration does real work, then kill at
        // a random moment of the following saves (a save takes a few ms here).
        Report r;
        ASSERT_EQ(read(pfd[0], &r, sizeof r), ssize_t(sizeof r)) << "child failed its first save";
        ++total_saves;
        if (r.name >= 0) committed[r.name] = r.seed;
        usleep(useconds_t(std::uniform_int_distribution<int>(0, 20000)(rng)));
        kill(pid, SIGKILL);
        int status = 0;
        ASSERT_EQ(waitpid(pid, &status, 0), pid);
        ASSERT_TRUE(WIFSIGNALED(status)) << "child exited on its own with " << WEXITSTATUS(status);
        while (read(pfd[0], &r, sizeof r) == ssize_t(sizeof r)) {
            ++total_saves;
            if (r.name >= 0) committed[r.name] = r.seed;
        }
        close(pfd[0]);

        StoreOptions o;
        o.state_dir = dir;
        o.budget_bytes = kBudget;
        o.log = [](const std::string &) {};
        std::unique_ptr<Store> s;
        const Status st = Store::open(o, &s);
        ASSERT_TRUE(st) << st.to_string();
        const RecoveryReport &rep = s->recovery_report();
        ASSERT_EQ(rep.entries_quarantined, 0) << "iteration " << iter;
        ASSERT_EQ(rep.bad_index_records, 0) << "iteration " << iter;
        kills_mid_write += rep.temp_files_removed;

        std::vector<EntryInfo> sessions;
        ASSERT_TRUE(s->list(&sessions));
        std::map<int, uint64_t> found;
        for (const EntryInfo &e : sessions) {
            LoadedPayload lp;
            const Status ls = s->load(e.name, &lp);
            ASSERT_TRUE(ls) << ls.to_string() << " (iteration " << iter << ")";
            uint64_t seed = 0;
            expect_genuine(lp, &seed);
            found[std::stoi(e.name.substr(1))] = seed;
        }
        // Durability: a save that returned OK is never lost or rolled back.
        for (const auto &[name, seed] : committed) {
            ASSERT_TRUE(found.count(name)) << "session s" << name << " lost (iteration " << iter << ")";
            EXPECT_GE(found[name], seed) << "session s" << name << " rolled back (iteration " << iter << ")";
        }
        std::vector<EntryInfo> cps;
        ASSERT_TRUE(s->list_checkpoints(&cps));
        for (const EntryInfo &c : cps) {
            // Every checkpoint must be findable and load intact.
            const auto toks_payload = testing::read_file(tmp.sub("state/payloads/" + c.file));
            payload::Header h;
            std::vector<int32_t> toks;
            std::string err;
            ASSERT_TRUE(payload::decode_payload(toks_payload.data(), toks_payload.size(), &h, &toks, &err)) << err;
            LoadedPayload lp;
            ASSERT_TRUE(s->load_longest_prefix(h.fingerprint, toks.data(), toks.size(), &lp));
            uint64_t seed = 0;
            expect_genuine(lp, &seed);
        }
        // Only referenced payload files remain.
        EXPECT_EQ(testing::list_files(tmp.sub("state/payloads")).size(), sessions.size() + cps.size());
    }
    printf("crash test: %d kills, %d saves completed, %d kills landed inside a save\n", kIterations, total_saves,
           kills_mid_write);
    EXPECT_GE(total_saves, kIterations);
    EXPECT_GT(kills_mid_write, 0) << "no kill landed inside a save";
}

}  // namespace
}  // namespace ds4::kvstore
