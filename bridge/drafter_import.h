// The importing half of a drafter shared across processes (ARCHITECTURE.md §5, "Shared
// drafter"): asks a ds4d for its drafter (GetDrafter), receives the sealed memfd with the
// reply, checks it against the descriptor and opens the drafter from that mapping.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "engine/model/model.h"

namespace ds4::bridge_impl {

// The drafter exported by the ds4d listening on `socket_path`, mapped read-only; nullptr with
// *why set when there is none to import (no daemon, a refusal, a descriptor or a file that
// does not check out, or `check` throwing for the opened drafter). Never throws.
std::unique_ptr<ds4::Model> import_drafter(const std::string &socket_path, const ds4::ModelOptions &opt,
                                           std::string *why,
                                           const std::function<void(const ds4::Model &)> &check);

}  // namespace ds4::bridge_impl
