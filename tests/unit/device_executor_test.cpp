// The device executor (a backend that takes CUDA memory): fusion, scaling and ordering on the
// device against fake CUDA memory, through the scheduler of ranks-as-threads (scheduler_job.hpp).
#include "scheduler/device_executor.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "comm/copy_blocks.hpp"
#include "fake_collectives.hpp"
#include "fake_env.hpp"
#include "scheduler_job.hpp"

namespace {

using hvd::Status;
using hvd::core::fake_env;
using hvd::core::SchedulerOptions;
using hvd::core::Settings;
using hvd::core::Submission;
using hvd::testing::allgather;
using hvd::testing::allreduce;
using hvd::testing::FakeDeviceMemory;
using hvd::testing::FakeRank;
using hvd::testing::fast_options;
using hvd::testing::Job;
using hvd::testing::kWait;
using hvd::testing::submit_and_wait;
using hvd::testing::submit_group_and_wait;
using hvd::testing::until_settled;
using namespace std::chrono_literals;

// ---- the device executor (a backend that takes CUDA memory) -----------------------------------

// Integer-valued data in `dtype` (all of them exact in fp16 and bf16 up to 256).
std::vector<char> values_in(hvd_dtype dtype, const std::vector<double>& values) {
  std::vector<char> out(values.size() * hvd_dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    const float f = static_cast<float>(values[i]);
    switch (dtype) {
      case HVD_FLOAT16:
        reinterpret_cast<uint16_t*>(out.data())[i] = hvd_float_to_float16(f);
        break;
      case HVD_BFLOAT16:
        reinterpret_cast<uint16_t*>(out.data())[i] = hvd_float_to_bfloat16(f);
        break;
      case HVD_FLOAT32:
        reinterpret_cast<float*>(out.data())[i] = f;
        break;
      default:
        reinterpret_cast<double*>(out.data())[i] = values[i];
        break;
    }
  }
  return out;
}

// Three ranks, each on its own device (rank r on device r + 1), submit `count` CUDA tensors of
// `dtype` from two producer streams as one group, scaled by 0.5 and 4. Exact results; one backend
// call on hvd's own stream, in the device's fusion buffer; one copy-and-scale launch per 1024
// tensors each way; one wait per producer stream; nothing misused, nothing left behind.
void device_fused_allreduces(hvd_dtype dtype, int count) {
  SchedulerOptions o = fast_options();
  Job job(3, o, /*data_takes_cuda=*/true);
  int streams[2];  // their addresses stand for two cudaStream_t of the application's
  job.each([&](int rank) {
    const int32_t device = rank + 1;
    std::vector<std::vector<char>> in, out;
    std::vector<Submission> group;
    for (int k = 0; k < count; ++k) {
      const size_t elements = 1 + static_cast<size_t>(k % 5);  // odd sizes: unaligned packing
      in.push_back(values_in(dtype, std::vector<double>(elements, 2 * (rank + 1) + k % 7)));
      out.push_back(values_in(dtype, std::vector<double>(elements, -1)));
    }
    for (int k = 0; k < count; ++k) {
      const size_t i = static_cast<size_t>(k);
      Submission s = allreduce("t" + std::to_string(k), in[i].data(), out[i].data(), dtype,
                               {static_cast<int64_t>(in[i].size() / hvd_dtype_size(dtype))});
      s.spec.memory = HVD_MEMORY_CUDA;
      s.spec.device = device;
      s.stream = &streams[k % 2];
      s.spec.prescale = 0.5;
      s.spec.postscale = 4;
      group.push_back(std::move(s));
    }
    const Status status = submit_group_and_wait(job.at(rank), std::move(group));
    ASSERT_TRUE(status.ok()) << status.to_string();
    for (int k = 0; k < count; ++k) {
      // ((2 + j) + (4 + j) + (6 + j)) x 0.5 x 4, j = k % 7
      const size_t i = static_cast<size_t>(k);
      const auto want = values_in(
          dtype, std::vector<double>(out[i].size() / hvd_dtype_size(dtype), 24.0 + 6.0 * (k % 7)));
      EXPECT_EQ(out[i], want) << "tensor " << k << ", " << hvd_dtype_name(dtype);
    }
    const FakeRank& backend = *job.data_ranks[static_cast<size_t>(rank)];
    EXPECT_EQ(backend.last_allreduce_memory, HVD_MEMORY_CUDA);
    EXPECT_NE(backend.last_allreduce_stream, &streams[0]);  // hvd's own stream
    EXPECT_NE(backend.last_allreduce_stream, &streams[1]);
    FakeDeviceMemory& gpu = *job.device_memory[static_cast<size_t>(rank)];
    constexpr size_t kPerLaunch = FakeDeviceMemory::kSpansPerLaunch;
    const size_t launches_each_way = (static_cast<size_t>(count) + kPerLaunch - 1) / kPerLaunch;
    EXPECT_EQ(gpu.launches, 2 * launches_each_way);
    EXPECT_EQ(gpu.spans_copied, 2u * static_cast<size_t>(count));
    EXPECT_EQ(gpu.waits, 2);   // the latest ready event of each producer stream
    EXPECT_EQ(gpu.copies, 0);  // nothing staged through host memory
    EXPECT_EQ(gpu.device_allocations, 1);
    EXPECT_TRUE(gpu.misuse.empty()) << gpu.misuse.front();
  });
  EXPECT_EQ(job.data_allreduces(), 1);
  for (auto& s : job.schedulers) s->shutdown();
  job.schedulers.clear();
  for (auto& gpu : job.device_memory) {
    EXPECT_EQ(gpu->events_live(), 0);  // the pool's, and the batch's once its requests went
    EXPECT_EQ(gpu->device_allocations_live(), 0u);
    EXPECT_EQ(gpu->streams_live, 0);
    EXPECT_TRUE(gpu->misuse.empty()) << gpu->misuse.front();
  }
}

// The copy-and-scale kernel's grid (copy_blocks.hpp; the kernel runs the same search with a warp,
// checked on a GPU by hvd-gpu-bench's batches of 1 to 1024 spans):
// each span a run of blocks of its own, enough for one pass of 16 KiB a block, between 1 and
// 1024; every block of the launch finds the span whose run holds it, and the run's end, in
// batches whose last group of 32 spans is whole, partial or a single span.
TEST(CopyBlocks, EachSpanGetsARunOfItsOwnAndEveryBlockFindsIt) {
  using namespace hvd::core::copy_blocks;
  EXPECT_EQ(blocks_for(0), 1u);
  EXPECT_EQ(blocks_for(1), 1u);
  EXPECT_EQ(blocks_for(16 << 10), 1u);
  EXPECT_EQ(blocks_for((16 << 10) + 1), 2u);
  EXPECT_EQ(blocks_for(16 << 20), 1024u);
  EXPECT_EQ(blocks_for((16 << 20) + 1), 1024u);  // more passes
  EXPECT_EQ(blocks_for(uint64_t{1} << 40), 1024u);
  std::mt19937_64 random(7);
  const auto odd_sizes = [&](size_t count) {  // one large tensor among small ones of odd sizes
    std::vector<uint64_t> sizes(count);
    for (uint64_t& size : sizes) size = random() % 70000;
    sizes[count / 2] = 64 << 20;
    return sizes;
  };
  const std::vector<std::vector<uint64_t>> batches = {{0},
                                                      {uint64_t{1} << 30},
                                                      std::vector<uint64_t>(1024, 16 << 10),
                                                      std::vector<uint64_t>(33, 40 << 10),
                                                      odd_sizes(1024),
                                                      odd_sizes(1023),
                                                      odd_sizes(64),
                                                      odd_sizes(65),
                                                      odd_sizes(31)};
  for (const std::vector<uint64_t>& sizes : batches) {
    std::vector<uint32_t> first_block, group_first_block;
    uint32_t blocks = 0;
    for (uint64_t bytes : sizes) {
      if (first_block.size() % kLanes == 0) group_first_block.push_back(blocks);
      first_block.push_back(blocks);
      blocks += blocks_for(bytes);
    }
    const uint32_t count = static_cast<uint32_t>(sizes.size());
    ASSERT_EQ(group_first_block.size(), groups_of(count));
    for (uint32_t k = 0; k < count; ++k) {
      const uint32_t end = k + 1 < count ? first_block[k + 1] : blocks;
      ASSERT_EQ(end - first_block[k], blocks_for(sizes[k]));
      for (uint32_t block = first_block[k]; block < end; ++block) {
        const auto run = run_of(first_block.data(), group_first_block.data(), count, blocks, block);
        ASSERT_EQ(run.span, k) << count << " spans, block " << block;
        ASSERT_EQ(run.first, first_block[k]) << count << " spans, block " << block;
        ASSERT_EQ(run.end, end) << count << " spans, block " << block;
      }
    }
  }
}

TEST(DeviceExecutor, FusesCudaTensorsOnTheDeviceWithTheirScaleFactorsInEveryFloatingDtype) {
  for (hvd_dtype dtype : {HVD_FLOAT16, HVD_BFLOAT16, HVD_FLOAT32, HVD_FLOAT64}) {
    device_fused_allreduces(dtype, 7);
  }
}

TEST(DeviceExecutor, PacksManyTensorsWithOneLaunchPer1024) {
  device_fused_allreduces(HVD_FLOAT32,
                          2 * static_cast<int>(FakeDeviceMemory::kSpansPerLaunch) + 52);
}

// One rank, the device paused: the request is settled (queued on the device) but not done until
// the device has run it; the collective runs after what the producer's stream queued before the
// submission, and streams ordered after the request run after it, the producer's own included
// (the next step's write: were the request waiting for all of the producer's work, not just what
// came before it, the two would wait for each other forever).
TEST(DeviceExecutor, ARequestCompletesWhenTheDeviceHasRunItsWorkAfterItsProducers) {
  Job job(1, fast_options(), /*data_takes_cuda=*/true);
  FakeDeviceMemory& gpu = *job.device_memory[0];
  int producer, consumer;  // two application streams
  std::vector<float> in(5, -1), out(5, 0);
  gpu.pause();
  ASSERT_TRUE(gpu.enqueue(0, &producer, [&] { in.assign(5, 7); }).ok());
  Submission s = allreduce("grad", in.data(), out.data(), HVD_FLOAT32, {5});
  s.spec.memory = HVD_MEMORY_CUDA;
  s.spec.device = 0;
  s.stream = &producer;
  s.spec.postscale = 3;
  auto done = job.at(0).submit(std::move(s));
  ASSERT_TRUE(done.ok()) << done.status().to_string();
  until_settled(job.at(0), 1);
  EXPECT_FALSE((*done)->done());
  const Status early = (*done)->wait(std::chrono::milliseconds(20));
  EXPECT_EQ(early.code(), HVD_ERR_TIMEOUT) << early.to_string();
  // Ordered after the request without the host waiting for the device.
  ASSERT_TRUE((*done)->order_stream(&producer, kWait).ok());
  ASSERT_TRUE(gpu.enqueue(0, &producer, [&] { in.assign(5, 99); }).ok());
  ASSERT_TRUE((*done)->order_stream(&consumer, kWait).ok());
  std::vector<float> seen;
  ASSERT_TRUE(gpu.enqueue(0, &consumer, [&] { seen = out; }).ok());
  EXPECT_TRUE(seen.empty());
  gpu.resume();
  EXPECT_TRUE((*done)->done());
  ASSERT_TRUE((*done)->wait(kWait).ok());
  EXPECT_EQ(out, std::vector<float>(5, 21));
  EXPECT_EQ(seen, out);
  EXPECT_EQ(in, std::vector<float>(5, 99));
  EXPECT_TRUE(gpu.misuse.empty()) << gpu.misuse.front();
}

TEST(DeviceExecutor, AnErrorOnTheDeviceIsTheRequestsStatus) {
  Job job(1, fast_options(), /*data_takes_cuda=*/true);
  FakeDeviceMemory& gpu = *job.device_memory[0];
  std::vector<float> in(2, 1), out(2, 0);
  gpu.pause();
  Submission s = allreduce("grad", in.data(), out.data(), HVD_FLOAT32, {2});
  s.spec.memory = HVD_MEMORY_CUDA;
  s.spec.device = 0;
  auto done = job.at(0).submit(std::move(s));
  ASSERT_TRUE(done.ok());
  until_settled(job.at(0), 1);
  gpu.break_device(Status(HVD_ERR_SYSTEM, "fake: an illegal memory access"));
  const Status failed = (*done)->wait(kWait);
  EXPECT_EQ(failed.code(), HVD_ERR_SYSTEM);
  EXPECT_EQ(failed.message(), "on the device: fake: an illegal memory access");
  EXPECT_TRUE((*done)->done());
  gpu.break_device(Status::success());
  gpu.resume();
}

// Broadcast, allgather and an unfused allreduce on the device: hvd's stream, after the ready
// event, completed by an event.
TEST(DeviceExecutor, OtherCollectivesRunOnHvdsStreamAfterTheirProducers) {
  SchedulerOptions o = fast_options();
  o.fusion_threshold = 0;
  Job job(2, o, /*data_takes_cuda=*/true);
  int producer;
  job.each([&](int rank) {
    FakeDeviceMemory& gpu = *job.device_memory[static_cast<size_t>(rank)];
    std::vector<int32_t> in(3, -1), gathered(6, 0), broadcast(3, 0), reduced(3, 0);
    ASSERT_TRUE(gpu.enqueue(rank, &producer, [&, rank] { in.assign(3, 10 + rank); }).ok());
    std::vector<Submission> group;
    group.push_back(allgather("gather", in.data(), gathered.data(), HVD_INT32, {3}));
    group.push_back(allreduce("bcast", in.data(), broadcast.data(), HVD_INT32, {3}));
    group.back().spec.type = HVD_COLLECTIVE_BROADCAST;
    group.back().spec.root = 1;
    group.push_back(allreduce("sum", in.data(), reduced.data(), HVD_INT32, {3}));
    for (Submission& s : group) {
      s.spec.memory = HVD_MEMORY_CUDA;
      s.spec.device = rank;
      s.stream = &producer;
    }
    const Status status = submit_group_and_wait(job.at(rank), std::move(group));
    ASSERT_TRUE(status.ok()) << status.to_string();
    EXPECT_EQ(gathered, std::vector<int32_t>({10, 10, 10, 11, 11, 11}));
    EXPECT_EQ(broadcast, std::vector<int32_t>(3, 11));
    EXPECT_EQ(reduced, std::vector<int32_t>(3, 21));
    EXPECT_EQ(gpu.waits, 3);
    EXPECT_EQ(gpu.launches, 0u);  // nothing to pack or scale
    EXPECT_TRUE(gpu.misuse.empty()) << gpu.misuse.front();
  });
}

TEST(DeviceExecutor, ARanksCudaTensorsAreOnOneDeviceAndATensorElsewhereFailsOnEveryRank) {
  Job job(2, fast_options(), /*data_takes_cuda=*/true);
  job.each([&](int rank) {
    std::vector<float> in(2, 1), out(2, 0);
    Submission first = allreduce("first", in.data(), out.data(), HVD_FLOAT32, {2});
    first.spec.memory = HVD_MEMORY_CUDA;
    first.spec.device = rank;
    ASSERT_TRUE(submit_and_wait(job.at(rank), first).ok());
    Submission other = first;
    other.name = "other";
    if (rank == 1) other.spec.device = 3;
    const Status failed = submit_and_wait(job.at(rank), other);
    EXPECT_EQ(failed.code(), HVD_ERR_INVALID_ARGUMENT) << failed.to_string();
    EXPECT_NE(failed.message().find("ALLREDUCE 'other': it is on CUDA device 3, this "
                                    "communicator's CUDA tensors on device 1"),
              std::string::npos)
        << failed.message();
  });
}

// Where the executor cannot drive the device (no CUDA runtime or driver; here a device that fails
// every call), CUDA tensors go to the backend as they are: on their stream, unfused, unscaled.
TEST(DeviceExecutor, WithoutADeviceItCanDriveCudaTensorsGoToTheBackendAsTheyAre) {
  Job job(2, fast_options(), /*data_takes_cuda=*/true);
  for (auto& gpu : job.device_memory) gpu->fail = true;
  int stream;
  job.each([&](int rank) {
    std::vector<float> a(3, 1.0f + rank), b(2, 5), out_a(3), out_b(2);
    std::vector<Submission> group;
    group.push_back(allreduce("a", a.data(), out_a.data(), HVD_FLOAT32, {3}));
    group.push_back(allreduce("b", b.data(), out_b.data(), HVD_FLOAT32, {2}));
    for (Submission& s : group) {
      s.spec.memory = HVD_MEMORY_CUDA;
      s.spec.device = 0;
      s.stream = &stream;
    }
    Submission scaled = group.front();
    scaled.name = "scaled";
    scaled.spec.prescale = 2;
    const Status status = submit_group_and_wait(job.at(rank), std::move(group));
    ASSERT_TRUE(status.ok()) << status.to_string();
    EXPECT_EQ(out_a, std::vector<float>(3, 3));
    EXPECT_EQ(out_b, std::vector<float>(2, 10));
    const FakeRank& backend = *job.data_ranks[static_cast<size_t>(rank)];
    EXPECT_EQ(backend.last_allreduce_stream, &stream);  // the application's own
    EXPECT_EQ(backend.last_allreduce_memory, HVD_MEMORY_CUDA);
    {
      std::vector<float> c(1, 1);
      Submission direct = allreduce("direct", c.data(), c.data(), HVD_FLOAT32, {1});
      direct.spec.memory = HVD_MEMORY_CUDA;
      direct.spec.device = 0;
      direct.stream = &stream;
      auto done = job.at(rank).submit(std::move(direct));
      ASSERT_TRUE(done.ok());
      int consumer;
      const Status unordered = (*done)->order_stream(&consumer, kWait);
      EXPECT_EQ(unordered.code(), HVD_ERR_UNSUPPORTED) << unordered.to_string();
    }
    const Status refused = submit_and_wait(job.at(rank), scaled);
    EXPECT_EQ(refused.code(), HVD_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(refused.message(),
              "ALLREDUCE 'scaled': scale factors on CUDA tensors need hvd's device executor, "
              "which cannot run here: fake: no CUDA device");
  });
  EXPECT_EQ(job.data_allreduces(), 3);  // unfused
}

// Ranks that would take the two paths apart fail the tensor alike, rather than batch apart.
TEST(DeviceExecutor, RanksThatDisagreeOnTheDevicePathFailAlike) {
  Job job(2, fast_options(), /*data_takes_cuda=*/true);
  job.device_memory[0]->fail = true;
  job.each([&](int rank) {
    std::vector<float> in(2, 1), out(2, 0);
    Submission s = allreduce("grad", in.data(), out.data(), HVD_FLOAT32, {2});
    s.spec.memory = HVD_MEMORY_CUDA;
    s.spec.device = 0;
    const Status failed = submit_and_wait(job.at(rank), s);
    EXPECT_EQ(failed.code(), HVD_ERR_MISMATCH) << failed.to_string();
    EXPECT_NE(failed.message().find("Mismatched ALLREDUCE CUDA paths for tensor 'grad'"),
              std::string::npos)
        << failed.message();
  });
  EXPECT_EQ(job.data_allreduces(), 0);
}

// Horovod's uneven split with scale factors, on the device: the blocks padded in device scratch
// by the copy-and-scale kernel, reduced, this rank's rows copied out and scaled.
TEST(DeviceExecutor, AnUnevenScaledReduceScatterRunsOnTheDevice) {
  Job job(3, fast_options(), /*data_takes_cuda=*/true);
  job.each([&](int rank) {
    // 7 rows of 2: ranks get 3, 2, 2 rows. Row i of rank r holds (r + 1) * (i + 1).
    std::vector<double> in;
    for (int i = 0; i < 7; ++i) in.insert(in.end(), 2, (rank + 1) * (i + 1));
    const size_t mine = rank == 0 ? 3 : 2;
    std::vector<double> out(2 * mine, -1);
    Submission s = allreduce("rs", in.data(), out.data(), HVD_FLOAT64, {7, 2});
    s.spec.type = HVD_COLLECTIVE_REDUCE_SCATTER;
    s.spec.memory = HVD_MEMORY_CUDA;
    s.spec.device = rank;
    s.spec.prescale = 2;
    s.spec.postscale = 0.5;
    const Status status = submit_and_wait(job.at(rank), s);
    ASSERT_TRUE(status.ok()) << status.to_string();
    const size_t first_row = rank == 0 ? 0 : rank == 1 ? 3 : 5;
    for (size_t i = 0; i < out.size(); ++i) {
      EXPECT_EQ(out[i], 6.0 * static_cast<double>(first_row + i / 2 + 1)) << "rank " << rank;
    }
    FakeDeviceMemory& gpu = *job.device_memory[static_cast<size_t>(rank)];
    EXPECT_EQ(gpu.launches, 2u);  // the blocks in, this rank's rows out
    EXPECT_TRUE(gpu.misuse.empty()) << gpu.misuse.front();
  });
}

// Device work settled before the communicators broke fails with their error once its event
// completes: an abort ends NCCL's kernels without an error of the device's own.
TEST(DeviceExecutor, WorkSettledBeforeTheCommunicatorBrokeFailsWithItsError) {
  Job job(1, fast_options(), /*data_takes_cuda=*/true);
  FakeDeviceMemory& gpu = *job.device_memory[0];
  std::vector<float> in(2, 1), out(2, 0);
  gpu.pause();
  Submission s = allreduce("grad", in.data(), out.data(), HVD_FLOAT32, {2});
  s.spec.memory = HVD_MEMORY_CUDA;
  s.spec.device = 0;
  auto settled = job.at(0).submit(std::move(s));
  ASSERT_TRUE(settled.ok());
  until_settled(job.at(0), 1);
  job.control_ranks[0]->fail_calls = true;  // the next negotiation fails: the scheduler stops
  const Status broke =
      submit_and_wait(job.at(0), allreduce("next", in.data(), out.data(), HVD_FLOAT32, {2}));
  EXPECT_EQ(broke.code(), HVD_ERR_SYSTEM) << broke.to_string();
  gpu.resume();
  const Status late = (*settled)->wait(kWait);
  EXPECT_EQ(late.code(), HVD_ERR_SYSTEM) << late.to_string();
  EXPECT_NE(late.message().find("the communicator broke before the device had run it: "),
            std::string::npos)
      << late.message();
}

// A batch the executor cannot queue in full (its kernel's launch fails) breaks the communicator:
// this rank's next call would pair with its peers' earlier one.
TEST(DeviceExecutor, ABatchItCannotQueueFailsAndAbortsTheCommunicator) {
  Job job(1, fast_options(), /*data_takes_cuda=*/true);
  job.device_memory[0]->fail_kernels = true;
  std::vector<float> a(2, 1), b(3, 1);
  std::vector<Submission> group;
  group.push_back(allreduce("a", a.data(), a.data(), HVD_FLOAT32, {2}));
  group.push_back(allreduce("b", b.data(), b.data(), HVD_FLOAT32, {3}));
  for (Submission& s : group) {
    s.spec.memory = HVD_MEMORY_CUDA;
    s.spec.device = 0;
  }
  {
    auto done = job.at(0).submit_group(std::move(group));
    ASSERT_TRUE(done.ok());
    for (auto& c : *done) {
      const Status failed = c->wait(kWait);
      EXPECT_EQ(failed.code(), HVD_ERR_SYSTEM);
      EXPECT_EQ(failed.message(), "fake: the kernel's launch failed");
    }
  }
  EXPECT_EQ(job.data_ranks[0]->aborted_with().message(), "fake: the kernel's launch failed");
  EXPECT_EQ(job.data_allreduces(), 0);
}

// A device whose streams and events work but where hvd's kernels have no code (an architecture
// the build did not name), and HVD_DEVICE_EXECUTOR=0, both take the direct path.
TEST(DeviceExecutor, NoKernelForTheDeviceOrTheKnobOffTakesTheDirectPath) {
  for (bool knob_off : {false, true}) {
    SchedulerOptions o = fast_options();
    o.device_executor = !knob_off;
    Job job(1, o, /*data_takes_cuda=*/true);
    if (!knob_off) job.device_memory[0]->no_kernels = true;
    int stream;
    std::vector<float> a(2, 1), out(2, 0);
    Submission s = allreduce("a", a.data(), out.data(), HVD_FLOAT32, {2});
    s.spec.memory = HVD_MEMORY_CUDA;
    s.spec.device = 0;
    s.stream = &stream;
    auto done = job.at(0).submit(std::move(s));
    ASSERT_TRUE(done.ok());
    ASSERT_TRUE((*done)->wait(kWait).ok());
    EXPECT_EQ(out, a);
    EXPECT_EQ(job.data_ranks[0]->last_allreduce_stream, &stream);
    EXPECT_EQ(job.device_memory[0]->launches, 0u);
  }
  EXPECT_FALSE(SchedulerOptions::from(*Settings::read(fake_env({{"HVD_DEVICE_EXECUTOR", "0"}})))
                   .device_executor);
}

// A larger batch outgrows the fusion buffer: the old one is freed in stream order, once the
// device is past the work that used it, and not before.
TEST(DeviceExecutor, AnOutgrownFusionBufferIsFreedOnceTheDeviceIsPastIt) {
  Job job(1, fast_options(), /*data_takes_cuda=*/true);
  FakeDeviceMemory& gpu = *job.device_memory[0];
  uint64_t settled = 0;
  std::list<std::vector<float>> tensors;  // alive until the paused device has run on them
  auto batch = [&](int64_t n) {
    std::vector<float>& a = tensors.emplace_back(static_cast<size_t>(n), 1.0f);
    std::vector<float>& b = tensors.emplace_back(static_cast<size_t>(n), 2.0f);
    std::vector<Submission> group;
    group.push_back(allreduce("a", a.data(), a.data(), HVD_FLOAT32, {n}));
    group.push_back(allreduce("b", b.data(), b.data(), HVD_FLOAT32, {n}));
    for (Submission& s : group) {
      s.spec.memory = HVD_MEMORY_CUDA;
      s.spec.device = 0;
    }
    auto done = job.at(0).submit_group(std::move(group));
    ASSERT_TRUE(done.ok());
    settled += 2;
    until_settled(job.at(0), settled);
  };
  batch(4);
  EXPECT_EQ(gpu.device_allocations_live(), 1u);
  gpu.pause();
  batch(4000);  // queued, not run: the first buffer is still in use by what precedes its free
  EXPECT_EQ(gpu.device_allocations, 2);
  EXPECT_EQ(gpu.device_allocations_live(), 2u);
  gpu.resume();
  EXPECT_EQ(gpu.device_allocations_live(), 1u);
  EXPECT_TRUE(gpu.misuse.empty()) << gpu.misuse.front();
}

}  // namespace
