// The TCP operations under the rendezvous store, on loopback: each bounded by its deadline, a peer
// that goes away an error (never a SIGPIPE), and the addresses and secrets around them.
#include "bootstrap/socket.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <string>
#include <thread>
#include <vector>

namespace hvd::core {
namespace {

using namespace std::chrono_literals;

// A listener on loopback, a client connected to it, and the server's end of that connection.
struct Connection {
  Fd listener, client, server;
};

// The next connection on `listener`, waiting for it no longer than `within`.
Fd accept_within(const Fd& listener, std::chrono::milliseconds within) {
  pollfd p{listener.get(), POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(within.count())) != 1) return Fd();
  return Fd(::accept(listener.get(), nullptr, nullptr));
}

Connection connect_on_loopback() {
  Connection c;
  HostPort at;
  auto listener = listen_tcp(HostPort{"127.0.0.1", 0}, &at);
  EXPECT_TRUE(listener.ok()) << listener.status().to_string();
  if (!listener.ok()) return c;
  c.listener = std::move(listener).value();
  auto client = connect_tcp(at, deadline_after(30s));
  EXPECT_TRUE(client.ok()) << client.status().to_string();
  if (!client.ok()) return c;
  c.client = std::move(client).value();
  c.server = accept_within(c.listener, 30s);
  EXPECT_TRUE(c.server.valid());
  return c;
}

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

TEST(Fd, ClosesWhatItOwnsOnceAndMovesOwnership) {
  int raw[2];
  ASSERT_EQ(::pipe(raw), 0);
  {
    Fd a(raw[0]);
    Fd b(std::move(a));
    EXPECT_FALSE(a.valid());
    EXPECT_EQ(b.get(), raw[0]);
    Fd c(raw[1]);
    c = std::move(b);  // closes c's own first
    EXPECT_FALSE(is_open(raw[1]));
    EXPECT_TRUE(is_open(raw[0]));
    EXPECT_EQ(c.get(), raw[0]);
  }
  EXPECT_FALSE(is_open(raw[0]));
  ASSERT_EQ(::pipe(raw), 0);
  Fd kept(raw[0]);
  EXPECT_EQ(kept.release(), raw[0]);
  kept.reset();
  EXPECT_TRUE(is_open(raw[0]));  // released: no longer its to close
  ::close(raw[0]);
  ::close(raw[1]);
}

TEST(ListenTcp, PortZeroBindsAFreePortAndSaysWhich) {
  HostPort bound;
  auto fd = listen_tcp(HostPort{"127.0.0.1", 0}, &bound);
  ASSERT_TRUE(fd.ok()) << fd.status().to_string();
  EXPECT_EQ(bound.host, "127.0.0.1");
  EXPECT_NE(bound.port, 0);
  // The port is taken now.
  EXPECT_EQ(listen_tcp(bound, nullptr).status().code(), HVD_ERR_SYSTEM);
}

TEST(Loopback, BytesArriveWholeAndInOrder) {
  Connection c = connect_on_loopback();
  ASSERT_TRUE(c.server.valid());
  EXPECT_EQ(local_address_of(c.client.get()), "127.0.0.1");
  // More than the sockets buffer: send_all must go on as the reader drains.
  std::vector<char> sent(8 << 20);
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<char>(i * 7 + i / 4096);
  Status send_status;
  std::thread sender([&] {
    send_status = send_all(c.client.get(), sent.data(), sent.size(), deadline_after(60s));
  });
  std::vector<char> got(sent.size());
  const Status recv_status = recv_all(c.server.get(), got.data(), got.size(), deadline_after(60s));
  sender.join();
  ASSERT_TRUE(send_status.ok()) << send_status.to_string();
  ASSERT_TRUE(recv_status.ok()) << recv_status.to_string();
  EXPECT_TRUE(got == sent);
}

TEST(Loopback, RecvSomeTakesNoMoreThanAskedAndWhatIsThere) {
  Connection c = connect_on_loopback();
  ASSERT_TRUE(c.server.valid());
  ASSERT_TRUE(send_all(c.client.get(), "0123456789", 10, deadline_after(30s)).ok());
  char buffer[64] = {};
  auto first = recv_some(c.server.get(), buffer, 4, deadline_after(30s));
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_EQ(*first, 4u);
  EXPECT_EQ(std::string(buffer, 4), "0123");
  // All ten bytes left in one send: the rest are there by now, and one recv takes them.
  auto rest = recv_some(c.server.get(), buffer, sizeof buffer, deadline_after(30s));
  ASSERT_TRUE(rest.ok()) << rest.status().to_string();
  EXPECT_EQ(std::string(buffer, *rest), "456789");
}

TEST(Loopback, AReceiveWithNothingComingEndsAtItsDeadline) {
  Connection c = connect_on_loopback();
  ASSERT_TRUE(c.server.valid());
  char byte;
  const auto start = Clock::now();
  auto got = recv_some(c.server.get(), &byte, 1, deadline_after(200ms));
  EXPECT_GE(Clock::now() - start, 150ms);  // it waited, rather than giving up at once
  EXPECT_EQ(got.status().code(), HVD_ERR_TIMEOUT);
  EXPECT_EQ(got.status().message(), "timed out while waiting for the rendezvous peer");
  EXPECT_EQ(recv_all(c.server.get(), &byte, 1, deadline_after(100ms)).code(), HVD_ERR_TIMEOUT);
}

TEST(Loopback, APeerThatClosesIsAnErrorEvenHalfwayThroughAMessage) {
  Connection c = connect_on_loopback();
  ASSERT_TRUE(c.server.valid());
  ASSERT_TRUE(send_all(c.client.get(), "abc", 3, deadline_after(30s)).ok());
  c.client.reset();
  char buffer[8];
  const Status s = recv_all(c.server.get(), buffer, sizeof buffer, deadline_after(30s));
  EXPECT_EQ(s.code(), HVD_ERR_REMOTE);
  EXPECT_EQ(s.message(), "connection closed by the peer");
  EXPECT_EQ(std::string(buffer, 3), "abc");  // what came before the close was taken
}

TEST(Loopback, SendingToAPeerThatWentAwayIsAnErrorAndRaisesNoSigpipe) {
  // SIGPIPE is held pending for this thread rather than delivered: a send without MSG_NOSIGNAL
  // would leave it pending here (and, unblocked, end the process).
  sigset_t pipe_only, before;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  ASSERT_EQ(::pthread_sigmask(SIG_BLOCK, &pipe_only, &before), 0);
  Connection c = connect_on_loopback();
  ASSERT_TRUE(c.server.valid());
  c.server.reset();
  c.listener.reset();
  // The first sends may still be taken by the kernel; the reset that answers them makes a later
  // one fail with EPIPE, the error that raises SIGPIPE.
  std::vector<Status> failures;
  for (int i = 0; i < 200 && failures.size() < 2; ++i) {
    const Status s = send_all(c.client.get(), "x", 1, deadline_after(30s));
    if (!s.ok()) failures.push_back(s);
    if (s.ok()) std::this_thread::sleep_for(5ms);
  }
  ASSERT_EQ(failures.size(), 2u) << "sending to a closed peer kept succeeding";
  for (const Status& s : failures) {
    EXPECT_EQ(s.code(), HVD_ERR_REMOTE);
    EXPECT_EQ(s.message().rfind("connection lost while sending: ", 0), 0u) << s.message();
  }
  sigset_t pending;
  ASSERT_EQ(::sigpending(&pending), 0);
  const bool raised = sigismember(&pending, SIGPIPE) == 1;
  if (raised) {
    const timespec now{0, 0};
    (void)::sigtimedwait(&pipe_only, nullptr, &now);
  }
  ASSERT_EQ(::pthread_sigmask(SIG_SETMASK, &before, nullptr), 0);
  EXPECT_FALSE(raised);
}

TEST(Loopback, ASendIntoAFullBufferWaitsNoLongerThanItsDeadline) {
  Connection c = connect_on_loopback();
  ASSERT_TRUE(c.server.valid());
  ASSERT_TRUE(set_nonblocking(c.client.get()).ok());
  // Nobody reads: the buffers fill, and then a non-blocking send takes nothing.
  std::vector<char> chunk(64 << 10, 'z');
  size_t taken = 1;
  for (int i = 0; i < 10000 && taken > 0; ++i) {
    auto n = send_nonblocking(c.client.get(), chunk.data(), chunk.size());
    ASSERT_TRUE(n.ok()) << n.status().to_string();
    taken = *n;
  }
  ASSERT_EQ(taken, 0u) << "the socket's buffers never filled";
  const auto start = Clock::now();
  const Status s = send_all(c.client.get(), chunk.data(), chunk.size(), deadline_after(200ms));
  EXPECT_GE(Clock::now() - start, 150ms);  // it waited, rather than giving up at once
  EXPECT_EQ(s.code(), HVD_ERR_TIMEOUT);
  EXPECT_EQ(s.message(), "timed out while sending to the rendezvous peer");
}

// A port nobody listens on (bound, then closed).
HostPort free_port() {
  HostPort at;
  { auto fd = listen_tcp(HostPort{"127.0.0.1", 0}, &at); }
  return at;
}

TEST(ConnectTcp, RetriesARefusedConnectionUntilTheServerListens) {
  const HostPort at = free_port();
  Result<Fd> connected = error(HVD_ERR_INTERNAL, "not yet");
  std::thread client([&] { connected = connect_tcp(at, deadline_after(60s)); });
  std::this_thread::sleep_for(100ms);  // refused a few times by now
  auto listener = listen_tcp(at, nullptr);
  ASSERT_TRUE(listener.ok()) << listener.status().to_string();
  Fd server = accept_within(*listener, 60s);
  client.join();
  ASSERT_TRUE(server.valid());
  ASSERT_TRUE(connected.ok()) << connected.status().to_string();
  ASSERT_TRUE(send_all(connected->get(), "hi", 2, deadline_after(30s)).ok());
  char got[2];
  ASSERT_TRUE(recv_all(server.get(), got, 2, deadline_after(30s)).ok());
  EXPECT_EQ(std::string(got, 2), "hi");
}

TEST(ConnectTcp, NobodyListeningIsATimeoutThatSaysWhatItLastHeard) {
  const HostPort at = free_port();
  auto refused = connect_tcp(at, deadline_after(300ms));
  EXPECT_EQ(refused.status().code(), HVD_ERR_TIMEOUT);
  EXPECT_EQ(refused.status().message(),
            "could not connect to " + at.to_string() + " before the timeout (Connection refused)");
}

TEST(ConnectTcp, AListenerThatNeverAcceptsCostsOnlyTheTimeout) {
  // A full accept queue makes the kernel drop new SYNs: the connect must still end at its
  // deadline, not after the kernel's SYN retries (minutes).
  Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener.get(), 0), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const HostPort at{"127.0.0.1", ntohs(addr.sin_port)};
  std::vector<Fd> queued;  // fill the queue (it holds one or two connections)
  for (int i = 0; i < 3; ++i) {
    auto fd = connect_tcp(at, deadline_after(200ms));
    if (fd.ok()) queued.push_back(std::move(fd).value());
  }
  const auto start = Clock::now();
  auto refused = connect_tcp(at, deadline_after(300ms));
  EXPECT_EQ(refused.status().code(), HVD_ERR_TIMEOUT);
  EXPECT_LT(Clock::now() - start, 1s);
}

