#include "gateway/response_store.h"

#include <algorithm>
#include <unordered_set>

namespace ds4::gateway {

void ResponseStore::touch_chain(const std::string &id) {
    // A chain refreshed from its end: the oldest ancestor ends up least recently used of them,
    // the turn itself most. The visited set stops a cycle (an id reused as its own ancestor).
    std::vector<std::string> chain;
    std::unordered_set<std::string> seen;
    for (std::string cur = id; !cur.empty() && seen.insert(cur).second;) {
        auto it = map_.find(cur);
        if (it == map_.end()) break;
        chain.push_back(cur);
        cur = it->second.turn.parent;
    }
    for (auto c = chain.rbegin(); c != chain.rend(); ++c) {
        Entry &e = map_[*c];
        lru_.splice(lru_.end(), lru_, e.pos);
    }
}

void ResponseStore::evict() {
    while (!lru_.empty() && (tokens_ > max_tokens_ || map_.size() > max_turns_)) {
        auto it = map_.find(lru_.front());
        tokens_ -= it->second.turn.tokens.size();
        map_.erase(it);
        lru_.pop_front();
    }
}

void ResponseStore::add(const std::string &id, Turn t) {
    std::lock_guard lk(mu_);
    if (auto old = map_.find(id); old != map_.end()) {
        tokens_ -= old->second.turn.tokens.size();
        lru_.erase(old->second.pos);
        map_.erase(old);
    }
    tokens_ += t.tokens.size();
    lru_.push_back(id);
    map_[id] = Entry{std::move(t), std::prev(lru_.end())};
    touch_chain(id);
    evict();
}

std::optional<ResponseStore::Turn> ResponseStore::find(const std::string &id) {
    std::lock_guard lk(mu_);
    auto it = map_.find(id);
    if (it == map_.end()) return std::nullopt;
    touch_chain(id);
    Turn t = it->second.turn;
    t.tokens.clear();
    return t;
}

std::optional<std::vector<int32_t>> ResponseStore::history(const std::string &id) {
    std::lock_guard lk(mu_);
    std::vector<const Turn *> chain;
    std::unordered_set<std::string> seen;
    for (std::string cur = id;;) {
        if (!seen.insert(cur).second) return std::nullopt;
        auto it = map_.find(cur);
        if (it == map_.end()) return std::nullopt;   // forgotten
        chain.push_back(&it->second.turn);
        if (it->second.turn.parent.empty()) {
            if (!it->second.turn.known_base) return std::nullopt;
            break;
        }
        cur = it->second.turn.parent;
    }
    std::vector<int32_t> out;
    for (auto c = chain.rbegin(); c != chain.rend(); ++c) out.insert(out.end(), (*c)->tokens.begin(), (*c)->tokens.end());
    touch_chain(id);
    return out;
}

size_t ResponseStore::turns() const {
    std::lock_guard lk(mu_);
    return map_.size();
}

size_t ResponseStore::tokens() const {
    std::lock_guard lk(mu_);
    return tokens_;
}

}  // namespace ds4::gateway
