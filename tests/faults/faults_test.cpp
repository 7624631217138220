// The fault suite: what every rank sees when something goes wrong, as a real multi-rank job
// (hvdrun -np N --backend B hvd_faults_test). Each test opens its own communicator with a short
// HVD_TIMEOUT (kTimeout), makes it fail, and checks the error every rank gets, how soon, and that
// it sticks; a long-lived communicator with a long timeout keeps the ranks in step between tests.
// docs/reliability.md is the table these tests prove.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "hvd/hvd.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr double kTimeout = 2;  // seconds: HVD_TIMEOUT of each test's communicator
// What a bounded wait may take: HVD_TIMEOUT, the host's margin (1 s), and slack for a loaded
// machine.
constexpr double kBound = kTimeout + 1 + 1.5;

hvd_comm* g_sync = nullptr;  // keeps the ranks in step between tests

class SyncEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    hvd_init_options options{};
    options.struct_size = sizeof options;
    options.timeout_seconds = 120;
    ASSERT_EQ(hvd_init(&options, &g_sync), HVD_SUCCESS) << hvd_last_error();
  }
};

int rank() { return hvd_rank(g_sync); }
int size() { return hvd_size(g_sync); }
std::string backend() { return hvd_backend_name(g_sync); }
// The test plugins kvs (ABI 1.2, with abort) and kvs10 (ABI 1.0, without) fail on demand.
bool has_fault_knobs() { return backend() == "kvs" || backend() == "kvs10"; }

void sync() { ASSERT_EQ(hvd_barrier(g_sync), HVD_SUCCESS) << hvd_last_error(); }

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The time a rank took to see an error, for docs/reliability.md (scripts/reliability.sh).
double measured(const char* what, double seconds) {
  std::printf("[measured] backend=%s ranks=%d rank=%d test=%s %s=%.3f s\n",
              hvd_backend_name(g_sync), hvd_size(g_sync), hvd_rank(g_sync),
              ::testing::UnitTest::GetInstance()->current_test_info()->name(), what, seconds);
  return seconds;
}

