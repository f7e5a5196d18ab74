// A pre-flight check of an LMDB data file, run before mdb_env_open maps it. LMDB trusts
// its meta pages: a file cut short of the last page they name is mapped anyway and the
// first access past its end kills the process with SIGBUS. Reading the two meta pages
// with pread first turns that into an error the store can act on.
#pragma once
#include <cstdint>
#include <string>

#include "kvstore/status.h"

namespace ds4::kvstore {

// What the newest valid meta page says (the one LMDB would use).
struct LmdbMetaInfo {
    uint32_t page_size = 0;
    uint64_t last_page = 0;  // highest page number in use
    uint64_t txnid = 0;
    uint64_t file_bytes = 0;
};

// kOk when `path` is absent or empty (LMDB initialises it) or when both meta pages are
// sane and the file holds every page up to the last one the newer meta names; *info is
// filled when the metas were read. kCorrupt, with a message saying what is wrong,
// otherwise; kIoError when the file cannot be read.
Status check_lmdb_data_file(const std::string &path, LmdbMetaInfo *info);

}  // namespace ds4::kvstore
