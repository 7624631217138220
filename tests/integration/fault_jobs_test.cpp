// Faults in real multi-process jobs (hvd_fault_job, hvd_mpi_abort_job), which each backend must
// turn into an error on every rank within HVD_TIMEOUT: never a hang, never a dead process. The
// jobs under mpirun are the Mpirun suite, which scripts/test.sh runs with Open MPI's sanitizer
// settings.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "shell_job.hpp"

namespace {

using hvd::testing::free_port;
using hvd::testing::Job;
using hvd::testing::run;

const std::string kHvdrun = HVD_HVDRUN;
const std::string kFaultJob = HVD_FAULT_JOB;
const std::string kMpirun = std::string(HVD_MPIEXEC) + " --allow-run-as-root --oversubscribe";

#define REQUIRE_MPI() \
  if (std::string(HVD_MPIEXEC).empty()) GTEST_SKIP() << "the mpi backend is not built"

// What one rank's call returned: "rank R: <call> of N float32 -> <status> after S s: <message>".
struct Report {
  std::string status;
  double seconds = -1;
  std::string message;
};

std::map<int, Report> reports(const std::string& output) {
  std::map<int, Report> by_rank;
  const std::regex line(R"(rank (\d+): \w+ of \d+ float32 -> ([a-z ]+) after ([0-9.]+) s: (.*))");
  for (std::sregex_iterator it(output.begin(), output.end(), line), end; it != end; ++it) {
    by_rank[std::stoi((*it)[1])] = Report{(*it)[2], std::stod((*it)[3]), (*it)[4]};
  }
  return by_rank;
}

constexpr double kTimeout = 2;  // HVD_TIMEOUT of these jobs
constexpr double kSlack = 2;    // what an error may take beyond it

// ---- gloo ---------------------------------------------------------------------------------------

// The 1 Mi against 1 Mi + 1 float32 allreduce that used to end rank 0 with an uncaught
// gloo::EnforceNotMet on Gloo's event-loop thread.
TEST(GlooFaultJob, CountsThatDifferAreAMismatchOnEveryRankNotACrash) {
  Job r = run(kHvdrun + " -np 2 --timeout 2 " + kFaultJob + " --count-for-rank 1=1048577");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << r.output;
  const auto by_rank = reports(r.output);
  ASSERT_EQ(by_rank.size(), 2u) << r.output;
  for (const auto& [rank, report] : by_rank) {
    EXPECT_EQ(report.status, "mismatch between ranks") << rank << ": " << report.message;
    EXPECT_NE(report.message.find("rank 0 allreduce of 1048576 float32 (sum); rank 1 allreduce "
                                  "of 1048577 float32 (sum)"),
              std::string::npos)
        << report.message;
  }
}

// `size` ranks started by hand (without hvdrun, which would stop the survivors as soon as a
// rank dies), each with `environment` and `options`; returns the job's output with "rank R exit S"
// lines.
Job job_of(int size, const std::string& environment, const std::string& options) {
  const std::string common = environment + " HVD_SIZE=" + std::to_string(size) +
                             " HVD_SECRET=s HVD_RENDEZVOUS_ADDR=127.0.0.1:" + free_port();
  std::string command = "(";
  for (int rank = 0; rank < size; ++rank) {
    command += "(" + common + " HVD_RANK=" + std::to_string(rank) + " " + kFaultJob + " " +
               options + "; echo \"rank " + std::to_string(rank) + " exit $?\") & ";
  }
  return run(command + "wait)");
}

Job job_of_three(const std::string& environment, const std::string& options) {
  return job_of(3, environment, options);
}

const std::string kGloo = "HVD_BACKEND=gloo HVD_TIMEOUT=10";

// Rank 1 of 3 is killed in the middle of a 64 MiB allreduce. The survivors' writes to it meet a
// reset connection, then EPIPE, whose SIGPIPE used to kill a survivor now and then (its exit
// status 141). The call may also finish before rank 1 dies.
TEST(GlooFaultJob, APeerKilledInTheMiddleIsAnErrorOnTheOthers) {
  for (int kill_ms : {50, 100, 200, 300}) {
    Job r = job_of_three(kGloo, "--count 16777216 --kill-rank 1=" + std::to_string(kill_ms));
    const auto by_rank = reports(r.output);
    for (int rank : {0, 2}) {
      EXPECT_NE(r.output.find("rank " + std::to_string(rank) + " exit 0"), std::string::npos)
          << "killed " << kill_ms << " ms in:\n"
          << r.output;
      ASSERT_EQ(by_rank.count(rank), 1u) << r.output;
      EXPECT_LT(by_rank.at(rank).seconds, kTimeout + kSlack) << by_rank.at(rank).message;
    }
  }
}

// Once the scheduler runs, rank 1 dies instead of calling: the survivors' negotiation fails,
// which breaks their communicators, and the blocking call returns that error.
TEST(GlooFaultJob, APeerDeadInTheFusedPathIsAnErrorOnTheOthers) {
  Job r = job_of_three(kGloo, "--fused --count 16777216 --die-rank 1");
  const auto by_rank = reports(r.output);
  for (int rank : {0, 2}) {
    EXPECT_NE(r.output.find("rank " + std::to_string(rank) + " exit 0"), std::string::npos)
        << r.output;
    ASSERT_EQ(by_rank.count(rank), 1u) << r.output;
    EXPECT_NE(by_rank.at(rank).status, "success") << r.output;
    EXPECT_LT(by_rank.at(rank).seconds, kTimeout + kSlack) << by_rank.at(rank).message;
  }
}

// The same kill in the middle of the fused 64 MiB allreduce, at times that straddle its length
// (about 0.2 s on loopback): an error within the timeout, or success if it finished first.
TEST(GlooFaultJob, APeerKilledInTheFusedPathIsAnErrorOnTheOthers) {
  for (int kill_ms : {50, 100, 200}) {
    Job r =
        job_of_three(kGloo, "--fused --count 16777216 --kill-rank 1=" + std::to_string(kill_ms));
    const auto by_rank = reports(r.output);
    for (int rank : {0, 2}) {
      EXPECT_NE(r.output.find("rank " + std::to_string(rank) + " exit 0"), std::string::npos)
          << "killed " << kill_ms << " ms in:\n"
          << r.output;
      ASSERT_EQ(by_rank.count(rank), 1u) << r.output;
      EXPECT_LT(by_rank.at(rank).seconds, kTimeout + kSlack) << by_rank.at(rank).message;
    }
  }
}

// A job whose rank 1 stopped (SIGSTOP) instead of calling: rank 0's call is a timeout, within
// the timeout's bounds, and its message holds `naming` (how the backend names rank 1).
void expect_stopped_rank_times_out(const Job& r, const std::string& naming) {
  const auto by_rank = reports(r.output);
  ASSERT_EQ(by_rank.count(0), 1u) << r.output;
  const Report& report = by_rank.at(0);
  EXPECT_EQ(report.status, "timeout") << report.message;
  EXPECT_NE(report.message.find(naming), std::string::npos) << report.message;
  EXPECT_GE(report.seconds, kTimeout - 0.1);
  EXPECT_LT(report.seconds, kTimeout + kSlack) << report.message;
}

// On the sync mesh (8 B) and in the agreement before the event-loop mesh (4 MiB).
void expect_gloo_stopped_rank_times_out(const std::string& count) {
  expect_stopped_rank_times_out(
      run(kHvdrun + " -np 2 --timeout 2 " + kFaultJob + " --stop-rank 1 --count " + count), "");
}

TEST(GlooFaultJob, AStoppedRankIsATimeoutWithinHvdTimeout) {
  expect_gloo_stopped_rank_times_out("2");
}

TEST(GlooFaultJob, AStoppedRankIsATimeoutBeforeALargeCallToo) {
  expect_gloo_stopped_rank_times_out("1048576");
}

// ---- ofi ----------------------------------------------------------------------------------------

// Every survivor's error names the rank that died (`naming` it), whichever rank it waited for
// itself: a rank that gives up tells the others whom it waited for (plugins/ofi/endpoint.hpp).
void expect_survivors_name(const Job& r, const std::vector<int>& survivors,
                           const std::regex& naming, bool may_succeed) {
  const auto by_rank = reports(r.output);
  for (int rank : survivors) {
    EXPECT_NE(r.output.find("rank " + std::to_string(rank) + " exit 0"), std::string::npos)
        << r.output;
    ASSERT_EQ(by_rank.count(rank), 1u) << r.output;
    const Report& report = by_rank.at(rank);
    EXPECT_LT(report.seconds, kTimeout + kSlack) << report.message;
    if (may_succeed && report.status == "success") continue;
    EXPECT_NE(report.status, "success") << r.output;
    EXPECT_TRUE(std::regex_search(report.message, naming)) << "rank " << rank << ": " << r.output;
  }
}

// The error ends naming the dead rank: "...: rank 1 stopped, died, or is in another call" (or, on
// shm, "rank 1 is gone (its process N exited or was killed)").
std::regex ends_naming(int dead) {
  return std::regex(
      ": rank " + std::to_string(dead) +
      " (stopped, died, or is in another call|failed or is unreachable|is gone \\(its "
      "process [0-9]+ exited or was killed\\))$");
}

void expect_survivors_name_rank_1(const Job& r, bool may_succeed) {
  expect_survivors_name(r, {0, 2}, ends_naming(1), may_succeed);
}

class OfiFaultJob : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
#ifndef HVD_TEST_OFI
    GTEST_SKIP() << "the ofi backend is not built";
#endif
  }
  std::string environment() const {
    return "HVD_BACKEND=ofi HVD_TIMEOUT=2 HVD_OFI_PROVIDER='" + GetParam() + "'";
  }
  // Two ranks under hvdrun, which stops the job once a rank dies.
  Job job_of_two(const std::string& options) const {
    return run(environment() + " " + kHvdrun + " -np 2 --backend ofi --timeout 2 " + kFaultJob +
               " " + options);
  }
};

