// ds4-gateway's HTTP server: libmicrohttpd (one epoll thread for every connection, with
// its own connection cap, idle timeout and header memory limit) in front of a pool of
// worker threads, each holding one libds4client connection to ds4d. A request's body is
// read on the HTTP thread, the generation runs on a worker, and the connection is
// suspended while it waits, so idle or slow connections never hold a worker.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace ds4::gateway {

struct Options {
    std::string socket_path;          // ds4d's socket ("" = the default path)
    std::string listen = "127.0.0.1:8080";
    bool auth = true;
    std::string key;                  // the bearer key (auth on)
    std::string model_name;           // reported model id ("" = the daemon's model name)
    unsigned max_connections = 2048;
    unsigned timeout_s = 60;          // idle connection timeout (not while generating)
    size_t max_body = 16u << 20;
    size_t max_header = 64u << 10;    // header memory per connection
    unsigned workers = 16;            // generations in flight at once
    unsigned queue = 256;             // requests waiting for a worker beyond that
    uint32_t default_max_tokens = 4096;
    std::string port_file;            // written with the bound port once listening
};

class Server {
public:
    explicit Server(Options o);
    ~Server();
    // Binds and starts serving; throws std::runtime_error when it cannot.
    void start();
    uint16_t port() const;
    // Cancels generations in flight, resumes their connections and stops.
    void stop();

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

// True for 127.0.0.0/8, ::1 and "localhost".
bool is_loopback_host(const std::string &host);

}  // namespace ds4::gateway