// Every test starts and ends with the ranks in step, and unsets what it set.
class Faults : public ::testing::Test {
 protected:
  void SetUp() override { sync(); }
  void TearDown() override {
    for (const char* name : set_) unsetenv(name);
    sync();
  }
  void set_env(const char* name, const char* value) {
    setenv(name, value, 1);
    set_.push_back(name);
  }
  static hvd_comm* open() {
    hvd_init_options options{};
    options.struct_size = sizeof options;
    options.timeout_seconds = kTimeout;
    hvd_comm* comm = nullptr;
    EXPECT_EQ(hvd_init(&options, &comm), HVD_SUCCESS) << hvd_last_error();
    return comm;
  }
  // Starts the scheduler: every blocking call goes through it from now on.
  static void start_scheduler(hvd_comm* comm) {
    int32_t x = 1;
    const int64_t shape[1] = {1};
    hvd_request* request = nullptr;
    ASSERT_EQ(hvd_allreduce_async(comm, "start", &x, &x, HVD_INT32, 1, shape, HVD_SUM, 0, 0,
                                  nullptr, &request),
              HVD_SUCCESS)
        << hvd_last_error();
    ASSERT_EQ(hvd_request_wait(request, 30), HVD_SUCCESS) << hvd_last_error();
    hvd_request_free(request);
  }
  // Ranks other than 0 start an allreduce of `n` int32 ones 1.5 s late, and rank 0's call (whose
  // backend hangs, as the test set it up) fails HVD_TIMEOUT + 1 s after it began.
  void expect_bounded_from_the_calls_start(uint64_t n) {
    hvd_comm* comm = open();
    if (rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    const auto start = Clock::now();
    EXPECT_NE(allreduce_ones(comm, n), HVD_SUCCESS);
    const double took = measured("error", seconds_since(start));
    const std::string message = hvd_last_error();
    if (rank() == 0) {
      EXPECT_GE(took, kTimeout + 1) << message;
      EXPECT_LT(took, kTimeout + 1.5) << message;  // from the call's start: not 1.5 s later
      EXPECT_NE(
          message.find("(serving hvd_allreduce) did not return within HVD_TIMEOUT (2 s) + 1 s"),
          std::string::npos)
          << message;
    }
    (void)hvd_finalize(comm);
  }
  // A valid blocking allreduce of `n` int32 ones.
  static hvd_status allreduce_ones(hvd_comm* comm, uint64_t n = 8) {
    std::vector<int32_t> v(n, 1);
    const hvd_status s = hvd_allreduce(comm, v.data(), v.data(), n, HVD_INT32, HVD_SUM, nullptr);
    if (s == HVD_SUCCESS) {
      for (int32_t x : v) EXPECT_EQ(x, size());
    }
    return s;
  }

 private:
  std::vector<const char*> set_;
};

// ---- handles ------------------------------------------------------------------------------

TEST_F(Faults, AFinalizedCommunicatorIsAnErrorNeverACrash) {
  hvd_comm* comm = open();
  ASSERT_NE(comm, nullptr);
  ASSERT_EQ(hvd_finalize(comm), HVD_SUCCESS) << hvd_last_error();
  int32_t x = 1;
  EXPECT_EQ(hvd_allreduce(comm, &x, &x, 1, HVD_INT32, HVD_SUM, nullptr), HVD_ERR_STATE);
  EXPECT_NE(std::string(hvd_last_error()).find("not a live communicator"), std::string::npos)
      << hvd_last_error();
  EXPECT_EQ(hvd_barrier(comm), HVD_ERR_STATE);
  EXPECT_EQ(hvd_rank(comm), -1);
  EXPECT_EQ(hvd_size(comm), -1);
  EXPECT_STREQ(hvd_backend_name(comm), "");
  EXPECT_EQ(hvd_finalize(comm), HVD_ERR_STATE);  // twice
  EXPECT_EQ(hvd_comm_abort(comm), HVD_ERR_STATE);
  // A handle that was never made.
  hvd_comm* made_up = reinterpret_cast<hvd_comm*>(uintptr_t{0x12345678});
  EXPECT_EQ(hvd_barrier(made_up), HVD_ERR_STATE);
  EXPECT_EQ(hvd_finalize(made_up), HVD_ERR_STATE);
}

TEST_F(Faults, AFreedRequestIsAnErrorNeverACrash) {
  hvd_comm* comm = open();
  int32_t x = 1;
  const int64_t shape[1] = {1};
  hvd_request* request = nullptr;
  ASSERT_EQ(
      hvd_allreduce_async(comm, "x", &x, &x, HVD_INT32, 1, shape, HVD_SUM, 0, 0, nullptr, &request),
      HVD_SUCCESS);
  // Host memory: ordering a stream after it is waiting for it (no stream is touched).
  EXPECT_EQ(hvd_request_wait_on_stream(request, nullptr, 30), HVD_SUCCESS) << hvd_last_error();
  ASSERT_EQ(hvd_request_wait(request, 30), HVD_SUCCESS) << hvd_last_error();
  hvd_request_free(request);
  int done = 0;
  EXPECT_EQ(hvd_request_poll(request, &done), HVD_ERR_STATE);
  EXPECT_EQ(hvd_request_wait(request, 1), HVD_ERR_STATE);
  EXPECT_EQ(hvd_request_wait_on_stream(request, nullptr, 1), HVD_ERR_STATE);
  EXPECT_EQ(hvd_request_wait_on_stream(nullptr, nullptr, 1), HVD_ERR_INVALID_ARGUMENT);
  void* data = nullptr;
  int64_t first_dim = 0;
  EXPECT_EQ(hvd_request_output(request, &data, &first_dim), HVD_ERR_STATE);
  hvd_request_free(request);  // twice: ignored
  EXPECT_EQ(hvd_finalize(comm), HVD_SUCCESS) << hvd_last_error();
  // A request outlives its communicator's finalize as a handle, completed.
  hvd_comm* again = open();
  ASSERT_EQ(hvd_allreduce_async(again, "y", &x, &x, HVD_INT32, 1, shape, HVD_SUM, 0, 0, nullptr,
                                &request),
            HVD_SUCCESS);
  ASSERT_EQ(hvd_request_wait(request, 30), HVD_SUCCESS) << hvd_last_error();
  EXPECT_EQ(hvd_finalize(again), HVD_SUCCESS) << hvd_last_error();
  EXPECT_EQ(hvd_request_poll(request, &done), HVD_SUCCESS);
  EXPECT_EQ(done, 1);
  hvd_request_free(request);
}

// ---- HVD_CHECK_ARGS -----------------------------------------------------------------------

TEST_F(Faults, CheckArgsFailsMismatchedDtypesOnEveryRankAlike) {
  set_env("HVD_CHECK_ARGS", "1");
  hvd_comm* comm = open();
  std::vector<int32_t> v(8, 1);  // float32 on rank 0, int32 elsewhere: the same bytes
  const hvd_dtype dtype = rank() == 0 ? HVD_FLOAT32 : HVD_INT32;
  EXPECT_EQ(hvd_allreduce(comm, v.data(), v.data(), 8, dtype, HVD_SUM, nullptr), HVD_ERR_MISMATCH);
  EXPECT_EQ(std::string(hvd_last_error()),
            "Mismatched blocking collectives (HVD_CHECK_ARGS): rank 0 called allreduce of 8 "
            "float32 (sum), but rank 1 called allreduce of 8 int32 (sum).");
  // Nothing ran, nothing broke: the next call runs.
  EXPECT_EQ(allreduce_ones(comm), HVD_SUCCESS) << hvd_last_error();
  EXPECT_EQ(hvd_finalize(comm), HVD_SUCCESS) << hvd_last_error();
}

TEST_F(Faults, CheckArgsFailsMismatchedCountsAndRootsOnEveryRank) {
  set_env("HVD_CHECK_ARGS", "1");
  hvd_comm* comm = open();
  const uint64_t n = (1u << 20) + (rank() == size() - 1 ? 1 : 0);
  std::vector<float> v(n, 1);
  EXPECT_EQ(hvd_allreduce(comm, v.data(), v.data(), n, HVD_FLOAT32, HVD_SUM, nullptr),
            HVD_ERR_MISMATCH);
  EXPECT_NE(std::string(hvd_last_error()).find("allreduce of 1048577 float32"), std::string::npos)
      << hvd_last_error();
  EXPECT_EQ(hvd_broadcast(comm, v.data(), v.data(), 8, HVD_FLOAT32, rank() == 1 ? 1 : 0, nullptr),
            HVD_ERR_MISMATCH);
  EXPECT_NE(std::string(hvd_last_error()).find("from root"), std::string::npos) << hvd_last_error();
  EXPECT_EQ(allreduce_ones(comm), HVD_SUCCESS) << hvd_last_error();
  EXPECT_EQ(hvd_finalize(comm), HVD_SUCCESS) << hvd_last_error();
}

TEST_F(Faults, CheckArgsFailsALocallyInvalidCallOnEveryRank) {
  set_env("HVD_CHECK_ARGS", "1");
  hvd_comm* comm = open();
  const int bad = size() - 1;
  std::vector<int32_t> v(8, 1);
  int32_t* buffer = rank() == bad ? nullptr : v.data();
  EXPECT_EQ(hvd_allreduce(comm, buffer, buffer, 8, HVD_INT32, HVD_SUM, nullptr),
            HVD_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(hvd_last_error()), "the call failed on rank " + std::to_string(bad) +
                                               ": allreduce: buffer is NULL for 8 elements");
  EXPECT_EQ(allreduce_ones(comm), HVD_SUCCESS) << hvd_last_error();
  EXPECT_EQ(hvd_finalize(comm), HVD_SUCCESS) << hvd_last_error();
}

// ---- errors that reach every rank through the scheduler -----------------------------------

TEST_F(Faults, ALocallyInvalidBlockingCallFailsOnEveryRankAndKeepsCallsMatched) {
  hvd_comm* comm = open();
  start_scheduler(comm);
  const int bad = size() - 1;
  std::vector<int32_t> v(8, 1);
  int32_t* buffer = rank() == bad ? nullptr : v.data();
  const auto start = Clock::now();
  EXPECT_EQ(hvd_allreduce(comm, buffer, buffer, 8, HVD_INT32, HVD_SUM, nullptr),
            HVD_ERR_INVALID_ARGUMENT);
  const std::string message = hvd_last_error();
  EXPECT_LT(measured("error", seconds_since(start)), kTimeout) << message;
  if (rank() == bad) {
    EXPECT_EQ(message, "ALLREDUCE 'hvd.blocking.0': buffer is NULL for 8 elements");
  } else {
    EXPECT_EQ(message, "Tensor 'hvd.blocking.0' failed on rank " + std::to_string(bad) +
                           ": ALLREDUCE 'hvd.blocking.0': buffer is NULL for 8 elements");
  }
  // It used up its place among the blocking calls: the next ones still match.
  EXPECT_EQ(allreduce_ones(comm), HVD_SUCCESS) << hvd_last_error();
  EXPECT_EQ(hvd_barrier(comm), HVD_SUCCESS) << hvd_last_error();
  EXPECT_EQ(hvd_finalize(comm), HVD_SUCCESS) << hvd_last_error();
}

TEST_F(Faults, ABadAsyncTensorFailsItsNameOnEveryRank) {
  hvd_comm* comm = open();
  std::vector<float> v(4, 1);
  const int64_t shape[1] = {4};
  const int bad = size() - 1;
  hvd_request* request = nullptr;
  const hvd_status submitted =
      hvd_allreduce_async(comm, "grad", v.data(), v.data(), HVD_FLOAT32, 1, shape, HVD_SUM,
                          rank() == bad ? std::nan("") : 1, 1, nullptr, &request);
  if (rank() == bad) {
    EXPECT_EQ(submitted, HVD_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(hvd_last_error()), "ALLREDUCE 'grad': a scale factor is not finite");
  } else {
    ASSERT_EQ(submitted, HVD_SUCCESS) << hvd_last_error();
    EXPECT_EQ(hvd_request_wait(request, kBound), HVD_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(hvd_last_error()),
              "Tensor 'grad' failed on rank " + std::to_string(bad) +
                  ": ALLREDUCE 'grad': a scale factor is not finite");
    hvd_request_free(request);
  }
  sync();  // a finalize now would shut the scheduler down before the others heard of it
  EXPECT_EQ(hvd_finalize(comm), HVD_SUCCESS) << hvd_last_error();
}

// ---- every wait bounded -------------------------------------------------------------------

TEST_F(Faults, ABlockingCallThroughTheSchedulerIsBoundedByTheTimeout) {
  hvd_comm* comm = open();
  start_scheduler(comm);
  if (rank() == 0) {  // the others never make this call
    const auto start = Clock::now();
    EXPECT_EQ(allreduce_ones(comm), HVD_ERR_TIMEOUT);
    const double took = measured("error", seconds_since(start));
    const std::string message = hvd_last_error();
    EXPECT_GE(took, kTimeout) << message;
    EXPECT_LT(took, kBound) << message;
    EXPECT_NE(message.find("hvd_allreduce (blocking call 'hvd.blocking.0') did not complete "
                           "within HVD_TIMEOUT (2 s) + 1 s"),
              std::string::npos)
        << message;
    // The communicator is broken: the next call fails at once, with the same error.
    EXPECT_EQ(hvd_barrier(comm), HVD_ERR_TIMEOUT);
    EXPECT_EQ(std::string(hvd_last_error()), message);
    const auto finalizing = Clock::now();
    EXPECT_EQ(hvd_finalize(comm), HVD_ERR_TIMEOUT);
    EXPECT_EQ(std::string(hvd_last_error()), message);
    EXPECT_LT(seconds_since(finalizing), 1);
  } else {
    // Rank 0 aborted its communicator: this rank's scheduler fails within the timeout.
    std::this_thread::sleep_for(std::chrono::duration<double>(kBound));
    EXPECT_NE(allreduce_ones(comm), HVD_SUCCESS);
    const auto finalizing = Clock::now();
    EXPECT_NE(hvd_finalize(comm), HVD_SUCCESS);
    EXPECT_LT(seconds_since(finalizing), 1);
  }
}

TEST_F(Faults, ABlockingCallOnTheBackendIsBoundedByTheTimeout) {
  hvd_comm* comm = open();
  if (rank() == 0) {  // the others never make this call
    const auto start = Clock::now();
    EXPECT_EQ(allreduce_ones(comm), HVD_ERR_TIMEOUT);
    const double took = measured("error", seconds_since(start));
    const std::string message = hvd_last_error();
    // The plugin's own timeout, not the watchdog's (which would take a second more).
    EXPECT_GE(took, kTimeout - 0.1) << message;
    EXPECT_LT(took, kTimeout + 0.9) << message;
    EXPECT_NE(allreduce_ones(comm), HVD_SUCCESS);
    EXPECT_EQ(std::string(hvd_last_error()), message);  // it sticks
    EXPECT_NE(hvd_finalize(comm), HVD_SUCCESS);
    EXPECT_EQ(std::string(hvd_last_error()), message);
  } else {
    std::this_thread::sleep_for(std::chrono::duration<double>(kBound));
    (void)hvd_finalize(comm);
  }
}

TEST_F(Faults, AbortFromAnotherThreadEndsACallInProgress) {
  hvd_comm* comm = open();
  if (rank() == 0) {  // the others never make this call: it waits until aborted
    std::thread aborter([comm] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      EXPECT_EQ(hvd_comm_abort(comm), HVD_SUCCESS);
      EXPECT_EQ(hvd_comm_abort(comm), HVD_SUCCESS);  // idempotent
    });
    const auto start = Clock::now();
    EXPECT_NE(allreduce_ones(comm), HVD_SUCCESS);
    const double took = measured("error", seconds_since(start));
    aborter.join();
    EXPECT_LT(took, 1.5) << hvd_last_error();
    const std::string aborted = "the communicator was aborted by the application (hvd_comm_abort)";
    EXPECT_EQ(allreduce_ones(comm), HVD_ERR_STATE);
    EXPECT_EQ(std::string(hvd_last_error()), aborted);
    EXPECT_EQ(hvd_finalize(comm), HVD_ERR_STATE);
    EXPECT_EQ(std::string(hvd_last_error()), aborted);
  } else {
    std::this_thread::sleep_for(std::chrono::duration<double>(kBound));
    (void)hvd_finalize(comm);
  }
}

