#include "kvstore/lmdb_check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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
    uint64_t last_page;
    uint64_t txnid;
};

// Parses the meta page at `page` (kPageHeader + kMetaBytes bytes); empty string or why not.
std::string parse_meta(const uint8_t *page, Meta *m) {
    if (!(le(page + 10, 2) & kPageMeta)) return "is not flagged as a meta page";
    const uint8_t *p = page + kPageHeader;
    if (le(p, 4) != kMagic) return "has no LMDB magic";
    if (le(p + 4, 4) != kDataVersion) return "has LMDB data version " + std::to_string(le(p + 4, 4));
    m->page_size = uint32_t(le(p + 24, 4));
    m->roots[0] = le(p + 24 + 40, 8);
    m->roots[1] = le(p + 24 + 48 + 40, 8);
    m->last_page = le(p + 120, 8);
    m->txnid = le(p + 128, 8);
    if (m->page_size < 512 || m->page_size > 65536 || (m->page_size & (m->page_size - 1)))
        return "names an impossible page size " + std::to_string(m->page_size);
    if (m->last_page < 1) return "names an impossible last page " + std::to_string(m->last_page);
    for (const uint64_t r : m->roots)
        if (r != kNoPage && (r < 2 || r > m->last_page))
            return "names a table root (page " + std::to_string(r) + ") outside its pages";
    return {};
}

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
                                           : parse_meta(page, &metas[i]);
        if (i == 0 && !why[0].empty()) break;  // no page size: page 1 cannot be found
    }
    ::close(fd);
    // LMDB refuses the file (or worse) unless both meta pages are sane.
    for (int i = 0; i < 2; ++i)
        if (!why[i].empty()) return {Code::kCorrupt, path + ": meta page " + std::to_string(i) + " " + why[i]};
    if (metas[1].page_size != metas[0].page_size)
        return {Code::kCorrupt, path + ": the meta pages disagree on the page size (" +
                                    std::to_string(metas[0].page_size) + " and " + std::to_string(metas[1].page_size) +
                                    ")"};
    const Meta &m = metas[1].txnid > metas[0].txnid ? metas[1] : metas[0];
    info->page_size = m.page_size;
    info->last_page = m.last_page;
    info->txnid = m.txnid;
    info->file_bytes = size;
    const uint64_t need = (m.last_page + 1) * uint64_t(m.page_size);
    if (m.last_page > (uint64_t(1) << 40) || size < need)
        return {Code::kCorrupt, path + " is " + std::to_string(size) + " bytes but its newest meta page (txn " +
                                    std::to_string(m.txnid) + ") uses pages up to " + std::to_string(m.last_page) +
                                    " of " + std::to_string(m.page_size) + " bytes (" + std::to_string(need) +
                                    " bytes): the file was cut short"};
    return Status::ok();
}

}  // namespace ds4::kvstore
