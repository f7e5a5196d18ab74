// ResponseStore (previous_response_id): a conversation is rebuilt from its chain of turns,
// forks share their ancestors, and the bound forgets least recently used turns first while a
// chain in use keeps its ancestors.
#include <gtest/gtest.h>

#include "gateway/response_store.h"

using ds4::gateway::ResponseStore;

namespace {

ResponseStore::Turn turn(std::string parent, std::vector<int32_t> tokens, bool known_base = true) {
    ResponseStore::Turn t;
    t.parent = std::move(parent);
    t.tokens = std::move(tokens);
    t.known_base = known_base;
    return t;
}

}  // namespace

TEST(ResponseStore, ChainsAndForks) {
    ResponseStore s;
    s.add("a", turn("", {1, 2, 3}));
    s.add("b", turn("a", {4, 5}));
    s.add("c", turn("b", {6}));
    s.add("b2", turn("a", {7}));   // a fork from the first turn
    EXPECT_EQ(s.history("c"), (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
    EXPECT_EQ(s.history("b2"), (std::vector<int32_t>{1, 2, 3, 7}));
    EXPECT_EQ(s.history("a"), (std::vector<int32_t>{1, 2, 3}));
    EXPECT_FALSE(s.history("nope"));
    ASSERT_TRUE(s.find("b"));
    EXPECT_EQ(s.find("b")->parent, "a");
    EXPECT_TRUE(s.find("b")->tokens.empty());   // find() does not copy the tokens
    EXPECT_EQ(s.tokens(), 7u);
    // A chain that began in a session the gateway joined late cannot be rebuilt.
    s.add("late", turn("", {9}, false));
    s.add("late2", turn("late", {10}));
    EXPECT_FALSE(s.history("late2"));
    EXPECT_TRUE(s.find("late2"));
}

TEST(ResponseStore, ForgetsLeastRecentlyUsedButKeepsAChainInUse) {
    ResponseStore s(9, 100);    // at most 9 tokens
    s.add("root", turn("", {1, 2, 3}));
    s.add("other", turn("", {4, 5, 6}));
    s.add("t1", turn("root", {7, 8}));   // refreshes root: other is now the oldest
    s.add("t2", turn("t1", {9, 10}));    // 10 tokens > 9: forgets "other", not root
    EXPECT_FALSE(s.find("other"));
    EXPECT_EQ(s.history("t2"), (std::vector<int32_t>{1, 2, 3, 7, 8, 9, 10}));
    s.add("x", turn("", {11, 12, 13, 14}));   // needs room: the root chain goes, oldest first
    EXPECT_FALSE(s.find("root"));
    EXPECT_FALSE(s.history("t2"));            // its ancestor is gone
    EXPECT_LE(s.tokens(), 9u);
    ResponseStore few(1000, 2);               // at most 2 turns
    few.add("a", turn("", {1}));
    few.add("b", turn("", {2}));
    few.add("c", turn("", {3}));
    EXPECT_EQ(few.turns(), 2u);
    EXPECT_FALSE(few.find("a"));
}
