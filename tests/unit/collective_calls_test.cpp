// A communicator's collectives as the scheduler and hvd.h call them: their arguments checked in
// one wording before the backend sees them, CUDA memory staged for a backend that takes host
// memory (and host memory for one that takes CUDA memory), and the collectives a backend lacks
// built from those it has.
#include "comm/communicator.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "fake_collectives.hpp"
#include "fake_env.hpp"
#include "kvs_job.hpp"

namespace hvd::core {
namespace {

using hvd::testing::contains;
using hvd::testing::kTestPlugins;
using hvd::testing::run_ranks;
using hvd::testing::test_plugin;

std::unique_ptr<Communicator> alone_on(const std::string& plugin) {
  CommOptions options;
  options.backend = test_plugin(plugin);
  auto comm = Communicator::create(options, fake_env({}));
  EXPECT_TRUE(comm.ok()) << comm.status().to_string();
  return comm.ok() ? std::move(comm).value() : nullptr;
}

// The check's message, where it refuses the arguments as invalid.
std::string invalid(const Status& s) {
  return s.code() == HVD_ERR_INVALID_ARGUMENT ? s.message() : "not invalid: " + s.to_string();
}

TEST(CollectiveCalls, BadArgumentsAreRefusedWithWhatIsWrong) {
  auto comm = alone_on("kvs");
  ASSERT_NE(comm, nullptr);
  int32_t x[4] = {};
  EXPECT_EQ(invalid(comm->check_allreduce(host_args(x, nullptr, 3, HVD_INT32))),
            "allreduce: buffer is NULL for 3 elements");
  EXPECT_TRUE(comm->check_allreduce(host_args(nullptr, nullptr, 0, HVD_INT32)).ok());
  EXPECT_EQ(invalid(comm->check_allreduce(host_args(x, x, UINT64_MAX / 2, HVD_FLOAT32))),
            "allreduce: count 9223372036854775807 overflows the buffer size");
  hvd_collective_args a = host_args(x, x, 1, HVD_INT32);
  a.op = static_cast<hvd_reduce_op>(99);
  EXPECT_EQ(invalid(comm->check_allreduce(a)), "allreduce: reduce op 99 is not an hvd_reduce_op");
  EXPECT_TRUE(comm->check_allgather(a).ok());  // an allgather reads no op
  a.root = 1;
  EXPECT_EQ(invalid(comm->check_broadcast(a)), "broadcast: root 1 is not a rank of this job of 1");
  EXPECT_EQ(invalid(comm->check_allgather(host_args(x, x, 1, static_cast<hvd_dtype>(42)))),
            "allgather: dtype 42 is not an hvd_dtype");
}

TEST(CollectiveCalls, CountsThatDoNotAddUpAreRefused) {
  auto comm = alone_on("kvs");
  ASSERT_NE(comm, nullptr);
  int32_t in[3] = {}, out[3] = {};
  hvd_collective_args a = host_args(in, out, 3, HVD_INT32);
  EXPECT_EQ(invalid(comm->check_alltoall_send(a)), "alltoall: send_counts is NULL");
  const uint64_t two[1] = {2}, huge[1] = {UINT64_MAX / 2};
  a.send_counts = two;
  EXPECT_EQ(invalid(comm->check_alltoall_send(a)), "alltoall: send_counts sum to 2, not count 3");
  a.send_counts = huge;
  EXPECT_EQ(invalid(comm->check_alltoall_send(a)),
            "alltoall: send_counts overflow the buffer size");
  const uint64_t three[1] = {3};
  a.send_counts = three;
  a.recvbuf = in;
  EXPECT_EQ(invalid(comm->check_alltoall_send(a)), "alltoall: alltoall cannot run in place");
  hvd_collective_args v = host_args(in, out, 3, HVD_INT32);
  v.recv_counts = two;
  EXPECT_EQ(invalid(comm->check_allgather(v)),
            "allgather: recv_counts[0] is 2 but this rank sends 3");
}

TEST(CollectiveCalls, OnlyWhatThePluginDeclaredReachesIt) {
  auto comm = alone_on("kvsmin");  // int32 and float32, sum
  ASSERT_NE(comm, nullptr);
  double d = 1;
  int32_t i = 1;
  const Status f64 = comm->check_allreduce(host_args(&d, &d, 1, HVD_FLOAT64));
  EXPECT_EQ(f64.code(), HVD_ERR_UNSUPPORTED);
  EXPECT_EQ(f64.message(),
            "allreduce: backend 'kvsmin' does not take float64 sum (its dtypes: int32,float32; its "
            "reduce ops: sum)");
  hvd_collective_args max = host_args(&i, &i, 1, HVD_INT32);
  max.op = HVD_MAX;
  EXPECT_EQ(comm->allreduce(max).message(),
            "allreduce: backend 'kvsmin' does not take int32 max (its dtypes: int32,float32; its "
            "reduce ops: sum)");
  EXPECT_EQ(comm->check_broadcast(host_args(&d, &d, 1, HVD_FLOAT64)).message(),
            "broadcast: backend 'kvsmin' does not take float64 (its dtypes: int32,float32)");
  // A broadcast reduces nothing: whatever op it carries, the plugin is handed one it declared.
  EXPECT_TRUE(comm->broadcast(max).ok());
  EXPECT_TRUE(comm->health().ok());
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
// Three ranks on kvs, which has no allgatherv, alltoall or reduce_scatter: each is built from
// the collectives it has. Rank r reports what each call left in its output.
std::string fallbacks_on_rank(int rank, const EnvLookup& env) {
  CommOptions options;
  options.backend = test_plugin("kvs");
  auto made = Communicator::create(options, env);
  if (!made.ok()) return made.status().to_string();
  Communicator& comm = **made;
  const int n = 3;
  auto text = [](const std::vector<int32_t>& v) {
    std::string out;
    for (int32_t x : v) out += " " + std::to_string(x);
    return out;
  };
  std::string report;
  // allgatherv: rank r sends counts[r] elements 10r, 10r + 1, ...
  const uint64_t counts[3] = {2, 0, 3};
  std::vector<int32_t> mine;
  for (uint64_t k = 0; k < counts[rank]; ++k) mine.push_back(10 * rank + static_cast<int32_t>(k));
  std::vector<int32_t> gathered(5, -1);
  hvd_collective_args v = host_args(mine.data(), gathered.data(), counts[rank], HVD_INT32);
  v.recv_counts = counts;
  Status s = comm.allgather(v);
  report += "allgatherv" + (s.ok() ? text(gathered) : " " + s.to_string());
  // alltoall: rank r sends matrix[r][q] elements 100r + 10q + k to rank q.
  uint64_t matrix[9];
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < n; ++q) matrix[r * n + q] = static_cast<uint64_t>((r + 2 * q) % n);
  }
  std::vector<int32_t> send;
  uint64_t recv_counts[3], received = 0;
  for (int q = 0; q < n; ++q) {
    for (uint64_t k = 0; k < matrix[rank * n + q]; ++k) {
      send.push_back(100 * rank + 10 * q + static_cast<int32_t>(k));
    }
    recv_counts[q] = matrix[q * n + rank];
    received += recv_counts[q];
  }
  std::vector<int32_t> exchanged(received, -1);
  hvd_collective_args t = host_args(send.data(), exchanged.data(), send.size(), HVD_INT32);
  t.send_counts = matrix + rank * n;
  t.recv_counts = recv_counts;
  s = comm.alltoall(t, matrix);
  report += " | alltoall" + (s.ok() ? text(exchanged) : " " + s.to_string());
  // reduce_scatter: 2 elements per rank of 100r + j; rank r keeps its block of the sums.
  std::vector<int32_t> all(6), block(2, -1);
  for (int j = 0; j < 6; ++j) all[static_cast<size_t>(j)] = 100 * rank + j;
  s = comm.reduce_scatter(host_args(all.data(), block.data(), 2, HVD_INT32));
  report += " | reduce_scatter" + (s.ok() ? text(block) : " " + s.to_string());
  const Status finalized = comm.finalize();
  return finalized.ok() ? report : report + " | finalize " + finalized.to_string();
}

TEST(CollectiveCalls, WhatTheBackendLacksIsBuiltFromWhatItHas) {
  const auto reports = run_ranks(3, {{"HVD_TIMEOUT", "60"}}, fallbacks_on_rank);
  EXPECT_EQ(reports[0], "allgatherv 0 1 20 21 22 | alltoall 100 200 201 | reduce_scatter 300 303");
  EXPECT_EQ(reports[1], "allgatherv 0 1 20 21 22 | alltoall 10 11 210 | reduce_scatter 306 309");
  EXPECT_EQ(reports[2], "allgatherv 0 1 20 21 22 | alltoall 20 120 121 | reduce_scatter 312 315");
}

}  // namespace
}  // namespace hvd::core
