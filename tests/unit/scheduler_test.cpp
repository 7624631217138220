// The fusion scheduler against ranks-as-threads (fake_collectives.hpp): negotiation in any
// order, every mismatch kind, duplicates, the cache, fusion boundaries, stalls and shutdown.
#include "scheduler/scheduler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <list>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "fake_collectives.hpp"
#include "fake_env.hpp"
#include "scheduler_job.hpp"
#include "tensor_workload.hpp"

namespace {

using hvd::Status;
using hvd::core::Completion;
using hvd::core::fake_env;
using hvd::core::Scheduler;
using hvd::core::SchedulerOptions;
using hvd::core::Settings;
using hvd::core::Submission;
using hvd::core::TensorSpec;
using hvd::testing::data_for;
using hvd::testing::FakeDeviceMemory;
using hvd::testing::FakeRank;
using hvd::testing::FakeWorld;
using hvd::testing::fast_options;
using hvd::testing::Job;
using hvd::testing::kWait;
using hvd::testing::random_tensors;
using hvd::testing::submit_and_wait;
using hvd::testing::submit_group_and_wait;
using hvd::testing::Tensor;
using hvd::testing::until_settled;
using namespace std::chrono_literals;

using hvd::testing::allgather;
using hvd::testing::allreduce;

// ---- results ------------------------------------------------------------------------------

// Every rank submits every tensor in its own random order, then waits for all; exact results.
void run_workload(Job& job, const std::vector<Tensor>& tensors, uint32_t order_seed) {
  job.each([&](int rank) {
    std::vector<size_t> order(tensors.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(),
                 std::mt19937(order_seed + static_cast<uint32_t>(rank)));
    std::vector<std::vector<char>> ins(tensors.size()), outs(tensors.size()), wants(tensors.size());
    std::vector<std::shared_ptr<Completion>> done(tensors.size());
    for (size_t k : order) {
      const Tensor& t = tensors[k];
      std::tie(ins[k], wants[k]) = data_for(t, rank, job.size());
      outs[k].assign(wants[k].size(), 0x5a);
      Submission s;
      s.name = t.name;
      s.send = ins[k].data();
      s.recv = outs[k].data();
      s.spec.type = t.collective;
      s.spec.dtype = t.dtype;
      s.spec.shape.assign(t.shape.begin(), t.shape.end());
      s.spec.op = t.op;
      s.spec.root = t.root;
      auto c = job.at(rank).submit(std::move(s));
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      done[k] = *c;
    }
    for (size_t k = 0; k < tensors.size(); ++k) {
      const Status s = done[k]->wait(kWait);
      ASSERT_TRUE(s.ok()) << tensors[k].name << ": " << s.to_string();
      EXPECT_EQ(outs[k], wants[k])
          << "rank " << rank << ", " << tensors[k].name << " (" << tensors[k].collective << ")";
    }
  });
}

TEST(Scheduler, RandomOrdersOnEveryRankGiveExactResults) {
  for (int size : {1, 2, 3, 4}) {
    Job job(size, fast_options());
    run_workload(job, random_tensors(60, size, 7), 100);
  }
}

TEST(Scheduler, SteadyStateNegotiatesThroughTheCacheAlone) {
  Job job(3, fast_options());
  const auto tensors = random_tensors(40, 3, 11);
  run_workload(job, tensors, 1);
  const int gathers_after_first_round = job.control_allgathers();
  EXPECT_GT(gathers_after_first_round, 0);
  run_workload(job, tensors, 2);  // other orders, same tensors: every one is a cache hit
  run_workload(job, tensors, 3);
  EXPECT_EQ(job.control_allgathers(), gathers_after_first_round);
}

TEST(Scheduler, CacheEvictionsKeepResultsExact) {
  SchedulerOptions o = fast_options();
  o.cache_capacity = 3;  // far fewer entries than tensors: every round evicts
  Job job(2, o);
  const auto tensors = random_tensors(12, 2, 5);
  for (uint32_t round = 0; round < 3; ++round) run_workload(job, tensors, round);
}

TEST(Scheduler, NoCacheAtAllStillWorks) {
  SchedulerOptions o = fast_options();
  o.cache_capacity = 0;
  Job job(3, o);
  const auto tensors = random_tensors(20, 3, 9);
  run_workload(job, tensors, 1);
  run_workload(job, tensors, 2);
}

// ---- the cycle clock ------------------------------------------------------------------------

TEST(Scheduler, AnIdleSchedulerVotesRarely) {
  Job job(2, fast_options());  // a cycle every 200 us while anything is in flight
  std::this_thread::sleep_for(300ms);
  // The first cycle, then one vote per idle interval (100 ms); not one per 200 us cycle.
  EXPECT_LE(job.control_ranks[0]->allreduces, 5);
}

// After an idle spell the vote comes a cycle time after the first submission, so it catches a
// burst shorter than that whole: one fused call, and nothing completes before the cycle time.
TEST(Scheduler, TheFirstVoteAfterAnIdleSpellCatchesTheWholeBurst) {
  SchedulerOptions o = fast_options();
  o.cycle_time = std::chrono::milliseconds(150);
  Job job(2, o);
  job.past_first_cycles();  // both ranks idle
  job.each([&](int rank) {
    std::vector<std::vector<int32_t>> in(4, std::vector<int32_t>(8, rank + 1));
    std::vector<std::vector<int32_t>> out(4, std::vector<int32_t>(8, 0));
    std::vector<std::shared_ptr<Completion>> done;
    const auto first = std::chrono::steady_clock::now();
    for (int k = 0; k < 4; ++k) {
      if (k > 0) std::this_thread::sleep_for(15ms);
      auto c = job.at(rank).submit(
          allreduce("burst." + std::to_string(k), in[k].data(), out[k].data(), HVD_INT32, {8}));
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      done.push_back(*c);
    }
    // Polled, not waited for: a wait would start the cycle at once.
    std::this_thread::sleep_until(first + 120ms);
    for (const auto& c : done) EXPECT_FALSE(c->done()) << "voted before the cycle time was up";
    for (int k = 0; k < 4; ++k) {
      ASSERT_TRUE(done[static_cast<size_t>(k)]->wait(kWait).ok());
      EXPECT_EQ(out[k], std::vector<int32_t>(8, 3));
    }
  });
  EXPECT_EQ(job.data_allreduces(), 1);
}

// A cycle time no test waits out: only waits start cycles.
SchedulerOptions clock_too_slow() {
  SchedulerOptions o = fast_options();
  o.cycle_time = std::chrono::seconds(20);
  return o;
}

// Every rank waits for its completion and finds `want` in its output; returns how long it took.
std::chrono::duration<double> wait_everywhere(Job& job,
                                              const std::vector<std::shared_ptr<Completion>>& done,
                                              const std::vector<std::vector<int32_t>>& out,
                                              const std::vector<int32_t>& want) {
  const auto start = std::chrono::steady_clock::now();
  job.each([&](int rank) {
    ASSERT_TRUE(done[rank]->wait(kWait).ok());
    EXPECT_EQ(out[rank], want);
  });
  return std::chrono::steady_clock::now() - start;
}

TEST(Scheduler, AWaitStartsTheNextCycleAtOnce) {
  Job job(2, clock_too_slow());
  job.past_first_cycles();
  std::vector<std::vector<int32_t>> in(2, std::vector<int32_t>(8)), out = in;
  for (int step = 0; step < 3; ++step) {  // the full exchange first, then the cache's bits
    // Every rank submits before any waits: a rank's early vote finds the tensor everywhere.
    std::vector<std::shared_ptr<Completion>> done(2);
    job.each([&](int rank) {
      in[rank].assign(8, rank + step);
      auto c =
          job.at(rank).submit(allreduce("now", in[rank].data(), out[rank].data(), HVD_INT32, {8}));
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      done[rank] = *c;
    });
    EXPECT_LT(wait_everywhere(job, done, out, std::vector<int32_t>(8, 1 + 2 * step)), 5s)
        << "the waits did not start a cycle";
  }
}

// A rank that voted for B while its peer had not submitted it yet, then waits for B: the cycle
// that ran A is followed by another at once, not at the clock.
TEST(Scheduler, WhileAWaiterIsServedCyclesFollowWithoutAPause) {
  Job job(2, clock_too_slow());
  job.past_first_cycles();
  std::vector<std::vector<int32_t>> in(2, std::vector<int32_t>(4)), a = in, b = in;
  std::vector<std::shared_ptr<Completion>> done_a(2), done_b(2);
  auto submit = [&](int rank, const char* name, std::vector<std::vector<int32_t>>& out,
                    std::vector<std::shared_ptr<Completion>>& done) {
    in[rank].assign(4, rank + 1);
    auto c =
        job.at(rank).submit(allreduce(name, in[rank].data(), out[rank].data(), HVD_INT32, {4}));
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    done[rank] = *c;
  };
  job.each([&](int rank) {
    submit(rank, "A", a, done_a);
    if (rank == 0) submit(rank, "B", b, done_b);  // rank 1 submits B later
  });
  job.each([&](int rank) { ASSERT_TRUE(done_a[rank]->wait(kWait).ok()); });
  EXPECT_FALSE(done_b[0]->done());
  submit(1, "B", b, done_b);
  EXPECT_LT(wait_everywhere(job, done_b, b, std::vector<int32_t>(4, 3)), 5s)
      << "rank 0 waited for its clock";
}

// Ranks that wait for tensors no other rank submits vote once, then leave it to the clock.
TEST(Scheduler, WaitingThroughAStallDoesNotSpin) {
  Job job(2, clock_too_slow());
  job.past_first_cycles();
  std::vector<int32_t> in(4, 1), out(4);
  job.each([&](int rank) {
    const uint64_t cycles = job.at(rank).stats().cycles;
    auto c = job.at(rank).submit(
        allreduce(rank == 0 ? "only0" : "only1", in.data(), out.data(), HVD_INT32, {4}));
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ((*c)->wait(300ms).code(), HVD_ERR_TIMEOUT);
    EXPECT_LE(job.at(rank).stats().cycles - cycles, 2u);
  });
}

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

// Rank r's `rows` rows of `width` int64 elements: row i holds 1000 * r + i, every element of it.
std::vector<int64_t> rows_of(int rank, int64_t rows, int64_t width) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < rows; ++i) v.insert(v.end(), static_cast<size_t>(width), 1000 * rank + i);
  return v;
}

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

