// What ranks do through the rendezvous store before a backend runs: exchange a value with every
// rank, and share the store rank 0 serves.
#include "bootstrap/rendezvous.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "fake_env.hpp"

namespace hvd::core {
namespace {

using namespace std::chrono_literals;

Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

World world_of(int rank, int size) {
  World w;
  w.rank = rank;
  w.size = size;
  w.local_rank = rank;
  w.local_size = size;
  return w;
}

TEST(Exchange, EveryRankGetsEveryRanksValueInRankOrder) {
  InMemoryStore store;
  const int n = 4;
  std::vector<Result<std::vector<Bytes>>> got(n, error(HVD_ERR_INTERNAL, "not run"));
  std::vector<std::thread> ranks;
  // In reverse: a rank waits for the ranks that have not published yet.
  for (int r = n - 1; r >= 0; --r) {
    ranks.emplace_back([&, r] {
      got[r] = exchange(store, "k", bytes("v" + std::to_string(r * 11)), world_of(r, n), 60s);
    });
  }
  for (auto& t : ranks) t.join();
  const std::vector<Bytes> want{bytes("v0"), bytes("v11"), bytes("v22"), bytes("v33")};
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(got[r].ok()) << got[r].status().to_string();
    EXPECT_EQ(*got[r], want) << "rank " << r;
  }
  // Each value under the key and its rank, where another rank's reader looks for it.
  EXPECT_EQ(store.get("k/2", 0ms).value(), bytes("v22"));
}

TEST(Exchange, ARankThatNeverArrivesIsATimeoutNamingIt) {
  InMemoryStore store;
  ASSERT_TRUE(store.set("k/0", bytes("here")).ok());
  const auto start = Clock::now();
  auto got = exchange(store, "k", bytes("me"), world_of(1, 3), 200ms);
  EXPECT_GE(Clock::now() - start, 150ms);  // it waited for rank 2
  EXPECT_EQ(got.status().code(), HVD_ERR_TIMEOUT);
  EXPECT_EQ(got.status().message(),
            "rank 2 did not arrive within 200 ms (HVD_TIMEOUT): did it start, and does it use the "
            "same HVD_RENDEZVOUS_ADDR?");
}

// A store whose host died: what is not there yet never comes.
class DeadStore final : public KvStore {
 public:
  Status set(const std::string& key, const Bytes& value) override { return inner_.set(key, value); }
  Result<Bytes> get(const std::string& key, std::chrono::milliseconds /*timeout*/) override {
    auto got = inner_.get(key, 0ms);
    if (got.ok()) return got;
    return error(HVD_ERR_REMOTE, "the rendezvous host closed the connection");
  }

 private:
  InMemoryStore inner_;
};

TEST(Exchange, AStoreThatFailsSaysWhichRankWasAwaited) {
  DeadStore store;
  auto got = exchange(store, "k", bytes("me"), world_of(0, 2), 60s);
  EXPECT_EQ(got.status().code(), HVD_ERR_REMOTE);
  EXPECT_EQ(got.status().message(),
            "while waiting for rank 1 to arrive: the rendezvous host closed the connection");
  InMemoryStore closed;
  closed.close();
  EXPECT_EQ(exchange(closed, "k", bytes("me"), world_of(0, 2), 60s).status().message(),
            "the rendezvous store is shutting down");  // its own publication failed
}

// share_rendezvous on rank 0, then on `others` ranks handed rank 0's record, as a broadcast
// would; every rank's result.
std::vector<Result<SharedRendezvous>> share(int others, const Settings& settings, int local_size) {
  std::string record;
  std::vector<Result<SharedRendezvous>> out;
  for (int r = 0; r <= others; ++r) {
    World w = world_of(r, others + 1);
    w.local_size = local_size;
    out.push_back(share_rendezvous(w, settings, [&](void* data, size_t size) {
      if (r == 0) {
        record.assign(static_cast<const char*>(data), size);
      } else {
        std::memcpy(data, record.data(), std::min(size, record.size()));
      }
      return Status::success();
    }));
  }
  return out;
}

TEST(ShareRendezvous, Rank0ServesOnLoopbackForOneHostAndEveryRankLearnsWhereAndTheSecret) {
  auto all = share(2, Settings(), 3);
  for (auto& r : all) ASSERT_TRUE(r.ok()) << r.status().to_string();
  const SharedRendezvous& served = *all[0];
  ASSERT_NE(served.server, nullptr);
  EXPECT_EQ(served.address.host, "127.0.0.1");
  EXPECT_EQ(served.address.port, served.server->address().port);
  EXPECT_EQ(served.secret.size(), 32u);
  for (size_t r = 1; r < all.size(); ++r) {
    EXPECT_EQ(all[r]->server, nullptr) << "only rank 0 serves";
    EXPECT_EQ(all[r]->address.to_string(), served.address.to_string());
    EXPECT_EQ(all[r]->secret, served.secret);
  }
  // The store is there, and takes that secret.
  auto client = TcpStoreClient::connect(all[1]->address, all[1]->secret, 30s);
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  ASSERT_TRUE((*client)->set("a", bytes("b")).ok());
  EXPECT_EQ((*client)->get("a", 30s).value(), bytes("b"));
}

TEST(ShareRendezvous, EachJobGetsAFreshSecret) {
  auto first = share(0, Settings(), 1), second = share(0, Settings(), 1);
  ASSERT_TRUE(first[0].ok() && second[0].ok());
  EXPECT_NE(first[0]->secret, second[0]->secret);
}

TEST(ShareRendezvous, HvdRendezvousIfaceNamesTheInterfaceToServeOn) {
  auto on_lo = share(1, *Settings::read(fake_env({{"HVD_RENDEZVOUS_IFACE", "lo"}})), 1);
  ASSERT_TRUE(on_lo[0].ok()) << on_lo[0].status().to_string();
  EXPECT_EQ(on_lo[1]->address.host, "127.0.0.1");  // though the ranks are on two hosts
  auto missing = share(0, *Settings::read(fake_env({{"HVD_RENDEZVOUS_IFACE", "hvd-none0"}})), 1);
  EXPECT_EQ(missing[0].status().code(), HVD_ERR_NOT_FOUND);
}

TEST(ShareRendezvous, ForSeveralHostsRank0ServesOnAnExternalInterface) {
  const std::string external = first_external_address();
  auto all = share(1, Settings(), 1);
  if (external.empty()) {
    EXPECT_EQ(all[0].status().message(), "rank 0 has no network interface that is up");
    return;
  }
  ASSERT_TRUE(all[1].ok()) << all[1].status().to_string();
  EXPECT_EQ(all[1]->address.host, external);
}

TEST(ShareRendezvous, ABroadcastThatFailsIsTheRanksError) {
  for (int rank : {0, 1}) {
    auto got = share_rendezvous(world_of(rank, 2), Settings(), [](void*, size_t) {
      return error(HVD_ERR_REMOTE, "the launcher's broadcast failed");
    });
    EXPECT_EQ(got.status().code(), HVD_ERR_REMOTE) << "rank " << rank;
    EXPECT_EQ(got.status().message(), "the launcher's broadcast failed");
  }
}

}  // namespace
}  // namespace hvd::core
