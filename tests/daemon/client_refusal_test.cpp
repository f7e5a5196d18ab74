// libds4client keeps the daemon's reason when the daemon closes while the client is still
// writing: a send that fails with EPIPE/ECONNRESET reads the Error already in the socket
// instead of reporting a broken pipe. The server here is a plain thread of this process
// (same uid) that answers Hello, then refuses the next request and closes unread.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <thread>

#include "client/ds4client.hpp"
#include "ipc/frame.h"

namespace {

namespace fb = ds4::ipc::fb;

template <class T> void send_frame(int fd, uint64_t rid, T build) {
    flatbuffers::FlatBufferBuilder fbb;
    ds4::ipc::finish_frame(fbb, rid, build(fbb));
    [[maybe_unused]] ssize_t w = ::send(fd, fbb.GetBufferPointer(), fbb.GetSize(), MSG_NOSIGNAL);
}

void refusing_server(int ls) {
    int c = ::accept(ls, nullptr, nullptr);
    if (c < 0) return;
    ds4::ipc::FrameDecoder dec;
    char buf[4096];
    bool hello_done = false;
    for (;;) {
        pollfd p{c, POLLIN, 0};
        if (::poll(&p, 1, 10000) != 1) break;
        ssize_t n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0) break;
        if (hello_done) {  // the first bytes of the next request: refuse it and close unread
            send_frame(c, 0, [](auto &fbb) {
                return fb::CreateErrorDirect(fbb, fb::ErrorCode::FrameTooLarge, "this test server takes no long requests");
            });
            break;
        }
        dec.feed(reinterpret_cast<const uint8_t *>(buf), size_t(n));
        if (dec.next() == ds4::ipc::FrameDecoder::Status::Frame) {
            send_frame(c, dec.envelope()->request_id(), [](auto &fbb) {
                return fb::CreateHelloOkDirect(fbb, ds4::ipc::kProtocolVersion, "test", 0, 4096, 1u << 30);
            });
            hello_done = true;
        }
    }
    ::close(c);
}

TEST(ClientRefusal, ASendCutShortByTheDaemonReportsItsError) {
    char t[] = "/tmp/ds4-refusal-XXXXXX";
    const std::string dir = mkdtemp(t);
    const std::string path = dir + "/ds4.sock";
    int ls = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
    ASSERT_EQ(::bind(ls, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
    ASSERT_EQ(::listen(ls, 4), 0);
    std::thread server(refusing_server, ls);
    {
        ds4::client::Client c(path);
        try {
            c.tokenize(std::string(8u << 20, 'x'));  // far more than the socket buffers hold
            ADD_FAILURE() << "the request went through";
        } catch (const ds4::client::ServerError &e) {
            EXPECT_EQ(e.code_name, "FrameTooLarge") << e.what();
            EXPECT_NE(e.server_message.find("no long requests"), std::string::npos) << e.what();
        } catch (const std::exception &e) {
            ADD_FAILURE() << "the daemon's reason was lost: " << e.what();
        }
    }
    server.join();
    ::close(ls);
    std::filesystem::remove_all(dir);
}

}  // namespace
