// ds4-bench-daemon: what the daemon adds on top of the engine. Starts a ds4d on a private
// socket (or uses a running one), then measures the same work twice, once through the
// socket with libds4client and once in this process through the bridge:
//   - request round trip: a short Tokenize request vs the tokenizer call;
//   - per-token streaming cost: a greedy generation of N tokens vs the same argmax/eval
//     loop in process; the difference per token is what the daemon costs a stream. As the
//     engine's speed moves between runs by more than that difference on a busy machine,
//     each side's time outside its forward steps (ds4d reports its steps' time in Done) is
//     compared too, which takes the engine out;
//   - time to first token for a short prompt.
// Each figure is the median of --reps runs. Both sides use the same thread count. Wall
// times depend on how busy the machine is (every hop is a thread wake-up); the CPU figures
// (all threads of ds4d from /proc, plus this process) show the work itself.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "bridge/ds4.hpp"
#include "client/ds4client.hpp"
#include "tools/bench_daemon/own_daemon.h"
#include "tools/bench_daemon/synthetic_prompt.h"
#include "ds4_version.h"

#ifndef DS4D_DEFAULT_PATH
#define DS4D_DEFAULT_PATH "ds4d"
#endif


namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// CPU time of every thread of pid, in microseconds (/proc/PID/task/*/schedstat: ns on CPU).
double proc_cpu_us(pid_t pid) {
    double total = 0;
    std::error_code ec;
    for (const auto &t : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
        FILE *f = std::fopen((t.path() / "schedstat").c_str(), "r");
        if (!f) continue;
        unsigned long long ns = 0;
        if (std::fscanf(f, "%llu", &ns) == 1) total += double(ns) / 1000.0;
        std::fclose(f);
    }
    return total;
}

double self_cpu_us() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) * 1e6 + double(ts.tv_nsec) / 1e3;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Args {
    std::string model, ds4d = DS4D_DEFAULT_PATH, socket;
    int tokens = 256, reps = 5, rtt_iters = 2000, threads = 1, prompt_tokens = 32;
    bool json = false;
};

[[noreturn]] void usage(int rc) {
    std::fprintf(rc ? stderr : stdout,
                 "usage: ds4-bench-daemon --model M.gguf [--ds4d PATH | --socket PATH] [--tokens N] [--reps N]\n"
                 "                        [--rtt-iters N] [--threads N] [--prompt-tokens N] [--json]\n"
                 "\n"
                 "Measures ds4d's overhead against the bridge called in process: request round trip\n"
                 "(Tokenize), per-token streaming cost (greedy generation of --tokens tokens; also each\n"
                 "side's time per token outside its forward steps, which leaves out the engine's speed;\n"
                 "with --threads 1 the same for CPU time) and time to first token, next to the machine's\n"
                 "floors: a thread ping-pong over a socketpair, and what one send() that wakes a reader\n"
                 "blocked on an idle core costs the sender (ds4d pays it once a streamed token).\n"
                 "Without --socket it starts its own ds4d (default %s) with\n"
                 "--threads N --backend cpu on a private socket; with --socket the running daemon's\n"
                 "model must be --model and use the same thread count for the comparison to mean much.\n",
                 DS4D_DEFAULT_PATH);
    std::exit(rc);
}

Args parse(int argc, char **argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        std::string s = argv[i];
        auto val = [&]() -> std::string {
            if (i + 1 >= argc) usage(2);
            return argv[++i];
        };
        auto num = [&]() {
            std::string v = val();
            char *end = nullptr;
            long n = std::strtol(v.c_str(), &end, 10);
            if (v.empty() || *end || n < 1 || n > 10000000) {
                std::fprintf(stderr, "ds4-bench-daemon: %s needs a positive integer, got \"%s\"\n", s.c_str(), v.c_str());
                std::exit(2);
            }
            return int(n);
        };
        if (s == "--model") a.model = val();
        else if (s == "--ds4d") a.ds4d = val();
        else if (s == "--socket") a.socket = val();
        else if (s == "--tokens") a.tokens = num();
        else if (s == "--reps") a.reps = num();
        else if (s == "--rtt-iters") a.rtt_iters = num();
        else if (s == "--threads") a.threads = num();
        else if (s == "--prompt-tokens") a.prompt_tokens = num();
        else if (s == "--json") a.json = true;
        else if (s == "-h" || s == "--help") usage(0);
        else {
            std::fprintf(stderr, "ds4-bench-daemon: unknown argument \"%s\"\n", s.c_str());
            usage(2);
        }
    }
    if (a.model.empty() && std::getenv("DS4_MODEL")) a.model = std::getenv("DS4_MODEL");  // --model default
    if (a.model.empty()) {
        std::fprintf(stderr, "ds4-bench-daemon: --model is required\n");
        usage(2);
    }
    return a;
}