// Rank 1 of 3 dies instead of calling: a 64 MiB allreduce (the ring) and an 8-byte one
// (recursive doubling).
TEST_P(OfiFaultJob, ADeadPeerIsAnErrorNamingItOnEveryRank) {
  for (const char* count : {"16777216", "2"}) {
    SCOPED_TRACE(std::string("count ") + count);
    expect_survivors_name_rank_1(
        job_of_three(environment(), std::string("--count ") + count + " --die-rank 1"), false);
  }
}

// Killed in the middle of the ring (it takes tens of ms on shm: the call may finish first).
TEST_P(OfiFaultJob, APeerKilledInTheMiddleIsAnErrorNamingIt) {
  for (int kill_ms : {5, 20}) {
    SCOPED_TRACE("killed " + std::to_string(kill_ms) + " ms in");
    expect_survivors_name_rank_1(
        job_of_three(environment(), "--count 16777216 --kill-rank 1=" + std::to_string(kill_ms)),
        true);
  }
}

// Rank 2 of 4 dies in the ring: rank 3 waits for it, rank 0 for rank 3, rank 1 for rank 0. Each
// survivor follows the others' notices along that chain to rank 2. On shm, where a waiting rank
// sees that its peer's process is gone, well within a 10 s timeout (0.1 s here unloaded, 0.2 s
// under ThreadSanitizer).
TEST_P(OfiFaultJob, ADeadPeerIsNamedAtTheEndOfAChainOfWaits) {
  const bool shm = GetParam() == "shm";
  Job r =
      job_of(4, environment() + (shm ? " HVD_TIMEOUT=10" : ""), "--count 16777216 --die-rank 2");
  expect_survivors_name(
      r, {0, 1, 3},
      shm ? std::regex(": rank 2 is gone \\(its process [0-9]+ exited or was killed\\)$")
          : ends_naming(2),
      false);
  for (const auto& [rank, report] : reports(r.output)) {
    if (shm) {
      EXPECT_LT(report.seconds, 2.0) << "rank " << rank << ": " << report.message;
    }
  }
}

