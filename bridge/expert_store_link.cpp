#include "bridge/expert_store_link.h"

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/common/error.h"
#include "kvstore/expert_store.h"

namespace ds4::bridge_impl {

namespace {

// Records are written by a thread of the link's own: a first run that fills the store would
// otherwise pay each expert's write inside the step (measured on the flash-shape file: half
// the decode speed). At most kMaxPending records wait; beyond that a record is dropped and
// simply stored the next time it is read from the GGUF.
class StoreLink final : public ExpertStoreLink {
public:
    explicit StoreLink(std::unique_ptr<kvstore::ExpertStore> s) : s_(std::move(s)), writer_([this] { write_loop(); }) {}
    ~StoreLink() override {
        {
            std::lock_guard<std::mutex> lk(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        writer_.join();
    }

    bool find(int layer, int expert, Record *out) override {
        kvstore::ExpertRecord r;
        if (!s_->find(layer, expert, &r)) return false;
        *out = Record{s_->read_fd(), r.offset, r.length};
        return true;
    }
    bool verify(int layer, int expert, const uint8_t *data, uint64_t length) override {
        kvstore::ExpertRecord r;
        return s_->find(layer, expert, &r) && kvstore::ExpertStore::verify(r, data, length);
    }
    // A failed write only means the expert is read from the GGUF next time too.
    void put(int layer, int expert, const uint8_t *data, uint64_t length) override {
        std::lock_guard<std::mutex> lk(mu_);
        if (pending_.size() >= kMaxPending) return;
        pending_.push_back({layer, expert, std::vector<uint8_t>(data, data + length)});
        cv_.notify_all();
    }
    void add_usage(const std::vector<uint32_t> &counts, int n_expert) override { (void)s_->add_usage(counts, n_expert); }
    std::vector<std::pair<int, int>> hot_set(size_t max) override { return s_->hot_set(max); }

private:
    static constexpr size_t kMaxPending = 16;
    struct Pending {
        int layer, expert;
        std::vector<uint8_t> bytes;
    };
    void write_loop() {
        std::unique_lock<std::mutex> lk(mu_);
        while (true) {
            cv_.wait(lk, [&] { return stop_ || !pending_.empty(); });
            if (pending_.empty()) return;  // stop_ and nothing left to write
            Pending p = std::move(pending_.front());
            pending_.pop_front();
            lk.unlock();
            (void)s_->put(p.layer, p.expert, p.bytes.data(), p.bytes.size());
            lk.lock();
        }
    }

    std::unique_ptr<kvstore::ExpertStore> s_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Pending> pending_;
    bool stop_ = false;
    std::thread writer_;
};

}  // namespace

std::shared_ptr<ExpertStoreLink> open_expert_store_link(const std::string &dir, uint64_t fingerprint,
                                                        const std::string &model_path) {
    std::unique_ptr<kvstore::ExpertStore> s;
    const kvstore::Status st = kvstore::ExpertStore::open(dir, fingerprint, &s);
    if (!st) throw Error("expert store " + dir + ": " + st.to_string());
    if (!model_path.empty()) {
        std::error_code ec;
        const std::filesystem::path abs = std::filesystem::absolute(model_path, ec);
        // Without it the model only stays in the store until a compaction that drops models
        // of unknown source: not worth failing the open.
        (void)s->set_source(ec ? model_path : abs.string());
    }
    return std::make_shared<StoreLink>(std::move(s));
}

}  // namespace ds4::bridge_impl