// The machine's floor: a one-byte ping-pong between two threads over a socketpair (two
// wake-ups per round trip, as a daemon request has four).
double thread_ping_pong_us(int iters) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 0;
    std::thread echo([&] {
        char b;
        for (int i = 0; i < iters; ++i)
            if (read(sv[1], &b, 1) != 1 || write(sv[1], &b, 1) != 1) return;
    });
    char b = 0;
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i)
        if (write(sv[0], &b, 1) != 1 || read(sv[0], &b, 1) != 1) break;
    const double us = us_since(t0) / iters;
    echo.join();
    close(sv[0]);
    close(sv[1]);
    return us;
}

// The machine's floor for streaming one token: what the sender pays for one send() that
// wakes a thread blocked in read() on an idle core, as ds4d's worker does for every token
// to a waiting client. Between sends the sender computes (a busy wait of gap_us, a token's
// step), as the worker does. Median, in microseconds. Virtual machines make this costly:
// waking an idle virtual CPU goes through the hypervisor.
double send_wake_us(int iters, double gap_us) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 0;
    std::thread reader([&] {
        char b;
        for (int i = 0; i < iters; ++i)
            if (read(sv[1], &b, 1) != 1) return;
    });
    std::vector<double> t;
    t.reserve(size_t(iters));
    for (int i = 0; i < iters; ++i) {
        const auto s0 = Clock::now();
        while (us_since(s0) < gap_us) {
        }
        const char b = 1;
        const auto t0 = Clock::now();
        if (send(sv[0], &b, 1, MSG_NOSIGNAL) != 1) break;
        t.push_back(us_since(t0));
    }
    reader.join();
    close(sv[0]);
    close(sv[1]);
    return median(t);
}

}  // namespace

