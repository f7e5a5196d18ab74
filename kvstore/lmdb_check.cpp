#include "kvstore/lmdb_check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace ds4::kvstore {
namespace {

// On-disk layout of LMDB 0.9 (LP64), from mdb.c: every page starts with a 16-byte header
// (u64 page number, u16 pad, u16 flags, u32 lower/upper); pages 0 and 1 are meta pages
// whose MDB_meta follows that header:
//   +0 u32 mm_magic  +4 u32 mm_version  +8 void* mm_address  +16 size_t mm_mapsize
//   +24 MDB_db mm_dbs[2] (48 bytes each: u32 md_pad, u16 flags, u16 depth, u64 branch,
//       leaf and overflow page counts, u64 entries, u64 md_root at +40)
//   +120 u64 mm_last_pg  +128 u64 mm_txnid
// The page size is stored in mm_dbs[0].md_pad (the free-list table's pad field).
constexpr size_t kPageHeader = 16;
constexpr size_t kMetaBytes = 136;
constexpr uint16_t kPageMeta = 0x08;
constexpr uint32_t kMagic = 0xBEEFC0DE;
constexpr uint32_t kDataVersion = 1;
constexpr uint64_t kNoPage = ~uint64_t(0);  // md_root of an empty table

uint64_t le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t(p[i]) << (8 * i);
    return v;
}

struct Meta {
    uint32_t page_size;
    uint64_t roots[2];
    uint16_t depths[2];  // md_depth: levels of each tree (0 when empty)
    uint64_t last_page;
    uint64_t txnid;
};

// Parses the meta page at `page` (kPageHeader + kMetaBytes bytes); empty string or why not.
std::string parse_meta(const uint8_t *page, int index, Meta *m) {
    if (!(le(page + 10, 2) & kPageMeta)) return "is not flagged as a meta page";
    const uint8_t *p = page + kPageHeader;
    if (le(p, 4) != kMagic) return "has no LMDB magic";
    if (le(p + 4, 4) != kDataVersion) return "has LMDB data version " + std::to_string(le(p + 4, 4));
    m->page_size = uint32_t(le(p + 24, 4));
    m->roots[0] = le(p + 24 + 40, 8);
    m->roots[1] = le(p + 24 + 48 + 40, 8);
    m->depths[0] = uint16_t(le(p + 24 + 6, 2));
    m->depths[1] = uint16_t(le(p + 24 + 48 + 6, 2));
    m->last_page = le(p + 120, 8);
    m->txnid = le(p + 128, 8);
    if (m->page_size < 512 || m->page_size > 65536 || (m->page_size & (m->page_size - 1)))
        return "names an impossible page size " + std::to_string(m->page_size);
    if (m->last_page < 1) return "names an impossible last page " + std::to_string(m->last_page);
    // LMDB writes transaction t's meta into page t % 2 (both hold 0 in a new file) and
    // takes the page with the larger id as the newest; the next write runs as id + 1. An id
    // on the wrong page, or one so large that the next ones wrap, is damage that LMDB
    // follows into its free list (a page handed out twice: an assertion, abort).
    if (m->txnid != 0 && m->txnid % 2 != uint64_t(index))
        return "holds transaction id " + std::to_string(m->txnid) + ", which LMDB never writes to this page";
    if (m->txnid > (uint64_t(1) << 62)) return "holds an impossible transaction id " + std::to_string(m->txnid);
    // Duplicate-key flags (DUPSORT, DUPFIXED, INTEGERDUP, REVERSEDUP) on the free list or
    // the main table make LMDB expect sub-cursors it never set up (an assertion, abort).
    for (int i = 0; i < 2; ++i)
        if (le(p + 24 + 48 * i + 4, 2) & 0x74)
            return "records " + std::string(i ? "the main table" : "the free list") + " with duplicate keys";
    for (const uint64_t r : m->roots)
        if (r != kNoPage && (r < 2 || r > m->last_page))
            return "names a table root (page " + std::to_string(r) + ") outside its pages";
    return {};
}

