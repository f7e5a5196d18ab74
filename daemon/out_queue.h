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
        {
            std::lock_guard<std::mutex> lk(mu_);
            q_.push_back(std::move(o));
        }
        uv_async_send(async_);
    }

    std::vector<Outgoing> take() {
        std::vector<Outgoing> out;
        std::lock_guard<std::mutex> lk(mu_);
        out.swap(q_);
        return out;
    }

private:
    std::mutex mu_;
    std::vector<Outgoing> q_;
    uv_async_t *async_ = nullptr;
};

}  // namespace ds4::daemon