// The same death with rank 3 late: rank 0 waits for rank 3, which says nothing before rank 0
// gives up, but rank 1 found rank 2 failed first hand (its sends to rank 2 failed, or, on shm,
// rank 2's process is gone while rank 1 waited for rank 0): rank 0's error ends naming rank 2 all
// the same. Rank 3 comes after rank 0's timeout and listening (2.5 s) even if rank 1's notice
// never reached rank 0.
TEST_P(OfiFaultJob, ADeadPeerIsNamedThoughTheRankWaitedForIsLate) {
  Job r = job_of(4, environment(), "--count 16777216 --die-rank 2 --late-rank 3=4000");
  expect_survivors_name(r, {0, 1}, ends_naming(2), false);
  const auto by_rank = reports(r.output);
  ASSERT_EQ(by_rank.count(3), 1u) << r.output;
  EXPECT_NE(by_rank.at(3).status, "success") << r.output;
  EXPECT_LT(by_rank.at(3).seconds, kTimeout + kSlack) << r.output;
}

// Rank 1 aborts its communicator while the others wait for it in a call, with none of its own in
// progress: they fail at once on its notice, naming it, long before the 10 s timeout.
TEST_P(OfiFaultJob, AnAbortWithNoCallInProgressFailsThePeersAtOnce) {
  for (const char* count : {"16777216", "2"}) {
    SCOPED_TRACE(std::string("count ") + count);
    Job r = job_of_three(environment() + " HVD_TIMEOUT=10",
                         std::string("--count ") + count + " --abort-rank 1");
    EXPECT_NE(r.output.find("rank 1: aborted -> success"), std::string::npos) << r.output;
    expect_survivors_name(r, {0, 2}, std::regex(": rank 1 was aborted$"), false);
    for (const auto& [rank, report] : reports(r.output)) {
      EXPECT_LT(report.seconds, 3.0) << "rank " << rank << ": " << report.message;
    }
  }
}

