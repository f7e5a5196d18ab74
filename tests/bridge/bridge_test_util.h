// Shared by the bridge GoogleTest suites: the converted fixture model and small helpers
// over the C ABI.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "bridge/ds4.hpp"

#ifndef DS4_TEST_MODEL
#error "DS4_TEST_MODEL must name the converted fixture model (tests/bridge/CMakeLists.txt)"
#endif

namespace bridge_test {

// One model per suite: opening it is the slow part.
class BridgeTest : public ::testing::Test {
protected:
    static inline ds4::bridge::Model *model = nullptr;

    static void SetUpTestSuite() {
        ds4::bridge::ModelOptions o;
        o.model_path = DS4_TEST_MODEL;
        o.n_threads = 1;
        model = new ds4::bridge::Model(o);
    }
    static void TearDownTestSuite() {
        delete model;
        model = nullptr;
    }

    // Deterministic in-vocabulary tokens.
    static std::vector<int32_t> tokens(size_t n, uint32_t seed = 7) {
        std::vector<int32_t> t(n);
        for (auto &x : t) {
            seed = seed * 1103515245u + 12345u;
            x = int32_t((seed >> 8) % uint32_t(model->vocab_size()));
        }
        return t;
    }
};

// EXPECT_TRUE(has(text, part)) prints both on failure.
inline ::testing::AssertionResult has(const std::string &text, const std::string &part) {
    if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

struct Err {
    char buf[512] = {0};
    std::string str() const { return buf; }
};

}  // namespace bridge_test
