// The rendezvous store: the in-memory store, the TCP server and client, the wire protocol's
// decoder, and the server under attack (floods of connections, huge announced frames, silent
// peers, descriptor exhaustion) with the bounds it must keep.
#include "bootstrap/store.hpp"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

namespace hvd::core {
namespace {

using namespace std::chrono_literals;

Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

// A field of /proc/<pid>/status in its own unit (kB for VmRSS), or -1.
long proc_status(const std::string& field, pid_t pid = 0) {
  std::ifstream in(pid == 0 ? "/proc/self/status" : "/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::atol(line.c_str() + field.size() + 1);
  }
  return -1;
}
long rss_mib() { return proc_status("VmRSS") / 1024; }

// Floods need more descriptors than a default soft limit of 1024 may leave.
void raise_fd_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

Bytes header(uint32_t size) {
  Bytes out(4);
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((size >> (8 * i)) & 0xff);
  return out;
}

// A peer speaking the wire protocol by hand, or not speaking it at all.
class RawPeer {
 public:
  explicit RawPeer(const HostPort& server) {
    auto fd = connect_tcp(server, deadline_after(5s));
    if (fd.ok()) fd_ = std::move(fd).value();
  }
  bool connected() const { return fd_.valid(); }
  bool send(const Bytes& data) {
    return send_all(fd_.get(), data.data(), data.size(), deadline_after(5s)).ok();
  }
  // The next reply: its status and body; an error when the server closed without one.
  Result<std::pair<hvd_status, std::string>> reply(std::chrono::milliseconds within = 5s) {
    FrameDecoder decoder(kStoreMaxFrame);
    char chunk[4096];
    const Deadline deadline = deadline_after(within);
    while (!decoder.complete()) {
      HVD_ASSIGN_OR_RETURN(size_t n, recv_some(fd_.get(), chunk,
                                               std::min(sizeof chunk, decoder.wanted()), deadline));
      HVD_RETURN_IF_ERROR(decoder.feed(chunk, n).status());
    }
    Bytes payload = decoder.take();
    if (payload.empty()) return error(HVD_ERR_REMOTE, "empty reply");
    return std::make_pair(static_cast<hvd_status>(payload[0]),
                          std::string(payload.begin() + 1, payload.end()));
  }
  // True when the server closed the connection (within the time given).
  bool closed_by_server(std::chrono::milliseconds within = 5s) {
    char c;
    for (;;) {
      Result<size_t> n = recv_some(fd_.get(), &c, 1, deadline_after(within));
      if (!n.ok()) return n.status().code() == HVD_ERR_REMOTE;
    }
  }
  // Close with a reset rather than a FIN: no TIME_WAIT left behind on this side.
  void reset() {
    linger hard{1, 0};
    ::setsockopt(fd_.get(), SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
    fd_.reset();
  }
  int fd() const { return fd_.get(); }

 private:
  Fd fd_;
};

// How long a real rank takes to join (connect, authenticate, one set and one get); -1 if it
// failed.
double join_seconds(const HostPort& server, const std::string& secret) {
  const auto start = Clock::now();
  auto c = TcpStoreClient::connect(server, secret, 5s);
  if (!c.ok()) return -1;
  if (!(*c)->set("joined", bytes("yes")).ok()) return -1;
  auto got = (*c)->get("joined", 1s);
  if (!got.ok() || *got != bytes("yes")) return -1;
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Wait until `pred` holds (checked every few ms) or `within` passes.
template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds within = 5s) {
  const Deadline deadline = deadline_after(within);
  while (!pred()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

TEST(InMemoryStore, SetThenGetAndTimeout) {
  InMemoryStore store;
  ASSERT_TRUE(store.set("a", bytes("1")).ok());
  auto got = store.get("a", 0ms);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, bytes("1"));
  auto missing = store.get("b", 50ms);
  EXPECT_EQ(missing.status().code(), HVD_ERR_TIMEOUT);
  EXPECT_EQ(missing.status().message(), "rendezvous key 'b' was not published within 50 ms");
}

TEST(InMemoryStore, GetWaitsForALaterSet) {
  InMemoryStore store;
  std::thread writer([&] {
    std::this_thread::sleep_for(50ms);
    (void)store.set("late", bytes("x"));
  });
  auto got = store.get("late", 5s);
  writer.join();
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, bytes("x"));
}

class TcpStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = TcpStoreServer::start(HostPort{"127.0.0.1", 0}, "s3cret");
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(server).value();
  }
  std::unique_ptr<TcpStoreClient> client(const std::string& secret = "s3cret") {
    auto c = TcpStoreClient::connect(server_->address(), secret, 5s);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  std::unique_ptr<TcpStoreServer> server_;
};

TEST_F(TcpStoreTest, ValuesTravelBetweenClients) {
  auto a = client();
  auto b = client();
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(a->set("k", bytes("hello")).ok());
  auto got = b->get("k", 1s);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, bytes("hello"));
  EXPECT_EQ(a->local_address(), "127.0.0.1");
  // Empty and large values.
  ASSERT_TRUE(a->set("empty", {}).ok());
  EXPECT_TRUE(b->get("empty", 1s)->empty());
  Bytes big(3 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 31);
  ASSERT_TRUE(a->set("big", big).ok());
  EXPECT_EQ(*b->get("big", 1s), big);
}

TEST_F(TcpStoreTest, WrongSecretIsRefusedWithAReason) {
  auto refused = TcpStoreClient::connect(server_->address(), "guess", 5s);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), HVD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(refused.status().message().find("authentication failed"), std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find(server_->address().to_string()), std::string::npos);
}

