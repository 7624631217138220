#include "comm/communicator.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "fake_collectives.hpp"
#include "fake_env.hpp"

namespace hvd::core {
namespace {

const fs::path kTestPlugins = HVD_TEST_PLUGIN_DIR;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Communicator, InitFailureCarriesThePluginsMessage) {
  auto comm = Communicator::create(
      {}, fake_env({{"HVD_BACKEND", "failinit"}, {"HVD_PLUGIN_PATH", kTestPlugins.string()}}));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), HVD_ERR_SYSTEM);
  EXPECT_EQ(
      comm.status().message(),
      "init on backend 'failinit' failed: failinit: this test plugin always refuses to start");
}

TEST(Communicator, ASingleProcessNeedsNoRendezvous) {
  CommOptions options;
  options.backend = (kTestPlugins / "libhvd-backend-kvs.so").string();
  auto comm = Communicator::create(options, fake_env({}));
  ASSERT_TRUE(comm.ok()) << comm.status().to_string();
  int32_t value = 41;
  hvd_collective_args args{};
  args.sendbuf = &value;
  args.recvbuf = &value;
  args.count = 1;
  args.dtype = HVD_INT32;
  args.op = HVD_MAX;
  EXPECT_TRUE((*comm)->allreduce(args).ok());
  EXPECT_EQ(value, 41);
  EXPECT_TRUE((*comm)->barrier().ok());
}

TEST(Communicator, CudaMemoryOnAHostBackendIsStagedThroughHostMemory) {
  hvd::testing::FakeDeviceMemory device;
  CommOptions options;
  options.backend = (kTestPlugins / "libhvd-backend-kvs.so").string();
  options.device_memory = &device;
  auto comm = Communicator::create(options, fake_env({}));
  ASSERT_TRUE(comm.ok()) << comm.status().to_string();
  int stream;  // its address stands for a cudaStream_t
  auto on_device = [&](const void* send, void* recv) {
    hvd_collective_args a = host_args(send, recv, 3, HVD_INT32);
    a.memory_type = HVD_MEMORY_CUDA;
    a.device = 2;
    a.stream = &stream;
    return a;
  };
  const std::vector<int32_t> in{7, -1, 5};
  std::vector<int32_t> reduced(3), gathered(3), broadcast(3);
  ASSERT_TRUE((*comm)->allreduce(on_device(in.data(), reduced.data())).ok());
  ASSERT_TRUE((*comm)->allgather(on_device(in.data(), gathered.data())).ok());
  ASSERT_TRUE((*comm)->broadcast(on_device(in.data(), broadcast.data())).ok());
  EXPECT_EQ(reduced, in);
  EXPECT_EQ(gathered, in);
  EXPECT_EQ(broadcast, in);
  EXPECT_EQ(device.copies, 6);  // each in and out
  EXPECT_EQ(device.bytes_copied, 6 * 3 * sizeof(int32_t));
  EXPECT_EQ(device.devices, std::set<int32_t>{2});
  EXPECT_TRUE(device.unsynchronized.empty());

  device.fail = true;  // as without a GPU
  const Status s = (*comm)->allreduce(on_device(in.data(), reduced.data()));
  EXPECT_EQ(s.code(), HVD_ERR_SYSTEM);
  EXPECT_EQ(s.message(),
            "allreduce: staging CUDA memory through host memory for backend 'kvs': fake: no CUDA "
            "device");
}