// Walks the trees the newest meta page names (the free list, the main table and the
// tables recorded in it) with pread, so that no page LMDB will follow can make it read
// past the end of the mapped file or of its own page: every page number lies inside the
// file and is used once, every node lies inside its page, every value inside its page or
// its overflow pages, and free-list records name only pages of the file. Page layout
// (mdb.c, LP64): u64 pgno, u16 pad, u16 flags, u16 lower, u16 upper (u32 page count on
// overflow pages), then u16 node offsets; a node is u16 lo, u16 hi, u16 flags, u16 key
// size, key, value (leaf: size lo|hi<<16; branch: child page lo|hi<<16|flags<<32).
class TreeWalk {
public:
    TreeWalk(int fd, uint32_t page_size, uint64_t last_page)
        : fd_(fd), ps_(page_size), last_(last_page), used_(last_page + 1, false) {}

    // Empty when every tree is sound, else why not.
    std::string run(const uint64_t roots[2], const uint16_t depths[2]) {
        if (!tree(roots[0], depths[0], kFree) || !tree(roots[1], depths[1], kMain)) return why_;
        // A page both free and in use would be handed out while still referenced (LMDB
        // asserts on it in mdb_page_touch); a page freed twice likewise.
        for (const uint64_t pg : free_)
            if (used_[pg]) return "page " + std::to_string(pg) + " is both free and in use";
            else used_[pg] = true;
        return {};
    }

private:
    static constexpr uint16_t kBranch = 0x01, kLeaf = 0x02, kOverflow = 0x04, kPageKinds = 0x7f;
    static constexpr uint16_t kBigData = 0x01, kSubData = 0x02;
    static constexpr int kMaxDepth = 32;  // LMDB's cursor stack
    enum Kind { kFree, kMain, kSub };

    bool fail(const std::string &why) {
        if (why_.empty()) why_ = why;
        return false;
    }
    bool read(uint64_t pgno, uint64_t pages, std::vector<uint8_t> *buf) {
        buf->resize(pages * ps_);
        const ssize_t got = pread(fd_, buf->data(), buf->size(), off_t(pgno * ps_));
        if (got != ssize_t(buf->size())) return fail("page " + std::to_string(pgno) + " cannot be read");
        if (le(buf->data(), 8) != pgno) return fail("page " + std::to_string(pgno) + " is labelled as another page");
        return true;
    }
    // Marks pages [pgno, pgno + n) as used by a tree.
    bool claim(uint64_t pgno, uint64_t n) {
        if (pgno < 2 || n == 0 || pgno > last_ || n > last_ - pgno + 1)
            return fail("a tree names pages " + std::to_string(pgno) + "+" + std::to_string(n) + " outside the file");
        for (uint64_t i = pgno; i < pgno + n; ++i) {
            if (used_[i]) return fail("page " + std::to_string(i) + " is used twice");
            used_[i] = true;
        }
        return true;
    }
    // A tree and the depth its record states (LMDB sizes its page spilling by that depth).
    bool tree(uint64_t root, uint64_t depth, Kind kind) {
        if (root == kNoPage) return depth == 0 || fail("an empty table is recorded with depth " + std::to_string(depth));
        int leaf_depth = -1;
        if (!page(root, 0, kind, &leaf_depth)) return false;
        if (depth != uint64_t(leaf_depth) + 1)
            return fail("the tree at page " + std::to_string(root) + " has " + std::to_string(leaf_depth + 1) +
                        " levels but is recorded with " + std::to_string(depth));
        return true;
    }
    // A free-list record: a u64 count, then that many page numbers of this file.
    bool free_record(const uint8_t *d, uint64_t n) {
        if (n < 8 || n % 8) return fail("a free-list record has " + std::to_string(n) + " bytes");
        const uint64_t count = le(d, 8);
        if (count > n / 8 - 1) return fail("a free-list record counts more pages than it holds");
        for (uint64_t i = 1; i <= count; ++i) {
            const uint64_t pg = le(d + 8 * i, 8);
            if (pg < 2 || pg > last_) return fail("the free list names page " + std::to_string(pg) + " outside the file");
            free_.push_back(pg);
        }
        return true;
    }
    // LMDB keeps a page's nodes packed from `upper` to the end of the page, each
    // EVEN(8 + key + value part) bytes, with their keys in ascending order (a branch's
    // first key is empty), and its node edits trust both: mdb_node_del shifts the others by
    // the deleted node's size, so a page that lies about it is turned into one whose
    // offsets point anywhere.
    bool packed_and_sorted(const std::vector<uint8_t> &b, uint16_t type, Kind kind, uint64_t upper, uint64_t n,
                           const std::string &at) {
        std::vector<std::pair<uint64_t, uint64_t>> spans;  // offset, size
        const uint8_t *prev = nullptr;
        uint64_t prev_size = 0;
        for (uint64_t i = 0; i < n; ++i) {
            const uint64_t off = le(&b[kPageHeader + 2 * i], 2);
            if (off < upper || off + 8 > ps_) return fail(at + " has a node outside the page");
            const uint8_t *node = &b[off];
            const uint64_t ksize = le(node + 6, 2);
            if (off + 8 + ksize > ps_) return fail(at + " has a key past the end of the page");
            uint64_t size = 8 + ksize;
            if (type == kLeaf) size += (le(node + 4, 2) & kBigData) ? 8 : (le(node, 2) | le(node + 2, 2) << 16);
            spans.push_back({off, size + (size & 1)});
            if (type == kBranch && i == 0) continue;
            const uint8_t *key = node + 8;
            if (prev) {
                int c;
                if (kind == kFree) {
                    c = prev_size == 8 && ksize == 8 ? (le(prev, 8) < le(key, 8) ? -1 : 1) : -1;   // sizes checked later
                    if (prev_size == 8 && ksize == 8 && le(prev, 8) == le(key, 8)) c = 0;
                } else {
                    c = std::memcmp(prev, key, std::min(prev_size, ksize));
                    if (c == 0) c = prev_size < ksize ? -1 : prev_size > ksize ? 1 : 0;
                }
                if (c >= 0) return fail(at + " has its keys out of order");
            }
            prev = key;
            prev_size = ksize;
        }
        std::sort(spans.begin(), spans.end());
        uint64_t at_off = upper;
        for (const auto &[off, size] : spans) {
            if (off != at_off) return fail(at + " has nodes that overlap or leave gaps");
            at_off += size;
        }
        if (at_off != ps_) return fail(at + " has nodes that overlap or leave gaps");
        return true;
    }