TEST(Scheduler, AnAllgatherIntoABufferTooSmallIsTheSameErrorOnEveryRank) {
  Job job(2, fast_options());
  std::vector<std::string> messages(2);
  job.each([&](int rank) {
    const int64_t rows = rank + 1;  // 1 and 2 rows of 3
    const std::vector<int64_t> in = rows_of(rank, rows, 3);
    std::vector<int64_t> out(static_cast<size_t>(2 * rows * 3));  // sized for equal shapes
    const Status s =
        submit_and_wait(job.at(rank), allgather("g", in.data(), out.data(), HVD_INT64, {rows, 3}));
    EXPECT_EQ(s.code(), HVD_ERR_MISMATCH);
    messages[static_cast<size_t>(rank)] = s.message();
    // The job goes on.
    std::vector<int64_t> ok(2 * 3);
    EXPECT_TRUE(
        submit_and_wait(job.at(rank), allgather("h", in.data(), ok.data(), HVD_INT64, {1, 3}))
            .ok());
  });
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_EQ(messages[0],
            "Mismatched ALLGATHER first dimensions for tensor 'g': the ranks sent 1, 2 (in rank "
            "order), 9 elements in all, but rank 0's output buffer holds 6 (an allgather's recvbuf "
            "is sized for equal shapes; pass recvbuf NULL and hvd allocates the output once the "
            "sizes are known).");
}