// libfabric 1.17 loads libinfinipath, which catches SIGTERM (and SIGINT, SIGSEGV, ...) and calls
// exit() from its handler: the host and the plugin put the process's own handling back, so a rank
// sent SIGTERM dies of it and its launcher says so (shm's own handler, which removes its shared
// memory and re-raises the signal, stays).
TEST(OfiSignals, ARankSentSigtermDiesOfIt) {
#ifndef HVD_TEST_OFI
  GTEST_SKIP() << "the ofi backend is not built";
#endif
  const std::string script =
      "out=$(mktemp); " + kHvdrun + " -np 2 --backend ofi --timeout 30 " + kFaultJob +
      " --count 2 --linger 20 > \"$out\" 2>&1 & launcher=$!; "
      "for i in $(seq 100); do grep -q \"rank 1: allreduce\" \"$out\" && break; sleep 0.1; done; "
      "for p in $(pgrep -x hvd_fault_job); do tr \"\\0\" \"\\n\" < /proc/$p/environ | "
      "grep -qx HVD_RANK=1 && kill -TERM $p; done; wait $launcher; cat \"$out\"; rm -f \"$out\"";
  Job r = run("bash -c '" + std::regex_replace(script, std::regex("'"), "'\\''") + "'");
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex(R"(hvdrun: rank 1 \(pid \d+\) was killed by signal 15)")))
      << r.output;
  EXPECT_LT(r.seconds, 15) << r.output;
}

// Through the scheduler: the negotiation fails the same way.
TEST_P(OfiFaultJob, ADeadPeerInTheFusedPathIsAnErrorNamingIt) {
  expect_survivors_name_rank_1(job_of_three(environment(), "--fused --count 1048576 --die-rank 1"),
                               false);
}