TEST_F(TcpStoreTest, GetTimesOutWithinItsBound) {
  auto c = client();
  ASSERT_TRUE(c);
  const auto start = Clock::now();
  auto got = c->get("never", 200ms);
  const auto took = Clock::now() - start;
  EXPECT_EQ(got.status().code(), HVD_ERR_TIMEOUT);
  EXPECT_GE(took, 200ms);
  EXPECT_LT(took, 3s);
  // The connection stays usable after a timeout.
  ASSERT_TRUE(c->set("after", bytes("ok")).ok());
  EXPECT_TRUE(c->get("after", 1s).ok());
}

TEST_F(TcpStoreTest, ConcurrentClientsSeeEveryonesKeys) {
  constexpr int kClients = 16;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      auto c = TcpStoreClient::connect(server_->address(), "s3cret", 5s);
      if (!c.ok()) return;
      if (!(*c)->set("rank/" + std::to_string(i), bytes(std::to_string(i))).ok()) return;
      for (int j = 0; j < kClients; ++j) {
        auto got = (*c)->get("rank/" + std::to_string(j), 5s);
        if (!got.ok() || *got != bytes(std::to_string(j))) return;
      }
      ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kClients);
}

TEST_F(TcpStoreTest, ServerShutdownWakesAWaitingClient) {
  auto c = client();
  ASSERT_TRUE(c);
  std::thread stopper([&] {
    std::this_thread::sleep_for(100ms);
    server_.reset();
  });
  const auto start = Clock::now();
  auto got = c->get("never", 30s);
  stopper.join();
  EXPECT_FALSE(got.ok());
  EXPECT_LT(Clock::now() - start, 5s);
}

TEST(TcpStoreClient, ConnectTimesOutWhenNobodyListens) {
  // Find a port nobody listens on: bind one, then close it.
  HostPort free_port;
  { auto fd = listen_tcp(HostPort{"127.0.0.1", 0}, &free_port); }
  const auto start = Clock::now();
  auto c = TcpStoreClient::connect(free_port, "x", 300ms);
  EXPECT_EQ(c.status().code(), HVD_ERR_TIMEOUT);
  EXPECT_LT(Clock::now() - start, 3s);
}

// ---- The wire protocol's decoder ------------------------------------------------------------

TEST(FrameDecoder, GrowsWithTheBytesThatArriveNotWithTheHeader) {
  FrameDecoder decoder(kStoreMaxFrame);
  const Bytes announce = header(200u << 20);
  ASSERT_EQ(*decoder.feed(announce.data(), announce.size()), 4u);
  EXPECT_EQ(decoder.wanted(), size_t{200} << 20);
  const Bytes some(1000, 'x');
  ASSERT_EQ(*decoder.feed(some.data(), some.size()), some.size());
  EXPECT_EQ(decoder.buffered(), 1000u);
  EXPECT_LE(decoder.capacity(), 2000u);  // not 200 MiB
  EXPECT_FALSE(decoder.complete());
}

