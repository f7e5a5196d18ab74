#include "engine/tokenizer/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "engine/common/error.h"
#include "engine/gguf/gguf.h"
#include "engine/tokenizer/pretokenize.h"
#include "engine/tokenizer/unicode.h"

namespace ds4::tok {
namespace {

struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct Merge {
    int32_t rank;
    int32_t result;
};

// Byte trie over the texts of the tokens matched on the special path.
class SpecialTrie {
public:
    SpecialTrie() { nodes_.emplace_back(); }

    void add(std::string_view text, int32_t id) {
        if (text.empty()) return;
        first_[static_cast<uint8_t>(text[0])] = true;
        size_t node = 0;
        for (char ch : text) {
            uint8_t b = static_cast<uint8_t>(ch);
            int32_t next = child(node, b);
            if (next < 0) {
                next = static_cast<int32_t>(nodes_.size());
                nodes_[node].edges.emplace_back(b, next);
                nodes_.emplace_back();
            }
            node = static_cast<size_t>(next);
        }
        if (nodes_[node].id < 0) nodes_[node].id = id;   // first token with this text wins
    }

    // Longest token starting at s[pos]: its id and length, or id -1.
    std::pair<int32_t, size_t> match(std::string_view s, size_t pos) const {
        if (!first_[static_cast<uint8_t>(s[pos])]) return {-1, 0};
        int32_t best = -1;
        size_t best_len = 0, node = 0;
        for (size_t k = pos; k < s.size(); ++k) {
            int32_t next = child(node, static_cast<uint8_t>(s[k]));
            if (next < 0) break;
            node = static_cast<size_t>(next);
            if (nodes_[node].id >= 0) best = nodes_[node].id, best_len = k + 1 - pos;
        }
        return {best, best_len};
    }

private:
    struct Node {
        std::vector<std::pair<uint8_t, int32_t>> edges;
        int32_t id = -1;
    };
    int32_t child(size_t node, uint8_t b) const {
        for (const auto &e : nodes_[node].edges)
            if (e.first == b) return e.second;
        return -1;
    }
    std::vector<Node> nodes_;
    bool first_[256] = {};
};

bool is_added_type(int32_t t) {
    return t == static_cast<int32_t>(TokenType::Control) || t == static_cast<int32_t>(TokenType::UserDefined);
}

// Direct-mapped word -> ids cache, one per thread, valid for one encode call (a
// generation number retires old entries for free, so it never needs clearing and never
// mixes tokenizers). Short words only; no allocation on any path.
class WordCache {
public:
    void begin_text() {
        if (slots_.empty()) slots_.resize(kSlots);
        if (++gen_ == 0) {   // wrapped: retire everything explicitly
            for (Slot &s : slots_) s.gen = 0;
            gen_ = 1;
        }
    }

    bool lookup(std::string_view w, std::vector<int32_t> &out) const {
        if (w.size() > kMaxKey) return false;
        const Slot &s = slots_[hash(w) & (kSlots - 1)];
        if (s.gen != gen_ || s.key_len != w.size() || std::memcmp(s.key, w.data(), w.size()) != 0) return false;
        out.insert(out.end(), s.ids, s.ids + s.n_ids);
        return true;
    }

    void store(std::string_view w, const int32_t *ids, size_t n) {
        if (w.size() > kMaxKey || n > kMaxIds) return;
        Slot &s = slots_[hash(w) & (kSlots - 1)];
        s.gen = gen_;
        s.key_len = static_cast<uint8_t>(w.size());
        s.n_ids = static_cast<uint8_t>(n);
        std::memcpy(s.key, w.data(), w.size());
        std::memcpy(s.ids, ids, n * sizeof(int32_t));
    }

private:
    static constexpr size_t kSlots = 1 << 14, kMaxKey = 26, kMaxIds = 8;
    struct Slot {
        uint32_t gen = 0;
        uint8_t key_len = 0, n_ids = 0;
        char key[kMaxKey];
        int32_t ids[kMaxIds];
    };
    static uint64_t hash(std::string_view w) {   // FNV-1a
        uint64_t h = 1469598103934665603ull;
        for (char c : w) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
        return h ^ (h >> 29);
    }
    std::vector<Slot> slots_;
    uint32_t gen_ = 0;
};

WordCache &word_cache() {
    thread_local WordCache c;
    return c;
}

}  // namespace

struct Tokenizer::Impl {
    Vocab vocab;
    std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> token_to_id;
    int32_t byte_id[256];
    std::unordered_map<uint64_t, Merge> merges;
    std::vector<std::string> decoded;
    SpecialTrie specials;
    std::vector<int32_t> stops;


