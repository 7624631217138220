// hvd-store-attack: the rendezvous store (TcpStoreServer) under attack, measured. Not a ctest:
// scripts/store-attack.sh runs it (tests/unit/store_test.cpp has the same attacks, smaller).
//
// The server runs in a child process, so that its resident memory, threads and CPU time are its
// own. Phases:
//   cycles  connect and close, as fast as a few threads can (half with a reset, half with a FIN)
//   flood   that many concurrent unauthenticated connections, each announcing a 1 GiB frame and
//           sending 64 KiB of it, all held open
//   slow    that many unauthenticated connections, each sending part of a hello and stopping
//   fds     a second server with 256 descriptors: floods of silent connections, then ranks that
//           take every descriptor and a backlog of newcomers (the server must neither spin nor
//           lock a rank out)
// Meanwhile a real rank joins again and again (connect with the secret, one set, one get). The
// goals: the server survives, its RSS grows by less than 64 MiB, every join takes under 1 s.
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/store.hpp"

namespace {

using namespace std::chrono_literals;
using hvd::core::Bytes;
using hvd::core::Clock;
using hvd::core::Fd;
using hvd::core::HostPort;
using hvd::core::TcpStoreClient;
using hvd::core::TcpStoreServer;

constexpr const char* kSecret = "0123456789abcdef0123456789abcdef";

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// ---- The server, in a child process --------------------------------------------------------

class ServerProcess {
 public:
  // Fork a server with at most `nofile` descriptors (0: as inherited). Call before any thread.
  bool start(rlim_t nofile) {
    int channel[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, channel) != 0) return false;
    pid_ = ::fork();
    if (pid_ < 0) return false;
    if (pid_ == 0) {
      ::close(channel[0]);
      serve(channel[1], nofile);
    }
    ::close(channel[1]);
    channel_ = Fd(channel[0]);
    uint16_t port = 0;
    if (::read(channel_.get(), &port, sizeof port) != sizeof port) return false;
    address_ = HostPort{"127.0.0.1", port};
    return true;
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      channel_.reset();  // the child exits when its end reads EOF
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }

  const HostPort& address() const { return address_; }
  bool alive() const { return pid_ > 0 && ::kill(pid_, 0) == 0 && !exited(); }
  // /proc/<pid>/status: VmRSS (kB), Threads.
  long status_field(const std::string& field) const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind(field + ":", 0) == 0) return std::atol(line.c_str() + field.size() + 1);
    }
    return -1;
  }
  double rss_mib() const { return status_field("VmRSS") / 1024.0; }
  double cpu_seconds() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/stat");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t paren = text.rfind(')');
    unsigned long utime = 0, stime = 0;
    if (paren == std::string::npos ||
        std::sscanf(text.c_str() + paren + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
                    &utime, &stime) != 2) {
      return -1;
    }
    return double(utime + stime) / double(::sysconf(_SC_CLK_TCK));
  }
  // The server's own counters, as one line.
  std::string stats() {
    const char ask = 's';
    if (::write(channel_.get(), &ask, 1) != 1) return "(no answer)";
    char line[512];
    const ssize_t n = ::read(channel_.get(), line, sizeof line - 1);
    return n > 0 ? std::string(line, static_cast<size_t>(n)) : "(no answer)";
  }

 private:
  bool exited() const {
    int status = 0;
    return ::waitpid(pid_, &status, WNOHANG) == pid_;
  }

  [[noreturn]] static void serve(int channel, rlim_t nofile) {
    if (nofile > 0) {
      rlimit limit{nofile, nofile};
      ::setrlimit(RLIMIT_NOFILE, &limit);
    }
    auto server = TcpStoreServer::start(HostPort{"127.0.0.1", 0}, kSecret);
    if (!server.ok()) {
      std::fprintf(stderr, "server: %s\n", server.status().to_string().c_str());
      ::_exit(2);
    }
    const uint16_t port = (*server)->address().port;
    if (::write(channel, &port, sizeof port) != sizeof port) ::_exit(3);
    char c;
    while (::read(channel, &c, 1) == 1) {
      const hvd::core::TcpStoreStats s = (*server)->stats();
      char line[512];
      const int n = std::snprintf(
          line, sizeof line,
          "accepted %llu, authenticated %llu, wrong secret %llu, oversized or malformed %llu, "
          "evicted %llu, auth timeouts %llu, over capacity %llu, out of descriptors %llu; "
          "open now %llu",
          (unsigned long long)s.accepted, (unsigned long long)s.authenticated,
          (unsigned long long)s.wrong_secret, (unsigned long long)s.bad_frame,
          (unsigned long long)s.evicted, (unsigned long long)s.auth_timeouts,
          (unsigned long long)s.over_capacity, (unsigned long long)s.fd_exhausted,
          (unsigned long long)s.open);
      if (::write(channel, line, static_cast<size_t>(n)) != n) break;
    }
    server = hvd::Result<std::unique_ptr<TcpStoreServer>>(nullptr);
    ::_exit(0);
  }

  pid_t pid_ = -1;
  Fd channel_;
  HostPort address_;
};

