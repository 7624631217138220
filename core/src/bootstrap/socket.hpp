// socket.hpp — the few TCP operations hvd needs, each bounded by a deadline.
#ifndef HVD_CORE_BOOTSTRAP_SOCKET_HPP
#define HVD_CORE_BOOTSTRAP_SOCKET_HPP

#include <chrono>
#include <cstdint>
#include <string>

#include "hvd/sdk/result.hpp"

namespace hvd::core {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline deadline_after(std::chrono::milliseconds timeout) { return Clock::now() + timeout; }

// An owned file descriptor: closed on destruction, move-only.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();

 private:
  int fd_ = -1;
};

struct HostPort {
  std::string host;
  uint16_t port = 0;
  std::string to_string() const { return host + ":" + std::to_string(port); }
};

// "host:port", "[v6addr]:port". Port 0 is allowed (bind to any free port).
Result<HostPort> parse_host_port(const std::string& text);

// A listening socket on host:port (port 0 picks one); `bound` receives the actual address.
Result<Fd> listen_tcp(const HostPort& where, HostPort* bound);

// Connect, retrying refused connections until the deadline (the server may not be up yet).
Result<Fd> connect_tcp(const HostPort& where, Deadline deadline);

// The local address of a connected socket ("10.0.0.2"): what peers can reach this host at.
std::string local_address_of(int fd);

// The IPv4 address of network interface `iface` ("eth0"); an error names the interfaces that exist.
Result<std::string> interface_address(const std::string& iface);

// The first IPv4 address of an interface that is up and not loopback; "" if there is none.
std::string first_external_address();

// 128 random bits as hex: a job's shared secret.
std::string random_secret();

// Every send here passes MSG_NOSIGNAL: a peer that went away is an error, never a SIGPIPE.
Status send_all(int fd, const void* data, size_t size, Deadline deadline);
Status recv_all(int fd, void* data, size_t size, Deadline deadline);
// Wait (until the deadline) for bytes, then return what one recv gave: at least 1 and at most
// `size`; the peer's close is an error.
Result<size_t> recv_some(int fd, void* data, size_t size, Deadline deadline);

// For event loops: O_NONBLOCK on `fd`, and one send that never waits (0 when the socket's buffer
// is full; an error when the connection is gone).
Status set_nonblocking(int fd);
Result<size_t> send_nonblocking(int fd, const void* data, size_t size);

}  // namespace hvd::core

#endif  // HVD_CORE_BOOTSTRAP_SOCKET_HPP