TEST(HostPort, Parses) {
  EXPECT_EQ(parse_host_port("10.0.0.1:29500")->port, 29500);
  EXPECT_EQ(parse_host_port("[::1]:80")->host, "::1");
  EXPECT_FALSE(parse_host_port("nohost").ok());
  EXPECT_FALSE(parse_host_port("h:99999").ok());
  EXPECT_FALSE(parse_host_port("h:").ok());
  EXPECT_EQ(parse_host_port("h:65535")->port, 65535);
  for (const char* loose :
       {"h:+80", "h: 80", "h:80 ", "h:-0", "h:0x50", "h:18446744073709551696"}) {
    EXPECT_EQ(parse_host_port(loose).status().message(),
              std::string("'") + loose + "' has no valid port (0-65535)");
  }
}

TEST(HostPort, SaysWhatIsWrongWithTheShape) {
  EXPECT_EQ(parse_host_port("nohost").status().message(), "'nohost' is not host:port");
  EXPECT_EQ(parse_host_port("[::1]").status().message(), "'[::1]' is not [address]:port");
  EXPECT_EQ(parse_host_port("[::1]80").status().message(), "'[::1]80' is not [address]:port");
  // The last colon separates the port; an empty host binds every address.
  EXPECT_EQ(parse_host_port(":0")->host, "");
}

TEST(InterfaceAddress, LoopbackIsThereAndAnUnknownNameListsTheOthers) {
  const auto loopback = interface_address("lo");
  ASSERT_TRUE(loopback.ok()) << loopback.status().to_string();
  EXPECT_EQ(*loopback, "127.0.0.1");
  const auto missing = interface_address("hvd-no-such0");
  EXPECT_EQ(missing.status().code(), HVD_ERR_NOT_FOUND);
  const std::string m = missing.status().message();
  EXPECT_EQ(m.rfind("no IPv4 interface 'hvd-no-such0' on this host (it has: ", 0), 0u) << m;
  EXPECT_NE(m.find("lo"), std::string::npos) << m;
  EXPECT_NE(first_external_address(), "127.0.0.1");  // never loopback
}

TEST(RandomSecret, Is128BitsOfHexAndNeverTheSameTwice) {
  const std::string a = random_secret(), b = random_secret();
  EXPECT_EQ(a.size(), 32u);
  for (char ch : a) EXPECT_TRUE(std::isxdigit(static_cast<unsigned char>(ch))) << a;
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace hvd::core