TEST(FrameDecoder, RefusesAHeaderOverTheLimitAndStopsThere) {
  FrameDecoder decoder(kStoreMaxHelloFrame);
  const Bytes announce = header(1u << 30);
  auto took = decoder.feed(announce.data(), announce.size());
  ASSERT_FALSE(took.ok());
  EXPECT_EQ(took.status().message(),
            "a rendezvous message of 1073741824 bytes is over the limit of 1024 bytes");
  EXPECT_EQ(decoder.capacity(), 0u);
  EXPECT_FALSE(decoder.feed(announce.data(), 1).ok());  // the stream is over
}

TEST(FrameDecoder, TakesNoByteBeyondTheFrameInProgress) {
  Bytes stream = encode_get("k", 5);
  const Bytes second = encode_set("k", "v", 1);
  stream.insert(stream.end(), second.begin(), second.end());
  FrameDecoder decoder(kStoreMaxFrame);
  size_t pos = *decoder.feed(stream.data(), stream.size());
  ASSERT_TRUE(decoder.complete());
  EXPECT_EQ(*decoder.feed(stream.data() + pos, stream.size() - pos), 0u);  // take() first
  auto get = parse_store_request(decoder.take());
  ASSERT_TRUE(get.ok()) << get.status().to_string();
  EXPECT_EQ(get->op, StoreOp::kGet);
  EXPECT_EQ(get->timeout_ms, 5);
  pos += *decoder.feed(stream.data() + pos, stream.size() - pos);
  EXPECT_EQ(pos, stream.size());
  auto set = parse_store_request(decoder.take());
  ASSERT_TRUE(set.ok());
  EXPECT_EQ(set->key, "k");
  EXPECT_EQ(set->value, bytes("v"));
}

TEST(StoreProtocol, MalformedRequestsAreErrors) {
  auto payload_of = [](Bytes frame) { return Bytes(frame.begin() + 4, frame.end()); };
  Bytes trailing = payload_of(encode_hello("s"));
  trailing.push_back('!');
  EXPECT_FALSE(parse_store_request(trailing).ok());
  Bytes cut = payload_of(encode_set("key", "value", 5));
  cut.pop_back();
  EXPECT_FALSE(parse_store_request(cut).ok());
  EXPECT_FALSE(parse_store_request({}).ok());
  auto unknown = parse_store_request(Bytes{9});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("opcode 9"), std::string::npos);
}

// ---- The server's bounds --------------------------------------------------------------------

TEST_F(TcpStoreTest, AGetParkedOnAKeyIsAnsweredByItsSet) {
  constexpr int kWaiters = 20;
  std::atomic<int> answered{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&] {
      auto c = TcpStoreClient::connect(server_->address(), "s3cret", 5s);
      if (!c.ok()) return;
      auto got = (*c)->get("later", 10s);
      if (got.ok() && *got == bytes("now")) ++answered;
    });
  }
  // One thread serves them all: parked gets hold no thread of their own.
  ASSERT_TRUE(eventually([&] { return server_->stats().open == kWaiters; }));
  std::this_thread::sleep_for(50ms);
  auto setter = client();
  ASSERT_TRUE(setter);
  const auto start = Clock::now();
  ASSERT_TRUE(setter->set("later", bytes("now")).ok());
  for (auto& t : waiters) t.join();
  EXPECT_EQ(answered.load(), kWaiters);
  EXPECT_LT(Clock::now() - start, 2s);
}

TEST_F(TcpStoreTest, OneThreadServesEveryConnection) {
  const long threads_before = proc_status("Threads");
  std::vector<std::unique_ptr<TcpStoreClient>> clients;
  std::vector<RawPeer> silent;
  for (int i = 0; i < 50; ++i) {
    clients.push_back(client());
    ASSERT_TRUE(clients.back());
    silent.emplace_back(server_->address());
  }
  ASSERT_TRUE(eventually([&] { return server_->stats().open == 100; }));
  EXPECT_EQ(proc_status("Threads"), threads_before);
}

