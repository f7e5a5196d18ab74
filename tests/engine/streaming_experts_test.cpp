// SSD expert streaming (engine/backend/streaming_experts.h) against the resident path:
// logits must be bit-identical whatever the cache budget (down to one token's experts per
// layer, which evicts on every layer), with prefetch on or off, for the f32 reference
// fixtures and the trained Q8_0 model; the expert store (kvstore/expert_store.h through the
// bridge's link) must detect a corrupt record, never use it and replace it, and a restart
// must prewarm the persisted hot set.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bridge/expert_store_link.h"
#include "engine/backend/streaming_experts.h"
#include "engine/common/error.h"
#include "engine/model/model.h"
#include "engine/model/session.h"
#include "kvstore/expert_store.h"
#include "tests/common/scratch.h"
#include "tests/engine/fixture.h"

using namespace ds4;
using namespace ds4test;

namespace {

const std::string kTrained = DS4_SOURCE_DIR "/models/ds4-pystd-q8_0.gguf";

ModelOptions streaming(uint64_t experts, bool prefetch = true, uint64_t bytes = 0) {
    ModelOptions o;
    o.n_threads = 2;
    o.streaming.enabled = true;
    o.streaming.cache_experts = experts;
    o.streaming.cache_bytes = bytes;
    o.streaming.prefetch = prefetch;
    return o;
}

// The logits of every position in the given mode, on the resident path and streamed.
void expect_identical(const std::string &path, const std::vector<int32_t> &toks, const ModelOptions &so,
                      const std::vector<std::string> &modes) {
    auto resident = Model::open(path, {2});
    auto streamed = Model::open(path, so);
    ASSERT_TRUE(streamed->streams_experts());
    for (const std::string &mode : modes) {
        const std::vector<float> a = run_mode(*resident, toks, mode);
        const std::vector<float> b = run_mode(*streamed, toks, mode);
        ASSERT_EQ(a.size(), b.size());
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
            << path << " mode " << mode << " cache " << so.streaming.cache_experts << " experts";
    }
    const ExpertSourceStats st = streamed->experts().stats();
    EXPECT_GT(st.acquired, 0u);
    EXPECT_GT(st.bytes_read, 0u);
    EXPECT_LE(st.resident, st.capacity);
}

TEST(StreamingExperts, FixturesBitIdenticalAtEveryBudget) {
    for (const char *name : {"mix", "flashlike"}) {
        RefFixture fx = load_fixture(name);
        const std::string path = converted_gguf(name, "f32");
        auto m = Model::open(path, {2});
        const ModelConfig &c = m->config();
        const uint64_t all = (uint64_t)c.n_layer * c.n_expert;
        // One token's experts of one layer (constant eviction), a few layers' worth, all.
        for (uint64_t cap : {(uint64_t)c.n_expert_used, (uint64_t)c.n_expert_used * 3 + 1, all})
            expect_identical(path, fx.tokens, streaming(cap), {"prefill", "decode", "5"});
        expect_identical(path, fx.tokens, streaming(c.n_expert_used, /*prefetch=*/false), {"decode", "5"});
    }
}

TEST(StreamingExperts, TrainedModelBitIdentical) {
    auto m = Model::open(kTrained, {2});
    const ModelConfig &c = m->config();
    std::vector<int32_t> toks;
    for (int i = 0; i < 40; ++i) toks.push_back((i * 7919 + 13) % c.n_vocab);
    for (uint64_t cap : {(uint64_t)c.n_expert_used, (uint64_t)c.n_expert * 2})
        expect_identical(kTrained, toks, streaming(cap), {"prefill", "decode"});
    // A budget in bytes behaves the same.
    expect_identical(kTrained, toks, streaming(0, true, 8u << 20), {"decode"});
}

TEST(StreamingExperts, PrefetchIsUsedWhenTheCacheIsSmall) {
    auto m = Model::open(kTrained, {2});
    const ModelConfig &c = m->config();
    auto s = Model::open(kTrained, streaming((uint64_t)c.n_expert_used * 4));
    // Whether a prediction made during a forward lands before its layer runs is a race the
    // tiny model mostly loses, so the mechanism is driven directly: a predicted layer that
    // has not run yet is read by the I/O thread, and acquiring it then counts as a use.
    ExpertSource &src = s->experts();
    const int layer = c.n_layer - 1;
    std::vector<int> ids;
    for (int e = 0; e < c.n_expert_used; ++e) ids.push_back(e);
    src.prefetch(layer, ids);
    for (int i = 0; i < 10000 && src.stats().prefetched < ids.size(); ++i) usleep(1000);
    ASSERT_EQ(src.stats().prefetched, ids.size()) << "the I/O thread did not read the prediction within 10 s";
    std::vector<ExpertView> views(ids.size());
    src.acquire(layer, ids, views.data());
    src.release();
    ExpertSourceStats st = src.stats();
    EXPECT_EQ(st.prefetch_used, ids.size());
    EXPECT_EQ(st.misses, 0u);
    EXPECT_EQ(st.late, 0u);

    // A whole generation with a cache of four tokens' experts per layer: some experts are
    // found resident, and the output is the resident path's (FixturesBitIdenticalAtEveryBudget).
    Session ses(*s, 64);
    std::vector<int32_t> toks = {1, 2, 3};
    ses.sync(toks);
    for (int i = 0; i < 20; ++i) ses.eval(ses.argmax());
    st = src.stats();
    EXPECT_GT(st.acquired, ids.size());
    EXPECT_LT(st.misses, st.acquired);
}

TEST(StreamingExperts, BudgetTooSmallIsAClearError) {
    auto m = Model::open(kTrained, {2});
    const int k = m->config().n_expert_used;
    try {
        Model::open(kTrained, streaming((uint64_t)k - 1));
        FAIL() << "a cache smaller than one token's experts per layer was accepted";
    } catch (const Error &e) {
        EXPECT_NE(std::string(e.what()).find("too small"), std::string::npos) << e.what();
    }
    EXPECT_THROW(Model::open(kTrained, streaming(0, true, 4096)), Error);
}

// Flips one byte inside the data file at the record of (layer, expert).
void corrupt_record(const std::string &data_path, const kvstore::ExpertRecord &r) {
    const int fd = ::open(data_path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    uint8_t b = 0;
    const off_t at = off_t(r.offset + r.length / 3);
    ASSERT_EQ(1, ::pread(fd, &b, 1, at));
    b ^= 0x5a;
    ASSERT_EQ(1, ::pwrite(fd, &b, 1, at));
    ::fsync(fd);
    ::close(fd);
}

ModelOptions with_store(uint64_t experts, const std::string &dir, bool cold = false, bool prefetch = true) {
    ModelOptions o = streaming(experts, prefetch);
    o.streaming.cold = cold;
    o.streaming.open_store = [dir](uint64_t fp) { return bridge_impl::open_expert_store_link(dir, fp); };
    return o;
}

TEST(ExpertStore, CorruptRecordIsDetectedRefetchedAndReplaced) {
    TempDir dir;
    auto resident = Model::open(kTrained, {2});
    const ModelConfig &c = resident->config();
    std::vector<int32_t> toks;
    for (int i = 0; i < 24; ++i) toks.push_back((i * 104729 + 7) % c.n_vocab);
    const std::vector<float> want = run_mode(*resident, toks, "decode");
    const uint64_t all = (uint64_t)c.n_layer * c.n_expert;
    // First run fills the store from the GGUF.
    {
        auto m = Model::open(kTrained, with_store(all, dir.path()));
        const std::vector<float> got = run_mode(*m, toks, "decode");
        EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)));
        EXPECT_EQ(m->experts().stats().store_reads, 0u);
    }
    std::unique_ptr<kvstore::ExpertStore> st;
    ASSERT_TRUE(kvstore::ExpertStore::open(dir.path(), resident->fingerprint(), &st));
    ASSERT_GT(st->records(), 0u);
    // Damage the records of every expert the run used in the last layer.
    int damaged = 0;
    std::vector<kvstore::ExpertRecord> old;
    for (int e = 0; e < c.n_expert; ++e) {
        kvstore::ExpertRecord r;
        if (!st->find(c.n_layer - 1, e, &r)) continue;
        corrupt_record(st->data_path(), r);
        old.push_back(r);
        ++damaged;
    }
    st.reset();
    ASSERT_GT(damaged, 0);
    // Second run reads from the store: the damaged records are caught, read from the GGUF
    // instead and rewritten; the logits do not change.
    {
        auto m = Model::open(kTrained, with_store(all, dir.path(), /*cold=*/true));
        const std::vector<float> got = run_mode(*m, toks, "decode");
        EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)));
        const ExpertSourceStats s = m->experts().stats();
        EXPECT_GT(s.store_reads, 0u);
        EXPECT_EQ(s.store_corrupt, (uint64_t)damaged);
    }
    ASSERT_TRUE(kvstore::ExpertStore::open(dir.path(), resident->fingerprint(), &st));
    std::vector<uint8_t> data = read_file_bytes(st->data_path());
    for (int e = 0, i = 0; e < c.n_expert; ++e) {
        kvstore::ExpertRecord r;
        if (!st->find(c.n_layer - 1, e, &r)) continue;
        EXPECT_NE(r.offset, old[i++].offset) << "expert " << e << " still points at the damaged record";
        ASSERT_LE(r.offset + r.length, data.size());
        EXPECT_TRUE(kvstore::ExpertStore::verify(r, data.data() + r.offset, r.length));
    }
}