// kvsdevice takes CUDA memory only (and, a test plugin, reads whatever pointer it gets): host
// memory goes through device memory of the device current where the communicator was made.
TEST(Communicator, HostMemoryOnABackendThatTakesCudaMemoryOnlyIsStagedThroughTheDevice) {
  hvd::testing::FakeDeviceMemory device;
  device.current = 3;
  CommOptions options;
  options.backend = (kTestPlugins / "libhvd-backend-kvsdevice.so").string();
  options.device_memory = &device;
  auto comm = Communicator::create(options, fake_env({}));
  ASSERT_TRUE(comm.ok()) << comm.status().to_string();
  const std::vector<int32_t> in{7, -1, 5};
  std::vector<int32_t> reduced(3), gathered(3), broadcast(3);
  ASSERT_TRUE((*comm)->allreduce(host_args(in.data(), reduced.data(), 3, HVD_INT32)).ok());
  ASSERT_TRUE((*comm)->allgather(host_args(in.data(), gathered.data(), 3, HVD_INT32)).ok());
  ASSERT_TRUE((*comm)->broadcast(host_args(in.data(), broadcast.data(), 3, HVD_INT32)).ok());
  EXPECT_EQ(reduced, in);
  EXPECT_EQ(gathered, in);
  EXPECT_EQ(broadcast, in);
  EXPECT_EQ(device.copies, 6);  // each in and out
  EXPECT_EQ(device.devices, std::set<int32_t>{3});
  EXPECT_EQ(device.device_allocations, 1);  // one staging buffer, kept
  EXPECT_TRUE(device.unsynchronized.empty());
  EXPECT_TRUE(device.misuse.empty()) << device.misuse.front();

  // Every wait of the staging is bounded by the communicator's timeout: a device that never runs
  // the copy fails the call within it.
  device.pause();
  options.timeout = std::chrono::milliseconds(200);
  auto bounded = Communicator::create(options, fake_env({}));
  ASSERT_TRUE(bounded.ok()) << bounded.status().to_string();
  const auto start = std::chrono::steady_clock::now();
  const Status late = (*bounded)->allreduce(host_args(in.data(), reduced.data(), 3, HVD_INT32));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(late.code(), HVD_ERR_TIMEOUT) << late.to_string();
  EXPECT_TRUE(contains(late.message(), "staging host memory through CUDA device 3's memory"))
      << late.message();
  EXPECT_GE(took, std::chrono::milliseconds(200));
  EXPECT_LT(took, std::chrono::seconds(10));
  device.resume();

  // A collective whose work never ends on the device (the wait after it times out: the copy in
  // was waited for once) breaks the communicator: the abort ends it, and every later call fails.
  device.synchronizations_until_hang = 1;
  const Status hung = (*bounded)->allreduce(host_args(in.data(), reduced.data(), 3, HVD_INT32));
  EXPECT_EQ(hung.code(), HVD_ERR_TIMEOUT) << hung.to_string();
  EXPECT_FALSE((*bounded)->health().ok());
  device.synchronizations_until_hang = -1;
  EXPECT_FALSE((*bounded)->allreduce(host_args(in.data(), reduced.data(), 3, HVD_INT32)).ok());

  // Without a device to stage through, host memory is refused as before.
  hvd::testing::FakeDeviceMemory no_gpu;
  no_gpu.fail = true;
  options.device_memory = &no_gpu;
  auto without = Communicator::create(options, fake_env({}));
  ASSERT_TRUE(without.ok()) << without.status().to_string();
  const Status refused = (*without)->allreduce(host_args(in.data(), reduced.data(), 3, HVD_INT32));
  EXPECT_EQ(refused.code(), HVD_ERR_UNSUPPORTED);
  EXPECT_TRUE(contains(refused.message(), "does not take host memory")) << refused.message();
}

TEST(Communicator, SeveralRanksWithoutRendezvousIsAClearError) {
  auto comm = Communicator::create({}, fake_env({{"HVD_RANK", "0"}, {"HVD_SIZE", "2"}}));
  ASSERT_FALSE(comm.ok());
  EXPECT_TRUE(contains(comm.status().message(), "HVD_RENDEZVOUS_ADDR is not set"))
      << comm.status().message();
}

TEST(Communicator, RendezvousWithoutSecretIsAClearError) {
  auto comm = Communicator::create(
      {}, fake_env({{"HVD_RANK", "1"}, {"HVD_SIZE", "2"}, {"HVD_RENDEZVOUS_ADDR", "127.0.0.1:1"}}));
  ASSERT_FALSE(comm.ok());
  EXPECT_TRUE(contains(comm.status().message(), "HVD_SECRET is not")) << comm.status().message();
}

}  // namespace
}  // namespace hvd::core