TEST_F(TcpStoreTest, WrongSecretAndRequestsBeforeTheHelloAreRefused) {
  RawPeer early(server_->address());
  ASSERT_TRUE(early.send(encode_get("k", 0)));
  auto refused = early.reply();
  ASSERT_TRUE(refused.ok()) << refused.status().to_string();
  EXPECT_EQ(refused->first, HVD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(refused->second.find("authentication failed"), std::string::npos);
  EXPECT_TRUE(early.closed_by_server());
  EXPECT_FALSE(TcpStoreClient::connect(server_->address(), "guess", 5s).ok());
  EXPECT_EQ(server_->stats().wrong_secret, 2u);
}

TEST_F(TcpStoreTest, AFrameOverTheLimitIsRefusedWithAReason) {
  // Before authentication the limit is a hello's.
  RawPeer stranger(server_->address());
  ASSERT_TRUE(stranger.send(header(2048)));
  auto refused = stranger.reply();
  ASSERT_TRUE(refused.ok()) << refused.status().to_string();
  EXPECT_EQ(refused->first, HVD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(refused->second,
            "refused before authentication: a rendezvous message of 2048 bytes is over the "
            "limit of 1024 bytes");
  EXPECT_TRUE(stranger.closed_by_server());

  // After it, the store's.
  RawPeer rank(server_->address());
  ASSERT_TRUE(rank.send(encode_hello("s3cret")));
  ASSERT_EQ(rank.reply()->first, HVD_SUCCESS);
  ASSERT_TRUE(rank.send(header(kStoreMaxFrame + 1)));
  refused = rank.reply();
  ASSERT_TRUE(refused.ok()) << refused.status().to_string();
  EXPECT_EQ(refused->second, "refused: a rendezvous message of " +
                                 std::to_string(kStoreMaxFrame + 1) +
                                 " bytes is over the limit of 256 MiB");
  EXPECT_TRUE(rank.closed_by_server());
  EXPECT_EQ(server_->stats().bad_frame, 2u);

  // The client says so before sending anything.
  auto c = client();
  ASSERT_TRUE(c);
  Status too_big = c->set("huge", Bytes(kStoreMaxFrame));
  EXPECT_EQ(too_big.code(), HVD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(too_big.message().find("over the store's limit of 256 MiB"), std::string::npos)
      << too_big.message();
  EXPECT_TRUE(c->set("fine", bytes("still connected")).ok());
}

TEST(TcpStoreAttack, TheAuthenticationDeadlineClosesASilentConnection) {
  TcpStoreLimits limits;
  limits.auth_timeout = 300ms;
  auto server = TcpStoreServer::start(HostPort{"127.0.0.1", 0}, "s3cret", limits);
  ASSERT_TRUE(server.ok());
  RawPeer silent((*server)->address());
  const auto start = Clock::now();
  auto told = silent.reply();
  ASSERT_TRUE(told.ok()) << told.status().to_string();
  EXPECT_EQ(told->first, HVD_ERR_TIMEOUT);
  EXPECT_EQ(told->second, "authentication timed out: no hello within 300 ms of connecting");
  EXPECT_TRUE(silent.closed_by_server());
  EXPECT_GE(Clock::now() - start, 250ms);
  EXPECT_LT(Clock::now() - start, 3s);
  EXPECT_EQ((*server)->stats().auth_timeouts, 1u);
  silent.reset();
  EXPECT_TRUE(eventually([&] { return (*server)->stats().open == 0; }));
}

TEST(TcpStoreAttack, ARankGetsInWhileUnauthenticatedConnectionsFillTheCap) {
  TcpStoreLimits limits;
  limits.max_unauthenticated = 8;
  auto server = TcpStoreServer::start(HostPort{"127.0.0.1", 0}, "s3cret", limits);
  ASSERT_TRUE(server.ok());
  std::vector<RawPeer> silent;
  for (int i = 0; i < 8; ++i) silent.emplace_back((*server)->address());
  ASSERT_TRUE(eventually([&] { return (*server)->stats().unauthenticated == 8; }));
  const double took = join_seconds((*server)->address(), "s3cret");
  EXPECT_GE(took, 0);
  EXPECT_LT(took, 1.0);
  EXPECT_EQ((*server)->stats().evicted, 1u);
  EXPECT_TRUE(silent.front().closed_by_server(1s));  // the oldest made room
}

TEST(TcpStoreAttack, TheConnectionCapRefusesWithAReason) {
  TcpStoreLimits limits;
  limits.max_connections = 3;
  auto server = TcpStoreServer::start(HostPort{"127.0.0.1", 0}, "s3cret", limits);
  ASSERT_TRUE(server.ok());
  std::vector<std::unique_ptr<TcpStoreClient>> ranks;
  for (int i = 0; i < 3; ++i) {
    auto c = TcpStoreClient::connect((*server)->address(), "s3cret", 5s);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    ranks.push_back(std::move(c).value());
  }
  auto refused = TcpStoreClient::connect((*server)->address(), "s3cret", 5s);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), HVD_ERR_STATE);
  EXPECT_NE(refused.status().message().find("limit of 3 connections"), std::string::npos)
      << refused.status().message();
  EXPECT_EQ((*server)->stats().over_capacity, 1u);
}

TEST(TcpStoreAttack, AReplyNobodyReadsIsDroppedAtTheWriteDeadline) {
  TcpStoreLimits limits;
  limits.write_timeout = 300ms;
  auto server = TcpStoreServer::start(HostPort{"127.0.0.1", 0}, "s3cret", limits);
  ASSERT_TRUE(server.ok());
  // The writer's own deadline bounds sending the 64 MiB, which under TSan on a loaded machine
  // took over 5 s; the test is about the reader.
  auto writer = TcpStoreClient::connect((*server)->address(), "s3cret", 60s);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->set("big", Bytes(size_t{64} << 20, 'v')).ok());
  RawPeer reader((*server)->address());
  ASSERT_TRUE(reader.send(encode_hello("s3cret")));
  ASSERT_EQ(reader.reply()->first, HVD_SUCCESS);
  ASSERT_TRUE(reader.send(encode_get("big", 0)));  // and never read the 64 MiB
  ASSERT_TRUE(eventually([&] { return (*server)->stats().write_timeouts == 1; }, 5s));
  EXPECT_TRUE(eventually([&] { return (*server)->stats().open == 1; }));
}

