// shell_job.hpp — what the multi-process tests share: a shell command run to its end with its
// output, and a free loopback port for a rendezvous.
#ifndef HVD_TESTS_SHELL_JOB_HPP
#define HVD_TESTS_SHELL_JOB_HPP

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace hvd::testing {

struct Job {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

inline Job run(const std::string& command) {
  const auto start = std::chrono::steady_clock::now();
  Job r;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) r.output.append(buffer, n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

// A port nobody listens on right now: the kernel picks it for a socket we then close.
inline std::string free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return std::to_string(ntohs(addr.sin_port));
}

}  // namespace hvd::testing

#endif  // HVD_TESTS_SHELL_JOB_HPP
