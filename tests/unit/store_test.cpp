#include "bootstrap/store.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace hvd::core {
namespace {

using namespace std::chrono_literals;

Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

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

TEST(HostPort, Parses) {
  EXPECT_EQ(parse_host_port("10.0.0.1:29500")->port, 29500);
  EXPECT_EQ(parse_host_port("[::1]:80")->host, "::1");
  EXPECT_FALSE(parse_host_port("nohost").ok());
  EXPECT_FALSE(parse_host_port("h:99999").ok());
  EXPECT_FALSE(parse_host_port("h:").ok());
}

}  // namespace
}  // namespace hvd::core
