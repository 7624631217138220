// The fusion scheduler's coordinator against ranks-as-threads (scheduler_job.hpp): exact results
// whatever order the ranks submit in, the cache, the cycle clock, what submission refuses, stalls,
// shutdown and groups. What runs the agreed tensors is in host_executor_test.cpp, what the ranks
// agree on in negotiation_test.cpp, a completion's own face in completion_test.cpp.
#include "scheduler/scheduler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <thread>

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
using hvd::testing::data_for;
using hvd::testing::fast_options;
using hvd::testing::Job;
using hvd::testing::kWait;
using hvd::testing::random_tensors;
using hvd::testing::submit_and_wait;
using hvd::testing::submit_group_and_wait;
using hvd::testing::Tensor;
using namespace std::chrono_literals;

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

// ---- validation -----------------------------------------------------------------------------

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

}  // namespace

TEST(SchedulerOptions, HorovodsDynamicTimelineWritesNoFile) {
  auto timeline = [](const char* value) {
    return SchedulerOptions::from(*Settings::read(fake_env({{"HOROVOD_TIMELINE", value}})))
        .timeline;
  };
  EXPECT_EQ(timeline("DYNAMIC"), "");
  EXPECT_EQ(timeline("trace.json"), "trace.json");
}
