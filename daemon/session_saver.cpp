#include "daemon/session_saver.h"

#include "daemon/log.h"

namespace ds4::daemon {

SessionSaver::SessionSaver(kvstore::Store &store, size_t max_checkpoints)
    : store_(store), max_checkpoints_(max_checkpoints), thread_([this] { run(); }) {}

SessionSaver::~SessionSaver() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

void SessionSaver::save(std::string name, std::vector<uint8_t> bytes, Done done) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        for (Item &it : q_)
            if (!it.is_checkpoint && it.name == name) {
                it.bytes = std::move(bytes);
                if (done) it.done.push_back(std::move(done));
                return;
            }
        Item it;
        it.name = std::move(name);
        it.bytes = std::move(bytes);
        if (done) it.done.push_back(std::move(done));
        q_.push_back(std::move(it));
    }
    cv_.notify_all();
}

bool SessionSaver::checkpoint(std::vector<uint8_t> bytes) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (queued_checkpoints_ >= max_checkpoints_) return false;
        Item it;
        it.is_checkpoint = true;
        it.bytes = std::move(bytes);
        q_.push_back(std::move(it));
        ++queued_checkpoints_;
    }
    cv_.notify_all();
    return true;
}

void SessionSaver::flush() {
    std::unique_lock<std::mutex> lk(mu_);
    idle_cv_.wait(lk, [&] { return q_.empty() && !busy_; });
}

uint64_t SessionSaver::saves_failed() const {
    std::lock_guard<std::mutex> lk(mu_);
    return failed_;
}

std::string SessionSaver::last_error(const std::string &name) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = errors_.find(name);
    return it == errors_.end() ? std::string() : it->second;
}

void SessionSaver::forget(const std::string &name) {
    std::lock_guard<std::mutex> lk(mu_);
    errors_.erase(name);
}

void SessionSaver::run() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
        cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
        if (q_.empty()) return;  // stop_ and nothing left
        Item it = std::move(q_.front());
        q_.pop_front();
        if (it.is_checkpoint) --queued_checkpoints_;
        busy_ = true;
        lk.unlock();
        kvstore::Status st;
        if (it.is_checkpoint) {
            st = store_.save_checkpoint(it.bytes.data(), it.bytes.size());
            if (!st) log_line("prefix checkpoint not stored: %s", st.to_string().c_str());
        } else {
            st = store_.save(it.name, it.bytes.data(), it.bytes.size());
            if (!st)
                log_line("saving session '%s' failed (the previous stored version is kept): %s", it.name.c_str(),
                         st.to_string().c_str());
        }
        for (Done &d : it.done) d(st);
        it.bytes = {};
        lk.lock();
        if (!st) ++failed_;
        if (!it.is_checkpoint) {
            if (st) errors_.erase(it.name);
            else errors_[it.name] = st.to_string();
        }
        busy_ = false;
        if (q_.empty()) idle_cv_.notify_all();
    }
}

}  // namespace ds4::daemon
