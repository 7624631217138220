// The host executor: what runs the responses every rank agreed on. Allreduces fused up to the
// threshold, where they lie in memory when they can, scaled on the way in and out; CUDA tensors
// staged through the fusion buffer for a backend that takes host memory only; allgathers of
// different first dimensions into outputs hvd allocates; groups that run together.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "fake_collectives.hpp"
#include "scheduler_job.hpp"

namespace hvd::core {
namespace {

using hvd::testing::allgather;
using hvd::testing::allreduce;
using hvd::testing::FakeDeviceMemory;
using hvd::testing::FakeRank;
using hvd::testing::fast_options;
using hvd::testing::Job;
using hvd::testing::kWait;
using hvd::testing::rows_of;
using hvd::testing::submit_and_wait;
using hvd::testing::submit_group_and_wait;

// ---- fusion ---------------------------------------------------------------------------------

// Four float32 tensors of `elements` each, grouped (so they are ready in the same cycle) and
// allreduced; returns how many data allreduces ran.
int fused_calls(uint64_t threshold, int64_t elements) {
  SchedulerOptions o = fast_options();
  o.fusion_threshold = threshold;
  Job job(2, o);
  job.each([&](int rank) {
    std::vector<std::vector<float>> in(4, std::vector<float>(static_cast<size_t>(elements)));
    std::vector<std::vector<float>> out(4, std::vector<float>(static_cast<size_t>(elements), -1));
    std::vector<Submission> group;
    for (int k = 0; k < 4; ++k) {
      for (int64_t i = 0; i < elements; ++i)
        in[k][static_cast<size_t>(i)] = static_cast<float>(rank + k + i);
      group.push_back(
          allreduce("g" + std::to_string(k), in[k].data(), out[k].data(), HVD_FLOAT32, {elements}));
    }
    auto done = job.at(rank).submit_group(std::move(group));
    ASSERT_TRUE(done.ok()) << done.status().to_string();
    for (int k = 0; k < 4; ++k) {
      ASSERT_TRUE((*done)[static_cast<size_t>(k)]->wait(kWait).ok());
      for (int64_t i = 0; i < elements; ++i) {
        // rank 0 + rank 1: (k + i) + (1 + k + i)
        ASSERT_EQ(out[k][static_cast<size_t>(i)], static_cast<float>(2 * (k + i) + 1));
      }
    }
  });
  return job.data_allreduces();
}

TEST(Scheduler, FusionFillsTheBufferUpToTheThresholdExactly) {
  EXPECT_EQ(fused_calls(1024, 128), 2);  // 4 x 512 B, threshold 1 KiB: two full buffers
  EXPECT_EQ(fused_calls(2048, 128), 1);  // all four in one
  EXPECT_EQ(fused_calls(2047, 128), 2);  // one byte short: three do not fit
}

TEST(Scheduler, ATensorLargerThanTheThresholdRunsAlone) {
  EXPECT_EQ(fused_calls(1024, 512), 4);  // 2 KiB each
}

TEST(Scheduler, ThresholdZeroDisablesFusion) { EXPECT_EQ(fused_calls(0, 16), 4); }

// Four grouped int32 tensors of 64 elements laid end to end in one allocation; each rank's recv
// starts `recv_offset` elements into `buffer` (which then is the send as well: 0 is in place) or
// in a buffer of its own (recv_offset < 0). `steps` times, values new each step. Checks exact
// results; returns whether the backend was handed the application's own memory, on both sides,
// in the last step. With `cache_full`, a cache of four entries already holds another tensor, so
// the last of the four takes its bit, the first: bit order is then not memory order.
bool reduced_where_they_lie(int recv_offset, int steps = 1, bool cache_full = false) {
  constexpr int64_t kElements = 64;
  SchedulerOptions options = fast_options();
  if (cache_full) options.cache_capacity = 4;
  Job job(2, options);
  std::vector<char> direct(2);  // not vector<bool>: each rank writes its own element
  job.each([&](int rank) {
    if (cache_full) {
      int32_t x = rank;
      auto done = job.at(rank).submit(allreduce("before", &x, &x, HVD_INT32, {1}));
      ASSERT_TRUE(done.ok() && (*done)->wait(kWait).ok());
    }
    std::vector<int32_t> buffer(4 * kElements + 2 * kElements), own(4 * kElements, -1);
    int32_t* recv = recv_offset < 0 ? own.data() : buffer.data() + recv_offset;
    for (int step = 0; step < steps; ++step) {
      for (size_t i = 0; i < 4 * kElements; ++i) buffer[i] = static_cast<int32_t>(i) + rank + step;
      std::vector<Submission> group;
      for (int64_t k = 0; k < 4; ++k) {
        group.push_back(allreduce("t" + std::to_string(k), buffer.data() + k * kElements,
                                  recv + k * kElements, HVD_INT32, {kElements}));
      }
      const Status status = submit_group_and_wait(job.at(rank), std::move(group));
      ASSERT_TRUE(status.ok()) << status.to_string();
      for (int64_t i = 0; i < 4 * kElements; ++i) {
        ASSERT_EQ(recv[i], static_cast<int32_t>(2 * (i + step) + 1)) << "element " << i;
      }
    }
    const FakeRank& fake = *job.data_ranks[static_cast<size_t>(rank)];
    direct[static_cast<size_t>(rank)] =
        fake.last_allreduce_send == buffer.data() && fake.last_allreduce_recv == recv;
  });
  EXPECT_EQ(job.data_allreduces(), steps + (cache_full ? 1 : 0));
  EXPECT_EQ(direct[0], direct[1]);
  return direct[0];
}

TEST(Scheduler, TensorsEndToEndInMemoryAreReducedWhereTheyLie) {
  EXPECT_TRUE(reduced_where_they_lie(-1));  // out of place, both sides end to end
  EXPECT_TRUE(reduced_where_they_lie(0));   // in place
}

TEST(Scheduler, CachedTensorsEndToEndAreReducedWhereTheyLieWhateverBitsTheyHold) {
  EXPECT_TRUE(reduced_where_they_lie(-1, 3));
  EXPECT_TRUE(reduced_where_they_lie(-1, 3, true));
  EXPECT_TRUE(reduced_where_they_lie(0, 3, true));
}

TEST(Scheduler, OutputsOverlappingInputsInPartGoThroughTheFusionBuffer) {
  // Each output starts half a tensor into its input: written straight away, the second half of
  // one output would overwrite the next tensor's input before it is read.
  EXPECT_FALSE(reduced_where_they_lie(32));
}

TEST(Scheduler, ScaleFactorsApplyOnTheWayInAndOut) {
  SchedulerOptions o = fast_options();
  Job job(3, o);
  job.each([&](int rank) {
    std::vector<double> in(5, rank + 1), out(5, 0);
    std::vector<float> in2(3, 2.0f * static_cast<float>(rank + 1)), out2(3, 0);
    Submission a = allreduce("scaled", in.data(), out.data(), HVD_FLOAT64, {5});
    a.spec.prescale = 0.5;
    a.spec.postscale = 4;
    Submission b = allreduce("scaled2", in2.data(), out2.data(), HVD_FLOAT32, {3});
    b.spec.prescale = 0.5;
    b.spec.postscale = 4;  // same factors: fused with the first? no, another dtype
    std::vector<Submission> group;
    group.push_back(std::move(a));
    group.push_back(std::move(b));
    const Status status = submit_group_and_wait(job.at(rank), std::move(group));
    ASSERT_TRUE(status.ok()) << status.to_string();
    for (double v : out) EXPECT_EQ(v, (0.5 * 1 + 0.5 * 2 + 0.5 * 3) * 4);
    for (float v : out2) EXPECT_EQ(v, (1.0f + 2.0f + 3.0f) * 4);
  });
}

TEST(Scheduler, ZeroSizeTensorsComplete) {
  Job job(2, fast_options());
  job.each([&](int rank) {
    auto a = job.at(rank).submit(allreduce("empty", nullptr, nullptr, HVD_FLOAT32, {0}));
    auto b = job.at(rank).submit(allreduce("empty2", nullptr, nullptr, HVD_INT32, {3, 0}));
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE((*a)->wait(kWait).ok());
    EXPECT_TRUE((*b)->wait(kWait).ok());
  });
}

// ---- CUDA tensors -----------------------------------------------------------------------------

// Three ranks each submit `count` float32 CUDA tensors of 3 elements (tensor k of rank r on
// device_of(r, k), alternating between two streams, factors 0.5 and 4) as one group, to a backend
// that takes host memory only. Checks exact results and the staging: every tensor copied in and
// out on its own device, every stream waited for on that device, the backend handed host memory.
// Returns the data allreduces per rank.
using DeviceOf = std::function<int32_t(int rank, int k)>;
int staged_cuda_allreduces(
    uint64_t threshold, int count, const DeviceOf& device_of = [](int, int) { return 1; }) {
  SchedulerOptions o = fast_options();
  o.fusion_threshold = threshold;
  Job job(3, o);
  int streams[2];  // their addresses stand for two cudaStream_t
  job.each([&](int rank) {
    std::vector<std::vector<float>> in(static_cast<size_t>(count)), out(in.size());
    std::vector<Submission> group;
    for (int k = 0; k < count; ++k) {
      const size_t i = static_cast<size_t>(k);
      in[i].assign(3, static_cast<float>(2 * (rank + 1) + k));
      out[i].assign(3, -1);
      Submission s =
          allreduce("cuda" + std::to_string(k), in[i].data(), out[i].data(), HVD_FLOAT32, {3});
      s.spec.memory = HVD_MEMORY_CUDA;
      s.spec.device = device_of(rank, k);
      s.stream = &streams[k % 2];
      s.spec.prescale = 0.5;
      s.spec.postscale = 4;
      group.push_back(std::move(s));
    }
    const Status status = submit_group_and_wait(job.at(rank), std::move(group));
    ASSERT_TRUE(status.ok()) << status.to_string();
    for (int k = 0; k < count; ++k) {
      // ((2 + k) + (4 + k) + (6 + k)) x 0.5 x 4
      for (float v : out[static_cast<size_t>(k)]) EXPECT_EQ(v, 24.0f + 6.0f * k) << "tensor " << k;
    }
    const FakeRank& backend = *job.data_ranks[static_cast<size_t>(rank)];
    EXPECT_EQ(backend.last_allreduce_memory, HVD_MEMORY_HOST);
    EXPECT_EQ(backend.last_allreduce_stream, nullptr);
    const FakeDeviceMemory& device = *job.device_memory[static_cast<size_t>(rank)];
    EXPECT_EQ(device.copies, 2 * count);
    EXPECT_EQ(device.bytes_copied, 2u * static_cast<uint64_t>(count) * 3 * sizeof(float));
    std::set<int32_t> expected_devices;
    for (int k = 0; k < count; ++k) expected_devices.insert(device_of(rank, k));
    EXPECT_EQ(device.devices, expected_devices);
    EXPECT_TRUE(device.unsynchronized.empty());
    // Staged through page-locked memory, one buffer kept for the next batches.
    EXPECT_GE(device.pinned_allocations, 1);
    EXPECT_EQ(device.pinned_live, 1);
  });
  return job.data_allreduces();
}

TEST(Scheduler, CudaTensorsOnAHostBackendAreFusedInHostMemoryWithTheirScaleFactors) {
  EXPECT_EQ(staged_cuda_allreduces(128 << 20, 5), 1);
}

// The normal GPU job: every rank drives its own device (device = local rank). Ranks agree on the
// kind of memory only, so the tensors fuse into one backend call as on one device.
TEST(Scheduler, RanksOnTheirOwnDevicesFuseAndReduceTogether) {
  EXPECT_EQ(staged_cuda_allreduces(128 << 20, 5, [](int rank, int) { return rank; }), 1);
}

// A rank may even spread one fused batch over two devices: each tensor is copied on its own.
TEST(Scheduler, ABatchOverSeveralDevicesOfOneRankCopiesEachTensorOnItsOwn) {
  EXPECT_EQ(staged_cuda_allreduces(128 << 20, 6,
                                   [](int rank, int k) { return rank == 1 ? k % 3 : rank; }),
            1);
}

TEST(Scheduler, CudaTensorsOnAHostBackendAreStagedOneByOneWhenTheyDoNotFuse) {
  EXPECT_EQ(staged_cuda_allreduces(0, 5), 5);  // fusion off
  EXPECT_EQ(staged_cuda_allreduces(8, 5), 5);  // 12 bytes each, over the threshold
}

TEST(Scheduler, AStagingCopyThatFailsFailsItsTensorAndTheJobGoesOn) {
  Job job(2, fast_options());
  for (auto& device : job.device_memory) device->fail = true;
  job.each([&](int rank) {
    std::vector<float> in(2, 1), out(2, 0);
    Submission s = allreduce("cuda", in.data(), out.data(), HVD_FLOAT32, {2});
    s.spec.memory = HVD_MEMORY_CUDA;
    s.spec.device = 0;
    const Status failed = submit_and_wait(job.at(rank), std::move(s));
    EXPECT_EQ(failed.code(), HVD_ERR_SYSTEM);
    EXPECT_EQ(failed.message(), "staging CUDA tensors in host memory: fake: no CUDA device");
    EXPECT_TRUE(
        submit_and_wait(job.at(rank), allreduce("host", in.data(), out.data(), HVD_FLOAT32, {2}))
            .ok());
    EXPECT_EQ(out, std::vector<float>(2, 2));
  });
  EXPECT_EQ(job.data_allreduces(), 1);  // the CUDA tensor never reached the backend
}

// ---- allgather of different first dimensions ---------------------------------------------------

// Each rank's rows, gathered in rank order.
std::vector<int64_t> gathered(const std::vector<int64_t>& rows_by_rank, int64_t width) {
  std::vector<int64_t> want;
  for (size_t r = 0; r < rows_by_rank.size(); ++r) {
    const auto part = rows_of(static_cast<int>(r), rows_by_rank[r], width);
    want.insert(want.end(), part.begin(), part.end());
  }
  return want;
}

// Rank r sends rows_by_rank[r] rows with no recv buffer; every rank gets the whole, exactly.
void expect_gathered(Job& job, const std::string& name, const std::vector<int64_t>& rows_by_rank) {
  const int64_t width = 3;
  const std::vector<int64_t> want = gathered(rows_by_rank, width);
  job.each([&](int rank) {
    const int64_t rows = rows_by_rank[static_cast<size_t>(rank)];
    const std::vector<int64_t> in = rows_of(rank, rows, width);
    auto done = job.at(rank).submit(allgather(name, in.data(), nullptr, HVD_INT64, {rows, width}));
    ASSERT_TRUE(done.ok()) << done.status().to_string();
    ASSERT_TRUE((*done)->wait(kWait).ok());
    void* data = nullptr;
    int64_t first_dim = -1;
    ASSERT_TRUE((*done)->output(&data, &first_dim).ok());
    ASSERT_EQ(first_dim * width, static_cast<int64_t>(want.size())) << "rank " << rank;
    const auto* out = static_cast<const int64_t*>(data);
    EXPECT_EQ(std::vector<int64_t>(out, out + want.size()), want) << "rank " << rank;
  });
}

TEST(Scheduler, AllgatherRanksMayDifferInTheFirstDimension) {
  const std::vector<std::vector<int64_t>> cases = {{5}, {1, 4}, {2, 0, 7}, {3, 1, 0, 2}};
  for (const auto& rows : cases) {
    Job job(static_cast<int>(rows.size()), fast_options());
    expect_gathered(job, "g", rows);
  }
}

TEST(Scheduler, AllgatherOfNewFirstDimensionsIsNegotiatedAgain) {
  Job job(3, fast_options());
  expect_gathered(job, "g", {1, 2, 3});
  const int gathers = job.control_allgathers();
  expect_gathered(job, "g", {1, 2, 3});  // the same sizes: from the cache
  EXPECT_EQ(job.control_allgathers(), gathers);
  expect_gathered(job, "g", {1, 5, 3});  // one rank's changed: negotiated in full
  EXPECT_GT(job.control_allgathers(), gathers);
  expect_gathered(job, "g", {0, 0, 0});
}

// ---- groups -----------------------------------------------------------------------------------

TEST(Scheduler, AGroupCompletesTogether) {
  Job job(3, fast_options());
  job.each([&](int rank) {
    std::vector<std::vector<int64_t>> in(5, std::vector<int64_t>(3, rank)),
        out(5, std::vector<int64_t>(3));
    std::vector<Submission> group;
    for (int k = 0; k < 5; ++k) {
      group.push_back(
          allreduce("grp" + std::to_string(k), in[k].data(), out[k].data(), HVD_INT64, {3}));
    }
    // Ranks submit a lone tensor first, in different places relative to the group.
    std::vector<int64_t> lone_in(1, 1), lone_out(1);
    auto lone = [&] {
      return submit_and_wait(job.at(rank),
                             allreduce("lone", lone_in.data(), lone_out.data(), HVD_INT64, {1}));
    };
    if (rank == 1) {
      ASSERT_TRUE(lone().ok());
    }
    auto done = job.at(rank).submit_group(std::move(group));
    ASSERT_TRUE(done.ok());
    if (rank != 1) {
      ASSERT_TRUE(lone().ok());
    }
    for (auto& c : *done) ASSERT_TRUE(c->wait(kWait).ok());
    for (auto& o : out) EXPECT_EQ(o[0], 0 + 1 + 2);
    EXPECT_EQ(lone_out[0], 3);
  });
}
}  // namespace
}  // namespace hvd::core
