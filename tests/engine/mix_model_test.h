// A test suite over the converted "mix" reference fixture (f32), opened once per suite.
#pragma once
#include <gtest/gtest.h>

#include "engine/model/model.h"
#include "tests/engine/fixture.h"

namespace ds4test {

// Derived: the suite's own class, so each suite has its own statics.
template <class Derived>
struct MixModelTest : ::testing::Test {
    static void SetUpTestSuite() {
        fx = new RefFixture(load_fixture("mix"));
        model = ds4::Model::open(converted_gguf("mix", "f32"), {2}).release();
    }
    static void TearDownTestSuite() {
        delete model;
        delete fx;
    }
    inline static RefFixture *fx = nullptr;
    inline static ds4::Model *model = nullptr;
};

}  // namespace ds4test