TEST_F(Faults, AbortEndsEveryRequestTheSchedulerHolds) {
  hvd_comm* comm = open();
  start_scheduler(comm);
  int32_t x = 1;
  const int64_t shape[1] = {1};
  hvd_request* request = nullptr;
  // Submitted by this rank only: it waits for the others until rank 0 aborts.
  const std::string name = "only on rank " + std::to_string(rank());
  ASSERT_EQ(hvd_allreduce_async(comm, name.c_str(), &x, &x, HVD_INT32, 1, shape, HVD_SUM, 0, 0,
                                nullptr, &request),
            HVD_SUCCESS);
  if (rank() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ASSERT_EQ(hvd_comm_abort(comm), HVD_SUCCESS);
    EXPECT_EQ(hvd_request_wait(request, kBound), HVD_ERR_STATE) << hvd_last_error();
  } else {
    // Rank 0's abort reaches this rank as a failure of its own scheduler.
    EXPECT_NE(hvd_request_wait(request, kBound), HVD_SUCCESS);
    // It completed with an error: the wait did not merely time out.
    EXPECT_EQ(std::string(hvd_last_error()).find("(it goes on)"), std::string::npos)
        << hvd_last_error();
  }
  hvd_request_free(request);
  EXPECT_NE(hvd_allreduce_async(comm, "after", &x, &x, HVD_INT32, 1, shape, HVD_SUM, 0, 0, nullptr,
                                &request),
            HVD_SUCCESS);
  if (rank() == 0) {
    EXPECT_EQ(std::string(hvd_last_error()),
              "the communicator was aborted by the application (hvd_comm_abort)");
    EXPECT_EQ(hvd_finalize(comm), HVD_ERR_STATE);
  } else {
    EXPECT_NE(hvd_finalize(comm), HVD_SUCCESS);
  }
}