int main(int argc, char **argv) {
    if (ds4_wants_version(argc, argv)) {
        ds4_print_version("ds4-bench-daemon");
        return 0;
    }
    Args a = parse(argc, argv);
    try {
        OwnDaemon own;
        std::string socket = a.socket;
        if (socket.empty()) {
            own.start(a.ds4d, {"--model", a.model, "--backend", "cpu", "--threads", std::to_string(a.threads)});
            socket = own.socket;
        }
        ds4::client::Client client(socket, "ds4-bench-daemon");
        ds4::bridge::ModelOptions mo;
        mo.model_path = a.model;
        mo.n_threads = a.threads;
        ds4::bridge::Model model(mo);
        const int vocab = model.vocab_size();
        // The daemon's own context size, so both sides run the same session shape.
        const int ctx = int(client.server_info().default_ctx);
        if (a.prompt_tokens + a.tokens + 8 > ctx)
            throw std::runtime_error("--prompt-tokens + --tokens exceed the daemon's context of " +
                                     std::to_string(client.server_info().default_ctx));

        // Request round trip: Tokenize of a short text.
        const std::string text = "round trip";
        for (int i = 0; i < 50; ++i) client.tokenize(text);
        std::vector<double> rtt_socket, rtt_local, rtt_cpu;
        for (int r = 0; r < a.reps; ++r) {
            const double d0 = own.pid > 0 ? proc_cpu_us(own.pid) : 0, c0 = self_cpu_us();
            auto t0 = Clock::now();
            for (int i = 0; i < a.rtt_iters; ++i) client.tokenize(text);
            rtt_socket.push_back(us_since(t0) / a.rtt_iters);
            rtt_cpu.push_back(((own.pid > 0 ? proc_cpu_us(own.pid) - d0 : 0) + self_cpu_us() - c0) / a.rtt_iters);
            t0 = Clock::now();
            size_t sink = 0;
            for (int i = 0; i < a.rtt_iters; ++i) sink += model.tokenize(text).size();
            rtt_local.push_back(us_since(t0) / a.rtt_iters);
            if (sink == 0) std::fprintf(stderr, "tokenizer returned nothing\n");
        }

        // Streaming: the same greedy generation through the daemon and in process. Each run
        // uses a fresh prompt, so neither side reuses a cached prefix.
        std::vector<double> tok_socket, tok_local, ttft_socket, ttft_local, cpu_daemon, cpu_client, cpu_local, prefill_daemon;
        std::vector<double> out_socket, out_local, cpu_out_socket, cpu_out_local;
        for (int r = 0; r < a.reps + 1; ++r) {  // run 0 warms both sides, not recorded
            const auto prompt = make_prompt(a.prompt_tokens, vocab, 1000 + r);
            ds4::client::GenerateRequest req;
            req.kind = ds4::client::GenerateRequest::Prompt::Tokens;
            req.tokens = prompt;
            req.max_tokens = uint32_t(a.tokens);
            req.ignore_eos = true;
            Clock::time_point first{};
            size_t got = 0;
            ds4::client::GenerateCallbacks cb;
            cb.on_chunk = [&](const ds4::client::Chunk &c) {
                if (got == 0) first = Clock::now();
                got += c.tokens.size();
                return true;
            };
            const double d_cpu0 = own.pid > 0 ? proc_cpu_us(own.pid) : 0, c_cpu0 = self_cpu_us();
            auto t0 = Clock::now();
            const ds4::client::DoneInfo done = client.generate(req, cb);
            const auto t_end = Clock::now();
            const double d_cpu = own.pid > 0 ? proc_cpu_us(own.pid) - d_cpu0 : 0, c_cpu = self_cpu_us() - c_cpu0;
            if (got != size_t(a.tokens)) throw std::runtime_error("daemon streamed " + std::to_string(got) + " tokens");

            ds4::bridge::Session s(model, ctx);
            const double l_cpu0 = self_cpu_us();
            auto l0 = Clock::now();
            s.sync(prompt);
            const double sync_us = us_since(l0);
            int32_t t = s.argmax();
            (void)model.token_text(t);
            const auto l_first = Clock::now();
            double eval_us = 0;   // the forward steps alone, like ds4d's decode_us
            for (int i = 1; i < a.tokens; ++i) {
                const auto e0 = Clock::now();
                s.eval(t);
                eval_us += us_since(e0);
                t = s.argmax();
                (void)model.token_text(t);
            }
            const auto l_end = Clock::now();
            const double l_cpu = self_cpu_us() - l_cpu0;
            if (r == 0) continue;
            prefill_daemon.push_back(double(done.prefill_us));
            cpu_daemon.push_back(d_cpu / a.tokens);
            cpu_client.push_back(c_cpu / a.tokens);
            cpu_local.push_back(l_cpu / a.tokens);
            const auto d = [](Clock::time_point x, Clock::time_point y) {
                return std::chrono::duration<double, std::micro>(y - x).count();
            };
            ttft_socket.push_back(d(t0, first));
            ttft_local.push_back(d(l0, l_first));
            tok_socket.push_back(d(first, t_end) / (a.tokens - 1));
            tok_local.push_back(d(l_first, l_end) / (a.tokens - 1));
            // Each side's time per token outside its forward steps, from the same run: the
            // engine's speed, which moves from run to run, drops out of the difference.
            out_socket.push_back((d(first, t_end) - double(done.decode_us)) / (a.tokens - 1));
            out_local.push_back((d(l_first, l_end) - eval_us) / (a.tokens - 1));
            // The same for CPU time. With one thread a forward step's CPU time is its wall
            // time (nothing else runs it), so both sides' steps come off their CPU figures:
            // ds4d's prefill and decode steps, the bridge's sync and evals.
            cpu_out_socket.push_back((d_cpu + c_cpu - double(done.prefill_us) - double(done.decode_us)) / a.tokens);
            cpu_out_local.push_back((l_cpu - sync_us - eval_us) / a.tokens);
        }

        std::vector<double> floor_v;
        for (int r = 0; r < a.reps; ++r) floor_v.push_back(thread_ping_pong_us(a.rtt_iters));
        const double pp = median(floor_v);
        const double wake = send_wake_us(std::min(a.rtt_iters, 2000), std::max(10.0, median(out_local) + median(tok_local)));
        const double rs = median(rtt_socket), rl = median(rtt_local);
        const double ts = median(tok_socket), tl = median(tok_local);
        const double os = median(out_socket), ol = median(out_local);
        const double fs = median(ttft_socket), fl = median(ttft_local);
        const double cd = median(cpu_daemon), cc = median(cpu_client), cl = median(cpu_local);
        const bool have_cpu = own.pid > 0;
        const double rc = median(rtt_cpu);
        // Only with one thread does a step's wall time stand for its CPU time.
        const bool have_cpu_out = have_cpu && a.threads == 1;
        const double cos_ = median(cpu_out_socket), col = median(cpu_out_local);
        if (a.json) {
            std::printf("{\"model\":\"%s\",\"threads\":%d,\"tokens\":%d,\"reps\":%d,"
                        "\"rtt_socket_us\":%.2f,\"rtt_inprocess_us\":%.2f,\"rtt_overhead_us\":%.2f,"
                        "\"token_socket_us\":%.2f,\"token_inprocess_us\":%.2f,\"token_overhead_us\":%.2f,"
                        "\"token_outside_step_socket_us\":%.2f,\"token_outside_step_inprocess_us\":%.2f,"
                        "\"token_outside_step_overhead_us\":%.2f,"
                        "\"ttft_socket_us\":%.1f,\"ttft_inprocess_us\":%.1f,"
                        "\"cpu_per_token_daemon_us\":%.2f,\"cpu_per_token_client_us\":%.2f,"
                        "\"cpu_per_token_inprocess_us\":%.2f,\"cpu_per_token_overhead_us\":%.2f,\"cpu_per_rtt_us\":%.2f,"
                        "\"thread_ping_pong_us\":%.2f,\"send_wake_us\":%.2f%s}\n",
                        client.server_info().model.name.c_str(), a.threads, a.tokens, a.reps, rs, rl, rs - rl, ts, tl,
                        ts - tl, os, ol, os - ol, fs, fl, cd, cc, cl, have_cpu ? cd + cc - cl : 0.0, have_cpu ? rc : 0.0, pp, wake,
                        have_cpu_out ? (",\"cpu_outside_step_socket_us\":" + std::to_string(cos_) +
                                        ",\"cpu_outside_step_inprocess_us\":" + std::to_string(col) +
                                        ",\"cpu_outside_step_overhead_us\":" + std::to_string(cos_ - col))
                                           .c_str()
                                     : "");
        } else {
            std::printf("model %s, %d thread(s), %d tokens per stream, %d-token prompts, median of %d runs\n",
                        client.server_info().model.name.c_str(), a.threads, a.tokens, a.prompt_tokens, a.reps);
            std::printf("%-28s %12s %12s %12s\n", "", "socket", "in-process", "overhead");
            std::printf("%-28s %9.2f us %9.2f us %9.2f us\n", "request round trip", rs, rl, rs - rl);
            std::printf("%-28s %9.2f us %9.2f us %9.2f us\n", "per streamed token", ts, tl, ts - tl);
            std::printf("%-28s %9.2f us %9.2f us %9.2f us   (the same runs less their forward steps)\n",
                        "  outside the forward step", os, ol, os - ol);
            std::printf("%-28s %9.1f us %9.1f us %9.1f us   (ds4d's prefill step: %.1f us)\n", "time to first token",
                        fs, fl, fs - fl, median(prefill_daemon));
            if (have_cpu)
                std::printf("%-28s %9.2f us %9.2f us %9.2f us\n", "CPU per round trip", rc, rl, rc - rl);
            if (have_cpu)
                std::printf("%-28s %9.2f us %9.2f us %9.2f us   (ds4d %.2f + client %.2f)\n", "CPU per streamed token",
                            cd + cc, cl, cd + cc - cl, cd, cc);
            if (have_cpu_out)
                std::printf("%-28s %9.2f us %9.2f us %9.2f us   (the same runs less their forward steps)\n",
                            "  outside the forward step", cos_, col, cos_ - col);
            std::printf("machine floor: thread ping-pong over a socketpair %.2f us per round trip\n", pp);
            std::printf("machine floor: one send() that wakes a reader blocked on an idle core costs the sender %.2f us\n"
                        "               (ds4d's worker pays this once per streamed token)\n",
                        wake);
        }
        return 0;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "ds4-bench-daemon: %s\n", e.what());
        return 1;
    }
}