// A restart with the use counts persisted by the previous run (flushed on close: 40 tokens
// are fewer than the periodic flush's interval) loads, before the first token, exactly the
// most used experts up to the budget: every prewarmed expert was used at least as often as
// every one left out (ties at the cut may go either way). Its first tokens then miss less
// than a cold start's with the same budget and prompt (deterministic: no prefetch thread).
TEST(ExpertStore, RestartPrewarmsTheHotSet) {
    TempDir dir;
    auto resident = Model::open(kTrained, {2});
    const ModelConfig &c = resident->config();
    const int n_layer = c.n_layer, n_expert = c.n_expert;
    // Half the experts: the hot half fits, and no prefetch, so misses show what the cache held.
    const uint64_t cap = (uint64_t)n_expert * n_layer / 2;
    auto decode = [&](Model &m, std::vector<int32_t> toks, int n) {
        Session s(m, 128);
        s.sync(toks);
        for (int i = 0; i < n; ++i) s.eval(s.argmax());
    };
    {
        auto m = Model::open(kTrained, with_store(cap, dir.path()));
        decode(*m, {5}, 40);
    }  // the use counts are flushed on close
    std::vector<uint64_t> count((size_t)n_layer * n_expert);
    uint64_t used = 0;
    {
        std::unique_ptr<kvstore::ExpertStore> st;
        ASSERT_TRUE(kvstore::ExpertStore::open(dir.path(), resident->fingerprint(), &st));
        for (int l = 0; l < n_layer; ++l)
            for (int e = 0; e < n_expert; ++e) used += (count[(size_t)l * n_expert + e] = st->use_count(l, e)) > 0;
    }
    ASSERT_GT(used, 0u) << "no use counts persisted at close";
    // 41 tokens of 2 experts in each of 6 layers: the prompt's token and the decoded ones.
    uint64_t total = 0;
    for (uint64_t x : count) total += x;
    EXPECT_EQ(total, 41u * n_layer * c.n_expert_used);

    // Another prompt than the run that counted, as a restarted daemon's first request.
    const std::vector<int32_t> prompt = {1000, 77, 4242};
    auto first_tokens_misses = [&](bool cold, std::vector<bool> *prewarmed) {
        auto m = Model::open(kTrained, with_store(cap, dir.path(), cold, /*prefetch=*/false));
        auto *se = dynamic_cast<StreamingExperts *>(&m->experts());
        EXPECT_NE(se, nullptr);
        if (!se) return uint64_t(0);
        m->prewarm();
        prewarmed->assign(count.size(), false);
        for (int l = 0; l < n_layer; ++l)
            for (int e = 0; e < n_expert; ++e) (*prewarmed)[(size_t)l * n_expert + e] = se->cached(l, e);
        const uint64_t before = m->experts().stats().misses;
        decode(*m, prompt, 8);
        return m->experts().stats().misses - before;
    };
    std::vector<bool> warm_set, cold_set;
    const uint64_t warm = first_tokens_misses(false, &warm_set);
    const uint64_t cold = first_tokens_misses(true, &cold_set);
    uint64_t n_warm = 0, min_in = UINT64_MAX, max_out = 0;
    for (size_t k = 0; k < count.size(); ++k) {
        EXPECT_FALSE(cold_set[k]) << "a cold start prewarmed expert " << k % n_expert << " of layer " << k / n_expert;
        if (warm_set[k]) {
            ++n_warm;
            min_in = std::min(min_in, count[k]);
            EXPECT_GT(count[k], 0u) << "an unused expert was prewarmed";
        } else {
            max_out = std::max(max_out, count[k]);
        }
    }
    EXPECT_EQ(n_warm, std::min<uint64_t>(cap, used));
    EXPECT_GE(min_in, max_out) << "an expert used " << max_out << " times was left out for one used " << min_in << " times";
    EXPECT_LT(warm, cold);
    std::printf("first 3+8 tokens after a restart: %llu misses prewarmed (%llu of %llu used experts loaded), %llu cold\n",
                (unsigned long long)warm, (unsigned long long)n_warm, (unsigned long long)used, (unsigned long long)cold);
}

