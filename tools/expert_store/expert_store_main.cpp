// ds4-expert-store: lists and compacts the expert store of SSD expert streaming
// (kvstore/expert_store.h; ds4d keeps it in STATE_DIR/experts). Compaction drops the models
// whose GGUF is gone and rewrites each data file without the holes that replaced or corrupt
// records leave; it refuses while a ds4d (or any model) has the store open.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ds4_version.h"
#include "kvstore/expert_store.h"

namespace {

const char *kUsage =
    "usage: ds4-expert-store [--state-dir DIR | --dir EXPERTS_DIR] list\n"
    "       ds4-expert-store [--state-dir DIR | --dir EXPERTS_DIR] compact [--keep FINGERPRINT]... [--drop-unknown]\n"
    "  --state-dir DIR    ds4d's state directory: the store is DIR/experts (default: ds4d's,\n"
    "                     $XDG_STATE_HOME/ds4 or ~/.local/state/ds4)\n"
    "  --dir EXPERTS_DIR  the expert store itself (ds4-bench --expert-store)\n"
    "  list               each model: fingerprint, records and their bytes, the data file's\n"
    "                     bytes (the difference is holes), experts with use counts, the GGUF\n"
    "                     the experts came from and whether it is still there\n"
    "  compact            drops models whose GGUF is gone (missing, or another size), rewrites\n"
    "                     each kept model's data file without holes (every record checked;\n"
    "                     corrupt ones dropped, read from the GGUF again when next used), keeps\n"
    "                     use counts; removes data files no model refers to and damaged indexes\n"
    "                     moved aside. Refused while a model has the store open (stop ds4d).\n"
    "  --keep FP          keep this model (hex fingerprint, as list prints it) whatever its GGUF\n"
    "  --drop-unknown     also drop models whose GGUF was never recorded (older stores)\n";

// ds4d's default state directory (daemon/options.cpp resolve_state_dir), without linking ds4d.
std::string default_state_dir() {
    const char *x = std::getenv("XDG_STATE_HOME");
    if (x && *x == '/') return std::string(x) + "/ds4";
    const char *h = std::getenv("HOME");
    if (h && *h == '/') return std::string(h) + "/.local/state/ds4";
    return {};
}

double mb(uint64_t b) { return double(b) / 1e6; }

}  // namespace

int main(int argc, char **argv) {
    if (ds4_wants_version(argc, argv)) {
        ds4_print_version("ds4-expert-store");
        return 0;
    }
    std::string dir, cmd;
    ds4::kvstore::ExpertStoreCompaction opt;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "ds4-expert-store: %s needs a value\n%s", a.c_str(), kUsage);
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "-h" || a == "--help") {
            std::fputs(kUsage, stdout);
            return 0;
        } else if (a == "--state-dir") {
            dir = val() + "/experts";
        } else if (a == "--dir") {
            dir = val();
        } else if (a == "--keep") {
            const std::string v = val();
            char *end = nullptr;
            const unsigned long long fp = std::strtoull(v.c_str(), &end, 16);
            if (v.empty() || *end) {
                std::fprintf(stderr, "ds4-expert-store: --keep %s is not a hexadecimal fingerprint\n", v.c_str());
                return 2;
            }
            opt.keep.push_back(fp);
        } else if (a == "--drop-unknown") {
            opt.drop_unknown = true;
        } else if ((a == "list" || a == "compact") && cmd.empty()) {
            cmd = a;
        } else {
            std::fprintf(stderr, "ds4-expert-store: unknown argument %s\n%s", a.c_str(), kUsage);
            return 2;
        }
    }
    if (cmd.empty() || (cmd == "list" && (opt.drop_unknown || !opt.keep.empty()))) {
        std::fputs(kUsage, stderr);
        return 2;
    }
    if (dir.empty()) {
        const std::string s = default_state_dir();
        if (s.empty()) {
            std::fprintf(stderr, "ds4-expert-store: no --state-dir or --dir, and neither XDG_STATE_HOME nor HOME is set\n");
            return 2;
        }
        dir = s + "/experts";
    }
    if (cmd == "list") {
        std::vector<ds4::kvstore::ExpertStoreModel> models;
        const ds4::kvstore::Status st = ds4::kvstore::ExpertStore::list(dir, &models);
        if (!st) {
            std::fprintf(stderr, "ds4-expert-store: %s\n", st.to_string().c_str());
            return 1;
        }
        std::printf("expert store %s: %zu models\n", dir.c_str(), models.size());
        for (const auto &m : models)
            std::printf("%016llx  %llu records, %.1f MB in records, %.1f MB data file (%.1f MB holes), %llu experts with "
                        "use counts; GGUF %s%s\n",
                        (unsigned long long)m.fingerprint, (unsigned long long)m.records, mb(m.record_bytes),
                        mb(m.file_bytes), mb(m.file_bytes > m.record_bytes ? m.file_bytes - m.record_bytes : 0),
                        (unsigned long long)m.used_experts, m.source.empty() ? "(not recorded)" : m.source.c_str(),
                        m.source.empty() ? "" : m.source_present ? " (present)" : " (gone)");
        return 0;
    }
    ds4::kvstore::ExpertStoreCompactReport r;
    const ds4::kvstore::Status st = ds4::kvstore::ExpertStore::compact(dir, opt, &r);
    if (!st) {
        std::fprintf(stderr, "ds4-expert-store: %s\n", st.to_string().c_str());
        return 1;
    }
    std::printf("compacted %s: %llu models kept (%llu records, %llu corrupt dropped), %llu removed, %llu files removed; "
                "data %.1f MB -> %.1f MB\n",
                dir.c_str(), (unsigned long long)r.models_kept, (unsigned long long)r.records_kept,
                (unsigned long long)r.records_corrupt, (unsigned long long)r.models_removed,
                (unsigned long long)r.files_removed, mb(r.bytes_before), mb(r.bytes_after));
    return 0;
}
