#include "bootstrap/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>
#include <random>
#include <thread>

#include "hvd/sdk/env.hpp"

namespace hvd::core {
namespace {

Status system_error(const std::string& what) {
  return error(HVD_ERR_SYSTEM, what + ": " + std::strerror(errno));
}

int millis_until(Deadline deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

// Wait until `fd` is ready for `events`; a timeout or error becomes a Status.
Status wait_ready(int fd, short events, Deadline deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, millis_until(deadline));
    if (n > 0) return Status::success();
    if (n == 0) return error(HVD_ERR_TIMEOUT, std::string("timed out while ") + what);
    if (errno != EINTR) return system_error(std::string("poll while ") + what);
  }
}

struct AddrInfoDeleter {
  void operator()(addrinfo* info) const { freeaddrinfo(info); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

Result<AddrInfoPtr> resolve(const HostPort& where, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* info = nullptr;
  const std::string port = std::to_string(where.port);
  const char* host = where.host.empty() ? nullptr : where.host.c_str();
  const int rc = ::getaddrinfo(host, port.c_str(), &hints, &info);
  if (rc != 0) {
    return error(HVD_ERR_SYSTEM, "cannot resolve '" + where.host + "': " + ::gai_strerror(rc));
  }
  return AddrInfoPtr(info);
}

// The numeric local address and port of a socket.
HostPort socket_address(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return {};
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text);
    return HostPort{text, ntohs(v4->sin_port)};
  }
  if (addr.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text);
    return HostPort{text, ntohs(v6->sin6_port)};
  }
  return {};
}

}  // namespace

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.release();
  }
  return *this;
}

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Result<HostPort> parse_host_port(const std::string& text) {
  std::string host;
  std::string port;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return error(HVD_ERR_INVALID_ARGUMENT, "'" + text + "' is not [address]:port");
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos) {
      return error(HVD_ERR_INVALID_ARGUMENT, "'" + text + "' is not host:port");
    }
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  const std::optional<uint64_t> value = sdk::parse_whole(port, 65535);
  if (!value) return error(HVD_ERR_INVALID_ARGUMENT, "'" + text + "' has no valid port (0-65535)");
  return HostPort{host, static_cast<uint16_t>(*value)};
}

Result<Fd> listen_tcp(const HostPort& where, HostPort* bound) {
  HVD_ASSIGN_OR_RETURN(AddrInfoPtr info, resolve(where, /*passive=*/true));
  Status last = error(HVD_ERR_SYSTEM, "no address to listen on for " + where.to_string());
  for (addrinfo* ai = info.get(); ai != nullptr; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      last = system_error("socket");
      continue;
    }
    const int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last = system_error("bind " + where.to_string());
      continue;
    }
    // A deep accept queue: when it is full the kernel drops a newcomer's SYN, and the client
    // retries only a second later, so a flood of connections would delay a real rank's join by
    // that second. The kernel caps it at net.core.somaxconn.
    if (::listen(fd.get(), 65535) != 0) {
      last = system_error("listen " + where.to_string());
      continue;
    }
    if (bound != nullptr) *bound = socket_address(fd.get());
    return fd;
  }
  return last;
}

