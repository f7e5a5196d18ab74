// A kernel switch (a bool& such as vnni_enabled() or attend8_avx512()) set for one test and
// put back after it, also when an assertion returns early.
#pragma once

namespace ds4::test {

struct SwitchGuard {
    bool &flag;
    const bool was;
    explicit SwitchGuard(bool &f) : flag(f), was(f) {}
    ~SwitchGuard() { flag = was; }
};

}  // namespace ds4::test
