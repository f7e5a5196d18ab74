// ds4-bench-gateway: streams the same completion through ds4-gateway (HTTP, SSE) and
// straight through libds4client (the Unix socket), with N concurrent streams each, and
// reports wall time per generated token. The difference is the front's overhead.
// Needs a running ds4d and ds4-gateway (see --help).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "client/ds4client.hpp"
#include "ds4_version.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Opt {
    std::string socket, key, host = "127.0.0.1", prompt = "def fibonacci(n):\n";
    int port = 8080, tokens = 256, reps = 3;
    std::vector<int> streams = {1, 16};
};

// One streamed /v1/completions request over a fresh TCP connection; returns the tokens
// the final usage reports (0 on failure).
uint32_t http_stream(const Opt &o) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(o.port));
    inet_pton(AF_INET, o.host.c_str(), &a.sin_addr);
    if (connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
        close(fd);
        return 0;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::string prompt;
    for (char c : o.prompt) {
        if (c == '\n') prompt += "\\n";
        else if (c == '"' || c == '\\') prompt += std::string("\\") + c;
        else prompt += c;
    }
    const std::string body = "{\"model\":\"m\",\"prompt\":\"" + prompt + "\",\"max_tokens\":" + std::to_string(o.tokens) +
                             ",\"temperature\":0,\"ignore_eos\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true}}";
    const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + o.key +
                            "\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\n\r\n" + body;
    if (write(fd, req.data(), req.size()) != ssize_t(req.size())) {
        close(fd);
        return 0;
    }
    std::string all;
    char buf[16384];
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0) break;
        all.append(buf, size_t(n));
    }
    close(fd);
    const size_t u = all.rfind("\"completion_tokens\":");
    return u == std::string::npos ? 0 : uint32_t(std::strtoul(all.c_str() + u + 20, nullptr, 10));
}

uint32_t socket_stream(const Opt &o, ds4::client::Client &c) {
    ds4::client::GenerateRequest g;
    g.text = o.prompt;
    g.max_tokens = uint32_t(o.tokens);
    g.ignore_eos = true;
    uint32_t n = 0;
    ds4::client::GenerateCallbacks cb;
    cb.on_chunk = [&](const ds4::client::Chunk &ch) {
        n += uint32_t(ch.tokens.size());
        return true;
    };
    c.generate(g, cb);
    return n;
}

// Wall time of `streams` concurrent runs of fn; the tokens they produced in total.
template <class F>
double run(int streams, F fn, uint64_t *tokens) {
    std::atomic<uint64_t> total{0};
    std::vector<std::thread> th;
    const auto t0 = Clock::now();
    for (int i = 0; i < streams; ++i) th.emplace_back([&, i] { total += fn(i); });
    for (auto &t : th) t.join();
    *tokens = total;
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char **argv) {
    if (ds4_wants_version(argc, argv)) {
        ds4_print_version("ds4-bench-gateway");
        return 0;
    }
    Opt o;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto val = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
        if (a == "--socket") o.socket = val();
        else if (a == "--port") o.port = std::atoi(val().c_str());
        else if (a == "--key") o.key = val();
        else if (a == "--tokens") o.tokens = std::atoi(val().c_str());
        else if (a == "--reps") o.reps = std::atoi(val().c_str());
        else if (a == "--streams") {
            o.streams.clear();
            std::string s = val();
            for (size_t p = 0; p < s.size();) {
                o.streams.push_back(std::atoi(s.c_str() + p));
                p = s.find(',', p);
                if (p == std::string::npos) break;
                ++p;
            }
        } else {
            std::printf("usage: ds4-bench-gateway --socket DS4D_SOCKET --port GATEWAY_PORT --key KEY\n"
                        "                         [--tokens N (256)] [--streams 1,16] [--reps 3]\n"
                        "Start ds4d (e.g. on a ds4-make-model tiny model) and ds4-gateway on it first.\n"
                        "Streams the same greedy completion (ignore_eos) N tokens long through the gateway\n"
                        "and through libds4client, S streams at once, and prints wall microseconds per\n"
                        "generated token (best of --reps) for both and their difference.\n");
            return a == "-h" || a == "--help" ? 0 : 2;
        }
    }
    try {
        std::printf("%-8s %-14s %-14s %-14s %s\n", "streams", "socket us/tok", "http us/tok", "overhead us", "(aggregate: wall / all tokens)");
        for (int s : o.streams) {
            std::vector<std::unique_ptr<ds4::client::Client>> clients;
            for (int i = 0; i < s; ++i) clients.push_back(std::make_unique<ds4::client::Client>(o.socket, "bench"));
            double best_sock = 1e30, best_http = 1e30;
            for (int r = 0; r < o.reps; ++r) {
                uint64_t nt = 0, nh = 0;
                const double ws = run(s, [&](int i) { return socket_stream(o, *clients[size_t(i)]); }, &nt);
                const double wh = run(s, [&](int) { return http_stream(o); }, &nh);
                if (nt != uint64_t(s) * uint64_t(o.tokens) || nh != nt) {
                    std::fprintf(stderr, "token counts differ: socket %llu, http %llu (want %d each)\n",
                                 (unsigned long long)nt, (unsigned long long)nh, s * o.tokens);
                    return 1;
                }
                best_sock = std::min(best_sock, ws * 1e6 / double(nt));
                best_http = std::min(best_http, wh * 1e6 / double(nh));
            }
            std::printf("%-8d %-14.2f %-14.2f %-14.2f\n", s, best_sock, best_http, best_http - best_sock);
        }
    } catch (const std::exception &e) {
        std::fprintf(stderr, "ds4-bench-gateway: %s\n", e.what());
        return 1;
    }
    return 0;
}
