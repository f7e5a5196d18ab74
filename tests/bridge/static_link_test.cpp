// A program that uses bridge/ds4.hpp and links the static libds4.a: the archive holds the
// engine's own ds4::Model and ds4::Session, so wrappers of the same names would share
// symbols with them (~Model, ~Session, Session::eval, ...) and the linker would silently
// pick the engine's definitions for the wrapper objects. In ds4::bridge they are distinct.
// Built without inlining, so every wrapper member is called through its symbol.
#include <gtest/gtest.h>

#include <vector>

#include "bridge/ds4.hpp"

namespace {

TEST(StaticLibds4, WrapperClassesAreNotTheEngineClasses) {
    ds4::bridge::ModelOptions o;
    o.model_path = DS4_TEST_MODEL;
    o.n_threads = 1;
    o.defer_boot_prewarm = true;
    ds4::bridge::Model m(o);
    ASSERT_GT(m.vocab_size(), 0);
    std::vector<int32_t> toks = m.tokenize("hello");
    ASSERT_FALSE(toks.empty());
    int32_t next = -1;
    {
        ds4::bridge::Session s(m, 32);
        s.sync(toks);
        next = s.argmax();
        s.eval(next);
        EXPECT_EQ(s.pos(), int(toks.size()) + 1);
        s.rewind(int(toks.size()));
        EXPECT_EQ(s.pos(), int(toks.size()));
    }
    ds4::bridge::Session again(m, 32);
    again.sync(toks);
    EXPECT_EQ(again.argmax(), next);
}

}  // namespace
