// Test helper: child processes with a bounded life. Each child runs in its own process group
// (so mpirun's children go with it), writes stdout and stderr to a file, and is killed with its
// whole group when the Process object goes away, whatever happened in the test.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace dgc::test {

// A fresh directory under the system temp dir, removed by the destructor.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, close).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    throw std::runtime_error("bind to port 0 failed");
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

class Process {
 public:
  // Starts argv[0] (a path) with the current environment plus `env` ("NAME=value" overrides or
  // adds NAME; a bare "NAME" removes it), writing stdout and stderr to `log`.
  Process(const std::vector<std::string>& argv, const std::vector<std::string>& env,
          const std::string& log)
      : log_(log) {
    std::vector<std::string> environment;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      const std::string name = entry.substr(0, entry.find('='));
      bool overridden = false;
      for (const auto& o : env) overridden = overridden || o.substr(0, o.find('=')) == name;
      if (!overridden) environment.push_back(entry);
    }
    for (const auto& e : env) {
      if (e.find('=') != std::string::npos) environment.push_back(e);
    }
    std::vector<char*> args, envp;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (const auto& e : environment) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    const int rc = posix_spawn(&pid_, args[0], &actions, &attr, args.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) throw std::runtime_error("posix_spawn " + argv[0] + " failed: " + strerror(rc));
  }

  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  ~Process() {
    if (!status_) {
      // Polite first (mpirun forwards SIGTERM to its ranks), then certain.
      ::kill(-pid_, SIGTERM);
      if (!wait_for(std::chrono::milliseconds(2000))) {
        ::kill(-pid_, SIGKILL);
        wait_for(std::chrono::milliseconds(5000));
      }
    }
    // Leftovers of the group (e.g. ranks of an mpirun that died first).
    ::kill(-pid_, SIGKILL);
  }

  pid_t pid() const { return pid_; }

  void signal(int sig) { ::kill(pid_, sig); }

  // Waits up to `timeout` for the process to end. Returns its wait status, or nullopt.
  std::optional<int> wait_for(std::chrono::milliseconds timeout) {
    if (status_) return status_;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        status_ = status;
        return status_;
      }
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // Exit code if it exited normally, -signal if killed, nullopt if still running.
  std::optional<int> exit_code() const {
    if (!status_) return std::nullopt;
    if (WIFEXITED(*status_)) return WEXITSTATUS(*status_);
    if (WIFSIGNALED(*status_)) return -WTERMSIG(*status_);
    return std::nullopt;
  }

  std::string output() const {
    std::ifstream in(log_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  pid_t pid_ = -1;
  std::string log_;
  std::optional<int> status_;
};

// Every process's output, each under a heading naming it, for failure messages.
inline std::string all_output(const std::vector<std::unique_ptr<Process>>& procs) {
  std::string out;
  for (size_t i = 0; i < procs.size(); ++i) {
    out += "---- process " + std::to_string(i) + " ----\n" + procs[i]->output();
  }
  return out;
}

}  // namespace dgc::test
