// Connects the engine's expert streaming to the expert store (kvstore/expert_store.h): the
// engine defines what it needs (ExpertStoreLink), the store knows nothing of the engine,
// and the bridge, above both, adapts one to the other.
#pragma once
#include <memory>
#include <string>

#include "engine/backend/streaming_experts.h"

namespace ds4::bridge_impl {

// Opens (creating) the store under `dir` for the model with this fingerprint; throws
// ds4::Error with the store's message when it cannot. `model_path` (optional): the GGUF the
// experts come from, recorded (absolute) so that compaction can tell when it is gone.
std::shared_ptr<ExpertStoreLink> open_expert_store_link(const std::string &dir, uint64_t fingerprint,
                                                        const std::string &model_path = {});

}  // namespace ds4::bridge_impl