// Rank 1 stops (SIGSTOP) instead of calling: rank 0 times out, naming it, in recursive doubling
// (8 B) and in the ring (4 MiB). Neither provider can tell a stopped peer from a slow one.
TEST_P(OfiFaultJob, AStoppedRankIsATimeoutNamingIt) {
  for (const char* count : {"2", "1048576"}) {
    SCOPED_TRACE(std::string("count ") + count);
    expect_stopped_rank_times_out(job_of_two(std::string("--stop-rank 1 --count ") + count),
                                  "rank 1 stopped, died");
  }
}

// 1 Mi against 1 Mi + 1 float32 (the ring): the rank that receives a message of the wrong length
// fails with a mismatch, and its notice (or a failed send to it) fails the other at once: both
// well before the timeout, at which a rank left waiting would fail. 2 against 3 (recursive
// doubling, one message each way): each rank receives the wrong length, too short or truncated,
// and both fail with the mismatch.
TEST_P(OfiFaultJob, CountsThatDifferAreAnErrorOnEveryRank) {
  for (const bool small : {false, true}) {
    SCOPED_TRACE(small ? "2 against 3" : "1 Mi against 1 Mi + 1");
    Job r = job_of_two(small ? "--count 2 --count-for-rank 1=3" : "--count-for-rank 1=1048577");
    const auto by_rank = reports(r.output);
    ASSERT_EQ(by_rank.size(), 2u) << r.output;
    int mismatches = 0;
    for (const auto& [rank, report] : by_rank) {
      EXPECT_NE(report.status, "success") << rank << ": " << r.output;
      EXPECT_LT(report.seconds, kTimeout) << report.message;
      if (report.status == "mismatch between ranks") ++mismatches;
    }
    EXPECT_GE(mismatches, small ? 2 : 1) << r.output;
  }
}

// Calls that differ where a message above the inject size would meet a shorter receive: on shm,
// libfabric 1.17's cross-memory-attach copy loops forever on such a message, so the ranks compare
// their calls (a Shape) before the first such message. Each case must end on both ranks well
// within the timeout (a hang is cut at 30 s and fails the test): 16383 against 16384 float32
// (recursive doubling against the ring), an allreduce against an allgather, and an allreduce
// against a broadcast, all a mismatch naming both calls on shm (on tcp;ofi_rxm, whose receives
// truncate cleanly, a mismatch or the timeout). 1000 against 2000 float32 (4000 B inline against
// 8000 B apart: the two never match) is the timeout on shm.
TEST_P(OfiFaultJob, CallsThatDifferNeverHang) {
  const bool shm = GetParam() == "shm";
  struct Case {
    const char* options;
    const char* calls[2];  // rank 0's call, rank 1's, as a mismatch on shm names them
  };
  const Case cases[] = {
      {"--count 16383 --count-for-rank 1=16384",
       {"allreduce of 16383 float32 (sum)", "allreduce of 16384 float32 (sum)"}},
      {"--count 300000 --call-for-rank 1=allgather",
       {"allreduce of 300000 float32 (sum)", "allgather of 300000 float32"}},
      {"--count 4096 --call-for-rank 1=broadcast",
       {"allreduce of 4096 float32 (sum)", "broadcast of 4096 float32 from root 0"}},
      {"--count 1000 --count-for-rank 1=2000", {nullptr, nullptr}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.options);
    Job r = run(environment() + " timeout -s KILL 30 " + kHvdrun +
                " -np 2 --backend ofi --timeout 2 " + kFaultJob + " " + c.options);
    const auto by_rank = reports(r.output);
    ASSERT_EQ(by_rank.size(), 2u) << r.output;
    int mismatches = 0;
    for (const auto& [rank, report] : by_rank) {
      EXPECT_NE(report.status, "success") << rank << ": " << r.output;
      EXPECT_LT(report.seconds, kTimeout + kSlack) << report.message;
      if (!shm) continue;
      if (c.calls[0] == nullptr) {
        EXPECT_TRUE(report.status == "timeout" || report.status == "remote failure")
            << rank << ": " << report.message;
        continue;
      }
      EXPECT_LT(report.seconds, 1.0) << report.message;
      const int peer = 1 - rank;
      if (report.status == "mismatch between ranks") {
        ++mismatches;
        const std::string names = "rank " + std::to_string(peer) + " called " + c.calls[peer] +
                                  " where this rank called " + c.calls[rank];
        EXPECT_NE(report.message.find(names), std::string::npos) << report.message;
      } else {
        EXPECT_TRUE(std::regex_search(
            report.message,
            std::regex(": rank " + std::to_string(peer) + " failed \\(mismatch between ranks\\)$")))
            << rank << ": " << report.message;
      }
    }
    if (shm && c.calls[0] != nullptr) {
      EXPECT_GE(mismatches, 1) << r.output;
    }
  }
}

