// Engine-internal error type. The engine throws ds4::Error; the bridge catches every
// exception at the C ABI and turns it into an int status + message, so nothing escapes.
#pragma once
#include <cstdarg>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace ds4 {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail(const std::string &msg) { throw Error(msg); }

[[noreturn]] __attribute__((format(printf, 1, 2))) inline void failf(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    throw Error(buf);
}

}  // namespace ds4