TEST(TcpStoreAttack, ConnectCloseCyclesLeaveNothingBehind) {
  auto server = TcpStoreServer::start(HostPort{"127.0.0.1", 0}, "s3cret");
  ASSERT_TRUE(server.ok());
  const HostPort at = (*server)->address();
  constexpr int kCycles = 2000;
  const long threads_before = proc_status("Threads");
  const long rss_before = rss_mib();
  std::atomic<double> join{-2};
  std::thread rank;
  const auto start = Clock::now();
  for (int i = 0; i < kCycles; ++i) {
    RawPeer peer(at);
    ASSERT_TRUE(peer.connected()) << "cycle " << i;
    if (i % 2 == 0) peer.reset();  // else a FIN; no TIME_WAIT piles up on the server's side
    if (i == kCycles / 2) rank = std::thread([&] { join = join_seconds(at, "s3cret"); });
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  rank.join();
  // Every connection accepted (some may still wait in the accept queue), and every one closed.
  EXPECT_TRUE(eventually([&] {
    const TcpStoreStats s = (*server)->stats();
    return s.accepted == kCycles + 1u && s.open == 0;
  })) << (*server)->stats().accepted
      << " accepted, " << (*server)->stats().open << " open";
  EXPECT_EQ(proc_status("Threads"), threads_before);
  EXPECT_LT(rss_mib() - rss_before, 64);
  EXPECT_GE(join.load(), 0);
  EXPECT_LT(join.load(), 1.0);
  std::printf("%d connect/close cycles in %.2f s (%.0f/s); a rank joined in %.3f s meanwhile\n",
              kCycles, seconds, kCycles / seconds, join.load());
}

TEST(TcpStoreAttack, UnauthenticatedGigabyteAnnouncementsCostNoMemory) {
  raise_fd_limit();
  auto server = TcpStoreServer::start(HostPort{"127.0.0.1", 0}, "s3cret");
  ASSERT_TRUE(server.ok());
  const HostPort at = (*server)->address();
  constexpr int kPeers = 500;
  const long rss_before = rss_mib();
  std::vector<RawPeer> peers;
  std::atomic<double> join{-2};
  std::thread rank;
  const Bytes junk(1000, 'j');
  for (int i = 0; i < kPeers; ++i) {
    peers.emplace_back(at);
    ASSERT_TRUE(peers.back().connected());
    ASSERT_TRUE(peers.back().send(header(1u << 30)));  // "here comes a GiB"
    (void)peers.back().send(junk);  // may fail: the server may have hung up already
    if (i == kPeers / 2) rank = std::thread([&] { join = join_seconds(at, "s3cret"); });
  }
  rank.join();
  // Every one of them is turned away, at its header or as the oldest unauthenticated.
  ASSERT_TRUE(eventually([&] {
    const TcpStoreStats s = (*server)->stats();
    return s.bad_frame + s.evicted == kPeers;
  })) << (*server)->stats().bad_frame
      << " refused, " << (*server)->stats().evicted << " evicted";
  const long growth = rss_mib() - rss_before;
  EXPECT_LT(growth, 64);
  EXPECT_GE(join.load(), 0);
  EXPECT_LT(join.load(), 1.0);
  std::printf("%d peers announcing 1 GiB each: RSS grew %ld MiB; a rank joined in %.3f s\n", kPeers,
              growth, join.load());
}

TEST(TcpStoreAttack, AnAuthenticatedAnnouncementIsNotAllocatedUpFront) {
  auto server = TcpStoreServer::start(HostPort{"127.0.0.1", 0}, "s3cret");
  ASSERT_TRUE(server.ok());
  const long rss_before = rss_mib();
  std::vector<RawPeer> ranks;
  for (int i = 0; i < 8; ++i) {
    ranks.emplace_back((*server)->address());
    ASSERT_TRUE(ranks.back().send(encode_hello("s3cret")));
    ASSERT_EQ(ranks.back().reply()->first, HVD_SUCCESS);
    ASSERT_TRUE(ranks.back().send(header(200u << 20)));  // 8 x 200 MiB announced
    ASSERT_TRUE(ranks.back().send(Bytes(64 << 10, 'x')));
  }
  std::this_thread::sleep_for(100ms);
  EXPECT_LT(rss_mib() - rss_before, 64);
  EXPECT_GE(join_seconds((*server)->address(), "s3cret"), 0);
}

TEST(TcpStoreAttack, ShutdownWithManyConnectionsIsPrompt) {
  raise_fd_limit();
  auto server = TcpStoreServer::start(HostPort{"127.0.0.1", 0}, "s3cret");
  ASSERT_TRUE(server.ok());
  std::vector<RawPeer> peers;
  for (int i = 0; i < 200; ++i) {
    peers.emplace_back((*server)->address());
    if (i % 2 == 0) {
      ASSERT_TRUE(peers.back().send(encode_hello("s3cret")));
      ASSERT_TRUE(peers.back().send(encode_get("never", 60000)));
    }
  }
  ASSERT_TRUE(eventually([&] { return (*server)->stats().open == 200; }));
  const auto start = Clock::now();
  server = Result<std::unique_ptr<TcpStoreServer>>(nullptr);
  EXPECT_LT(Clock::now() - start, 1s);
  EXPECT_TRUE(peers.front().closed_by_server(1s));
}

// A server whose descriptor limit is `limit`, in a child process (the limit is per process). The
// child lives until the parent closes its end, or dies; the destructor kills it.
class ServerInChild {
 public:
  explicit ServerInChild(rlim_t limit) {
    int channel[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, channel) != 0) return;
    pid_ = ::fork();
    if (pid_ < 0) return;
    if (pid_ == 0) {
      ::close(channel[0]);
      rlimit lowered{limit, limit};
      ::setrlimit(RLIMIT_NOFILE, &lowered);
      auto server = TcpStoreServer::start(HostPort{"127.0.0.1", 0}, "s3cret");
      if (!server.ok()) ::_exit(2);
      const uint16_t port = (*server)->address().port;
      if (::write(channel[1], &port, sizeof port) != sizeof port) ::_exit(3);
      char c;
      while (::read(channel[1], &c, 1) != 0) {
      }
      ::_exit(0);
    }
    ::close(channel[1]);
    parent_end_ = Fd(channel[0]);
    uint16_t port = 0;
    if (::read(parent_end_.get(), &port, sizeof port) == static_cast<ssize_t>(sizeof port)) {
      at_ = HostPort{"127.0.0.1", port};
    }
  }
  ~ServerInChild() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  ServerInChild(const ServerInChild&) = delete;
  ServerInChild& operator=(const ServerInChild&) = delete;

  bool started() const { return pid_ > 0 && at_.port != 0; }
  pid_t pid() const { return pid_; }
  const HostPort& at() const { return at_; }
  // The CPU seconds the server's process has used.
  double cpu_seconds() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/stat");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    unsigned long utime = 0, stime = 0;
    const size_t paren = text.rfind(')');
    if (paren == std::string::npos) return -1.0;
    std::sscanf(text.c_str() + paren + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
                &utime, &stime);
    return double(utime + stime) / double(::sysconf(_SC_CLK_TCK));
  }

 private:
  pid_t pid_ = -1;
  Fd parent_end_;
  HostPort at_{"127.0.0.1", 0};
};