// Compaction of a real store: the trained model's experts and a second model whose GGUF is
// then deleted; replaced (corrupt) records leave holes, and one more record is damaged after
// the last run. compact() drops the gone model (entries and data file), rewrites the kept
// model's data file as exactly its records, drops the damaged record, keeps the use counts
// and the hot set, and the store then serves the same logits from its records.
TEST(ExpertStore, CompactionDropsGoneModelsHolesAndCorruptRecords) {
    TempDir dir;
    const std::string store = dir.path() + "/experts";
    auto resident = Model::open(kTrained, {2});
    const ModelConfig &c = resident->config();
    const uint64_t all = (uint64_t)c.n_layer * c.n_expert;
    std::vector<int32_t> toks;
    for (int i = 0; i < 24; ++i) toks.push_back((i * 104729 + 7) % c.n_vocab);
    const std::vector<float> want = run_mode(*resident, toks, "decode");
    auto with_source = [&](const std::string &model, bool cold) {
        ModelOptions o = streaming(all);
        o.streaming.cold = cold;
        o.streaming.open_store = [store, model](uint64_t fp) { return bridge_impl::open_expert_store_link(store, fp, model); };
        return o;
    };
    { auto m = Model::open(kTrained, with_source(kTrained, true)); (void)run_mode(*m, toks, "decode"); }

    // A second model, from a copy of a fixture that is deleted afterwards.
    const std::string other = dir.path() + "/other.gguf";
    {
        const std::vector<uint8_t> bytes = read_file_bytes(converted_gguf("mix", "f32"));
        std::FILE *f = std::fopen(other.c_str(), "wb");
        ASSERT_TRUE(f);
        ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
        std::fclose(f);
        RefFixture fx = load_fixture("mix");
        auto m = Model::open(other, with_source(other, true));
        (void)run_mode(*m, fx.tokens, "decode");
    }

    // Holes: damage the last layer's records and run again (they are replaced at the end).
    std::unique_ptr<kvstore::ExpertStore> st;
    ASSERT_TRUE(kvstore::ExpertStore::open(store, resident->fingerprint(), &st));
    for (int e = 0; e < c.n_expert; ++e) {
        kvstore::ExpertRecord r;
        if (st->find(c.n_layer - 1, e, &r)) corrupt_record(st->data_path(), r);
    }
    const std::string data_path = st->data_path();
    st.reset();
    { auto m = Model::open(kTrained, with_source(kTrained, true)); (void)run_mode(*m, toks, "decode"); }
    // And one damaged record that nothing has read since.
    ASSERT_TRUE(kvstore::ExpertStore::open(store, resident->fingerprint(), &st));
    kvstore::ExpertRecord victim;
    int victim_expert = -1;
    for (int e = 0; e < c.n_expert && victim_expert < 0; ++e)
        if (st->find(0, e, &victim)) victim_expert = e;
    ASSERT_GE(victim_expert, 0);
    corrupt_record(data_path, victim);
    const size_t records_before = st->records();
    const auto hot_before = st->hot_set(all);
    const uint64_t top_count = st->use_count(hot_before.front().first, hot_before.front().second);

    // Refused while the store is open.
    kvstore::ExpertStoreCompactReport rep;
    const kvstore::Status busy = kvstore::ExpertStore::compact(store, {}, &rep);
    EXPECT_EQ(busy.code(), kvstore::Code::kBusy) << busy.to_string();
    st.reset();

    std::vector<kvstore::ExpertStoreModel> models;
    ASSERT_TRUE(kvstore::ExpertStore::list(store, &models));
    ASSERT_EQ(models.size(), 2u);
    for (const auto &m : models) {
        EXPECT_TRUE(m.source_present) << m.source;
        if (m.fingerprint == resident->fingerprint()) {
            EXPECT_GT(m.file_bytes, m.record_bytes) << "replaced records left holes";
        }
    }
    ASSERT_EQ(std::remove(other.c_str()), 0);
    ASSERT_TRUE(kvstore::ExpertStore::compact(store, {}, &rep));
    EXPECT_EQ(rep.models_removed, 1u);
    EXPECT_EQ(rep.models_kept, 1u);
    EXPECT_EQ(rep.records_corrupt, 1u);
    EXPECT_EQ(rep.records_kept, records_before - 1);
    EXPECT_EQ(rep.files_removed, 1u) << "the gone model's data file";
    EXPECT_LT(rep.bytes_after, rep.bytes_before);
    std::printf("compaction: %llu -> %llu bytes, %llu records kept\n", (unsigned long long)rep.bytes_before,
                (unsigned long long)rep.bytes_after, (unsigned long long)rep.records_kept);

    ASSERT_TRUE(kvstore::ExpertStore::list(store, &models));
    ASSERT_EQ(models.size(), 1u);
    EXPECT_EQ(models[0].fingerprint, resident->fingerprint());
    EXPECT_EQ(models[0].file_bytes, models[0].record_bytes) << "no holes";
    EXPECT_EQ(models[0].records, records_before - 1);

    ASSERT_TRUE(kvstore::ExpertStore::open(store, resident->fingerprint(), &st));
    kvstore::ExpertRecord r;
    EXPECT_FALSE(st->find(0, victim_expert, &r)) << "the corrupt record was dropped";
    EXPECT_EQ(st->hot_set(all), hot_before) << "use counts kept";
    EXPECT_EQ(st->use_count(hot_before.front().first, hot_before.front().second), top_count);
    st.reset();
    // Served from the compacted records: identical logits, nothing corrupt, the dropped
    // expert read from the GGUF again.
    {
        auto m = Model::open(kTrained, with_source(kTrained, true));
        const std::vector<float> got = run_mode(*m, toks, "decode");
        EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)));
        EXPECT_GT(m->experts().stats().store_reads, 0u);
        EXPECT_EQ(m->experts().stats().store_corrupt, 0u);
    }
    // Nothing left to do a second time.
    ASSERT_TRUE(kvstore::ExpertStore::compact(store, {}, &rep));
    EXPECT_EQ(rep.models_removed + rep.records_corrupt + rep.files_removed, 0u);
    EXPECT_EQ(rep.bytes_after, rep.bytes_before);
}

}  // namespace
