// hvd's collective algorithms (plugins/common/algorithms.hpp) over ranks as threads: exact results
// at 1-8 ranks, odd sizes, every collective, on both sides of every threshold, with segments and
// queues small enough that the ring's pipeline, its back-pressure and its scratch slots all turn.
#include "algorithms.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/collectives.hpp"

namespace {

using hvd::Status;
using hvd::algorithms::Algorithms;
using hvd::algorithms::Tuning;
using namespace std::chrono_literals;

// Messages between threads. A send completes only when a receive takes it (the data is copied
// then, from the sender's buffer as it is at that moment), so an algorithm that reuses a buffer
// before its send completed gets wrong results. Each rank may have `queue` sends and `queue`
// receives posted and not done; try_* refuse beyond that.
class World {
 public:
  World(int size, size_t queue) : size_(size), queue_(queue) {}
  int size() const { return size_; }

  struct Op {
    std::atomic<bool> done{false};
    int peer = -1;
    bool is_send = false;
    uint32_t index = 0;
    void* buffer = nullptr;
    size_t bytes = 0;
    Status failure;
  };

  class Transport {
   public:
    using Op = World::Op;
    Transport(World& world, int rank) : world_(world), rank_(rank) {}
    int rank() const { return rank_; }
    int size() const { return world_.size(); }

    hvd::Result<Op*> try_send(int peer, uint32_t index, const void* buffer, size_t bytes) {
      return world_.post(rank_, true, peer, index, const_cast<void*>(buffer), bytes, false);
    }
    hvd::Result<Op*> try_recv(int peer, uint32_t index, void* buffer, size_t bytes) {
      return world_.post(rank_, false, peer, index, buffer, bytes, false);
    }
    hvd::Result<Op*> send(int peer, uint32_t index, const void* buffer, size_t bytes) {
      return world_.post(rank_, true, peer, index, const_cast<void*>(buffer), bytes, true);
    }
    hvd::Result<Op*> recv(int peer, uint32_t index, void* buffer, size_t bytes) {
      return world_.post(rank_, false, peer, index, buffer, bytes, true);
    }
    Status exchange(int peer, uint32_t index, const void* send_buf, void* recv_buf, size_t bytes) {
      return hvd::algorithms::exchange_by_posts(*this, peer, index, send_buf, recv_buf, bytes);
    }
    template <typename Done, typename WaitingFor>
    Status wait_until(Done&& done, WaitingFor&& waiting_for) {
      const auto deadline = std::chrono::steady_clock::now() + world_.timeout;
      world_.deliver(rank_);
      while (!done()) {
        if (Status failed = world_.failure_of(rank_); !failed.ok()) return failed;
        if (std::chrono::steady_clock::now() > deadline) {
          return Status(HVD_ERR_TIMEOUT, "waiting on rank " + std::to_string(waiting_for()));
        }
        world_.wait_for_change();
        world_.deliver(rank_);
      }
      return world_.failure_of(rank_);
    }
    Status wait(const Op* op) {
      return wait_until([op] { return op->done.load(); }, [op] { return op->peer; });
    }
    Status wait_all() {
      return wait_until([&] { return world_.in_flight(rank_) == 0; }, [] { return -1; });
    }

   private:
    World& world_;
    int rank_;
  };

  // Runs fn(rank, transport) on one thread per rank; every op is released afterwards.
  void run(const std::function<void(int, Transport&)>& fn, bool every_message_completes = true) {
    std::vector<std::thread> threads;
    for (int r = 0; r < size_; ++r) {
      threads.emplace_back([&, r] {
        Transport t(*this, r);
        fn(r, t);
      });
    }
    for (auto& t : threads) t.join();
    std::lock_guard<std::mutex> lock(mutex_);
    if (every_message_completes) {
      for (const auto& op : ops_) EXPECT_TRUE(op.done) << "a message never completed";
    }
    ops_.clear();
    pending_.clear();
    deliveries_.clear();
    failures_.clear();
  }

  std::chrono::milliseconds timeout = 20s;
  int max_in_flight_seen = 0;

 private:
  using Key = std::tuple<int, int, uint32_t>;  // from, to, index