// Ranks on `at` until the server turns one away, which must be for want of a descriptor.
std::vector<std::unique_ptr<TcpStoreClient>> ranks_until_refused(const HostPort& at) {
  std::vector<std::unique_ptr<TcpStoreClient>> ranks;
  for (;;) {
    auto c = TcpStoreClient::connect(at, "s3cret", 5s);
    if (!c.ok()) {
      EXPECT_NE(c.status().message().find("no file descriptor left"), std::string::npos)
          << c.status().to_string();
      return ranks;
    }
    ranks.push_back(std::move(c).value());
    if (ranks.size() >= 64u) {
      ADD_FAILURE() << "64 ranks joined a server limited to 64 descriptors";
      return ranks;
    }
  }
}

// Out of file descriptors, the server neither spins on its listener nor locks a rank out: it
// evicts the oldest unauthenticated connection, or turns the newcomer away with a reason.
TEST(TcpStoreAttack, OutOfDescriptorsNeitherSpinsNorLocksRanksOut) {
  ServerInChild server(64);
  ASSERT_TRUE(server.started());
  const HostPort& at = server.at();

  // Silent connections far beyond the descriptors: the oldest make room, a rank still joins.
  std::vector<RawPeer> silent;
  for (int i = 0; i < 150; ++i) silent.emplace_back(at);
  const double join = join_seconds(at, "s3cret");
  EXPECT_GE(join, 0);
  EXPECT_LT(join, 1.0);
  silent.clear();

  // Ranks take every descriptor; the next newcomer is told why it cannot join, and the
  // backlog of further ones costs no CPU.
  std::vector<std::unique_ptr<TcpStoreClient>> ranks = ranks_until_refused(at);
  ASSERT_FALSE(ranks.empty());
  for (int i = 0; i < 50; ++i) silent.emplace_back(at);
  std::this_thread::sleep_for(200ms);
  const double cpu_before = server.cpu_seconds();
  std::this_thread::sleep_for(1s);
  EXPECT_LT(server.cpu_seconds() - cpu_before, 0.2);  // a spinning loop would burn the whole second
  EXPECT_TRUE(ranks.front()->set("still", bytes("served")).ok());
}

// Out of descriptors, accept() fails whether or not a connection is pending: the server evicts
// nobody for a queue that is empty. A rank takes the last descriptor while a connection that has
// not spoken yet is open: that connection stays.
TEST(TcpStoreAttack, TheLastDescriptorTakenEvictsNobody) {
  ServerInChild server(64);
  ASSERT_TRUE(server.started());
  const HostPort& at = server.at();
  std::vector<std::unique_ptr<TcpStoreClient>> ranks = ranks_until_refused(at);
  ASSERT_GT(ranks.size(), 5u);
  std::this_thread::sleep_for(
      1100ms);                     // the one turned away lingers up to 1 s in the spare's place
  ranks.resize(ranks.size() - 2);  // two descriptors free
  std::this_thread::sleep_for(200ms);
  RawPeer quiet(at);  // takes one
  std::this_thread::sleep_for(200ms);
  auto last = TcpStoreClient::connect(at, "s3cret", 5s);  // takes the other
  ASSERT_TRUE(last.ok()) << last.status().to_string();
  EXPECT_FALSE(quiet.closed_by_server(300ms));
  EXPECT_TRUE((*last)->set("still", bytes("served")).ok());
}

}  // namespace
}  // namespace hvd::core