namespace {

// A connected socket as callers expect it: blocking, no Nagle delay.
Fd connected(Fd fd) {
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags >= 0) ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  const int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

Result<Fd> connect_tcp(const HostPort& where, Deadline deadline) {
  using std::chrono::milliseconds;
  HVD_ASSIGN_OR_RETURN(AddrInfoPtr info, resolve(where, /*passive=*/false));
  std::vector<const addrinfo*> addresses;
  for (const addrinfo* ai = info.get(); ai != nullptr; ai = ai->ai_next) addresses.push_back(ai);
  if (addresses.empty()) return error(HVD_ERR_SYSTEM, "no address for " + where.to_string());

  // Connects are non-blocking, so that the deadline bounds them. A SYN that the server's kernel
  // drops (its accept queue is full: a flood of connections, or a busy server) is sent again only
  // after 1 s, then 3 s: rather than wait that long, a connect still pending after a while is
  // raced by a fresh one (the last kRacing stay in the race), 250 ms later, then 500 ms, up to
  // 2 s apart. A refusal (nobody listens yet: rank 0 may start last) is retried after a backoff.
  constexpr size_t kRacing = 4;
  std::vector<Fd> racing;  // oldest first
  std::string last = "no answer";
  size_t next_address = 0;
  auto refused_backoff = milliseconds(10);
  auto race_interval = milliseconds(250);
  auto refused = [&](int err) {
    last = std::strerror(err);
    const Deadline retry = Clock::now() + refused_backoff;
    refused_backoff = std::min(refused_backoff * 2, milliseconds(500));
    return retry;
  };
  Deadline next_attempt = Clock::now();
  for (;;) {
    Deadline now = Clock::now();
    if (now >= next_attempt) {
      const addrinfo* ai = addresses[next_address++ % addresses.size()];
      Fd fd(
          ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
      if (!fd.valid()) return system_error("socket");
      if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0) return connected(std::move(fd));
      if (errno == EINPROGRESS) {
        if (racing.size() == kRacing) racing.erase(racing.begin());
        racing.push_back(std::move(fd));
        next_attempt = now + race_interval;
        race_interval = std::min(race_interval * 2, milliseconds(2000));
      } else {
        // The host's other addresses at once; after a round of them, back off.
        next_attempt = next_address % addresses.size() != 0 ? now : refused(errno);
      }
      now = Clock::now();
    }
    if (now >= deadline) {
      return error(HVD_ERR_TIMEOUT, "could not connect to " + where.to_string() +
                                        " before the timeout (" + last + ")");
    }
    const Deadline until = std::min(deadline, next_attempt);
    if (racing.empty()) {
      std::this_thread::sleep_for(until - now);
      continue;
    }
    std::vector<pollfd> polled;
    for (const Fd& fd : racing) polled.push_back(pollfd{fd.get(), POLLOUT, 0});
    const auto wait = std::chrono::ceil<milliseconds>(std::max(until - now, Clock::duration(0)));
    const int n = ::poll(polled.data(), polled.size(),
                         static_cast<int>(std::min<int64_t>(wait.count(), 1 << 30)));
    if (n < 0 && errno != EINTR) return system_error("poll while connecting");
    for (size_t i = polled.size(); i-- > 0;) {
      if (polled[i].revents == 0) continue;
      int err = 0;
      socklen_t len = sizeof err;
      if (::getsockopt(racing[i].get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      if (err == 0) return connected(std::move(racing[i]));
      racing.erase(racing.begin() + static_cast<std::ptrdiff_t>(i));
      const Deadline retry = refused(err);
      if (racing.empty()) next_attempt = retry;
    }
  }
}

std::string local_address_of(int fd) { return socket_address(fd).host; }

namespace {

// Every (interface, IPv4 address) of this host, in the kernel's order.
std::vector<std::pair<std::string, std::string>> ipv4_interfaces(bool up_and_external_only) {
  std::vector<std::pair<std::string, std::string>> found;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return found;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    if (up_and_external_only &&
        ((it->ifa_flags & IFF_UP) == 0 || (it->ifa_flags & IFF_LOOPBACK) != 0)) {
      continue;
    }
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(it->ifa_addr)->sin_addr, text,
                sizeof text);
    found.emplace_back(it->ifa_name, text);
  }
  ::freeifaddrs(list);
  return found;
}

}  // namespace

Result<std::string> interface_address(const std::string& iface) {
  std::string names;
  for (const auto& [name, address] : ipv4_interfaces(false)) {
    if (name == iface) return address;
    names += (names.empty() ? "" : ", ") + name;
  }
  return error(HVD_ERR_NOT_FOUND, "no IPv4 interface '" + iface + "' on this host (it has: " +
                                      (names.empty() ? "none" : names) + ")");
}

std::string first_external_address() {
  const auto found = ipv4_interfaces(true);
  return found.empty() ? "" : found.front().second;
}

std::string random_secret() {
  std::random_device device;
  std::string out;
  for (int i = 0; i < 4; ++i) {
    char chunk[9];
    std::snprintf(chunk, sizeof chunk, "%08x", device());
    out += chunk;
  }
  return out;
}

Status send_all(int fd, const void* data, size_t size, Deadline deadline) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    HVD_RETURN_IF_ERROR(wait_ready(fd, POLLOUT, deadline, "sending to the rendezvous peer"));
    HVD_ASSIGN_OR_RETURN(const size_t n, send_nonblocking(fd, p, size));
    p += n;
    size -= n;
  }
  return Status::success();
}

Result<size_t> recv_some(int fd, void* data, size_t size, Deadline deadline) {
  for (;;) {
    HVD_RETURN_IF_ERROR(wait_ready(fd, POLLIN, deadline, "waiting for the rendezvous peer"));
    const ssize_t n = ::recv(fd, data, size, MSG_DONTWAIT);
    if (n > 0) return static_cast<size_t>(n);
    if (n == 0) return error(HVD_ERR_REMOTE, "connection closed by the peer");
    if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      return error(HVD_ERR_REMOTE,
                   std::string("connection lost while receiving: ") + std::strerror(errno));
    }
  }
}

Status recv_all(int fd, void* data, size_t size, Deadline deadline) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    HVD_ASSIGN_OR_RETURN(const size_t n, recv_some(fd, p, size, deadline));
    p += n;
    size -= n;
  }
  return Status::success();
}

Status set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return system_error("setting a socket non-blocking");
  }
  return Status::success();
}

Result<size_t> send_nonblocking(int fd, const void* data, size_t size) {
  for (;;) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
    if (errno != EINTR) {
      return error(HVD_ERR_REMOTE,
                   std::string("connection lost while sending: ") + std::strerror(errno));
    }
  }
}

}  // namespace hvd::core