  hvd::Result<Op*> post(int rank, bool is_send, int peer, uint32_t index, void* buffer,
                        size_t bytes, bool wait_for_room) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (peer < 0 || peer >= size_ || peer == rank) {
      return Status(HVD_ERR_INTERNAL, "a message to rank " + std::to_string(peer));
    }
    while (posted_[{rank, is_send}] >= queue_) {
      if (!wait_for_room) return nullptr;
      deliver_locked(rank);
      if (changed_.wait_for(lock, timeout) == std::cv_status::timeout) {
        return Status(HVD_ERR_TIMEOUT, "no room");
      }
    }
    ops_.emplace_back();
    Op* op = &ops_.back();
    op->peer = peer;
    op->is_send = is_send;
    op->index = index;
    op->buffer = buffer;
    op->bytes = bytes;
    ++posted_[{rank, is_send}];
    max_in_flight_seen =
        std::max<int>(max_in_flight_seen, static_cast<int>(posted_[{rank, is_send}]));
    const Key key = is_send ? Key{rank, peer, index} : Key{peer, rank, index};
    auto& queue = pending_[key];
    // One message per key at a time: the algorithms never reuse an index in flight.
    if (!queue.empty() && queue.front().second == is_send) {
      return Status(HVD_ERR_INTERNAL, "two messages with the same index in flight");
    }
    if (queue.empty()) {
      queue.emplace_back(op, is_send);
    } else {
      Op* other = queue.front().first;
      queue.pop_front();
      Op* send_op = is_send ? op : other;
      Op* recv_op = is_send ? other : op;
      deliveries_[std::get<1>(key)].emplace_back(send_op, recv_op);
    }
    return op;
  }

  // The receiver copies what matched when it next progresses, not the sender when it posts: a
  // send stays in flight, its buffer still to be read, for as long as the receiver is busy.
  void deliver(int rank) {
    std::lock_guard<std::mutex> lock(mutex_);
    deliver_locked(rank);
  }
  void deliver_locked(int rank) {
    auto& mine = deliveries_[rank];
    for (auto [send_op, recv_op] : mine) {
      if (send_op->bytes != recv_op->bytes) {
        failures_[rank] = Status(HVD_ERR_MISMATCH, "sizes differ");
      } else if (send_op->bytes > 0) {
        std::memcpy(recv_op->buffer, send_op->buffer, send_op->bytes);
      }
      send_op->done = true;
      recv_op->done = true;
      --posted_[{recv_op->peer, true}];
      --posted_[{rank, false}];
    }
    if (!mine.empty()) changed_.notify_all();
    mine.clear();
  }
  size_t in_flight(int rank) {
    std::lock_guard<std::mutex> lock(mutex_);
    return posted_[{rank, true}] + posted_[{rank, false}];
  }
  Status failure_of(int rank) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = failures_.find(rank);
    return it == failures_.end() ? Status::success() : it->second;
  }
  void wait_for_change() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_for(lock, 1ms);
  }

  const int size_;
  const size_t queue_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Op> ops_;
  std::map<Key, std::deque<std::pair<Op*, bool>>> pending_;
  std::map<std::pair<int, bool>, size_t> posted_;  // rank, sends or receives
  std::map<int, Status> failures_;
  std::map<int, std::vector<std::pair<Op*, Op*>>> deliveries_;  // by receiver: send, receive
};

using Transport = World::Transport;

hvd_collective_args args(const void* send, void* recv, uint64_t count, hvd_dtype dtype,
                         hvd_reduce_op op = HVD_SUM) {
  hvd_collective_args a = hvd::core::host_args(send, recv, count, dtype);
  a.op = op;
  return a;
}

// Rank r's element i: small integers, so that every sum, product, min and max is exact.
int32_t value(int rank, uint64_t i) { return static_cast<int32_t>((rank * 7 + i * 3) % 11) - 5; }

// Small enough that a few elements take the ring and its segments; a large count takes 64 KiB
// segments (thousands of 12-byte messages would only take time).
Tuning small_tuning(uint64_t count = 0) {
  Tuning t;
  if (count > (1 << 16)) {
    t.segment_bytes = 64 << 10;
    return t;
  }
  t.ring_allreduce_bytes = 64;  // the ring from 16 int32
  t.scatter_broadcast_bytes = 64;
  t.segment_bytes = 12;  // 3 int32: blocks of 7 or more take several segments
  t.segments_in_flight = 2;
  t.sends_in_flight = 3;
  return t;
}