TEST_F(Faults, FinalizeAfterAStallShutdownIsQuickAndReportsIt) {
  set_env("HVD_STALL_CHECK_TIME_SECONDS", "0.5");
  set_env("HVD_STALL_SHUTDOWN_TIME_SECONDS", "1");
  hvd_comm* comm = open();
  start_scheduler(comm);
  int32_t x = 1;
  const int64_t shape[1] = {1};
  hvd_request* request = nullptr;
  if (rank() == 0) {  // the others never submit it
    ASSERT_EQ(hvd_allreduce_async(comm, "stalled", &x, &x, HVD_INT32, 1, shape, HVD_SUM, 0, 0,
                                  nullptr, &request),
              HVD_SUCCESS);
    EXPECT_EQ(hvd_request_wait(request, 30), HVD_ERR_TIMEOUT);
    EXPECT_NE(std::string(hvd_last_error()).find("stall shutdown"), std::string::npos)
        << hvd_last_error();
    hvd_request_free(request);
  }
  sync();  // every rank's scheduler has stopped
  const auto start = Clock::now();
  EXPECT_EQ(hvd_finalize(comm), HVD_ERR_TIMEOUT);
  EXPECT_NE(std::string(hvd_last_error()).find("stall shutdown"), std::string::npos)
      << hvd_last_error();
  EXPECT_LT(measured("finalize", seconds_since(start)), 1);
}

