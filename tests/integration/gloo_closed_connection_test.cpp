// hvd's Gloo algorithms (plugins/gloo/gloo_algorithms.hpp) over real TCP meshes, ranks as threads
// of this process: a connection that ended before an algorithm registered its receive buffers is
// an error at once (ClosedConnections), not a wait for the whole timeout. Gloo wakes only the
// buffers registered with a pair when it fails; CI once saw a survivor of a killed rank wait out
// its 10 s HVD_TIMEOUT this way.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include <gloo/transport/tcp/device.h>

#include "gloo_algorithms.hpp"

namespace {

using namespace std::chrono_literals;
using hvd::gloo_algorithms::KvStore;
using hvd::gloo_algorithms::Meshes;

// An in-memory key-value store for the ranks' rendezvous.
class MemoryStore {
 public:
  KvStore kv() {
    return KvStore{[this](const std::string& key, const std::vector<char>& value) {
                     std::lock_guard<std::mutex> lock(mutex_);
                     values_[key] = value;
                     changed_.notify_all();
                     return hvd::Status::success();
                   },
                   [this](const std::string& key,
                          std::chrono::milliseconds timeout) -> hvd::Result<std::vector<char>> {
                     std::unique_lock<std::mutex> lock(mutex_);
                     if (!changed_.wait_for(lock, timeout, [&] { return values_.count(key); })) {
                       return hvd::Status(HVD_ERR_TIMEOUT, "no key " + key);
                     }
                     return values_[key];
                   }};
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<char>> values_;
};

std::vector<Meshes> connect(int size, std::chrono::milliseconds timeout) {
  MemoryStore store;
  const KvStore kv = store.kv();
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  std::vector<std::future<Meshes>> pending;
  for (int rank = 0; rank < size; ++rank) {
    pending.push_back(std::async(std::launch::async, [&, rank] {
      return Meshes::connect(kv, gloo::transport::tcp::CreateDevice(attr), rank, size, timeout);
    }));
  }
  std::vector<Meshes> meshes;
  for (auto& p : pending) meshes.push_back(p.get());
  return meshes;
}

// One collective of hvd's Gloo algorithms, run by rank 0 on the event-loop mesh (over 64 KiB).
struct Case {
  const char* name;
  std::function<void(Meshes&)> run;
};

std::ostream& operator<<(std::ostream& out, const Case& c) { return out << c.name; }

constexpr size_t kCount = size_t{1} << 16;  // 256 KiB of float per buffer

std::vector<float> ones(size_t count) { return std::vector<float>(count, 1.0f); }

const Case kCases[] = {
    {"ReusedAllreduce",  // 4 MiB: an algorithm object kept for later calls
     [](Meshes& m) {
       auto data = ones(kCount * 16);
       hvd::gloo_algorithms::allreduce(m, data.data(), data.size(),
                                       gloo::ReductionFunction<float>::sum, true);
     }},
    {"AllreduceRing",  // 128 KiB, order-insensitive: one message per hop
     [](Meshes& m) {
       auto data = ones(kCount / 2);
       hvd::gloo_algorithms::allreduce(m, data.data(), data.size(),
                                       gloo::ReductionFunction<float>::max, false);
     }},
    {"AllreduceRingChunked",  // 128 KiB floating sum at 3 ranks
     [](Meshes& m) {
       auto data = ones(kCount / 2);
       hvd::gloo_algorithms::allreduce(m, data.data(), data.size(),
                                       gloo::ReductionFunction<float>::sum, true);
     }},
    {"Broadcast",
     [](Meshes& m) {
       auto data = ones(kCount);
       hvd::gloo_algorithms::broadcast(m, data.data(), data.size(), 2);
     }},
    {"Allgather",
     [](Meshes& m) {
       auto mine = ones(kCount);
       std::vector<float> all(kCount * 3);
       hvd::gloo_algorithms::allgather(m, mine.data(), all.data(), kCount);
     }},
    {"ReduceScatter",
     [](Meshes& m) {
       auto data = ones(kCount * 3);
       std::vector<float> mine(kCount);
       std::vector<char> scratch;
       hvd::gloo_algorithms::reduce_scatter(m, data.data(), mine.data(), kCount,
                                            gloo::ReductionFunction<float>::sum, &scratch);
     }},
    {"Alltoall",
     [](Meshes& m) {
       auto send = ones(kCount * 3);
       std::vector<float> recv(kCount * 3);
       const std::vector<size_t> counts(3, kCount);
       hvd::gloo_algorithms::alltoall(m, send.data(), counts, recv.data(), counts,
                                      9 * kCount * sizeof(float));
     }},
};

class GlooClosedConnection : public ::testing::TestWithParam<Case> {};

// Rank 2 of 3 is gone; rank 0 then runs a collective on the event-loop mesh that waits for rank 2
// (or, for the ring's receives, for its left neighbour, rank 2), after Gloo's event loop closed
// that pair but before the algorithm registered its buffers. Rank 1 is alive and idle.
TEST_P(GlooClosedConnection, IsAnErrorAtOnceNotAfterTheTimeout) {
  constexpr auto kTimeout = 10s;
  std::vector<Meshes> meshes = connect(3, kTimeout);
  { const Meshes gone = std::move(meshes[2]); }  // rank 2's sockets close, as at its death
  std::this_thread::sleep_for(300ms);  // rank 0's event loop reads the end and closes its pair

  const auto begin = std::chrono::steady_clock::now();
  std::string error;
  try {
    GetParam().run(meshes[0]);
  } catch (const gloo::IoException& e) {
    error = e.what();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  EXPECT_NE(error.find("rank 2"), std::string::npos) << error;
  EXPECT_LT(seconds, 2.0) << error;
}

INSTANTIATE_TEST_SUITE_P(EventLoopMesh, GlooClosedConnection, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& c) { return c.param.name; });

}  // namespace
