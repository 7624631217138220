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

#include "comm/copy_blocks.hpp"
#include "common/host_memory.hpp"
#include "fake_collectives.hpp"
#include "fake_env.hpp"
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
using hvd::testing::random_tensors;
using hvd::testing::Tensor;
using namespace std::chrono_literals;

constexpr std::chrono::duration<double> kWait = 30s;

SchedulerOptions fast_options() {
  SchedulerOptions o;
  o.cycle_time = std::chrono::microseconds(200);
  return o;
}

// N ranks, each with its own scheduler over separate data and control fakes (so the tests can
// count the data path's calls) and its own fake CUDA memory. With `data_takes_cuda`, the data
// backend takes CUDA memory as it is; otherwise CUDA tensors are staged through host memory.
class Job {
 public:
  Job(int size, SchedulerOptions options, bool data_takes_cuda = false)
      : data_(size), control_(size) {
    for (int r = 0; r < size; ++r) {
      device_memory.push_back(std::make_unique<FakeDeviceMemory>());
      data_ranks.push_back(
          std::make_unique<FakeRank>(data_, r, data_takes_cuda, device_memory.back().get()));
      control_ranks.push_back(std::make_unique<FakeRank>(control_, r));
    }
    for (int r = 0; r < size; ++r) {
      options.device_memory = device_memory[static_cast<size_t>(r)].get();
      auto started = Scheduler::start(*data_ranks[static_cast<size_t>(r)],
                                      *control_ranks[static_cast<size_t>(r)], options);
      EXPECT_TRUE(started.ok()) << started.status().to_string();
      schedulers.push_back(std::move(started).value());
    }
  }
  // Every rank finalizes at once (as a job's ranks do), and every scheduler stops before the
  // fakes go.
  ~Job() {
    for (auto& s : schedulers) s->shutdown();
    schedulers.clear();
  }

  int size() const { return data_.size(); }
  // Returns once every rank's first cycle (the one at start) has taken its queue: what is
  // submitted from then on waits for a later cycle.
  void past_first_cycles() {
    for (const auto& s : schedulers) {
      while (s->stats().cycles == 0) std::this_thread::sleep_for(1ms);
    }
  }
  Scheduler& at(int rank) { return *schedulers[static_cast<size_t>(rank)]; }

  // fn(rank) on one thread per rank.
  void each(const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    for (int r = 0; r < size(); ++r) threads.emplace_back(fn, r);
    for (auto& t : threads) t.join();
  }
  int data_allreduces() const {
    int n = 0;
    for (const auto& r : data_ranks) n += r->allreduces;
    return n / size();
  }
  int control_allgathers() const { return control_ranks[0]->allgathers; }

  std::vector<std::unique_ptr<FakeRank>> data_ranks, control_ranks;
  std::vector<std::unique_ptr<FakeDeviceMemory>> device_memory;
  std::vector<std::unique_ptr<Scheduler>> schedulers;

 private:
  FakeWorld data_, control_;
};

Submission allreduce(const std::string& name, const void* send, void* recv, hvd_dtype dtype,
                     std::vector<int64_t> shape, hvd_reduce_op op = HVD_SUM) {
  Submission s;
  s.name = name;
  s.send = send;
  s.recv = recv;
  s.spec.type = HVD_COLLECTIVE_ALLREDUCE;
  s.spec.dtype = dtype;
  s.spec.shape.assign(shape.begin(), shape.end());
  s.spec.op = op;
  return s;
}

// Returns once `scheduler` has finished `n` tensors (settled them), failing the test after kWait.
void until_settled(Scheduler& scheduler, uint64_t n) {
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  while (scheduler.stats().tensors < n) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "nothing settled within kWait";
    std::this_thread::sleep_for(1ms);
  }
}

Status submit_and_wait(Scheduler& scheduler, Submission s) {
  auto completion = scheduler.submit(std::move(s));
  if (!completion.ok()) return completion.status();
  return (*completion)->wait(kWait);
}

// Submits the group and waits for every tensor of it: the first failure, or success.
Status submit_group_and_wait(Scheduler& scheduler, std::vector<Submission> group) {
  auto done = scheduler.submit_group(std::move(group));
  if (!done.ok()) return done.status();
  for (auto& c : *done) HVD_RETURN_IF_ERROR(c->wait(kWait));
  return Status::success();
}

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