// ---- plugins that ignore their timeout ----------------------------------------------------

TEST_F(Faults, APluginThatIgnoresItsTimeoutIsStoppedByTheWatchdog) {
  if (!has_fault_knobs()) GTEST_SKIP() << "backend " << backend() << " has no fault knobs";
  set_env("HVD_TEST_HANG", "allreduce");  // spins, ignoring timeout_ms
  set_env("HVD_TEST_HANG_RANK", "0");
  hvd_comm* comm = open();
  const auto start = Clock::now();
  EXPECT_NE(allreduce_ones(comm), HVD_SUCCESS);
  const double took = measured("error", seconds_since(start));
  const std::string message = hvd_last_error();
  EXPECT_LT(took, kBound) << message;
  if (rank() == 0) {
    // kvs is aborted; kvs10, without abort, is walked away from: the same error either way.
    EXPECT_EQ(message, "allreduce on backend '" + backend() +
                           "' (serving hvd_allreduce) did not return within HVD_TIMEOUT (2 s) + "
                           "1 s: the communicator was aborted");
    EXPECT_GE(took, kTimeout + 1) << message;
  }
  EXPECT_NE(allreduce_ones(comm), HVD_SUCCESS);
  EXPECT_EQ(std::string(hvd_last_error()), message);  // it sticks
  const auto finalizing = Clock::now();
  EXPECT_NE(hvd_finalize(comm), HVD_SUCCESS);
  EXPECT_EQ(std::string(hvd_last_error()), message);
  EXPECT_LT(seconds_since(finalizing), 1);
}

