// One line per event on stderr, prefixed with the time: ds4d runs in the foreground.
#pragma once
#include <sys/time.h>

#include <cstdarg>
#include <cstdio>
#include <ctime>

namespace ds4::daemon {

__attribute__((format(printf, 1, 2))) inline void log_line(const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    timeval tv;
    gettimeofday(&tv, nullptr);
    tm t;
    localtime_r(&tv.tv_sec, &t);
    std::fprintf(stderr, "%02d:%02d:%02d.%03ld ds4d: %s\n", t.tm_hour, t.tm_min, t.tm_sec, long(tv.tv_usec / 1000), msg);
}

}  // namespace ds4::daemon