// A rank count and the counts each test runs at it, in one process.
struct Case {
  int ranks;
  std::vector<uint64_t> counts;
};

std::vector<Case> cases() {
  std::vector<Case> all;
  // 1000 elements take hundreds of the small tuning's segments, enough for the ring's guards on
  // buffer reuse to matter; at more ranks than cores they only take time.
  for (int n = 1; n <= 8; ++n) {
    all.push_back({n, n <= 3 ? std::vector<uint64_t>{0, 1, 7, 15, 16, 97, 1000}
                             : std::vector<uint64_t>{0, 1, 7, 15, 16, 97}});
  }
  all.push_back({3, {(uint64_t{1} << 20) + 3}});
  return all;
}

class AlgorithmsTest : public ::testing::TestWithParam<Case> {};

TEST_P(AlgorithmsTest, AllreduceIsExactForEveryOpInAndOutOfPlace) {
  const int n = GetParam().ranks;
  for (const uint64_t count : GetParam().counts) {
    SCOPED_TRACE("count " + std::to_string(count));
    World world(n, 5);
    for (hvd_reduce_op op : {HVD_SUM, HVD_MIN, HVD_MAX, HVD_PRODUCT, HVD_AVERAGE}) {
      for (bool in_place : {false, true}) {
        world.run([&, op = op, in_place = in_place](int rank, Transport& t) {
          Algorithms<Transport> algorithms(t, small_tuning(count));
          std::vector<int32_t> in(count), out(count, 99);
          for (uint64_t i = 0; i < count; ++i) in[i] = value(rank, i);
          if (op == HVD_AVERAGE) {
            for (uint64_t i = 0; i < count; ++i) in[i] = value(rank, i) * n;  // divides exactly
          }
          if (op == HVD_PRODUCT) {
            for (uint64_t i = 0; i < count; ++i) in[i] = (value(rank, i) % 2 == 0) ? 1 : -1;
          }
          hvd_collective_args a =
              args(in.data(), in_place ? in.data() : out.data(), count, HVD_INT32, op);
          ASSERT_TRUE(algorithms.allreduce(a).ok()) << "rank " << rank;
          const int32_t* got = static_cast<const int32_t*>(a.recvbuf);
          for (uint64_t i = 0; i < count; ++i) {
            int64_t want = op == HVD_PRODUCT ? 1
                           : op == HVD_MIN   ? INT32_MAX
                           : op == HVD_MAX   ? INT32_MIN
                                             : 0;
            for (int r = 0; r < n; ++r) {
              int32_t v = value(r, i);
              if (op == HVD_AVERAGE) v *= n;
              if (op == HVD_PRODUCT) v = (value(r, i) % 2 == 0) ? 1 : -1;
              if (op == HVD_SUM || op == HVD_AVERAGE) want += v;
              if (op == HVD_PRODUCT) want *= v;
              if (op == HVD_MIN) want = std::min<int64_t>(want, v);
              if (op == HVD_MAX) want = std::max<int64_t>(want, v);
            }
            if (op == HVD_AVERAGE) want /= n;
            ASSERT_EQ(got[i], want)
                << hvd_reduce_op_name(op) << " element " << i << " rank " << rank;
          }
        });
      }
    }
  }
}

TEST_P(AlgorithmsTest, ReduceScatterIsExactInAndOutOfPlace) {
  const int n = GetParam().ranks;
  for (const uint64_t count : GetParam().counts) {
    SCOPED_TRACE("count " + std::to_string(count));
    World world(n, 5);
    for (bool in_place : {false, true}) {
      world.run([&, in_place = in_place](int rank, Transport& t) {
        Algorithms<Transport> algorithms(t, small_tuning(count));
        const uint64_t total = count * static_cast<uint64_t>(n);
        std::vector<int32_t> in(total), out(count, 99);
        for (uint64_t i = 0; i < total; ++i) in[i] = value(rank, i);
        hvd_collective_args a =
            args(in.data(), in_place ? in.data() : out.data(), count, HVD_INT32, HVD_SUM);
        ASSERT_TRUE(algorithms.reduce_scatter(a).ok());
        const int32_t* got = static_cast<const int32_t*>(a.recvbuf);
        for (uint64_t i = 0; i < count; ++i) {
          int32_t want = 0;
          for (int r = 0; r < n; ++r) want += value(r, static_cast<uint64_t>(rank) * count + i);
          ASSERT_EQ(got[i], want) << "element " << i << " rank " << rank;
        }
      });
    }
  }
}