// A blocking call that makes several backend calls is bounded as a whole, from its start: the
// argument check (an allgather) waits 1.5 s for rank 1, then the allreduce hangs on rank 0, and
// the watchdog ends it HVD_TIMEOUT + 1 s after hvd_allreduce began, not after the allreduce did.
TEST_F(Faults, ABlockingCallOfSeveralBackendCallsIsBoundedAsAWhole) {
  if (!has_fault_knobs()) GTEST_SKIP() << "backend " << backend() << " has no fault knobs";
  set_env("HVD_CHECK_ARGS", "1");
  set_env("HVD_TEST_HANG", "allreduce");
  set_env("HVD_TEST_HANG_RANK", "0");
  expect_bounded_from_the_calls_start(8);
}

// A hierarchical allreduce is one blocking call made of backend calls on two child communicators
// (the host's ranks, the hosts'), which serve the parent's scope: it too is bounded as a whole.
// Four ranks as two hosts of two (faults.kvs.hierarchical.np4 runs them so), the allreduce in two
// chunks: rank 0's first reduce-scatter within its host (an allreduce: kvs has no reduce-scatter)
// waits 1.5 s for rank 1, its second hangs, and the watchdog ends it HVD_TIMEOUT + 1 s after
// hvd_allreduce began, not after the child's call did. (The knobs hang rank 0 of every child
// communicator: ranks 1 and 2 hang in theirs too, later; rank 0's time is the one checked.)
TEST_F(Faults, AHierarchicalAllreduceIsBoundedAsAWhole) {
  if (!has_fault_knobs()) GTEST_SKIP() << "backend " << backend() << " has no fault knobs";
  const char* host = std::getenv("HVD_HOSTNAME");
  if (size() != 4 || host == nullptr) {
    GTEST_SKIP() << "needs 4 ranks as two hosts of two (faults.kvs.hierarchical.np4)";
  }
  set_env("HVD_HIERARCHICAL_ALLREDUCE", "1");
  set_env("HVD_HIERARCHICAL_CHUNK_BYTES", "65536");  // the smallest: 32 Ki int32 in two chunks
  set_env("HVD_TEST_HANG", "allreduce");
  set_env("HVD_TEST_HANG_RANK", "0");
  set_env("HVD_TEST_FAULT_SKIP", "1");  // each child communicator's first allreduce runs
  expect_bounded_from_the_calls_start(32 << 10);
}