    bool page(uint64_t pgno, int depth, Kind kind, int *leaf_depth) {
        if (depth >= kMaxDepth) return fail("a tree is deeper than LMDB can follow");
        if (!claim(pgno, 1)) return false;
        std::vector<uint8_t> b;
        if (!read(pgno, 1, &b)) return false;
        const std::string at = "page " + std::to_string(pgno);
        const uint16_t type = uint16_t(le(&b[10], 2) & kPageKinds);
        if (type != kBranch && type != kLeaf) return fail(at + " is neither a branch nor a leaf");
        const uint64_t lower = le(&b[12], 2), upper = le(&b[14], 2);
        if (lower < kPageHeader + 2 || lower > upper || upper > ps_ || (lower - kPageHeader) % 2)
            return fail(at + " has impossible bounds");
        if (type == kLeaf) {
            if (*leaf_depth >= 0 && *leaf_depth != depth) return fail(at + " is a leaf at another depth");
            *leaf_depth = depth;
        }
        const uint64_t n = (lower - kPageHeader) / 2;
        if (!packed_and_sorted(b, type, kind, upper, n, at)) return false;
        for (uint64_t i = 0; i < n; ++i) {
            const uint64_t off = le(&b[kPageHeader + 2 * i], 2);
            if (off < upper || off + 8 > ps_) return fail(at + " has a node outside the page");
            const uint8_t *node = &b[off];
            const uint64_t flags = le(node + 4, 2), ksize = le(node + 6, 2), key_end = off + 8 + ksize;
            if (key_end > ps_) return fail(at + " has a key past the end of the page");
            if (type == kBranch) {
                if (kind == kFree && ksize != 0 && ksize != 8) return fail(at + " has a free-list key of another size");
                const uint64_t child = le(node, 2) | le(node + 2, 2) << 16 | flags << 32;
                if (!page(child, depth + 1, kind, leaf_depth)) return false;
                continue;
            }
            if (flags & ~uint64_t(kBigData | kSubData)) return fail(at + " has a node with unknown flags");
            if (kind == kFree && ksize != 8) return fail(at + " has a free-list key of another size");
            const uint64_t dsize = le(node, 2) | le(node + 2, 2) << 16;
            const uint8_t *data = node + 8 + ksize;
            std::vector<uint8_t> big;
            if (flags & kBigData) {
                if (key_end + 8 > ps_) return fail(at + " has an overflow reference past the end of the page");
                const uint64_t opg = le(data, 8);
                if (opg < 2 || opg > last_) return fail(at + " names overflow page " + std::to_string(opg) + " outside the file");
                std::vector<uint8_t> head;
                if (!read(opg, 1, &head)) return false;
                const uint64_t pages = le(&head[12], 4);
                if (!(le(&head[10], 2) & kOverflow)) return fail("page " + std::to_string(opg) + " is not an overflow page");
                if (!claim(opg, pages)) return false;
                if (dsize > pages * ps_ - kPageHeader) return fail(at + " has a value longer than its overflow pages");
                if (kind == kFree) {
                    if (!read(opg, pages, &big)) return false;
                    data = big.data() + kPageHeader;
                }
            } else if (key_end + dsize > ps_) {
                return fail(at + " has a value past the end of the page");
            }
            if (kind == kFree && !free_record(data, dsize)) return false;
            if (flags & kSubData) {
                if (kind != kMain || (flags & kBigData) || dsize != 48) return fail(at + " has a bad table record");
                if (le(data + 4, 2) & 0x74) return fail(at + " records a table with duplicate keys");   // DUPSORT etc.
                if (!tree(le(data + 40, 8), le(data + 6, 2), kSub)) return false;
            }
        }
        return true;
    }

