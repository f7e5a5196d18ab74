// The store thread: payload writes (named-session saves and prefix checkpoints) leave the
// worker as in-memory bytes and are made durable here, so a reply never waits for an
// fsync. Saves of one name are ordered; a queued save not yet started is replaced by a
// newer one of the same name (only the latest state matters). Checkpoints are best-effort
// and bounded: beyond max_checkpoints queued, new ones are dropped.
//
// A failed save (disk full, I/O error, budget) keeps the previous stored version; the
// failure is remembered per name until a later save of that name succeeds or the name is
// forgotten, so clients can be told (SessionOpened, ListSessions) that the stored state is
// behind the live one.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kvstore/store.h"

namespace ds4::daemon {

class SessionSaver {
public:
    // Called on the store thread with the save's outcome.
    using Done = std::function<void(const kvstore::Status &)>;

    explicit SessionSaver(kvstore::Store &store, size_t max_checkpoints = 4);
    ~SessionSaver();  // finishes everything queued, then joins
    SessionSaver(const SessionSaver &) = delete;
    SessionSaver &operator=(const SessionSaver &) = delete;

    void save(std::string name, std::vector<uint8_t> bytes, Done done = {});
    // False when dropped (queue full).
    bool checkpoint(std::vector<uint8_t> bytes);
    // Returns once everything queued before the call is durable (or failed).
    void flush();

    uint64_t saves_failed() const;
    // Why the latest save of `name` failed; empty when it succeeded (or none was made).
    std::string last_error(const std::string &name) const;
    // Drops the remembered failure (the session was deleted).
    void forget(const std::string &name);

private:
    struct Item {
        bool is_checkpoint = false;
        std::string name;
        std::vector<uint8_t> bytes;
        std::vector<Done> done;
    };
    void run();

    kvstore::Store &store_;
    const size_t max_checkpoints_;
    mutable std::mutex mu_;
    std::condition_variable cv_, idle_cv_;
    std::deque<Item> q_;
    size_t queued_checkpoints_ = 0;
    bool busy_ = false, stop_ = false;
    uint64_t failed_ = 0;
    std::unordered_map<std::string, std::string> errors_;  // name -> latest failure
    std::thread thread_;
};

}  // namespace ds4::daemon