TEST(Scheduler, AllgatherRanksMustAgreeBeyondTheFirstDimension) {
  const std::vector<std::vector<int64_t>> shapes = {{2, 3}, {1, 4}, {2}, {2, 1}};
  for (size_t k = 0; k < shapes.size(); k += 2) {
    Job job(2, fast_options());
    std::vector<std::string> messages(2);
    job.each([&](int rank) {
      const std::vector<int64_t> in(8, rank);
      const Status s = submit_and_wait(
          job.at(rank), allgather("g", in.data(), nullptr, HVD_INT64, shapes[k + rank]));
      EXPECT_EQ(s.code(), HVD_ERR_MISMATCH);
      messages[static_cast<size_t>(rank)] = s.message();
    });
    EXPECT_EQ(messages[0], messages[1]);
    const std::string text = k == 0 ? "[2, 3], but another rank sent a tensor of shape [1, 4]"
                                    : "[2], but another rank sent a tensor of shape [2, 1]";
    EXPECT_EQ(messages[0],
              "Mismatched ALLGATHER tensor shapes for tensor 'g': One rank sent a "
              "tensor of shape " +
                  text + " (only the first dimension may differ).");
  }
}

TEST(Scheduler, AnOutputIsThereOnlyForAnAllgatherHvdAllocated) {
  Job job(1, fast_options());
  std::vector<int64_t> in(4, 7), out(4);
  auto given = job.at(0).submit(allgather("given", in.data(), out.data(), HVD_INT64, {4}));
  ASSERT_TRUE(given.ok());
  ASSERT_TRUE((*given)->wait(kWait).ok());
  EXPECT_EQ(out, in);
  void* data = nullptr;
  int64_t first_dim = 0;
  EXPECT_EQ((*given)->output(&data, &first_dim).code(), HVD_ERR_STATE);
}

