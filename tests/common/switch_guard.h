// A kernel switch (a bool& such as vnni_enabled() or attend8_avx512(), or a threshold such
// as q8_0_rows_tile_max()) set for one test and put back after it, also when an assertion
// returns early.
#pragma once

namespace ds4::test {

template <class T>
struct SwitchGuard {
    T &flag;
    const T was;
    explicit SwitchGuard(T &f) : flag(f), was(f) {}
    ~SwitchGuard() { flag = was; }
};

}  // namespace ds4::test