    const Merge *find_merge(int32_t a, int32_t b) const {
        auto it = merges.find((static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b));
        return it == merges.end() ? nullptr : &it->second;
    }

    void bpe(std::string_view word, std::vector<int32_t> &out) const;
    // The cache must have been started (begin_text) by the public entry point.
    void encode_plain(std::string_view text, WordCache &cache, std::vector<int32_t> &out) const;
    void encode_block(std::string_view text, WordCache &cache, std::vector<int32_t> &out) const;
};

// Merges the byte symbols of one piece: lowest rank first, leftmost among equal ranks
// (HF's BPE::merge_word without dropout). Bytes missing from the vocabulary are dropped,
// as HF does when there is no unknown token.
void Tokenizer::Impl::bpe(std::string_view word, std::vector<int32_t> &out) const {
    struct Sym {
        int32_t id, prev, next;
        bool live;
    };
    struct Cand {
        int32_t rank, pos, result;
        bool operator<(const Cand &o) const {   // std heap is a max-heap: invert
            return rank != o.rank ? rank > o.rank : pos > o.pos;
        }
    };
    thread_local std::vector<Sym> syms;
    thread_local std::vector<Cand> heap;
    syms.clear();
    heap.clear();
    for (char ch : word) {
        int32_t id = byte_id[static_cast<uint8_t>(ch)];
        if (id < 0) continue;
        int32_t i = static_cast<int32_t>(syms.size());
        syms.push_back(Sym{id, i - 1, i + 1, true});
    }
    if (syms.empty()) return;
    syms.back().next = -1;
    for (size_t i = 0; i + 1 < syms.size(); ++i)
        if (const Merge *m = find_merge(syms[i].id, syms[i + 1].id))
            heap.push_back(Cand{m->rank, static_cast<int32_t>(i), m->result});
    std::make_heap(heap.begin(), heap.end());
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end());
        Cand top = heap.back();
        heap.pop_back();
        Sym &left = syms[top.pos];
        if (!left.live || left.next < 0) continue;
        Sym &right = syms[left.next];
        // A stale entry: the pair at this position changed since it was queued.
        const Merge *now = find_merge(left.id, right.id);
        if (!now || now->result != top.result) continue;
        left.id = top.result;
        right.live = false;
        left.next = right.next;
        if (left.next >= 0) syms[left.next].prev = top.pos;
        if (left.prev >= 0)
            if (const Merge *m = find_merge(syms[left.prev].id, left.id)) {
                heap.push_back(Cand{m->rank, left.prev, m->result});
                std::push_heap(heap.begin(), heap.end());
            }
        if (left.next >= 0)
            if (const Merge *m = find_merge(left.id, syms[left.next].id)) {
                heap.push_back(Cand{m->rank, top.pos, m->result});
                std::push_heap(heap.begin(), heap.end());
            }
    }
    for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

// Where a long text may be cut into independently pre-tokenized blocks: right after a
// '\n' followed by a printable ASCII character. No match of the pre-tokenizer spans such
// a point ('\n' always ends the whitespace match it belongs to when non-space follows,
// and never starts an unmatched gap), so every Split restarts there exactly as it would
// on the whole text. Blocks keep the per-character scratch arrays small.
static size_t next_block_end(std::string_view text, size_t from) {
    constexpr size_t kBlock = 64 * 1024;
    if (text.size() - from <= kBlock) return text.size();
    for (size_t i = from + kBlock; i + 1 < text.size(); ++i)
        if (text[i] == '\n' && text[i + 1] > 0x20 && text[i + 1] < 0x7F) return i + 1;
    return text.size();
}