// ---- validation -----------------------------------------------------------------------------

// Rank 0 submits `a`, rank 1 `b` under one name; both must fail with the same message, which
// contains `expected`. A later tensor still completes.
void expect_mismatch(const std::function<void(Submission&)>& on_rank1,
                     const std::string& expected) {
  Job job(2, fast_options());
  std::vector<std::string> messages(2);
  job.each([&](int rank) {
    std::vector<float> in(4, 1), out(4, 0);
    Submission s = allreduce("x", in.data(), out.data(), HVD_FLOAT32, {4});
    if (rank == 1) on_rank1(s);
    std::vector<char> big(64 * 8, 0);
    if (rank == 1) s.recv = big.data();  // room for any shape or type the change asks for
    if (rank == 1 && s.send != nullptr) s.send = big.data();
    const Status status = submit_and_wait(job.at(rank), std::move(s));
    EXPECT_EQ(status.code(), HVD_ERR_MISMATCH) << status.to_string();
    messages[static_cast<size_t>(rank)] = status.message();
    // The job goes on.
    std::vector<float> ok_in(2, 1), ok_out(2, 0);
    EXPECT_TRUE(submit_and_wait(job.at(rank),
                                allreduce("after", ok_in.data(), ok_out.data(), HVD_FLOAT32, {2}))
                    .ok());
    EXPECT_EQ(ok_out[0], 2.0f);
  });
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_NE(messages[0].find(expected), std::string::npos) << messages[0];
}

