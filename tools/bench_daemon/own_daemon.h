// A private ds4d for a benchmark run: started on a socket in a fresh temporary directory
// (no store unless the arguments name one), stopped and cleaned up by the destructor.
#pragma once
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "client/ds4client.hpp"

extern "C" char **environ;

struct OwnDaemon {
    pid_t pid = -1;
    std::string dir, socket, log;

    OwnDaemon() = default;
    OwnDaemon(const OwnDaemon &) = delete;
    OwnDaemon &operator=(const OwnDaemon &) = delete;
    ~OwnDaemon() { stop(); }

    void stop() {
        if (pid > 0) {
            kill(pid, SIGTERM);
            waitpid(pid, nullptr, 0);
            pid = -1;
        }
        if (!dir.empty()) std::filesystem::remove_all(dir);
        dir.clear();
    }

    // args: everything after the program name except --socket (and --no-store, added when
    // the args name no --state-dir). Returns once the socket accepts a client.
    void start(const std::string &exe, std::vector<std::string> args) {
        char tmpl[] = "/tmp/ds4-bench-XXXXXX";
        if (!mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
        dir = tmpl;
        socket = dir + "/ds4.sock";
        log = dir + "/ds4d.log";
        std::vector<std::string> argv = {exe, "--socket", socket};
        bool has_state = false;
        for (const auto &x : args) has_state = has_state || x == "--state-dir";
        if (!has_state) argv.push_back("--no-store");
        argv.insert(argv.end(), args.begin(), args.end());
        std::vector<char *> av;
        for (auto &s : argv) av.push_back(s.data());
        av.push_back(nullptr);
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        const int rc = posix_spawn(&pid, av[0], &fa, nullptr, av.data(), environ);
        posix_spawn_file_actions_destroy(&fa);
        if (rc != 0) {
            pid = -1;
            throw std::runtime_error("cannot start " + exe + " (use --ds4d PATH)");
        }
        // Large models take minutes to open and prewarm: wait while the daemon lives.
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(30);
        while (std::chrono::steady_clock::now() < deadline) {
            int st = 0;
            if (waitpid(pid, &st, WNOHANG) == pid) {
                pid = -1;
                throw std::runtime_error("ds4d exited during start-up; see " + log);
            }
            try {
                ds4::client::Client probe(socket, "bench-probe");
                return;
            } catch (const ds4::client::ConnectError &) {
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
            }
        }
        throw std::runtime_error("ds4d did not listen within 30 minutes; see " + log);
    }
};