// A rank killed on shm leaves its shared-memory region (/dev/shm/<pid>:0:0) behind, and a later
// rank given that pid could not open its endpoint. Stale regions are planted for the next 300
// pids (never over an existing file), then a 2-rank shm job must run.
TEST(OfiShm, ARegionLeftByADeadProcessWithTheSamePidIsNoObstacle) {
#ifndef HVD_TEST_OFI
  GTEST_SKIP() << "the ofi backend is not built";
#endif
  Job r =
      run("set -C; base=$(sh -c 'echo $$'); p=$base; while [ $p -lt $((base + 300)) ]; do "
          "{ true > /dev/shm/$p:0:0; } 2>/dev/null; p=$((p + 1)); done; HVD_OFI_PROVIDER=shm " +
          kHvdrun + " -np 2 --backend ofi --timeout 10 " + kFaultJob + " --count 2");
  const auto by_rank = reports(r.output);
  ASSERT_EQ(by_rank.size(), 2u) << r.output;
  for (const auto& [rank, report] : by_rank) EXPECT_EQ(report.status, "success") << r.output;
}

INSTANTIATE_TEST_SUITE_P(Providers, OfiFaultJob, ::testing::Values("shm", "tcp;ofi_rxm"),
                         [](const ::testing::TestParamInfo<std::string>& provider) {
                           return provider.param == "shm" ? std::string("shm") : std::string("tcp");
                         });

// ---- mpi ----------------------------------------------------------------------------------------

// The mpi backend's two modes: hvd's algorithms (the default) and MPI's collectives.
std::string mpi_job(const std::string& arguments, const std::string& algorithms) {
  return kMpirun +
         " -np 2 -x HVD_BACKEND=mpi -x HVD_TIMEOUT=2 -x HVD_MPI_ALGORITHMS=" + algorithms + " " +
         kFaultJob + " " + arguments;
}

// A stopped rank, which the survivor used to wait on for ever at 100% of a core: a timeout. hvd's
// algorithms name the rank (recursive doubling at 8 B, the ring at 4 MiB); MPI's collectives
// cannot tell which rank they wait for (the nonblocking call at 8 B, the blocking call on the
// plugin's thread at 4 MiB).
void expect_mpi_stopped_rank_times_out(const std::string& count, const std::string& algorithms) {
  expect_stopped_rank_times_out(
      run(mpi_job("--stop-rank 1 --count " + count, algorithms)),
      std::string("did not complete within 2000 ms (HVD_TIMEOUT); waiting on ") +
          (algorithms == "hvd" ? "rank 1" : "the other ranks"));
}

TEST(Mpirun, AStoppedRankIsATimeoutNamingIt) {
  REQUIRE_MPI();
  expect_mpi_stopped_rank_times_out("2", "hvd");
}

TEST(Mpirun, AStoppedRankIsATimeoutInTheRingToo) {
  REQUIRE_MPI();
  expect_mpi_stopped_rank_times_out("1048576", "hvd");
}

TEST(Mpirun, AStoppedRankIsATimeoutInMpisNonblockingAllreduce) {
  REQUIRE_MPI();
  expect_mpi_stopped_rank_times_out("2", "library");
}