TEST_P(AlgorithmsTest, AllgatherOfEqualAndOfDifferentCountsIsExact) {
  const int n = GetParam().ranks;
  for (const uint64_t count : GetParam().counts) {
    SCOPED_TRACE("count " + std::to_string(count));
    World world(n, 5);
    for (bool varying : {false, true}) {
      world.run([&, varying = varying](int rank, Transport& t) {
        Algorithms<Transport> algorithms(t, small_tuning(count));
        std::vector<uint64_t> counts(static_cast<size_t>(n));
        for (int r = 0; r < n; ++r)
          counts[static_cast<size_t>(r)] =
              varying ? (count + static_cast<uint64_t>(r) * 5) % 13 : count;
        const uint64_t total = std::accumulate(counts.begin(), counts.end(), uint64_t{0});
        const uint64_t mine_count = counts[static_cast<size_t>(rank)];
        std::vector<int32_t> in(mine_count), out(total, 99);
        for (uint64_t i = 0; i < mine_count; ++i) in[i] = value(rank, i);
        hvd_collective_args a{};
        a.struct_size = sizeof a;
        a.sendbuf = in.data();
        a.recvbuf = out.data();
        a.count = mine_count;
        a.recv_counts = varying ? counts.data() : nullptr;
        a.dtype = HVD_INT32;
        ASSERT_TRUE(algorithms.allgather(a).ok());
        uint64_t at = 0;
        for (int r = 0; r < n; ++r) {
          for (uint64_t i = 0; i < counts[static_cast<size_t>(r)]; ++i) {
            ASSERT_EQ(out[at++], value(r, i)) << "rank " << r << " element " << i;
          }
        }
      });
    }
  }
}

TEST_P(AlgorithmsTest, BroadcastFromEveryRootIsExact) {
  const int n = GetParam().ranks;
  for (const uint64_t count : GetParam().counts) {
    SCOPED_TRACE("count " + std::to_string(count));
    World world(n, 5);
    for (int root = 0; root < n; ++root) {
      world.run([&](int rank, Transport& t) {
        Algorithms<Transport> algorithms(t, small_tuning(count));
        std::vector<int32_t> data(count, 99);
        if (rank == root) {
          for (uint64_t i = 0; i < count; ++i) data[i] = value(root, i);
        }
        hvd_collective_args a = args(data.data(), data.data(), count, HVD_INT32);
        a.root = root;
        ASSERT_TRUE(algorithms.broadcast(a).ok());
        for (uint64_t i = 0; i < count; ++i) ASSERT_EQ(data[i], value(root, i)) << "root " << root;
      });
    }
  }
}

