// A real full file system: a small tmpfs mounted for the test (needs root and mount
// permission; skipped otherwise).
#include <gtest/gtest.h>

#include "kvstore/store.h"
#include "tests/common/tmpfs_mount.h"
#include "tests/kvstore/test_util.h"

namespace ds4::kvstore {
namespace {

using testing::make_payload;

using ds4test::TmpfsMount;

TEST(KvstoreDiskFull, SmallTmpfsReportsNoSpaceAndKeepsTheOldVersion) {
    testing::TempDir tmp;
    TmpfsMount m(tmp.path(), "size=6m,mode=0700");
    if (!m.ok()) GTEST_SKIP() << "cannot mount a tmpfs here (" << strerror(m.error()) << ")";
    StoreOptions o;
    o.state_dir = tmp.sub("state");
    o.map_size = 1 << 20;
    o.log = [](const std::string &) {};
    std::unique_ptr<Store> s;
    ASSERT_TRUE(Store::open(o, &s));
    const auto old = make_payload(1, 100, 1 << 20), big = make_payload(2, 100, 5 << 20);
    ASSERT_TRUE(s->save("chat", old.data(), old.size()));
    const Status st = s->save("chat", big.data(), big.size());
    EXPECT_EQ(st.code(), Code::kNoSpace) << st.to_string();
    LoadedPayload lp;
    ASSERT_TRUE(s->load("chat", &lp));
    ASSERT_EQ(lp.bytes.size(), old.size());
    EXPECT_EQ(memcmp(lp.bytes.data(), old.data(), old.size()), 0);
    EXPECT_EQ(testing::list_files(tmp.sub("state/payloads")).size(), 1u) << "the failed temp file is gone";
    // Space is usable again for a save that fits.
    const auto mid = make_payload(3, 100, 2 << 20);
    ASSERT_TRUE(s->save("chat", mid.data(), mid.size()));
    s.reset();
    ASSERT_TRUE(Store::open(o, &s));
    ASSERT_TRUE(s->load("chat", &lp));
    EXPECT_EQ(lp.bytes.size(), mid.size());
}

}  // namespace
}  // namespace ds4::kvstore
