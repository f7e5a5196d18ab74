// One line per event on stderr: ds4d runs in the foreground. On a terminal or a file each
// line starts with the time; when stderr is the systemd journal ($JOURNAL_STREAM names it)
// the journal keeps the time and each line starts with its syslog priority instead ("<6>"
// info, "<4>" warning, "<3>" error), which journald reads as the entry's severity.
#pragma once
#include <sys/stat.h>
#include <sys/time.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace ds4::daemon {

enum class LogLevel { Error = 3, Warning = 4, Info = 6 };

// Whether stderr is the stream $JOURNAL_STREAM ("DEV:INODE") names; checked once.
inline bool stderr_is_journal() {
    static const bool yes = [] {
        const char *js = std::getenv("JOURNAL_STREAM");
        unsigned long long dev = 0, ino = 0;
        if (!js || std::sscanf(js, "%llu:%llu", &dev, &ino) != 2) return false;
        struct stat st {};
        return ::fstat(2, &st) == 0 && (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
    }();
    return yes;
}

inline void log_va(LogLevel level, const char *fmt, va_list ap) {
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (stderr_is_journal()) {
        std::fprintf(stderr, "<%d>%s\n", int(level), msg);
        return;
    }
    timeval tv;
    gettimeofday(&tv, nullptr);
    tm t;
    localtime_r(&tv.tv_sec, &t);
    std::fprintf(stderr, "%02d:%02d:%02d.%03ld ds4d: %s%s\n", t.tm_hour, t.tm_min, t.tm_sec, long(tv.tv_usec / 1000),
                 level == LogLevel::Error ? "error: " : level == LogLevel::Warning ? "warning: " : "", msg);
}

__attribute__((format(printf, 1, 2))) inline void log_line(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_va(LogLevel::Info, fmt, ap);
    va_end(ap);
}

__attribute__((format(printf, 1, 2))) inline void log_warning(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_va(LogLevel::Warning, fmt, ap);
    va_end(ap);
}

__attribute__((format(printf, 1, 2))) inline void log_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_va(LogLevel::Error, fmt, ap);
    va_end(ap);
}

}  // namespace ds4::daemon
