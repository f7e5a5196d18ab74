#include "bridge/expert_store_link.h"

#include "engine/common/error.h"
#include "kvstore/expert_store.h"

namespace ds4::bridge_impl {

namespace {

class StoreLink final : public ExpertStoreLink {
public:
    explicit StoreLink(std::unique_ptr<kvstore::ExpertStore> s) : s_(std::move(s)) {}

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
        (void)s_->put(layer, expert, data, length);
    }
    void add_usage(const std::vector<uint32_t> &counts, int n_expert) override { (void)s_->add_usage(counts, n_expert); }
    std::vector<std::pair<int, int>> hot_set(size_t max) override { return s_->hot_set(max); }

private:
    std::unique_ptr<kvstore::ExpertStore> s_;
};

}  // namespace

std::shared_ptr<ExpertStoreLink> open_expert_store_link(const std::string &dir, uint64_t fingerprint) {
    std::unique_ptr<kvstore::ExpertStore> s;
    const kvstore::Status st = kvstore::ExpertStore::open(dir, fingerprint, &s);
    if (!st) throw Error("expert store " + dir + ": " + st.to_string());
    return std::make_shared<StoreLink>(std::move(s));
}

}  // namespace ds4::bridge_impl