TEST_P(AlgorithmsTest, AlltoallWithUnevenSplitsIsExact) {
  const int n = GetParam().ranks;
  for (const uint64_t count : GetParam().counts) {
    SCOPED_TRACE("count " + std::to_string(count));
    World world(n, 64);
    // Rank s sends rank d (count + s + 2d) % 9 elements: some pairs exchange nothing.
    auto split = [&](int s, int d) { return (count + static_cast<uint64_t>(s + 2 * d)) % 9; };
    world.run([&](int rank, Transport& t) {
      Algorithms<Transport> algorithms(t, small_tuning(count));
      std::vector<uint64_t> send_counts(static_cast<size_t>(n)),
          recv_counts(static_cast<size_t>(n));
      for (int p = 0; p < n; ++p) {
        send_counts[static_cast<size_t>(p)] = split(rank, p);
        recv_counts[static_cast<size_t>(p)] = split(p, rank);
      }
      std::vector<int32_t> in,
          out(std::accumulate(recv_counts.begin(), recv_counts.end(), uint64_t{0}), 99);
      for (int p = 0; p < n; ++p) {
        for (uint64_t i = 0; i < split(rank, p); ++i)
          in.push_back(value(rank, 100 * static_cast<uint64_t>(p) + i));
      }
      hvd_collective_args a = args(in.data(), out.data(), 0, HVD_INT32);
      a.send_counts = send_counts.data();
      a.recv_counts = recv_counts.data();
      ASSERT_TRUE(algorithms.alltoall(a).ok());
      uint64_t at = 0;
      for (int p = 0; p < n; ++p) {
        for (uint64_t i = 0; i < split(p, rank); ++i) {
          ASSERT_EQ(out[at++], value(p, 100 * static_cast<uint64_t>(rank) + i)) << "from " << p;
        }
      }
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, AlgorithmsTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& param) {
                           return "np" + std::to_string(param.param.ranks) +
                                  (param.param.counts[0] > (1 << 16) ? "_large" : "");
                         });

// No rank leaves the barrier before every rank has come to it, the last one late.
TEST(Algorithms, NoRankLeavesTheBarrierBeforeEveryRankCame) {
  for (int n = 1; n <= 8; ++n) {
    World world(n, 5);
    std::atomic<int> arrived{0};
    world.run([&](int rank, Transport& t) {
      Algorithms<Transport> algorithms(t, small_tuning());
      if (rank == n / 2) std::this_thread::sleep_for(20ms);
      arrived.fetch_add(1);
      ASSERT_TRUE(algorithms.barrier().ok()) << n << " ranks";
      EXPECT_EQ(arrived.load(), n) << "rank " << rank << " of " << n << " left early";
    });
  }
}

// Floating point: every rank must get the same bits, which holds only if each element is reduced
// in the same order everywhere (the ring reduces each block on one rank; recursive doubling
// combines each pair lower rank first).
TEST(Algorithms, EveryRankGetsTheSameBitsOfAFloatSum) {
  for (int n : {3, 5, 8}) {
    for (uint64_t count : {13, 1000}) {
      World world(n, 5);
      std::vector<std::vector<float>> results(static_cast<size_t>(n));
      world.run([&](int rank, Transport& t) {
        Algorithms<Transport> algorithms(t, small_tuning(count));
        std::vector<float> data(count);
        for (uint64_t i = 0; i < count; ++i) data[i] = 1.0f / static_cast<float>(rank * 13 + i + 1);
        hvd_collective_args a = args(data.data(), data.data(), count, HVD_FLOAT32, HVD_SUM);
        ASSERT_TRUE(algorithms.allreduce(a).ok());
        results[static_cast<size_t>(rank)] = data;
      });
      for (int r = 1; r < n; ++r) {
        EXPECT_EQ(std::memcmp(results[0].data(), results[static_cast<size_t>(r)].data(),
                              count * sizeof(float)),
                  0)
            << n << " ranks, " << count << " elements: rank " << r << " differs from rank 0";
      }
    }
  }
}

// A transport whose queue is full refuses a post (try_*); the ring posts again after progress.
TEST(Algorithms, TheRingWaitsForRoomInTheTransportsQueue) {
  World world(4, 2);  // shorter than sends_in_flight
  world.run([&](int rank, Transport& t) {
    Algorithms<Transport> algorithms(t, small_tuning());
    std::vector<int32_t> data(4000, rank + 1);
    hvd_collective_args a = args(data.data(), data.data(), data.size(), HVD_INT32, HVD_SUM);
    ASSERT_TRUE(algorithms.allreduce(a).ok());
    for (int32_t v : data) ASSERT_EQ(v, 10);
  });
  EXPECT_EQ(world.max_in_flight_seen, 2);
}

// A rank that never comes: the others' waits end at the deadline, naming a rank they wait on.
TEST(Algorithms, ARankThatNeverComesIsATimeoutNamingARank) {
  World world(3, 5);
  world.timeout = 200ms;
  world.run(
      [&](int rank, Transport& t) {
        if (rank == 2) return;
        Algorithms<Transport> algorithms(t, small_tuning());
        std::vector<int32_t> data(1000, 1);
        hvd_collective_args a = args(data.data(), data.data(), data.size(), HVD_INT32, HVD_SUM);
        const Status s = algorithms.allreduce(a);
        EXPECT_EQ(s.code(), HVD_ERR_TIMEOUT);
        // Rank 0's ring receives from rank 2; rank 1 waits on rank 0, which waits on rank 2.
        if (rank == 0) {
          EXPECT_EQ(s.message(), "waiting on rank 2");
        }
      },
      /*every_message_completes=*/false);
}

}  // namespace
