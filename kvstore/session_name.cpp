#include "kvstore/session_name.h"

#include <cstdio>

namespace ds4::kvstore {

Status validate_session_name(std::string_view name) {
    if (name.empty()) return {Code::kInvalidArgument, "session name is empty"};
    if (name.size() > kMaxSessionName)
        return {Code::kInvalidArgument, "session name is " + std::to_string(name.size()) + " bytes, the limit is " +
                                            std::to_string(kMaxSessionName)};
    for (size_t i = 0; i < name.size(); ++i) {
        const unsigned char c = static_cast<unsigned char>(name[i]);
        if (c < 0x20 || c > 0x7E) {
            char buf[96];
            snprintf(buf, sizeof buf, "session name has a non-printable byte 0x%02x at offset %zu", c, i);
            return {Code::kInvalidArgument, buf};
        }
        if (c == '/' || c == '\\')
            return {Code::kInvalidArgument, "session name contains a path separator at offset " + std::to_string(i)};
    }
    if (name.find("..") != std::string_view::npos)
        return {Code::kInvalidArgument, "session name contains \"..\""};
    if (name.front() == ' ' || name.back() == ' ')
        return {Code::kInvalidArgument, "session name starts or ends with a space"};
    return Status::ok();
}

}  // namespace ds4::kvstore
