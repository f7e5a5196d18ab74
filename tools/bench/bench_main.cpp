// ds4-bench: prefill and decode throughput of a model on this machine, the weight bytes a
// decoded token streams, and that figure as achieved bandwidth against the machine's
// read bandwidth measured in the same run.
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/kernels/matmul.h"
#include "engine/model/model.h"
#include "engine/model/session.h"
#include "engine/quant/quants.h"
#include "tools/backend_option.h"
#include "tools/bench/int8_work.h"
#include "tools/bench/membw.h"
#include "ds4_version.h"
#include "tools/bench_kvstore/raw_disk.h"
#include "io/aligned_buffer.h"
#include "bridge/expert_store_link.h"

namespace {

const char *kUsage =
    "usage: ds4-bench -m MODEL.gguf [--prompt-tokens N] [--prefill-chunk N] [--prefill-rows N] [--gen-tokens N] [--threads N] [--backend auto|cpu|cuda] [--warm] [--json]\n"
    "                 [--ssd-streaming [--expert-cache-bytes N | --expert-cache-experts N] [--cold]\n"
    "                  [--expert-store DIR] [--no-prefetch] [--raw-bytes N] [--hit-curve] [--prompt-seed S]]\n"
    "  --prompt-tokens N   tokens prefilled before decoding (default 128)\n"
    "  --prefill-chunk N   tokens per prefill step, the session's rings made to hold them\n"
    "                      (default: steps of 1024 with rings of 256 on the CPU, 2048 on a GPU)\n"
    "  --prefill-rows N    tokens per prefill step, the rings the backend's (on the CPU the\n"
    "                      attention runs in 256-row pieces; a GPU takes at most 2048)\n"
    "  --gen-tokens N      tokens decoded greedily after the prompt (default 32)\n"
    "  --threads N         engine threads (default: all cores)\n"
    "  --backend B         auto (default: CUDA when a usable GPU is present), cpu or cuda;\n"
    "                      the bandwidth measured is the host's (achieved GB/s is the backend's);\n"
    "                      with cuda also the device's copy rate, and achieved as a share of it\n"
    "  --warm              prefill another prompt of the same length first, untimed, on the\n"
    "                      same executor: the timed prefill then finds its scratch memory\n"
    "                      already touched, as a daemon's prefills do after its first\n"
    "                      (without it the first prefill's page faults are counted)\n"
    "  --json              one JSON object instead of text\n"
    "  --ssd-streaming     routed experts read from disk (io_uring, O_DIRECT) into a bounded\n"
    "                      cache instead of used from the mapping; reports hit rate, bytes\n"
    "                      read, read GB/s and the disk's raw O_DIRECT read GB/s measured on\n"
    "                      the model file in the same run (--raw-bytes, default 1 GiB)\n"
    "  --expert-cache-bytes N | --expert-cache-experts N   the cache budget (default 4 GiB);\n"
    "                      with --backend cuda it is VRAM, filled from a RAM tier of 2 GiB\n"
    "  --cold              do not prewarm the cache from the store's hot set\n"
    "  --expert-store DIR  the expert store (re-laid-out experts + use counts) to use\n"
    "  --no-prefetch       no prediction of the next layer's experts\n"
    "  --hit-curve         print the experts read on demand by each decoded token (the first,\n"
    "                      untimed one included), the tokens until the cache is steady: the\n"
    "                      first token from which the mean misses of 8 tokens are within 20%\n"
    "                      (+1) of the last half's mean, and the misses of the first tokens\n"
    "  --prompt-seed S     seed of the random prompt (default 1): a restart measured with\n"
    "                      another prompt than the run that saved the use counts\n"
    "  --page-out-experts  (without --ssd-streaming) after the prewarm, ask the kernel to\n"
    "                      reclaim the routed experts' pages of the mapping (MADV_PAGEOUT), so\n"
    "                      the run starts with them on disk like a cold streaming cache\n"
    "Reports prefill tok/s, decode tok/s, weight bytes streamed per decoded token, the\n"
    "achieved GB/s and the machine's read bandwidth measured in the same run. On the CPU\n"
    "backend with Q8_0 weights also the prefill's share of the int8 multiply-add peak: the\n"
    "layers' Q8_0 multiply-adds a token (routed experts as many times as a token uses one;\n"
    "no embedding, no output head) at the prefill's rate, against the peak of the Q8_0\n"
    "tile's int8 instruction measured in the same run: one thread's best (its CPU clock,\n"
    "before and after the prefill) times --threads.\n";

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

int main(int argc, char **argv) {
    if (ds4_wants_version(argc, argv)) {
        ds4_print_version("ds4-bench");
        return 0;
    }
    std::string model;
    int prompt = 128, gen = 32, threads = 0, chunk = 0, rows = 0;
    bool json = false;
    ds4::BackendKind backend = ds4::BackendKind::Auto;
    ds4::ExpertStreamingOptions so;
    std::string store_dir;
    uint64_t raw_bytes = uint64_t(1) << 30;
    bool page_out = false, hit_curve = false, warm = false, raw_given = false;
    uint64_t prompt_seed = 1;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto val = [&]() -> const char * {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "ds4-bench: %s needs a value\n%s", a.c_str(), kUsage);
                std::exit(2);
            }
            return argv[++i];
        };
        // A whole decimal number in [lo, hi], or a clear error (atoi read "abc" as 0, strtoull
        // "-1" as 2^64-1).
        auto count64 = [&](uint64_t lo = 0, uint64_t hi = UINT64_MAX) -> uint64_t {
            const char *v = val();
            char *end = nullptr;
            errno = 0;
            const unsigned long long n = std::strtoull(v, &end, 10);
            if (end == v || *end || errno || *v == '-' || *v == '+' || n < lo || n > hi) {
                if (hi == UINT64_MAX) std::fprintf(stderr, "ds4-bench: %s needs a whole number, not '%s'\n", a.c_str(), v);
                else
                    std::fprintf(stderr, "ds4-bench: %s needs a whole number from %llu to %llu, not '%s'\n", a.c_str(),
                                 (unsigned long long)lo, (unsigned long long)hi, v);
                std::exit(2);
            }
            return uint64_t(n);
        };
        auto count = [&](int lo, int hi) { return int(count64(uint64_t(lo), uint64_t(hi))); };
        if (a == "-m" || a == "--model") model = val();
        else if (a == "--prompt-tokens") prompt = count(1, 1 << 24);
        else if (a == "--gen-tokens") gen = count(1, 1 << 24);
        else if (a == "--prefill-chunk") chunk = count(1, 1 << 24);
        else if (a == "--prefill-rows") rows = count(1, 1 << 24);
        else if (a == "--threads") threads = count(0, 4096);
        else if (a == "--json") json = true;
        else if (a == "--warm") warm = true;
        else if (a == "--ssd-streaming") so.enabled = true;
        else if (a == "--expert-cache-bytes") so.cache_bytes = count64();
        else if (a == "--expert-cache-experts") so.cache_experts = count64();
        else if (a == "--cold") so.cold = true;
        else if (a == "--no-prefetch") so.prefetch = false;
        else if (a == "--page-out-experts") page_out = true;
        else if (a == "--hit-curve") hit_curve = true;
        else if (a == "--prompt-seed") prompt_seed = count64();
        else if (a == "--expert-store") store_dir = val();
        else if (a == "--raw-bytes") raw_bytes = count64(), raw_given = true;
        else if (a == "--backend") backend = ds4::tools::backend_arg("ds4-bench", val());
        else if (a == "-h" || a == "--help") {
            std::fputs(kUsage, stdout);
            return 0;
        } else {
            std::fprintf(stderr, "ds4-bench: unknown argument %s\n%s", a.c_str(), kUsage);
            return 2;
        }
    }
    if (model.empty() && std::getenv("DS4_MODEL")) model = std::getenv("DS4_MODEL");  // --model default
    if (model.empty()) {   // the counts were checked as they were read
        std::fputs(kUsage, stderr);
        return 2;
    }
    if (!so.enabled && (so.cache_bytes || so.cache_experts || so.cold || !so.prefetch || !store_dir.empty() ||
                        hit_curve || raw_given)) {
        std::fprintf(stderr, "ds4-bench: the expert cache options (--expert-cache-bytes, --expert-cache-experts, --cold,\n"
                             "--expert-store, --no-prefetch, --hit-curve, --raw-bytes) need --ssd-streaming\n");
        return 2;
    }
    if (so.enabled && page_out) {
        std::fprintf(stderr, "ds4-bench: --page-out-experts is for the mapped path, not --ssd-streaming\n");
        return 2;
    }
    if (so.enabled && warm) {
        std::fprintf(stderr, "ds4-bench: --warm is for the mapped path (a warm prefill would fill the expert cache)\n");
        return 2;
    }
    if (so.cache_bytes && so.cache_experts) {
        std::fprintf(stderr, "ds4-bench: give --expert-cache-bytes or --expert-cache-experts, not both\n");
        return 2;
    }
    if (!store_dir.empty())
        so.open_store = [store_dir, model](uint64_t fp) { return ds4::bridge_impl::open_expert_store_link(store_dir, fp, model); };
    try {
        const double t_open = now();
        ds4::ModelOptions mo = ds4::tools::model_options(threads, backend, json);
        mo.streaming = so;
        auto m = ds4::Model::open(model, mo);
        if (!json) ds4::tools::say_backend("ds4-bench", *m);
        m->prewarm();
        const double open_s = now() - t_open;
        const ds4::ExpertSourceStats e_warm = m->experts().stats();  // what the hot-set prewarm loaded
        if (page_out) {
            uint64_t paged = 0;
            for (const auto &t : m->reader().tensors()) {
                if (!t.data || t.name.find("_exps.") == std::string::npos) continue;
                const uintptr_t a = reinterpret_cast<uintptr_t>(t.data) & ~uintptr_t(4095);
                const size_t len = ds4::io::round_up(reinterpret_cast<uintptr_t>(t.data) + t.nbytes - a, 4096);
                if (madvise(reinterpret_cast<void *>(a), len, MADV_PAGEOUT) == 0) paged += len;
            }
            if (!json) std::printf("paged out        %.2f GB of routed experts\n", paged / 1e9);
        }
        const ds4::ModelConfig &c = m->config();
        double bw = 0;
        int n_threads = 0;
        {
            ds4::ThreadPool pool(threads);   // the same thread count the session's executor gets
            bw = ds4::measure_read_bandwidth(pool);
            n_threads = pool.size();
        }
        // The share of the int8 multiply-add peak a CPU prefill reaches: the layers' Q8_0
        // products a token against the peak of the tile's instruction, one thread's best
        // (by its CPU clock, best of 10, three times: after the model opens, just before the
        // timed prefill and after the decode) times the thread count.
        // On a shared or virtual machine that is the most the cores can do, not what they
        // did during the prefill: the share errs low, never high.
        const bool on_cpu = m->backend().name() == "cpu";
        const double q8_macs = on_cpu ? ds4::bench::q8_0_macs_per_token(m->reader().tensors(), m->config()) : 0;
        double peak = 0;
        const auto sample_peak = [&] {
            if (q8_macs > 0)
                peak = std::max(peak, n_threads * ds4::bench::int8_peak(10, ds4::bench::PeakClock::ThreadCpu));
        };
        sample_peak();
        const double dev_bw = m->backend().device_copy_bytes_per_s();   // 0 without device memory
        // The disk's raw O_DIRECT read bandwidth on the model file itself (16 requests of
        // 4 MiB in flight, into memory), the ceiling for streamed expert reads.
        double raw_gbs = 0;
        if (so.enabled && raw_bytes) {
            raw_bytes = ds4::io::round_up(raw_bytes, ds4::io::kIoAlign);
            ds4::io::AlignedBuffer rb(raw_bytes);
            const double mib = ds4::bench::raw_read_queued_mibs(model, rb.data(), raw_bytes, 16);
            raw_gbs = mib > 0 ? mib * (1 << 20) / 1e9 : 0;
        }
        std::vector<int32_t> toks(prompt);
        uint64_t r = 88172645463325252ull ^ ((prompt_seed - 1) * 0x9e3779b97f4a7c15ull);
        for (auto &t : toks) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            t = (int32_t)(r % (uint64_t)c.n_vocab);
        }
        // The timed session runs on its own executor, or with --warm on one that an untimed
        // prefill of another prompt (the next seed's) has already run.
        std::unique_ptr<ds4::Executor> ex = m->make_executor();
        if (warm) {
            std::vector<int32_t> other(prompt);
            for (auto &t : other) {
                r ^= r << 13, r ^= r >> 7, r ^= r << 17;
                t = (int32_t)(r % (uint64_t)c.n_vocab);
            }
            ds4::Session w(*m, *ex, prompt + gen + 1, chunk);
            if (rows) w.set_prefill_cap(std::min(rows, prompt + gen + 1));
            w.sync(other);
        }
        sample_peak();
        ds4::Session s(*m, *ex, prompt + gen + 1, chunk);
        if (rows) s.set_prefill_cap(std::min(rows, prompt + gen + 1));
        const double t0 = now();
        s.sync(toks);
        const double prefill_s = now() - t0;
        const ds4::ExpertSourceStats e_pre = m->experts().stats();
        // One warm-up decode step, then the timed ones. The hit curve starts at the warm-up
        // step: a cold cache misses most there, which is what a restart's prewarm saves.
        std::vector<uint64_t> miss_curve;  // demand misses of each decoded token (--hit-curve)
        {
            const uint64_t before = m->experts().stats().misses;
            s.eval(s.argmax());
            if (hit_curve) miss_curve.push_back(m->experts().stats().misses - before);
        }
        const ds4::ExpertSourceStats e0 = m->experts().stats();
        const uint64_t b0 = s.executor().stats().weight_bytes;
        const double t1 = now();
        for (int i = 1; i < gen; ++i) {
            const uint64_t before = hit_curve ? m->experts().stats().misses : 0;
            s.eval(s.argmax());
            if (hit_curve) miss_curve.push_back(m->experts().stats().misses - before);
        }
        const double decode_s = now() - t1;
        sample_peak();
        const double int8_rate = q8_macs * prompt / prefill_s, int8_share = peak > 0 ? int8_rate / peak : 0;
        const int n_dec = gen - 1;
        const double bytes_per_tok = n_dec > 0 ? (double)(s.executor().stats().weight_bytes - b0) / n_dec : 0;
        const double dec_tps = n_dec > 0 ? n_dec / decode_s : 0;
        const double achieved = bytes_per_tok * dec_tps;
        const ds4::ExpertSourceStats e1 = m->experts().stats();
        const double acq = double(e1.acquired - e0.acquired), miss = double(e1.misses - e0.misses);
        const double hit = acq > 0 ? 1 - miss / acq : 1;
        const double rd_bytes = double(e1.bytes_read - e0.bytes_read);
        const double rd_ns = double((e1.demand_read_ns - e0.demand_read_ns) + (e1.prefetch_read_ns - e0.prefetch_read_ns));
        const double wait_ns = double(e1.wait_ns - e0.wait_ns);
        const double busy_ns = double(e1.io_busy_ns - e0.io_busy_ns);
        const double read_gbs = busy_ns > 0 ? rd_bytes / busy_ns : 0;  // while reads were in flight
        const double hidden = busy_ns > 0 ? std::max(0.0, 1 - wait_ns / busy_ns) : 0;
        (void)rd_ns;
        if (json) {
            std::printf("{\"model\":\"%s\",\"backend\":\"%s\",\"threads\":%d,\"open_s\":%.3f,\"prompt_tokens\":%d,\"gen_tokens\":%d,"
                        "\"prefill_tok_s\":%.3f,\"decode_tok_s\":%.3f,\"bytes_per_token\":%.0f,\"achieved_gb_s\":%.3f,"
                        "\"machine_read_gb_s\":%.3f,\"fraction_of_bandwidth\":%.4f,\"ssd_streaming\":%s,\"hit_rate\":%.4f,"
                        "\"expert_bytes_per_token\":%.0f,\"read_gb_s\":%.3f,\"read_hidden\":%.4f,\"disk_raw_gb_s\":%.3f,"
                        "\"cache_bytes\":%llu,\"host_tier_bytes\":%llu,\"host_read_bytes_per_token\":%.0f,"
                        "\"device_copy_gb_s\":%.3f,\"fraction_of_device_copy\":%.4f,"
                        "\"q8_0_macs_per_token\":%.0f,\"int8_peak_g_s\":%.3f,\"prefill_int8_share\":%.4f}\n",
                        model.c_str(), m->backend().name().c_str(), n_threads, open_s, prompt, gen, prompt / prefill_s, dec_tps, bytes_per_tok,
                        achieved / 1e9, bw / 1e9, achieved / bw, so.enabled ? "true" : "false", hit, n_dec > 0 ? rd_bytes / n_dec : 0.0,
                        read_gbs, hidden, raw_gbs, (unsigned long long)e1.capacity_bytes, (unsigned long long)e1.host_capacity_bytes,
                        n_dec > 0 ? double(e1.host_bytes_read - e0.host_bytes_read) / n_dec : 0.0, dev_bw / 1e9,
                        dev_bw > 0 ? achieved / dev_bw : 0.0, q8_macs, peak / 1e9, int8_share);
        } else {
            std::printf("model            %s\n                 %s\n", model.c_str(), c.summary().c_str());
            const std::string bname = m->backend().name();
            // the CPU's int8 instruction for Q8_0 products (quant::q8_0_tile_isa)
            if (bname == "cpu")
                std::printf("backend          cpu (Q8_0 int8: %s)\n", ds4::quant::q8_0_tile_isa());
            else
                std::printf("backend          %s\n", bname.c_str());
            std::printf("threads          %d\n", n_threads);
            std::printf("open + prewarm   %.2f s\n", open_s);
            std::printf("prefill          %d tokens in %.3f s = %.2f tok/s (steps of %d, attention in pieces of %d)\n", prompt,
                        prefill_s, prompt / prefill_s, s.prefill_cap(), std::min(s.prefill_cap(), s.ring_rows()));
            if (peak > 0)
                std::printf("prefill int8     %.1f M Q8_0 multiply-adds a token: %.1f G/s = %.1f%% of the int8 peak\n"
                            "                 (%.1f G/s: %s, one thread's best times %d, measured now)\n",
                            q8_macs / 1e6, int8_rate / 1e9, 100 * int8_share,
                            peak / 1e9, ds4::bench::int8_peak_instruction(), n_threads);
            std::printf("decode           %d tokens in %.3f s = %.2f tok/s\n", n_dec, decode_s, dec_tps);
            std::printf("weights/token    %.3f GB\n", bytes_per_tok / 1e9);
            std::printf("achieved         %.2f GB/s\n", achieved / 1e9);
            std::printf("machine read bw  %.2f GB/s (measured now)\n", bw / 1e9);
            std::printf("fraction         %.1f%% of measured bandwidth\n", 100 * achieved / bw);
            if (dev_bw > 0) {
                std::printf("device copy bw   %.2f GB/s (device to device, bytes read + written, measured now)\n", dev_bw / 1e9);
                std::printf("device fraction  %.1f%% of the device copy rate\n", 100 * achieved / dev_bw);
            }
        }
        if (so.enabled && !json) {
            std::printf("expert cache     %llu experts, %.2f GB (%llu resident after the run)\n", (unsigned long long)e1.capacity,
                        e1.capacity_bytes / 1e9, (unsigned long long)e1.resident);
            if (e_warm.resident)
                std::printf("prewarm          %llu experts of the stored hot set, %.2f GB read in %.2f s (%.2f GB/s)\n",
                            (unsigned long long)e_warm.resident, e_warm.bytes_read / 1e9, e_warm.demand_read_ns / 1e9,
                            e_warm.demand_read_ns ? e_warm.bytes_read / double(e_warm.demand_read_ns) : 0.0);
            std::printf("prefill experts  %llu used, %llu read (%.2f GB)\n", (unsigned long long)(e_pre.acquired),
                        (unsigned long long)(e_pre.misses + e_pre.prefetched), (e_pre.bytes_read - e_warm.bytes_read) / 1e9);
            const double pre_used = double(e1.prefetch_used - e0.prefetch_used), late = double(e1.late - e0.late);
            std::printf("decode hit rate  %.1f%% not read on demand (%.0f of %.0f experts were); %.1f%% already cached\n"
                        "                 before the token (not prefetched for it), %.0f waited on their prefetch\n",
                        100 * hit, miss, acq, acq > 0 ? 100 * (acq - miss - pre_used - late) / acq : 0.0, late);
            std::printf("prefetch         %llu read, %llu used; %.1f%% of read time hidden from the step\n",
                        (unsigned long long)(e1.prefetched - e0.prefetched), (unsigned long long)(e1.prefetch_used - e0.prefetch_used),
                        100 * hidden);
            std::printf("expert reads     %.3f GB/token, %.2f GB/s while reading, %.2f GB/s over the decode\n",
                        n_dec > 0 ? rd_bytes / n_dec / 1e9 : 0.0, read_gbs, rd_bytes / decode_s / 1e9);
            if (e1.host_capacity_bytes)   // the VRAM tier over a RAM tier (CUDA): the reads above are uploads
                std::printf("RAM tier         %.2f GB; %.3f GB/token read from disk over the decode (%llu experts)\n",
                            e1.host_capacity_bytes / 1e9, n_dec > 0 ? double(e1.host_bytes_read - e0.host_bytes_read) / n_dec / 1e9 : 0.0,
                            (unsigned long long)(e1.host_misses - e0.host_misses));
            std::printf("disk raw read    %.2f GB/s (O_DIRECT, 16 x 4 MiB in flight, measured now)\n", raw_gbs);
            std::printf("store            %llu records read, %llu failed their checksum\n", (unsigned long long)e1.store_reads,
                        (unsigned long long)e1.store_corrupt);
            if (hit_curve) {
                std::printf("misses/token    ");
                for (uint64_t x : miss_curve) std::printf(" %llu", (unsigned long long)x);
                std::printf("  (of %d experts a token)\n", c.n_layer * c.n_expert_used);
                // Steady: the mean of the last half; reached at the first token from which a
                // window of 8 tokens is within 20% (+1 expert) of it.
                const size_t n = miss_curve.size(), w = std::min<size_t>(8, n);
                double steady = 0;
                for (size_t i = n / 2; i < n; ++i) steady += double(miss_curve[i]);
                steady = n - n / 2 ? steady / double(n - n / 2) : 0;
                size_t reached = n;
                for (size_t i = 0; i + w <= n && reached == n; ++i) {
                    double m = 0;
                    for (size_t j = i; j < i + w; ++j) m += double(miss_curve[j]);
                    if (m / double(w) <= steady * 1.2 + 1) reached = i;
                }
                std::printf("steady           %.1f misses/token (mean of the last half), reached after %zu decoded tokens\n",
                            steady, reached);
                uint64_t first = 0;
                for (size_t i = 0; i < std::min<size_t>(16, n); ++i) first += miss_curve[i];
                std::printf("first tokens     %llu misses in the prefill, %llu in the first %zu decoded tokens\n",
                            (unsigned long long)e_pre.misses, (unsigned long long)first, std::min<size_t>(16, n));
            }
        }
    } catch (const std::exception &e) {
        std::fprintf(stderr, "ds4-bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