// The staging buffer: ordinary memory until it stages, then page-locked, kept while it fits, and
// freed by what allocated it; where the runtime gives no page-locked memory, ordinary memory,
// asked for once.
TEST(StagingBuffer, PinsOnceItStagesKeepsWhatFitsAndFreesThroughItsAllocator) {
  FakeDeviceMemory device;
  {
    hvd::core::StagingBuffer buffer;
    char* host = buffer.reserve(100);
    ASSERT_NE(host, nullptr);
    EXPECT_FALSE(buffer.pinned());
    EXPECT_EQ(buffer.reserve(50), host);  // fits: kept
    EXPECT_EQ(device.pinned_allocations, 0);
    char* pinned = buffer.reserve(80, &device);
    ASSERT_NE(pinned, nullptr);
    EXPECT_TRUE(buffer.pinned());
    EXPECT_GE(buffer.size(), 100u);  // never shrinks
    EXPECT_EQ(buffer.reserve(100, &device), pinned);
    EXPECT_EQ(buffer.reserve(10), pinned);  // pinned memory serves host batches too
    EXPECT_NE(buffer.reserve(1000, &device), nullptr);
    EXPECT_EQ(device.pinned_allocations, 2);
    EXPECT_EQ(device.pinned_live, 1);
  }
  EXPECT_EQ(device.pinned_live, 0);

  FakeDeviceMemory no_gpu;
  no_gpu.fail = true;
  hvd::core::StagingBuffer buffer;
  ASSERT_NE(buffer.reserve(64, &no_gpu), nullptr);
  EXPECT_FALSE(buffer.pinned());
  ASSERT_NE(buffer.reserve(128, &no_gpu), nullptr);
  EXPECT_FALSE(buffer.pinned());
  EXPECT_EQ(no_gpu.pinned_allocations, 0);
}

namespace {

// The flags /proc/self/smaps gives the mapping that holds `p` ("rd wr mr ... hg": hg is
// MADV_HUGEPAGE); empty where there is no such mapping.
std::string mapping_flags(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long long from = 0, to = 0;
    if (line.rfind("VmFlags:", 0) == 0) {
      if (inside) return line.substr(8) + " ";
    } else if (std::sscanf(line.c_str(), "%llx-%llx ", &from, &to) == 2) {
      inside = from <= at && at < to;  // a mapping's first line: its address range
    }
  }
  return "";
}

}  // namespace

// The fusion buffer is read by the peers' single-copy transfers: from 2 MiB up it is a mapping
// of its own on 2 MiB boundaries with huge pages advised (the advice is what hvd gives, whatever
// the kernel then makes of it), in whole huge pages; below, ordinary malloc.
TEST(StagingBuffer, AdvisesHugePagesFromTwoMebibytes) {
  using hvd::core::kHugePageBytes;
  if (hvd::core::transparent_huge_pages() == "unknown") {
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  }
  void* below = hvd::core::allocate_host(kHugePageBytes - 1);
  void* at = hvd::core::allocate_host(kHugePageBytes);
  ASSERT_NE(below, nullptr);
  ASSERT_NE(at, nullptr);
  if (mapping_flags(at).empty()) GTEST_SKIP() << "/proc/self/smaps gives no VmFlags here";
  EXPECT_EQ(reinterpret_cast<uintptr_t>(at) % kHugePageBytes, 0u);
  EXPECT_NE(mapping_flags(at).find(" hg "), std::string::npos) << mapping_flags(at);
  EXPECT_EQ(mapping_flags(below).find(" hg "), std::string::npos) << mapping_flags(below);
  hvd::core::free_host(below, kHugePageBytes - 1);
  hvd::core::free_host(at, kHugePageBytes);
  EXPECT_EQ(hvd::core::host_allocation_bytes(SIZE_MAX), 0u);  // no wrap-around to a tiny block

  hvd::core::StagingBuffer large;
  const size_t bytes = (size_t{64} << 20) + 3;
  char* p = large.reserve(bytes);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHugePageBytes, 0u);
  EXPECT_NE(mapping_flags(p).find(" hg "), std::string::npos) << mapping_flags(p);
  EXPECT_EQ(large.size(), size_t{66} << 20);  // whole huge pages
  std::memset(p, 1, large.size());            // writable to the end (ASan would see a short one)
  EXPECT_EQ(large.reserve(size_t{65} << 20), p);  // a growth within them keeps the buffer
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

// ---- the device executor (a backend that takes CUDA memory) -----------------------------------

Submission allgather(const std::string& name, const void* send, void* recv, hvd_dtype dtype,
                     std::vector<int64_t> shape);

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

Submission allgather(const std::string& name, const void* send, void* recv, hvd_dtype dtype,
                     std::vector<int64_t> shape) {
  Submission s = allreduce(name, send, recv, dtype, std::move(shape));
  s.spec.type = HVD_COLLECTIVE_ALLGATHER;
  return s;
}

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
