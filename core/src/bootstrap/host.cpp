#include "bootstrap/host.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

namespace hvd::core {
namespace {

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

// The running kernel's boot id: the same for every namespace and container of one machine,
// different on every other machine (and after a reboot).
std::string boot_id() {
  std::ifstream file("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(file, id);
  return id.empty() ? "?" : id;
}

// The network namespace's inode: distinct for every namespace alive on one kernel.
std::string network_namespace() {
  struct stat info {};
  if (::stat("/proc/self/ns/net", &info) != 0) return "?";
  return std::to_string(static_cast<unsigned long long>(info.st_ino));
}

// An address as text, without the port: what getifaddrs and getaddrinfo results are compared by.
std::string address_text(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(address)->sin_addr, text,
                sizeof text);
  } else if (address->sa_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr, text,
                sizeof text);
  }
  return text;
}

bool is_loopback(const sockaddr* address) {
  if (address->sa_family == AF_INET) {
    const uint32_t ip = ntohl(reinterpret_cast<const sockaddr_in*>(address)->sin_addr.s_addr);
    return (ip >> 24) == 127;
  }
  if (address->sa_family == AF_INET6) {
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr);
  }
  return false;
}

}  // namespace

std::string host_identity(const Settings& settings) {
  if (const auto name = settings.optional(Knob::kHostname)) return *name;
  return host_name() + " (boot " + boot_id() + ", netns " + network_namespace() + ")";
}

LocalPlace local_place(const std::vector<std::string>& identities, int rank) {
  LocalPlace place{0, 0};
  const std::string& mine = identities[static_cast<size_t>(rank)];
  for (size_t r = 0; r < identities.size(); ++r) {
    if (identities[r] != mine) continue;
    if (static_cast<int>(r) < rank) ++place.rank;
    ++place.size;
  }
  return place;
}

bool is_this_host(const std::string& host) {
  if (host == "localhost") return true;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* resolved = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &resolved) != 0) return false;
  std::vector<std::string> candidates;
  bool loopback = false;
  for (addrinfo* it = resolved; it != nullptr; it = it->ai_next) {
    loopback = loopback || is_loopback(it->ai_addr);
    candidates.push_back(address_text(it->ai_addr));
  }
  ::freeaddrinfo(resolved);
  if (loopback) return true;
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) != 0) return false;
  bool found = false;
  for (ifaddrs* it = interfaces; it != nullptr && !found; it = it->ifa_next) {
    if (it->ifa_addr == nullptr) continue;
    const std::string mine = address_text(it->ifa_addr);
    for (const std::string& candidate : candidates)
      found = found || (!mine.empty() && mine == candidate);
  }
  ::freeifaddrs(interfaces);
  return found;
}

}  // namespace hvd::core