void Tokenizer::Impl::encode_plain(std::string_view text, WordCache &cache, std::vector<int32_t> &out) const {
    if (!text.empty() && vocab.pre != "deepseek-v3" && vocab.pre != "deepseek-v4")
        fail("tokenizer: this model's pre-tokenizer (GGUF key tokenizer.ggml.pre = '" + vocab.pre +
             "') is not supported (deepseek-v3/deepseek-v4 only), so text cannot be tokenized exactly; "
             "send token ids instead (decoding works)");
    for (size_t at = 0; at < text.size();) {
        size_t end = next_block_end(text, at);
        encode_block(text.substr(at, end - at), cache, out);
        at = end;
    }
}

void Tokenizer::Impl::encode_block(std::string_view text, WordCache &cache, std::vector<int32_t> &out) const {
    thread_local std::vector<Piece> pieces;
    pieces.clear();
    pretokenize_deepseek_v3(text, pieces);
    for (const Piece &p : pieces) {
        std::string_view word = text.substr(p.begin, p.end - p.begin);
        if (word.size() == 1) {
            int32_t id = byte_id[static_cast<uint8_t>(word[0])];
            if (id >= 0) out.push_back(id);
            continue;
        }
        if (cache.lookup(word, out)) continue;
        size_t start = out.size();
        bpe(word, out);
        cache.store(word, out.data() + start, out.size() - start);
    }
}

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::from_vocab(Vocab v) {
    auto impl = std::make_shared<Impl>();
    const size_t n = v.tokens.size();
    if (n == 0) fail("tokenizer: empty vocabulary");
    if (n > 0x7FFFFFFF) fail("tokenizer: vocabulary too large");
    if (v.types.size() != n) failf("tokenizer: %zu token types for %zu tokens", v.types.size(), n);
    if (v.model != "gpt2") fail("tokenizer: model '" + v.model + "' is not the byte-level BPE 'gpt2'");
    for (int32_t id : {v.bos, v.eos, v.pad, v.eot})
        if (id < -1 || id >= static_cast<int64_t>(n)) failf("tokenizer: special token id %d outside the vocabulary", id);

    // Normal tokens take precedence for BPE lookups; added tokens fill in the rest.
    for (int pass = 0; pass < 2; ++pass)
        for (size_t i = 0; i < n; ++i) {
            int32_t t = v.types[i];
            if (t == static_cast<int32_t>(TokenType::Unused)) continue;
            if ((pass == 0) == is_added_type(t)) continue;
            impl->token_to_id.emplace(v.tokens[i], static_cast<int32_t>(i));
        }
    for (int b = 0; b < 256; ++b) {
        std::string s;
        utf8_append(s, byte_to_unicode(static_cast<uint8_t>(b)));
        auto it = impl->token_to_id.find(s);
        impl->byte_id[b] = it == impl->token_to_id.end() ? -1 : it->second;
    }
    impl->merges.reserve(v.merges.size());
    for (size_t r = 0; r < v.merges.size(); ++r) {
        const std::string &m = v.merges[r];
        size_t sp = m.find(' ', 1);
        if (sp == std::string::npos || sp + 1 >= m.size())
            failf("tokenizer.ggml.merges[%zu] '%s' is not two tokens separated by a space", r, m.c_str());
        std::string a = m.substr(0, sp), b = m.substr(sp + 1);
        auto ia = impl->token_to_id.find(a), ib = impl->token_to_id.find(b), ic = impl->token_to_id.find(a + b);
        if (ia == impl->token_to_id.end() || ib == impl->token_to_id.end() || ic == impl->token_to_id.end())
            failf("tokenizer.ggml.merges[%zu] '%s' refers to a token missing from the vocabulary", r, m.c_str());
        uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) | static_cast<uint32_t>(ib->second);
        impl->merges[key] = Merge{static_cast<int32_t>(r), ic->second};   // a repeated pair keeps the last rank, as HF
    }

    impl->decoded.resize(n);
    for (size_t i = 0; i < n; ++i) {
        const std::string &t = v.tokens[i];
        int32_t ty = v.types[i];
        if (is_added_type(ty) || ty == static_cast<int32_t>(TokenType::Unused)) {
            impl->decoded[i] = t;
            continue;
        }
        std::string &d = impl->decoded[i];
        const auto *s = reinterpret_cast<const unsigned char *>(t.data());
        for (size_t k = 0; k < t.size();) {
            uint32_t cp;
            int len = utf8_decode(s, t.size(), k, &cp);
            int byte = cp == kInvalidCodepoint ? -1 : unicode_to_byte(cp);
            if (byte >= 0) d.push_back(static_cast<char>(byte));
            else d.append(t, k, len);   // outside the byte alphabet: kept as written
            k += len;
        }
    }
    for (size_t i = 0; i < n; ++i)
        if (is_added_type(v.types[i])) impl->specials.add(v.tokens[i], static_cast<int32_t>(i));
    if (v.eos >= 0) impl->stops.push_back(v.eos);
    if (v.eot >= 0 && v.eot != v.eos) impl->stops.push_back(v.eot);
    impl->vocab = std::move(v);
    return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_gguf(const gguf::Reader &r) { return from_vocab(read_vocab(r)); }

