// The --backend option shared by the engine tools: parsing, the progress line while weights
// go to a GPU, and the line that says which backend "auto" chose.
#pragma once
#include <cstdio>
#include <string>

#include "engine/model/model.h"

namespace ds4::tools {

inline constexpr const char *kBackendHelp =
    "  --backend B         auto (default: CUDA when a usable GPU is present), cpu or cuda\n";

// Exits with status 2 and a message for anything but auto|cpu|cuda.
inline BackendKind backend_arg(const char *tool, const std::string &v) {
    BackendKind k;
    if (!parse_backend_kind(v, &k)) {
        std::fprintf(stderr, "%s: --backend must be auto, cpu or cuda (got %s)\n", tool, v.c_str());
        std::exit(2);
    }
    return k;
}

inline ModelOptions model_options(int threads, BackendKind backend, bool quiet = false) {
    ModelOptions o;
    o.n_threads = threads;
    o.backend = backend;
    if (!quiet)
        o.progress = [](uint64_t done, uint64_t total) {
            std::fprintf(stderr, "\rcopying weights to the GPU: %.1f / %.1f GiB", done / 1073741824.0, total / 1073741824.0);
            if (done == total) std::fputc('\n', stderr);
        };
    return o;
}

inline void say_backend(const char *tool, const Model &m) {
    const DeviceInfo d = m.backend().device_info();
    if (m.backend().name() == "cpu")
        std::fprintf(stderr, "%s: backend cpu\n", tool);
    else
        std::fprintf(stderr, "%s: backend %s (%s, %.1f GiB of weights in VRAM, %.1f of %.1f GiB free)\n", tool,
                     m.backend().name().c_str(), d.name.c_str(), d.weight_bytes / 1073741824.0, d.free / 1073741824.0,
                     d.total / 1073741824.0);
}

}  // namespace ds4::tools