TEST(Scheduler, EveryMismatchIsTheSameErrorOnEveryRank) {
  expect_mismatch([](Submission& s) { s.spec.dtype = HVD_INT32; },
                  "Mismatched ALLREDUCE data types for tensor 'x': One rank sent a tensor of type "
                  "float32, but another rank sent a tensor of type int32.");
  expect_mismatch(
      [](Submission& s) {
        s.spec.shape = {2, 2};
      },
      "Mismatched ALLREDUCE tensor shapes for tensor 'x': One rank sent a tensor of "
      "shape [4], but another rank sent a tensor of shape [2, 2].");
  expect_mismatch([](Submission& s) { s.spec.op = HVD_MAX; },
                  "Mismatched ALLREDUCE reduce ops for tensor 'x'");
  expect_mismatch([](Submission& s) { s.spec.type = HVD_COLLECTIVE_ALLGATHER; },
                  "Mismatched collective operations for tensor 'x': One rank did an ALLREDUCE, "
                  "but another rank did an ALLGATHER.");
  expect_mismatch([](Submission& s) { s.spec.prescale = 0.5; },
                  "Mismatched ALLREDUCE prescale factors for tensor 'x': One rank sent factor 1, "
                  "but another rank sent factor 0.5.");
  expect_mismatch([](Submission& s) { s.spec.postscale = 2; },
                  "Mismatched ALLREDUCE postscale factors");
  expect_mismatch(
      [](Submission& s) {
        s.spec.memory = HVD_MEMORY_CUDA;
        s.spec.device = 0;
      },
      "Mismatched ALLREDUCE memory kinds for tensor 'x': One rank sent a tensor in host memory, "
      "but another rank sent a tensor in CUDA memory.");
}

TEST(Scheduler, MismatchedBroadcastRootsAreTheSameErrorOnEveryRank) {
  Job job(3, fast_options());
  std::vector<std::string> messages(3);
  job.each([&](int rank) {
    std::vector<int32_t> buf(3, rank);
    Submission s;
    s.name = "b";
    s.send = buf.data();
    s.recv = buf.data();
    s.spec.type = HVD_COLLECTIVE_BROADCAST;
    s.spec.dtype = HVD_INT32;
    s.spec.shape = {3};
    s.spec.root = rank == 2 ? 1 : 0;
    const Status status = submit_and_wait(job.at(rank), std::move(s));
    EXPECT_EQ(status.code(), HVD_ERR_MISMATCH);
    messages[static_cast<size_t>(rank)] = status.message();
  });
  EXPECT_EQ(messages[0], messages[2]);
  EXPECT_EQ(messages[0],
            "Mismatched BROADCAST root ranks for tensor 'b': One rank specified root rank 0, but "
            "another rank specified root rank 1.");
}

TEST(Scheduler, ADuplicateNameInFlightIsRefusedAtOnce) {
  Job job(2, fast_options());
  std::vector<float> in(2, 1), out(2, 0), out2(2, 0);
  auto first = job.at(0).submit(allreduce("dup", in.data(), out.data(), HVD_FLOAT32, {2}));
  ASSERT_TRUE(first.ok());
  auto second = job.at(0).submit(allreduce("dup", in.data(), out2.data(), HVD_FLOAT32, {2}));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), HVD_ERR_INVALID_ARGUMENT);
  EXPECT_NE(second.status().message().find("Duplicate tensor name 'dup'"), std::string::npos);
  // The first still completes once rank 1 submits it; then the name is free again.
  std::vector<float> in1(2, 2), out1(2, 0);
  ASSERT_TRUE(
      submit_and_wait(job.at(1), allreduce("dup", in1.data(), out1.data(), HVD_FLOAT32, {2})).ok());
  ASSERT_TRUE((*first)->wait(kWait).ok());
  EXPECT_EQ(out[0], 3.0f);
  job.each([&](int rank) {
    std::vector<float> a(2, 1), b(2, 0);
    EXPECT_TRUE(
        submit_and_wait(job.at(rank), allreduce("dup", a.data(), b.data(), HVD_FLOAT32, {2})).ok());
  });
}