// The scheduler's own backend calls serve no blocking hvd_* call: the watchdog's stamp of the call
// at its first look is all that bounds them.
TEST_F(Faults, APluginThatIgnoresItsTimeoutOnTheSchedulersThreadIsStoppedByTheWatchdog) {
  if (!has_fault_knobs()) GTEST_SKIP() << "backend " << backend() << " has no fault knobs";
  set_env("HVD_TEST_HANG", "allreduce");  // the scheduler's negotiation, then its batch
  set_env("HVD_TEST_HANG_RANK", "0");
  hvd_comm* comm = open();
  int32_t x = 1;
  const int64_t shape[1] = {1};
  hvd_request* request = nullptr;
  const auto start = Clock::now();
  ASSERT_EQ(hvd_allreduce_async(comm, "hung", &x, &x, HVD_INT32, 1, shape, HVD_SUM, 0, 0, nullptr,
                                &request),
            HVD_SUCCESS)
      << hvd_last_error();
  EXPECT_NE(hvd_request_wait(request, 30), HVD_SUCCESS);
  const double took = measured("error", seconds_since(start));
  const std::string message = hvd_last_error();
  hvd_request_free(request);
  EXPECT_LT(took, kBound) << message;
  if (rank() == 0) {
    EXPECT_NE(message.find("allreduce on backend '" + backend() +
                           "' did not return within HVD_TIMEOUT (2 s) + 1 s"),
              std::string::npos)
        << message;
    EXPECT_GE(took, kTimeout + 1) << message;
  }
  (void)hvd_finalize(comm);
}

TEST_F(Faults, AFinalizeThatHangsIsWalkedAwayFrom) {
  if (!has_fault_knobs()) GTEST_SKIP() << "backend " << backend() << " has no fault knobs";
  set_env("HVD_TEST_HANG", "finalize");
  hvd_comm* comm = open();
  EXPECT_EQ(allreduce_ones(comm), HVD_SUCCESS) << hvd_last_error();
  const auto start = Clock::now();
  EXPECT_EQ(hvd_finalize(comm), HVD_ERR_TIMEOUT);
  EXPECT_EQ(
      std::string(hvd_last_error()),
      "finalize on backend '" + backend() +
          "' did not return within HVD_TIMEOUT (2 s) + 1 s: its communicator is left unreleased");
  EXPECT_LT(measured("finalize", seconds_since(start)), kBound);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new SyncEnvironment);
  int result = RUN_ALL_TESTS();
  // The ranks leave together, each with its summary printed: under mpirun, once one rank exits
  // without MPI_Finalize (the mpi backend skips it after a collective failed), mpirun ends the
  // others, and a rank still printing its summary would lose it.
  std::fflush(stdout);
  if (g_sync != nullptr) {
    if (hvd_barrier(g_sync) != HVD_SUCCESS || hvd_finalize(g_sync) != HVD_SUCCESS) {
      std::printf("[  FAILED  ] leaving the job: %s\n", hvd_last_error());
      result = 1;
    }
  }
  return result;
}