    int fd_;
    uint64_t ps_, last_;
    std::vector<bool> used_;
    std::vector<uint64_t> free_;  // pages the free list names
    std::string why_;
};

}  // namespace

Status check_lmdb_data_file(const std::string &path, LmdbMetaInfo *info) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // as LMDB opens it
    if (fd < 0) {
        if (errno == ENOENT) return Status::ok();
        return {Code::kIoError, "cannot open " + path + ": " + strerror(errno)};
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        const int e = errno;
        ::close(fd);
        return {Code::kIoError, "cannot stat " + path + ": " + strerror(e)};
    }
    const uint64_t size = uint64_t(st.st_size);
    if (size == 0) {
        ::close(fd);
        return Status::ok();
    }
    Meta metas[2];
    std::string why[2];
    uint8_t page[kPageHeader + kMetaBytes];
    for (int i = 0; i < 2; ++i) {
        // Page 1 sits one page size (as page 0 says) into the file.
        const uint64_t off = i == 0 ? 0 : metas[0].page_size;
        const ssize_t got = pread(fd, page, sizeof page, off_t(off));
        if (got < 0) {
            const int e = errno;
            ::close(fd);
            return {Code::kIoError, "reading " + path + ": " + strerror(e)};
        }
        why[i] = size_t(got) < sizeof page ? "is cut off (the file is " + std::to_string(size) + " bytes)"
                                           : parse_meta(page, i, &metas[i]);
        if (i == 0 && !why[0].empty()) break;  // no page size: page 1 cannot be found
    }
    // LMDB refuses the file (or worse) unless both meta pages are sane.
    for (int i = 0; i < 2; ++i)
        if (!why[i].empty()) {
            ::close(fd);
            return {Code::kCorrupt, path + ": meta page " + std::to_string(i) + " " + why[i]};
        }
    if (metas[1].page_size != metas[0].page_size) {
        ::close(fd);
        return {Code::kCorrupt, path + ": the meta pages disagree on the page size (" +
                                    std::to_string(metas[0].page_size) + " and " + std::to_string(metas[1].page_size) +
                                    ")"};
    }
    const Meta &m = metas[1].txnid > metas[0].txnid ? metas[1] : metas[0];
    info->page_size = m.page_size;
    info->last_page = m.last_page;
    info->txnid = m.txnid;
    info->file_bytes = size;
    const uint64_t need = (m.last_page + 1) * uint64_t(m.page_size);
    if (m.last_page > (uint64_t(1) << 40) || size < need) {
        ::close(fd);
        return {Code::kCorrupt, path + " is " + std::to_string(size) + " bytes but its newest meta page (txn " +
                                    std::to_string(m.txnid) + ") uses pages up to " + std::to_string(m.last_page) +
                                    " of " + std::to_string(m.page_size) + " bytes (" + std::to_string(need) +
                                    " bytes): the file was cut short"};
    }
    // LMDB also trusts every other page: a node offset or value size pointing past the
    // page reads past the end of the file (SIGBUS) or of the map.
    const std::string bad = TreeWalk(fd, m.page_size, m.last_page).run(m.roots, m.depths);
    ::close(fd);
    if (!bad.empty()) return {Code::kCorrupt, path + " (txn " + std::to_string(m.txnid) + "): " + bad};
    return Status::ok();
}

}  // namespace ds4::kvstore