TEST(Mpirun, AStoppedRankIsATimeoutInMpisBlockingAllreduceOnThePluginsThread) {
  REQUIRE_MPI();
  expect_mpi_stopped_rank_times_out("1048576", "library");
}

// Ranks in different collectives, and counts that differ, are told apart by hvd's algorithms
// only: to MPI's collectives they are erroneous programs (the host's HVD_CHECK_ARGS and the
// scheduler's negotiation catch them before any backend call).
TEST(Mpirun, BroadcastAgainstAllreduceTimesOutOnBothRanks) {
  REQUIRE_MPI();
  Job r = run(mpi_job("--call-for-rank 1=broadcast --linger 3", "hvd"));
  const auto by_rank = reports(r.output);
  ASSERT_EQ(by_rank.size(), 2u) << r.output;
  for (const auto& [rank, report] : by_rank) {
    EXPECT_EQ(report.status, "timeout") << rank << ": " << report.message;
    EXPECT_LT(report.seconds, kTimeout + kSlack) << report.message;
  }
}

// Counts that differ (1 Mi and 1 Mi + 1 floats): the rank sent a message of another length than
// it expects reports the mismatch, without receiving it (in the ring, rank 0, whose first step
// is sent rank 1's block 0, one float longer: received, it would be written past the end of its
// buffer); the other, whose peer left the collective, times out (MPI has no way to tell it
// sooner). Neither succeeds, neither waits past the timeout. Under AddressSanitizer this also
// proves no byte lands past the receive buffer.
TEST(Mpirun, CountsThatDifferAreAnErrorOnEveryRank) {
  REQUIRE_MPI();
  Job r = run(mpi_job("--count-for-rank 1=1048577 --linger 3", "hvd"));
  const auto by_rank = reports(r.output);
  ASSERT_EQ(by_rank.size(), 2u) << r.output;
  int mismatches = 0;
  for (const auto& [rank, report] : by_rank) {
    EXPECT_NE(report.status, "success") << rank;
    EXPECT_LT(report.seconds, kTimeout + kSlack) << report.message;
    if (report.status != "mismatch between ranks") continue;
    ++mismatches;
    EXPECT_NE(report.message.find("the ranks called allreduce with different counts"),
              std::string::npos)
        << report.message;
  }
  EXPECT_GE(mismatches, 1) << r.output;
}

// abort ends a blocked call at once and every later one, in each way a call waits: MPI's
// nonblocking collective (2 elements), its blocking one on the plugin's thread (1 Mi), and
// hvd's algorithms.
class MpiAbort : public ::testing::TestWithParam<std::pair<const char*, const char*>> {};

TEST_P(MpiAbort, EndsABlockedCallAtOnceAndEveryLaterOne) {
  REQUIRE_MPI();
  const auto [algorithms, count] = GetParam();
  Job r = run(kMpirun + " -np 2 -x HVD_MPI_ALGORITHMS=" + algorithms + " " + HVD_MPI_ABORT_JOB +
              " " + HVD_MPI_PLUGIN + " " + count);
  const std::regex allreduce(R"(rank 0: allreduce -> invalid state after ([0-9.]+) s: .*aborted)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, allreduce)) << r.output;
  EXPECT_LT(std::stod(m[1]), 0.3 + 1.0) << "abort came at 0.3 s; the timeout is 30 s";
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex(R"(rank 0: then barrier -> invalid state after 0.0\d s: .*aborted)")))
      << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(rank 0: abort again -> success)")))
      << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(rank 0: finalize -> success after 0.0)")))
      << r.output;
}

INSTANTIATE_TEST_SUITE_P(Mpirun, MpiAbort,
                         ::testing::Values(std::make_pair("library", "2"),
                                           std::make_pair("library", "1048576"),
                                           std::make_pair("hvd", "2")),
                         [](const auto& param_info) {
                           return std::string(param_info.param.first) + "_" +
                                  param_info.param.second;
                         });

}  // namespace
