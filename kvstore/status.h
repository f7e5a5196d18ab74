// Result of every kvstore operation. The store never throws across its API: internal
// exceptions (allocation failure included) are caught and turned into a Status.
#pragma once
#include <string>
#include <utility>

namespace ds4::kvstore {

enum class Code {
    kOk = 0,
    kInvalidArgument,  // bad session name, malformed payload, ...
    kNotFound,         // no such session / prefix
    kCorrupt,          // a payload file failed its checks (and was quarantined)
    kNoSpace,          // ENOSPC / EDQUOT from the file system, or the LMDB map cannot grow
    kIoError,          // any other I/O failure
    kBudgetExceeded,   // the payload cannot fit the byte budget even after eviction
    kSchemaTooNew,     // the state dir was written by a newer ds4
    kBusy,             // the state dir is locked by another process
    kInternal,         // LMDB or other unexpected failure
};

const char *code_name(Code c);

class [[nodiscard]] Status {
public:
    Status() = default;
    Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
    static Status ok() { return {}; }

    bool is_ok() const { return code_ == Code::kOk; }
    explicit operator bool() const { return is_ok(); }
    Code code() const { return code_; }
    const std::string &message() const { return message_; }
    // "CODE: message", for logs and test failures.
    std::string to_string() const;

private:
    Code code_ = Code::kOk;
    std::string message_;
};

}  // namespace ds4::kvstore
