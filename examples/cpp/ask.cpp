// Continue a text with a running ds4d through the C++ client (client/ds4client.hpp).
//   ./ask "def fib(n):"              (socket: $DS4_SOCKET or the default)
#include <client/ds4client.hpp>

#include <cstdio>

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s PROMPT\n", argv[0]);
        return 2;
    }
    try {
        ds4::client::Client client;
        ds4::client::GenerateRequest req;
        req.text = argv[1];        // plain completion; kind = Chat with messages for a chat turn
        req.max_tokens = 16;       // greedy: temperature 0
        ds4::client::GenerateCallbacks cb;
        cb.on_chunk = [](const ds4::client::Chunk &c) {
            std::fwrite(c.text.data(), 1, c.text.size(), stdout);
            return true;           // false cancels
        };
        client.generate(req, cb);
        std::printf("\n");
    } catch (const std::exception &e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
