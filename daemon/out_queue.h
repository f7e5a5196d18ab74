// Frames travelling from the worker thread to the loop thread, which writes them.
#pragma once
#include <uv.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace ds4::daemon {

struct Outgoing {
    uint64_t conn = 0;          // 0: a control note for the loop (the worker has finished)
    std::vector<uint8_t> bytes; // one complete frame
    uint64_t request_id = 0;
    bool final = false;         // the last frame of request_id
};

class OutQueue {
public:
    // The loop's async handle; must be set before the worker pushes.
    void attach(uv_async_t *async) { async_ = async; }

    void push(Outgoing &&o) {
        bool wake;
        {
            std::lock_guard<std::mutex> lk(mu_);
            q_.push_back(std::move(o));
            wake = held_ == 0;
            staged_ = staged_ || !wake;
        }
        if (wake) uv_async_send(async_);
    }

    // Between hold() and release() pushes only queue: the loop is woken once, at release(),
    // for all of them (a batched step's tokens: one wake-up and one write per connection
    // instead of one per row). Nests.
    void hold() {
        std::lock_guard<std::mutex> lk(mu_);
        ++held_;
    }
    void release() {
        bool wake;
        {
            std::lock_guard<std::mutex> lk(mu_);
            wake = --held_ == 0 && staged_;
            if (held_ == 0) staged_ = false;
        }
        if (wake) uv_async_send(async_);
    }

    // Everything queued, into `into` (cleared first); the two vectors trade storage, so a
    // loop that passes the same vector each time allocates nothing once both are grown.
    void take(std::vector<Outgoing> &into) {
        into.clear();
        std::lock_guard<std::mutex> lk(mu_);
        into.swap(q_);
    }
    std::vector<Outgoing> take() {
        std::vector<Outgoing> out;
        take(out);
        return out;
    }

private:
    std::mutex mu_;
    std::vector<Outgoing> q_;
    int held_ = 0;
    bool staged_ = false;   // pushed while held: release() wakes the loop
    uv_async_t *async_ = nullptr;
};

}  // namespace ds4::daemon