TEST(Scheduler, BadArgumentsFailAtSubmission) {
  Job job(2, fast_options());
  std::vector<int32_t> buf(4);
  auto code = [&](Submission s) {
    auto r = job.at(0).submit(std::move(s));
    return r.ok() ? HVD_SUCCESS : r.status().code();
  };
  EXPECT_EQ(code(allreduce("", buf.data(), buf.data(), HVD_INT32, {4})), HVD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(code(allreduce("n", buf.data(), buf.data(), static_cast<hvd_dtype>(42), {4})),
            HVD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(code(allreduce("n", nullptr, buf.data(), HVD_INT32, {4})), HVD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(code(allreduce("n", buf.data(), buf.data(), HVD_INT32, {-1})),
            HVD_ERR_INVALID_ARGUMENT);
  Submission scaled = allreduce("n", buf.data(), buf.data(), HVD_INT32, {4});
  scaled.spec.prescale = 2;  // integers cannot be scaled
  EXPECT_EQ(code(scaled), HVD_ERR_INVALID_ARGUMENT);
  Submission root = allreduce("n", buf.data(), buf.data(), HVD_INT32, {4});
  root.spec.type = HVD_COLLECTIVE_BROADCAST;
  root.spec.root = 2;  // a job of 2
  EXPECT_EQ(code(root), HVD_ERR_INVALID_ARGUMENT);
}

// ---- stalls and shutdown --------------------------------------------------------------------

TEST(Scheduler, AStallIsReportedAndThenAnErrorOnEveryRank) {
  SchedulerOptions o = fast_options();
  o.stall_check = std::chrono::duration<double>(0.3);
  o.stall_shutdown = std::chrono::duration<double>(0.8);
  Job job(2, o);
  std::vector<float> in(2, 1), out(2, 0);
  ::testing::internal::CaptureStderr();
  auto lonely = job.at(0).submit(allreduce("lonely", in.data(), out.data(), HVD_FLOAT32, {2}));
  ASSERT_TRUE(lonely.ok());
  const Status s = (*lonely)->wait(kWait);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(s.code(), HVD_ERR_TIMEOUT) << s.to_string();
  EXPECT_NE(s.message().find("'lonely' (missing ranks 1)"), std::string::npos) << s.message();
  EXPECT_NE(log.find("Missing ranks:\n  1: [lonely]"), std::string::npos) << log;
  // Rank 1's scheduler stopped in the same cycle: a later submission fails at once, or (if it
  // raced the last cycle) is failed by the stop.
  auto later = job.at(1).submit(allreduce("later", in.data(), out.data(), HVD_FLOAT32, {2}));
  if (later.ok()) {
    EXPECT_EQ((*later)->wait(kWait).code(), HVD_ERR_TIMEOUT);
  } else {
    EXPECT_EQ(later.status().code(), HVD_ERR_TIMEOUT) << later.status().to_string();
  }
}

TEST(Scheduler, ShutdownOnOneRankFailsWhatOthersHaveInFlight) {
  Job job(2, fast_options());
  std::vector<float> in(2, 1), out(2, 0);
  auto waiting = job.at(1).submit(allreduce("never", in.data(), out.data(), HVD_FLOAT32, {2}));
  ASSERT_TRUE(waiting.ok());
  job.at(0).shutdown();
  const Status s = (*waiting)->wait(kWait);
  EXPECT_EQ(s.code(), HVD_ERR_STATE);
  EXPECT_NE(s.message().find("shut down"), std::string::npos) << s.message();
  auto after = job.at(1).submit(allreduce("after", in.data(), out.data(), HVD_FLOAT32, {2}));
  EXPECT_FALSE(after.ok());
}

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

// Four int64 tensors grouped, members listed in a rank's own order; waits for all.
void run_group(Job& job, uint32_t order_seed) {
  job.each([&](int rank) {
    std::vector<int> order = {0, 1, 2, 3};
    std::shuffle(order.begin(), order.end(),
                 std::mt19937(order_seed + static_cast<uint32_t>(rank)));
    std::vector<std::vector<int64_t>> in(4, std::vector<int64_t>(3, rank + 1)),
        out(4, std::vector<int64_t>(3));
    std::vector<Submission> group;
    for (int k : order) {
      group.push_back(
          allreduce("member" + std::to_string(k), in[k].data(), out[k].data(), HVD_INT64, {3}));
    }
    const Status status = submit_group_and_wait(job.at(rank), std::move(group));
    ASSERT_TRUE(status.ok()) << status.to_string();
    const int64_t want = job.size() * (job.size() + 1) / 2;
    for (auto& o : out) EXPECT_EQ(o, std::vector<int64_t>(3, want));
  });
}

TEST(Scheduler, TheSameGroupAgainHitsTheCache) {
  Job job(3, fast_options());
  run_group(job, 1);
  const int gathers_after_first_round = job.control_allgathers();
  EXPECT_GT(gathers_after_first_round, 0);
  run_group(job, 2);  // the same members, listed in other orders
  run_group(job, 3);
  EXPECT_EQ(job.control_allgathers(), gathers_after_first_round);
}

TEST(Scheduler, GroupedOnOneRankAndAloneOnAnotherIsAMismatchOnEveryRank) {
  Job job(2, fast_options());
  std::vector<std::string> messages(2);
  job.each([&](int rank) {
    std::vector<int64_t> a_in(2, 1), a_out(2), b_in(2, 1), b_out(2);
    std::vector<Submission> members;
    members.push_back(allreduce("a", a_in.data(), a_out.data(), HVD_INT64, {2}));
    members.push_back(allreduce("b", b_in.data(), b_out.data(), HVD_INT64, {2}));
    std::vector<std::shared_ptr<Completion>> done;
    if (rank == 0) {
      auto group = job.at(rank).submit_group(std::move(members));
      ASSERT_TRUE(group.ok());
      done = *group;
    } else {
      for (Submission& m : members) done.push_back(*job.at(rank).submit(std::move(m)));
    }
    const Status a = done[0]->wait(kWait);
    EXPECT_EQ(a.code(), HVD_ERR_MISMATCH) << a.to_string();
    EXPECT_EQ(done[1]->wait(kWait).code(), HVD_ERR_MISMATCH);
    messages[static_cast<size_t>(rank)] = a.message();
  });
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_NE(messages[0].find("Mismatched ALLREDUCE groups for tensor 'a': One rank submitted it "
                             "in a group of 2 tensors ("),
            std::string::npos)
      << messages[0];
  EXPECT_NE(messages[0].find("), but another rank alone."), std::string::npos) << messages[0];
}

}  // namespace

// ---- join ----------------------------------------------------------------------------------

Submission broadcast_of(const std::string& name, const void* send, void* recv, int64_t count,
                        int root) {
  Submission s = allreduce(name, send, recv, HVD_INT64, {count});
  s.spec.type = HVD_COLLECTIVE_BROADCAST;
  s.spec.root = root;
  return s;
}

// Rank `first` joins at once; the others reduce two tensors (first negotiated in full, then
// again from the cache), then join. The joined rank's zeros count in the average's divisor.
TEST(Scheduler, AJoinedRankServesTheOthersAllreducesWithZerosUntilEveryRankJoins) {
  for (int size : {1, 2, 3, 4}) {
    Job job(size, fast_options());
    for (int first = 0; first < size; ++first) {
      std::vector<int> last(static_cast<size_t>(size), -2);
      job.each([&](int rank) {
        Scheduler& s = job.at(rank);
        if (rank != first) {
          for (int round = 0; round < 2; ++round) {  // the second from the cache
            std::vector<float> a(7), a_out(7);
            std::vector<int32_t> b(5), b_out(5);
            for (size_t i = 0; i < a.size(); ++i) a[i] = float(rank + 1) * float(i + 1);
            for (size_t i = 0; i < b.size(); ++i) b[i] = (rank + 1) * int32_t(i + 3);
            auto ca = s.submit(allreduce("a", a.data(), a_out.data(), HVD_FLOAT32, {7}));
            auto cb = s.submit(allreduce("b", b.data(), b_out.data(), HVD_INT32, {5}, HVD_AVERAGE));
            ASSERT_TRUE(ca.ok() && cb.ok());
            ASSERT_TRUE((*ca)->wait(kWait).ok());
            ASSERT_TRUE((*cb)->wait(kWait).ok());
            int ranks_sum = 0;  // of rank + 1 over the ranks that submitted
            for (int r = 0; r < size; ++r) ranks_sum += r == first ? 0 : r + 1;
            for (size_t i = 0; i < a.size(); ++i) {
              EXPECT_EQ(a_out[i], float(ranks_sum) * float(i + 1)) << "size " << size;
            }
            for (size_t i = 0; i < b.size(); ++i) {
              EXPECT_EQ(b_out[i], ranks_sum * int32_t(i + 3) / size) << "size " << size;
            }
          }
        }
        auto joined = s.join();
        ASSERT_TRUE(joined.ok()) << joined.status().to_string();
        ASSERT_TRUE((*joined)->wait(kWait).ok());
        ASSERT_TRUE((*joined)->last_joined(&last[static_cast<size_t>(rank)]).ok());
      });
      for (int r = 0; r < size; ++r) {
        EXPECT_EQ(last[static_cast<size_t>(r)], last[0]) << "every rank learns the same rank";
      }
      EXPECT_GE(last[0], 0);
      if (size > 1) {
        EXPECT_NE(last[0], first) << "the first to join is not the last";
      }
    }
  }
}

// Only host-memory allreduces go on with zeros: an allgather negotiated in full and a broadcast
// answered from the cache fail on every rank that submitted them, with one message.
TEST(Scheduler, OtherCollectivesFailOnEveryRankWhileARankHasJoined) {
  Job job(3, fast_options());
  std::vector<int64_t> in(4, 9);
  job.each([&](int rank) {  // "bc" enters the cache
    std::vector<int64_t> out(4);
    EXPECT_TRUE(
        submit_and_wait(job.at(rank), broadcast_of("bc", in.data(), out.data(), 4, 1)).ok());
  });
  std::vector<std::string> messages(3);
  job.each([&](int rank) {
    Scheduler& s = job.at(rank);
    if (rank == 0) {
      auto joined = s.join();
      ASSERT_TRUE(joined.ok());
      EXPECT_TRUE((*joined)->wait(kWait).ok());
      return;
    }
    std::vector<int64_t> out(12);
    Submission gather = allreduce("g", in.data(), out.data(), HVD_INT64, {4});
    gather.spec.type = HVD_COLLECTIVE_ALLGATHER;
    const Status g = submit_and_wait(s, std::move(gather));
    EXPECT_EQ(g.code(), HVD_ERR_UNSUPPORTED) << g.to_string();
    const Status b = submit_and_wait(s, broadcast_of("bc", in.data(), out.data(), 4, 1));
    EXPECT_EQ(b.code(), HVD_ERR_UNSUPPORTED) << b.to_string();
    messages[static_cast<size_t>(rank)] = g.message() + " | " + b.message();
    auto joined = s.join();
    ASSERT_TRUE(joined.ok());
    EXPECT_TRUE((*joined)->wait(kWait).ok());
  });
  EXPECT_EQ(messages[1], messages[2]);
  EXPECT_NE(messages[1].find("ALLGATHER 'g' cannot run while rank(s) 0 have joined"),
            std::string::npos)
      << messages[1];
  EXPECT_NE(messages[1].find("BROADCAST 'bc' cannot run"), std::string::npos) << messages[1];
}

TEST(SchedulerOptions, HorovodsDynamicTimelineWritesNoFile) {
  auto timeline = [](const char* value) {
    return SchedulerOptions::from(*Settings::read(fake_env({{"HOROVOD_TIMELINE", value}})))
        .timeline;
  };
  EXPECT_EQ(timeline("DYNAMIC"), "");
  EXPECT_EQ(timeline("trace.json"), "trace.json");
}