// ---- Attackers and a rank ------------------------------------------------------------------

// A connection from 127.0.0.<source>: many source addresses give the cycles enough ports.
Fd connect_from(const HostPort& server, int source) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return fd;
  const int one = 1;
  ::setsockopt(fd.get(), IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  from.sin_addr.s_addr = htonl(0x7f000000u | static_cast<uint32_t>(source));
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(server.port);
  to.sin_addr.s_addr = htonl(0x7f000001u);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&from), sizeof from) != 0 ||
      ::connect(fd.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    fd.reset();
  }
  return fd;
}

void send_some(int fd, const Bytes& data) {
  (void)hvd::core::send_all(fd, data.data(), data.size(), hvd::core::deadline_after(2s));
}

Bytes header(uint32_t size) {
  Bytes out(4);
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((size >> (8 * i)) & 0xff);
  return out;
}

// A real rank joining, again and again while an attack runs: the slowest join, and failures.
class Joiner {
 public:
  explicit Joiner(HostPort server) : server_(std::move(server)) {
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        const auto start = Clock::now();
        const bool ok = join_once();
        const double took = seconds_since(start);
        ++joins_;
        if (!ok) ++failed_;
        slowest_ = std::max(slowest_.load(), took);
        std::this_thread::sleep_for(50ms);
      }
    });
  }
  ~Joiner() { finish(); }
  void finish() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int joins() const { return joins_; }
  int failed() const { return failed_; }
  double slowest() const { return slowest_; }

 private:
  bool join_once() {
    auto c = TcpStoreClient::connect(server_, kSecret, 5s);
    if (!c.ok()) {
      std::fprintf(stderr, "  a rank failed to join: %s\n", c.status().to_string().c_str());
      return false;
    }
    const std::string key = "rank/" + std::to_string(joins_.load());
    if (!(*c)->set(key, Bytes(64, 'r')).ok()) return false;
    auto got = (*c)->get(key, 1s);
    return got.ok() && got->size() == 64;
  }

  HostPort server_;
  std::atomic<bool> stop_{false};
  std::atomic<int> joins_{0}, failed_{0};
  std::atomic<double> slowest_{0};
  std::thread thread_;
};

struct Goals {
  double rss_before = 0;
  double rss_peak = 0;
  double slowest_join = 0;
  int failed_joins = 0;
  bool server_died = false;
  bool other_failure = false;

  void joins(const Joiner& j) {
    slowest_join = std::max(slowest_join, j.slowest());
    failed_joins += j.failed();
  }
  void rss(const ServerProcess& s) {
    rss_peak = std::max(rss_peak, s.rss_mib());
    if (!s.alive()) server_died = true;
  }
};

// ---- Phases ------------------------------------------------------------------------------------

