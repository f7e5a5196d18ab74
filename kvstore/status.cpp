#include "kvstore/status.h"

namespace ds4::kvstore {

const char *code_name(Code c) {
    switch (c) {
        case Code::kOk: return "OK";
        case Code::kInvalidArgument: return "INVALID_ARGUMENT";
        case Code::kNotFound: return "NOT_FOUND";
        case Code::kCorrupt: return "CORRUPT";
        case Code::kNoSpace: return "NO_SPACE";
        case Code::kIoError: return "IO_ERROR";
        case Code::kBudgetExceeded: return "BUDGET_EXCEEDED";
        case Code::kSchemaTooNew: return "SCHEMA_TOO_NEW";
        case Code::kBusy: return "BUSY";
        case Code::kInternal: return "INTERNAL";
    }
    return "UNKNOWN";
}

std::string Status::to_string() const {
    if (is_ok()) return "OK";
    return std::string(code_name(code_)) + ": " + message_;
}

}  // namespace ds4::kvstore
