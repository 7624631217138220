// hvd's Gloo algorithms (plugins/gloo/gloo_algorithms.hpp) over real TCP meshes, ranks as threads
// of this process: a connection that ended before an algorithm registered its receive buffers is
// an error at once (ClosedConnections), not a wait for the whole timeout. Gloo wakes only the
// buffers registered with a pair when it fails; CI once saw a survivor of a killed rank wait out
// its 10 s HVD_TIMEOUT this way.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
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

// Rank 2 of 3 is gone; rank 0 then runs a 4 MiB allreduce on the event-loop mesh.
// It sends to rank 1, which is alive, and waits for rank 2, whose connection Gloo's event loop
// closed before the allreduce registered its buffers.
TEST(GlooClosedConnection, IsAnErrorAtOnceNotAfterTheTimeout) {
  constexpr auto kTimeout = 10s;
  std::vector<Meshes> meshes = connect(3, kTimeout);
  { const Meshes gone = std::move(meshes[2]); }  // rank 2's sockets close, as at its death
  std::this_thread::sleep_for(300ms);  // rank 0's event loop reads the end and closes its pair

  std::vector<float> data(1 << 20, 1.0f);
  const auto begin = std::chrono::steady_clock::now();
  std::string error;
  try {
    hvd::gloo_algorithms::allreduce(meshes[0], data.data(), data.size(),
                                    gloo::ReductionFunction<float>::sum, true);
  } catch (const gloo::IoException& e) {
    error = e.what();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  EXPECT_NE(error.find("rank 2"), std::string::npos) << error;
  EXPECT_LT(seconds, 2.0) << error;
}

}  // namespace