void cycles(ServerProcess& server, long count, int threads, Goals& goals) {
  Joiner joiner(server.address());
  std::atomic<long> next{0}, failed{0};
  const auto start = Clock::now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      for (long i = next++; i < count; i = next++) {
        Fd fd = connect_from(server.address(), 2 + static_cast<int>(i % 64));
        if (!fd.valid()) {
          ++failed;
          continue;
        }
        if (i % 2 == 0) {  // a reset; else a FIN
          linger hard{1, 0};
          ::setsockopt(fd.get(), SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  const double took = seconds_since(start);
  joiner.finish();
  goals.joins(joiner);
  goals.rss(server);
  if (failed > count / 1000) goals.other_failure = true;
  std::printf(
      "[cycles] %ld connect/close cycles by %d threads in %.2f s: %.0f cycles/s, %ld failed to "
      "connect\n         a rank joined %d times meanwhile, slowest %.3f s, %d failed; server RSS "
      "%.1f MiB, %ld threads\n",
      count, threads, took, count / took, failed.load(), joiner.joins(), joiner.slowest(),
      joiner.failed(), server.rss_mib(), server.status_field("Threads"));
}

void flood(ServerProcess& server, int count, Goals& goals) {
  Joiner joiner(server.address());
  std::vector<Fd> peers;
  const Bytes announce = header(1u << 30);
  const Bytes part(64 << 10, 'j');
  const auto start = Clock::now();
  for (int i = 0; i < count; ++i) {
    Fd fd = connect_from(server.address(), 2 + i % 64);
    if (!fd.valid()) continue;
    send_some(fd.get(), announce);
    send_some(fd.get(), part);  // the server may have hung up already
    peers.push_back(std::move(fd));
  }
  const double took = seconds_since(start);
  std::this_thread::sleep_for(300ms);
  goals.rss(server);
  const double rss_held = server.rss_mib();
  joiner.finish();
  goals.joins(joiner);
  std::printf(
      "[flood]  %zu concurrent unauthenticated connections, each announcing a 1 GiB frame and "
      "sending 64 KiB of it, in %.2f s, all held open\n         server RSS %.1f MiB while held; "
      "a rank joined %d times meanwhile, slowest %.3f s, %d failed\n",
      peers.size(), took, rss_held, joiner.joins(), joiner.slowest(), joiner.failed());
}

void slow(ServerProcess& server, int count, Goals& goals) {
  Joiner joiner(server.address());
  std::vector<Fd> peers;
  Bytes partial = header(1000);  // a hello-sized frame, of which only half ever comes
  partial.resize(4 + 500, 'h');
  for (int i = 0; i < count; ++i) {
    Fd fd = connect_from(server.address(), 2 + i % 64);
    if (!fd.valid()) continue;
    send_some(fd.get(), partial);
    peers.push_back(std::move(fd));
  }
  std::this_thread::sleep_for(300ms);
  goals.rss(server);
  const double rss_held = server.rss_mib();
  joiner.finish();
  goals.joins(joiner);
  std::printf(
      "[slow]   %zu unauthenticated connections each sending half of a 1000-byte hello, held "
      "open\n         server RSS %.1f MiB while held; a rank joined %d times meanwhile, slowest "
      "%.3f s, %d failed\n",
      peers.size(), rss_held, joiner.joins(), joiner.slowest(), joiner.failed());
}

void descriptors(Goals& goals) {
  ServerProcess server;
  if (!server.start(256)) {
    std::printf("[fds]    could not start a server with 256 descriptors\n");
    goals.other_failure = true;
    return;
  }
  const double rss_before = server.rss_mib();
  double slowest = 0;
  int failed = 0;
  {
    Joiner joiner(server.address());
    std::vector<Fd> silent;
    for (int i = 0; i < 1000; ++i) silent.push_back(connect_from(server.address(), 2 + i % 64));
    std::this_thread::sleep_for(300ms);
    joiner.finish();
    slowest = joiner.slowest();
    failed = joiner.failed();
    goals.joins(joiner);
  }
  // Ranks take every descriptor; newcomers pile up in the backlog.
  std::vector<std::unique_ptr<TcpStoreClient>> ranks;
  std::string refusal;
  while (ranks.size() < 300) {
    auto c = TcpStoreClient::connect(server.address(), kSecret, 5s);
    if (!c.ok()) {
      refusal = c.status().message();
      break;
    }
    ranks.push_back(std::move(c).value());
  }
  std::vector<Fd> backlog;
  for (int i = 0; i < 200; ++i) backlog.push_back(connect_from(server.address(), 2 + i % 64));
  std::this_thread::sleep_for(300ms);
  const double cpu_before = server.cpu_seconds();
  std::this_thread::sleep_for(1s);
  const double cpu = server.cpu_seconds() - cpu_before;
  const bool still_served = !ranks.empty() && ranks.front()->set("still", Bytes(1, 'x')).ok();
  if (cpu > 0.2 || !still_served || refusal.find("no file descriptor") == std::string::npos) {
    goals.other_failure = true;
  }
  if (!server.alive()) goals.server_died = true;
  std::printf(
      "[fds]    a server with 256 descriptors: 1000 silent connections, a rank joined meanwhile "
      "(slowest %.3f s, %d failed);\n         %zu ranks took every descriptor, the next was told "
      "'%s'; with 200 more waiting in the backlog the server used %.0f%% of a CPU, and still "
      "served its ranks: %s; RSS %.1f -> %.1f MiB\n         %s\n",
      slowest, failed, ranks.size(), refusal.c_str(), 100 * cpu, still_served ? "yes" : "no",
      rss_before, server.rss_mib(), server.stats().c_str());
}

long arg(int argc, char** argv, const char* name, long fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atol(argv[i + 1]);
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const long cycle_count = arg(argc, argv, "--cycles", 100000);
  const int threads = static_cast<int>(arg(argc, argv, "--threads", 2));
  const int flood_count = static_cast<int>(arg(argc, argv, "--flood", 500));
  if (argc > 1 && std::string(argv[1]) == "--help") {
    std::printf("usage: hvd-store-attack [--cycles N] [--threads N] [--flood N]\n");
    return 0;
  }
  ::signal(SIGPIPE, SIG_IGN);  // the attackers write to connections the server closes

  // Attackers hold a few thousand sockets at once.
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }

  ServerProcess server;
  if (!server.start(0)) {
    std::fprintf(stderr, "hvd-store-attack: could not start the server\n");
    return 1;
  }
  Goals goals;
  {
    Joiner warm_up(server.address());  // the server's first rank, before the baseline
    std::this_thread::sleep_for(200ms);
  }
  goals.rss_before = goals.rss_peak = server.rss_mib();
  std::printf("server at %s, a process of its own: RSS %.1f MiB, %ld threads before any attack\n",
              server.address().to_string().c_str(), goals.rss_before,
              server.status_field("Threads"));

  cycles(server, cycle_count, threads, goals);
  flood(server, flood_count, goals);
  slow(server, flood_count, goals);
  const double rss_after = server.rss_mib();
  goals.rss(server);
  std::printf("         %s\n", server.stats().c_str());
  descriptors(goals);

  const double growth = goals.rss_peak - goals.rss_before;
  const bool pass = !goals.server_died && growth < 64 && goals.slowest_join < 1.0 &&
                    goals.failed_joins == 0 && !goals.other_failure;
  std::printf(
      "result: server %s; RSS %.1f MiB before, %.1f MiB after, peak growth %.1f MiB (goal < 64); "
      "slowest join %.3f s (goal < 1 s), %d failed joins: %s\n",
      goals.server_died ? "DIED" : "alive", goals.rss_before, rss_after, growth, goals.slowest_join,
      goals.failed_joins, pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