Tokenizer Tokenizer::from_hf_json(const std::string &path) { return from_vocab(read_vocab_hf_json(path, 0)); }

Tokenizer Tokenizer::byte_fallback(int n_vocab) { return from_vocab(fallback_vocab(n_vocab)); }

void Tokenizer::encode(std::string_view text, std::vector<int32_t> &out) const {
    WordCache &cache = word_cache();
    cache.begin_text();
    impl_->encode_plain(text, cache, out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 1);
    encode(text, out);
    return out;
}

void Tokenizer::encode_special(std::string_view text, std::vector<int32_t> &out) const {
    WordCache &cache = word_cache();
    cache.begin_text();
    size_t seg = 0, pos = 0;
    while (pos < text.size()) {
        auto [id, len] = impl_->specials.match(text, pos);
        if (id < 0) {
            ++pos;
            continue;
        }
        impl_->encode_plain(text.substr(seg, pos - seg), cache, out);
        out.push_back(id);
        pos += len;
        seg = pos;
    }
    impl_->encode_plain(text.substr(seg), cache, out);
}

std::vector<int32_t> Tokenizer::encode_special(std::string_view text) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 1);
    encode_special(text, out);
    return out;
}

const std::string &Tokenizer::token_bytes(int32_t id) const {
    if (id < 0 || static_cast<size_t>(id) >= impl_->decoded.size())
        failf("token id %d is outside the vocabulary of %zu tokens", id, impl_->decoded.size());
    return impl_->decoded[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
    std::string out;
    for (int32_t id : ids) out += token_bytes(id);
    return out;
}

const std::string &Tokenizer::token_text(int32_t id) const {
    token_bytes(id);   // range check
    return impl_->vocab.tokens[id];
}

TokenType Tokenizer::token_type(int32_t id) const {
    token_bytes(id);
    return static_cast<TokenType>(impl_->vocab.types[id]);
}

int32_t Tokenizer::find_token(std::string_view text) const {
    auto it = impl_->token_to_id.find(text);
    return it == impl_->token_to_id.end() ? -1 : it->second;
}

int32_t Tokenizer::bos() const { return impl_->vocab.bos; }
int32_t Tokenizer::eos() const { return impl_->vocab.eos; }
bool Tokenizer::is_stop(int32_t id) const {
    return std::find(impl_->stops.begin(), impl_->stops.end(), id) != impl_->stops.end();
}
const std::vector<int32_t> &Tokenizer::stop_tokens() const { return impl_->stops; }
int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->vocab.tokens.size()); }
const Vocab &Tokenizer::vocab() const { return impl_->vocab; }

}  // namespace ds4::tok
