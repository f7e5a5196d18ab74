// A decode step allocates nothing once a session is warm: every buffer of the forward pass
// is session- or thread-owned scratch, and the pool takes its loop bodies by reference.
// Per-token allocations cost more than the work on small models and add latency jitter in
// the daemon. Counted by replacing the global operator new for this test binary (counting
// only while a test asks).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "engine/model/model.h"
#include "engine/model/session.h"
#include "tests/engine/fixture.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_news{0};
}  // namespace

void *operator new(size_t n) {
    if (g_counting.load(std::memory_order_relaxed)) g_news.fetch_add(1, std::memory_order_relaxed);
    if (void *p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
void operator delete(void *p) noexcept { std::free(p); }
void operator delete(void *p, size_t) noexcept { std::free(p); }

namespace {

TEST(DecodeAllocations, AWarmDecodeStepAllocatesNothing) {
#if defined(__SANITIZE_ADDRESS__)
    GTEST_SKIP() << "the sanitizer owns operator new";
#endif
    using namespace ds4;
    // "mix" has sliding, CSA (indexer) and HCA layers and routed + hash MoE; two threads so
    // the pool's workers take part.
    const ds4test::RefFixture fx = ds4test::load_fixture("mix");
    auto model = Model::open(ds4test::converted_gguf("mix", "f32"), {2});
    Session s(*model, 512);
    s.sync(std::span<const int32_t>(fx.tokens).first(40));
    for (int i = 0; i < 24; ++i) s.eval(s.argmax());   // warm: scratch reaches its size
    constexpr int kSteps = 200;
    g_news = 0;
    g_counting = true;
    for (int i = 0; i < kSteps; ++i) s.eval(s.argmax());
    g_counting = false;
    // Only amortised growth (the token history doubling, an expert list meeting a new
    // maximum, a compressed-entry array taking its next step: session_state.h) may
    // allocate: a handful, where one allocation per step would give kSteps.
    EXPECT_LE(g_news.load(), 16) << "allocations in " << kSteps << " decode steps";
}

}  // namespace
