// Real multi-process jobs: hvdrun, the rank-0-hosted rendezvous, disagreements and failures.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "shell_job.hpp"

namespace {

using hvd::testing::free_port;
using hvd::testing::Job;
using hvd::testing::run;

const std::string kHvdrun = HVD_HVDRUN;
const std::string kProbe = HVD_PROBE;
const std::string kTestPlugins = HVD_TEST_PLUGIN_DIR;
const std::string kFlawedPlugins = HVD_FLAWED_PLUGIN_DIR;
const std::string kPluginCheck = HVD_PLUGIN_CHECK;
const std::string kHello = HVD_HELLO;
const std::string kMpirun = std::string(HVD_MPIEXEC) + " --allow-run-as-root --oversubscribe";

#define REQUIRE_MPI() \
  if (std::string(HVD_MPIEXEC).empty()) GTEST_SKIP() << "the mpi backend is not built"

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The text after "rank R: init failed: " on each rank's line.
std::vector<std::string> init_failures(const std::string& output) {
  std::vector<std::string> messages;
  const std::regex line(R"(rank \d+: init failed: (.*))");
  for (std::sregex_iterator it(output.begin(), output.end(), line), end; it != end; ++it) {
    messages.push_back((*it)[1]);
  }
  return messages;
}

TEST(Hvdrun, RunsRanksAndTagsTheirOutput) {
  Job r = run(kHvdrun + " -np 3 " + kProbe + " --allreduce");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(has(r.output, "[" + std::to_string(rank) + "]<stdout>:rank " +
                                  std::to_string(rank) + ": allreduce = 6"))
        << r.output;
  }
}

TEST(Hvdrun, AFailingRankStopsTheOthersAndSetsTheExitCode) {
  Job r = run(kHvdrun + " -np 3 " + kProbe + " --exit-after-init 1=3 --hang");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output,
      std::regex(R"(hvdrun: rank 1 \(pid \d+\) exited with status 3; stopping the other ranks)")))
      << r.output;
  EXPECT_LT(r.seconds, 30) << "the hanging ranks were not stopped";
}

// hvdrun ignores SIGPIPE for itself; its ranks start with SIGPIPE as hvdrun found it (an ignored
// signal survives exec).
bool sigpipe_ignored(const std::string& status_line) {
  const size_t colon = status_line.rfind(':');
  const uint64_t ignored = std::stoull(status_line.substr(colon + 1), nullptr, 16);
  return (ignored >> (SIGPIPE - 1) & 1) != 0;
}

TEST(Hvdrun, RanksGetSigpipeAsHvdrunFoundIt) {
  Job outside = run("grep SigIgn /proc/self/status");
  Job rank = run(kHvdrun + " -np 1 -- grep SigIgn /proc/self/status");
  ASSERT_EQ(rank.exit_code, 0) << rank.output;
  EXPECT_EQ(sigpipe_ignored(rank.output), sigpipe_ignored(outside.output))
      << "outside hvdrun: " << outside.output << "rank: " << rank.output;
  Job ignoring =
      run("sh -c 'trap \"\" PIPE; exec " + kHvdrun + " -np 1 -- grep SigIgn /proc/self/status'");
  EXPECT_TRUE(sigpipe_ignored(ignoring.output)) << ignoring.output;
}

TEST(Hvdrun, ExplainsBadUsage) {
  Job r = run(kHvdrun + " " + kProbe);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(has(r.output, "-np N is required")) << r.output;
  r = run(kHvdrun + " -np 2 /nonexistent/program");
  EXPECT_EQ(r.exit_code, 127) << r.output;
  EXPECT_TRUE(has(r.output, "cannot run '/nonexistent/program'")) << r.output;
  for (const char* np : {"0", "+2", "2x", "4097", "0x2"}) {
    r = run(kHvdrun + " -np " + np + " " + kProbe);
    EXPECT_EQ(r.exit_code, 2) << np << ": " << r.output;
    EXPECT_TRUE(
        has(r.output, std::string("hvdrun: -np '") + np + "' is not a number of ranks (1-4096)"))
        << r.output;
  }
  for (const char* timeout : {"0", "-1", "5s", "nan", "1e8"}) {
    r = run(kHvdrun + " -np 2 --timeout " + timeout + " " + kProbe);
    EXPECT_EQ(r.exit_code, 2) << timeout << ": " << r.output;
    EXPECT_TRUE(has(r.output, std::string("hvdrun: --timeout: HVD_TIMEOUT='") + timeout +
                                  "' is not a number of seconds above 0 and at most 10000000"))
        << r.output;
  }
}

TEST(Agreement, RanksWithDifferentBackendsAllFailWithTheSameMessage) {
  Job r = run(kHvdrun + " -np 3 --plugin-path " + kTestPlugins + " " + kProbe +
              " --backend-for-rank 1=kvs --exit-zero");
  const auto messages = init_failures(r.output);
  ASSERT_EQ(messages.size(), 3u) << r.output;
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_EQ(messages[1], messages[2]);
  EXPECT_TRUE(has(messages[0],
                  "mismatch between ranks: ranks chose different backends: ranks 0, 2 use gloo"))
      << messages[0];
  EXPECT_TRUE(has(messages[0], "rank 1 uses kvs 1.0.0 (ABI 1.2)")) << messages[0];
}

// The fusion scheduler's batches are collectives: ranks that cut them differently would call the
// backend with different counts (which it is told they agree on).
TEST(Agreement, RanksWithDifferentFusionThresholdsAllFailWithTheSameMessage) {
  Job r = run(kHvdrun + " -np 2 -- sh -c '[ \"$HVD_RANK\" = 1 ] && export " +
              "HVD_FUSION_THRESHOLD=4096; exec " + kProbe + " --exit-zero'");
  const auto messages = init_failures(r.output);
  ASSERT_EQ(messages.size(), 2u) << r.output;
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_TRUE(has(messages[0], "mismatch between ranks")) << messages[0];
  EXPECT_TRUE(has(messages[0], "with HVD_FUSION_THRESHOLD=4096")) << messages[0];
}

TEST(Agreement, AnUnknownBackendListsTheAvailableOnesOnEveryRank) {
  Job r = run("HVD_BACKEND=nope " + kHvdrun + " -np 2 " + kProbe + " --exit-zero");
  const auto messages = init_failures(r.output);
  ASSERT_EQ(messages.size(), 2u) << r.output;
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_TRUE(has(messages[0], "unknown backend 'nope'")) << messages[0];
  EXPECT_TRUE(has(messages[0], "Available backends: gloo")) << messages[0];
  EXPECT_TRUE(has(messages[0], "Searched: ")) << messages[0];
}

// A chunk size init cannot take is an error naming the knob and what it takes, never a number
// read loosely (a sign, a space, a base prefix, or one too large for 64 bits).
TEST(Agreement, AChunkSizeThatIsNotAByteCountFailsInit) {
  for (const char* bad : {"1k", "+65536", " 65536", "0x10000", "65535", "99999999999999999999"}) {
    Job r = run(std::string("HVD_HIERARCHICAL_CHUNK_BYTES='") + bad + "' " + kHvdrun + " -np 1 " +
                kProbe + " --exit-zero");
    const auto messages = init_failures(r.output);
    ASSERT_EQ(messages.size(), 1u) << bad << ": " << r.output;
    EXPECT_TRUE(has(messages[0], std::string("HVD_HIERARCHICAL_CHUNK_BYTES='") + bad +
                                     "' is not 0 or a byte count of at least 65536"))
        << messages[0];
  }
}

TEST(Failures, ADeadPeerIsAnErrorWellWithinTheTimeout) {
  // Rank 2 leaves right after init without a word; the others' allreduce must fail, not hang,
  // and finalizing the broken communicator must not wait out the 20 s timeout either.
  Job r = run(kHvdrun + " -np 3 --timeout 20 " + kProbe +
              " --exit-after-init 2=0 --allreduce --exit-zero");
  EXPECT_LT(r.seconds, 10) << r.output;
  for (int rank : {0, 1}) {
    EXPECT_TRUE(
        std::regex_search(r.output, std::regex("rank " + std::to_string(rank) +
                                               ": allreduce failed: (remote failure|timeout): ")))
        << r.output;
  }
}

TEST(Failures, AMissingRankTimesOutAtInitNamingIt) {
  // HVD_SIZE says 3 but only ranks 0 and 1 exist (rank 2 never starts).
  const std::string common = "HVD_SIZE=3 HVD_TIMEOUT=2 HVD_SECRET=s HVD_RENDEZVOUS_ADDR=127.0.0.1:";
  const std::string port = free_port();
  Job r = run("(" + common + port + " HVD_RANK=0 " + kProbe + " & " + common + port +
              " HVD_RANK=1 " + kProbe + " & wait)");
  const auto messages = init_failures(r.output);
  ASSERT_EQ(messages.size(), 2u) << r.output;
  // Whoever times out first names rank 2; a rank whose rendezvous host gave up first says it
  // was waiting for rank 2 when the server went away.
  for (const std::string& m : messages) {
    EXPECT_TRUE(has(m, "rank 2 did not arrive within 2000 ms") ||
                has(m, "while waiting for rank 2 to arrive"))
        << m;
  }
  EXPECT_TRUE(has(r.output, "rank 2 did not arrive within 2000 ms")) << r.output;
  EXPECT_LT(r.seconds, 15);
}

TEST(Rendezvous, RankZeroHostsItWithoutHvdrun) {
  const std::string port = free_port();
  const std::string common = "HVD_SIZE=2 HVD_SECRET=t0p HVD_RENDEZVOUS_ADDR=127.0.0.1:" + port;
  Job r = run("(" + common + " HVD_RANK=1 " + kProbe + " --allreduce & " + common + " HVD_RANK=0 " +
              kProbe + " --allreduce & wait)");
  EXPECT_TRUE(has(r.output, "rank 0: allreduce = 3")) << r.output;
  EXPECT_TRUE(has(r.output, "rank 1: allreduce = 3")) << r.output;
}

// ---- jobs under Open MPI ------------------------------------------------------------------------

TEST(Mpirun, GlooNeedsNoRendezvousVariables) {
  REQUIRE_MPI();
  Job r = run(kMpirun + " -np 3 -x HVD_BACKEND=gloo " + kProbe + " --allreduce");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(has(r.output, "rank " + std::to_string(rank) + ": allreduce = 6")) << r.output;
  }
}

TEST(Mpirun, RanksWithDifferentBackendsAllFailWithTheSameMessage) {
  REQUIRE_MPI();
  // Ranks 0 and 2 run mpi; rank 1 wants gloo and opens an mpi communicator to bootstrap it.
  Job r = run(kMpirun + " -np 3 -x HVD_BACKEND=mpi " + kProbe +
              " --backend-for-rank 1=gloo --exit-zero");
  const auto messages = init_failures(r.output);
  ASSERT_EQ(messages.size(), 3u) << r.output;
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_EQ(messages[1], messages[2]);
  EXPECT_TRUE(has(messages[0], "ranks chose different backends: ranks 0, 2 use mpi"))
      << messages[0];
  EXPECT_TRUE(has(messages[0], "as the bootstrap of gloo")) << messages[0];
}

// Open MPI groups these two ranks on one host; their host identities (HVD_HOSTNAME) say two. The
// mpi backend was made before the ranks could compare hosts (no store), so every rank makes it
// again with the places the identities give: what the plugin was told matches hvd_local_rank.
TEST(Mpirun, ASelfBootstrappingBackendIsMadeAgainWhereTheHostsPlaceRanksOtherwise) {
  REQUIRE_MPI();
  Job r =
      run(kMpirun + " -np 2 -x HVD_BACKEND=mpi -x HVD_LOG_LEVEL=debug sh -c " +
          "'HVD_HOSTNAME=host$OMPI_COMM_WORLD_RANK exec " + kProbe + " --print-local --allreduce'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string at = "[hvd rank " + std::to_string(rank) + "] debug: init of backend 'mpi': ";
    EXPECT_TRUE(has(r.output, at + "rank " + std::to_string(rank) + " of 2, local rank " +
                                  std::to_string(rank) + " of 2"))
        << r.output;
    EXPECT_TRUE(has(r.output, at + "rank " + std::to_string(rank) + " of 2, local rank 0 of 1"))
        << r.output;
    EXPECT_TRUE(has(r.output, "rank " + std::to_string(rank) + ": local rank 0 of 1")) << r.output;
    EXPECT_TRUE(has(r.output, "rank " + std::to_string(rank) + ": allreduce = 3")) << r.output;
  }
}

// The same two "hosts" on Gloo under mpirun: the rendezvous made through MPI is not served on
// loopback (the launcher said one host, the identities say two), and the ranks find their places.
TEST(Mpirun, ARendezvousThroughTheLauncherServesEveryHostTheIdentitiesName) {
  REQUIRE_MPI();
  Job r =
      run(kMpirun + " -np 2 -x HVD_BACKEND=gloo -x HVD_LOG_LEVEL=info sh -c " +
          "'HVD_HOSTNAME=host$OMPI_COMM_WORLD_RANK exec " + kProbe + " --print-local --allreduce'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "rendezvous made through 'mpi' at ")) << r.output;
  EXPECT_FALSE(has(r.output, "rendezvous made through 'mpi' at 127.0.0.1")) << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(has(r.output, "rank " + std::to_string(rank) + ": local rank 0 of 1")) << r.output;
    EXPECT_TRUE(has(r.output, "rank " + std::to_string(rank) + ": allreduce = 3")) << r.output;
  }
}

TEST(Mpirun, TheMpiBackendOutsideMpirunSaysToUseIt) {
  REQUIRE_MPI();
  Job r = run("HVD_BACKEND=mpi " + kHvdrun + " -np 2 " + kProbe + " --exit-zero");
  const auto messages = init_failures(r.output);
  ASSERT_EQ(messages.size(), 2u) << r.output;
  for (int rank : {0, 1}) {  // lines arrive in any order
    EXPECT_TRUE(has(r.output, "MPI says this is rank 0 of 1 but hvd was told rank " +
                                  std::to_string(rank) + " of 2: launch with mpirun"))
        << r.output;
  }
}

TEST(Mpirun, HvdrunLaunchesThroughItForTheMpiBackendAndForHosts) {
  REQUIRE_MPI();
  Job r = run(kHvdrun + " -np 3 --verbose --backend mpi " + kProbe + " --allreduce");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(
      std::regex_search(r.output, std::regex(R"(hvdrun: \S*mpirun .*-np 3 .*-x HVD_SECRET)")))
      << r.output;
  EXPECT_FALSE(has(r.output, "HVD_SECRET=")) << "the secret must not appear on a command line";
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(has(r.output, "rank " + std::to_string(rank) + ": allreduce = 6")) << r.output;
  }
  r = run(kHvdrun + " -np 2 -H localhost:2 --backend gloo " + kProbe + " --allreduce");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "rank 1: allreduce = 3")) << r.output;
}

// What each rank's Open MPI reads: mpirun hands its --mca values to the ranks as OMPI_MCA_*.
TEST(Mpirun, HvdrunLeavesPutOutOfTheTcpTransportUnlessTheJobSetsItsFlags) {
  REQUIRE_MPI();
  const std::string print = " -- sh -c 'echo \"flags=[$OMPI_MCA_btl_tcp_flags]\"'";
  Job r = run(kHvdrun + " -np 1 --mpi" + print);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "flags=[send,inplace,need-ack,need-csum,hetero-rdma]")) << r.output;
  r = run(kHvdrun + " -np 1 --mpi --mpi-args '--mca btl_tcp_flags send,put'" + print);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "flags=[send,put]")) << r.output;
  r = run("OMPI_MCA_btl_tcp_flags=send,put " + kHvdrun + " -np 1 --mpi" + print);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "flags=[send,put]")) << r.output;
}

TEST(Mpirun, HvdrunSaysWhenItIsMissing) {
  Job r = run(kHvdrun + " -np 2 -H hostA:1,hostB:1 --mpirun /nonexistent/mpirun " + kProbe);
  EXPECT_EQ(r.exit_code, 127) << r.output;
  EXPECT_TRUE(has(r.output, "multi-host jobs need Open MPI")) << r.output;
}

TEST(Mpirun, AnApplicationThatOwnsMpiKeepsIt) {
  REQUIRE_MPI();
  const std::string app = HVD_MPI_APP;
  Job r = run(kMpirun + " -np 2 " + app + " multiple");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "rank 1: hvd allreduce = 3, application allreduce after hvd = 2"))
      << r.output;
  // Too low a thread level is refused, with what to do about it.
  r = run(kMpirun + " -np 2 " + app + " single");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output,
                  "MPI provides MPI_THREAD_SINGLE but hvd's mpi backend needs "
                  "MPI_THREAD_SERIALIZED"))
      << r.output;
}

// ---- process hygiene: the rendezvous on loopback, plugins that crash --------------------------

const std::string kHvdInfo = HVD_HVD_INFO;

bool have_crashentry() {
  return ::access((kTestPlugins + "/libhvd-backend-crashentry.so").c_str(), F_OK) == 0;
}

// The address a TCP listener on `port` is bound to, as ss prints it in the lines of `output`.
std::vector<std::string> listening_addresses(const std::string& output, const std::string& port) {
  std::vector<std::string> found;
  const std::regex line(R"(LISTEN\s+\d+\s+\d+\s+(\S+):)" + port + R"(\s)");
  for (std::sregex_iterator it(output.begin(), output.end(), line), end; it != end; ++it) {
    found.push_back((*it)[1]);
  }
  return found;
}

// A job through mpirun whose every host is this one serves the rendezvous where nothing off this
// host can reach it. Each rank asks the kernel (ss) where the port of HVD_RENDEZVOUS_ADDR listens.
TEST(Mpirun, AOneHostJobServesItsRendezvousOnLoopbackOnly) {
  REQUIRE_MPI();
  if (run("command -v ss").exit_code != 0) GTEST_SKIP() << "ss (iproute2) is not installed";
  char hostfile[] = "/tmp/hvd-hostfile.XXXXXX";
  const int fd = ::mkstemp(hostfile);
  ASSERT_GE(fd, 0);
  const std::string line = "localhost slots=2  # this host\n";
  ASSERT_EQ(::write(fd, line.data(), line.size()), static_cast<ssize_t>(line.size()));
  ::close(fd);
  const std::vector<std::string> launches = {"-np 1 --mpi", "-np 1 --backend mpi",
                                             "-np 2 -H localhost:2",
                                             "-np 2 --hostfile " + std::string(hostfile)};
  for (const std::string& launch : launches) {
    Job r = run(kHvdrun + " --verbose " + launch +
                " -- sh -c 'ss -ltnH \"( sport = :${HVD_RENDEZVOUS_ADDR##*:} )\"'");
    ASSERT_EQ(r.exit_code, 0) << launch << "\n" << r.output;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.output, m,
                                  std::regex(R"(hvdrun: rendezvous listening on (\S+):(\d+) \()")))
        << launch << "\n"
        << r.output;
    EXPECT_EQ(m[1], "127.0.0.1") << launch << "\n" << r.output;
    const auto addresses = listening_addresses(r.output, m[2]);
    ASSERT_FALSE(addresses.empty()) << launch << "\n" << r.output;
    for (const std::string& address : addresses) {
      EXPECT_EQ(address, "127.0.0.1") << launch << "\n" << r.output;
    }
  }
  ::unlink(hostfile);
}

// The store rank 0 serves for a rendezvous made through the launcher, on one host: loopback too.
TEST(Mpirun, ARendezvousThroughTheLauncherOnOneHostIsOnLoopback) {
  REQUIRE_MPI();
  Job r =
      run(kMpirun + " -np 2 -x HVD_BACKEND=gloo -x HVD_LOG_LEVEL=info " + kProbe + " --allreduce");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "rendezvous made through 'mpi' at 127.0.0.1:")) << r.output;
  EXPECT_TRUE(has(r.output, "rank 1: allreduce = 3")) << r.output;
}

// hvd-info loads each plugin in a process of its own: one that crashes is named with its signal,
// every other is still listed, and the exit status says that something failed.
TEST(HvdInfo, NamesAPluginThatCrashesAndListsTheOthers) {
  if (!have_crashentry()) GTEST_SKIP() << "the crashentry test plugin is not built";
  Job r = run("HVD_PLUGIN_PATH=" + kTestPlugins + " " + kHvdInfo);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(has(r.output, "libhvd-backend-crashentry.so: crashed (SIGSEGV) while loading"))
      << r.output;
  for (const std::string name : {"kvs", "kvsmin", "failinit", "gloo"}) {
    EXPECT_TRUE(std::regex_search(r.output, std::regex("\n  " + name + " +[0-9]"))) << name << "\n"
                                                                                    << r.output;
  }
  EXPECT_TRUE(has(r.output, "libhvd-backend-noentry.so: not an hvd backend plugin")) << r.output;
  EXPECT_TRUE(has(r.output, "Backend for this environment: ")) << r.output;
}

TEST(HvdInfo, ExitsZeroWhenEveryPluginLoads) {
  Job r = run("env -u HVD_PLUGIN_PATH " + kHvdInfo);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "\n  gloo ")) << r.output;
  EXPECT_FALSE(has(r.output, "Failed to load")) << r.output;
}

// The error for an unknown backend names the backends there are without loading them: a plugin
// that crashes while loading on the path costs the application nothing.
TEST(Agreement, AnUnknownBackendIsAnErrorEvenWithACrashingPluginOnThePath) {
  if (!have_crashentry()) GTEST_SKIP() << "the crashentry test plugin is not built";
  Job r = run("HVD_BACKEND=nope " + kHvdrun + " -np 2 --plugin-path " + kTestPlugins + " " +
              kProbe + " --exit-zero");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const auto messages = init_failures(r.output);
  ASSERT_EQ(messages.size(), 2u) << r.output;
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_TRUE(has(messages[0], "unknown backend 'nope'")) << messages[0];
  EXPECT_TRUE(
      std::regex_search(messages[0], std::regex("Available backends: [^.]*crashentry, [^.]*kvs, ")))
      << messages[0];
  EXPECT_TRUE(has(messages[0], "hvd-info says which work")) << messages[0];
}

}  // namespace

// ---- hvd-plugin-check, and the rules it enforces where the host meets them ------------------

namespace plugin_check {

std::string plugin(const std::string& dir, const std::string& name) {
  return dir + "/libhvd-backend-" + name + ".so";
}

// The line of `report` that names `name`, and the reason lines after it.
std::string case_lines(const std::string& report, const std::string& name) {
  const size_t at = report.find(name);
  if (at == std::string::npos) return "";
  const size_t begin = report.rfind('\n', at) + 1;
  size_t end = report.find('\n', at);
  while (end != std::string::npos && report.compare(end + 1, 8, "        ") == 0) {
    end = report.find('\n', end + 1);
  }
  return report.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

// Runs hvd-plugin-check with `arguments` (and `environment` before it) in a $TMPDIR of its own,
// then checks where it left its work: a run that failed keeps it in the directory it names,
// under $TMPDIR; any other leaves nothing. Removes that $TMPDIR.
Job run(const std::string& arguments, const std::string& environment = "") {
  char scratch[] = "/tmp/hvd-plugin-check-test.XXXXXX";
  if (::mkdtemp(scratch) == nullptr) {
    ADD_FAILURE() << "mkdtemp: " << std::strerror(errno);
    return Job{};
  }
  Job r =
      hvd::testing::run(environment + " TMPDIR=" + scratch + " " + kPluginCheck + " " + arguments);
  std::error_code ec;
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(scratch, ec)) {
    left.push_back(entry.path().string());
  }
  if (r.exit_code == 1) {
    const std::string named = std::string(scratch) + "/hvd-plugin-check.";
    const bool kept = left.size() == 1 && left[0].rfind(named, 0) == 0 &&
                      has(r.output, "are kept in " + left[0] + "\n");
    EXPECT_TRUE(kept) << "a failed run keeps its work under $TMPDIR and names where\n" << r.output;
    bool has_log = false;
    for (const auto& entry : std::filesystem::directory_iterator(kept ? left[0] : scratch, ec)) {
      has_log = has_log || entry.path().extension() == ".log";
    }
    EXPECT_TRUE(has_log) << "the kept directory holds no job output\n" << r.output;
  } else {
    EXPECT_TRUE(left.empty()) << "hvd-plugin-check (exit " << r.exit_code << ") left "
                              << (left.empty() ? "" : left[0]) << " behind\n"
                              << r.output;
  }
  std::filesystem::remove_all(scratch, ec);
  return r;
}

}  // namespace plugin_check

TEST(PluginCheck, APluginMissingDtypesItDidNotDeclarePassesWithSkips) {
  Job r = plugin_check::run(
      plugin_check::plugin(kTestPlugins, "kvsmin") +
      " -np 1,2 --max-count 1023 --filter 'AllDtypesAndOps/Allreduce.*:Timeouts.*'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "The plugin passes.")) << r.output;
  const std::string uint8 = plugin_check::case_lines(
      r.output, "AllDtypesAndOps/Allreduce.ExactAtEverySize/uint8_sum_outofplace");
  EXPECT_TRUE(has(uint8, "skip skip")) << uint8;
  EXPECT_TRUE(has(uint8, "backend 'kvsmin' does not declare uint8")) << uint8;
  const std::string int32 = plugin_check::case_lines(
      r.output, "AllDtypesAndOps/Allreduce.ExactAtEverySize/int32_sum_outofplace");
  EXPECT_TRUE(has(int32, "pass pass")) << int32;
  EXPECT_TRUE(has(plugin_check::case_lines(r.output, "  Timeouts.APeerThatNeverCalls"), "pass"))
      << r.output;
}

TEST(PluginCheck, APluginReturningWrongSumsFailsNamingTheCase) {
  Job r = plugin_check::run(
      plugin_check::plugin(kTestPlugins, "wrongsum") +
      " -np 2 --max-count 7 --filter 'AllDtypesAndOps/Allreduce.ExactAtEverySize/int32_*'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const std::string line = plugin_check::case_lines(
      r.output, "AllDtypesAndOps/Allreduce.ExactAtEverySize/int32_sum_outofplace");
  EXPECT_TRUE(has(line, "FAIL")) << r.output;
  EXPECT_TRUE(has(line, "np2: rank 0: ")) << line;
  EXPECT_TRUE(has(r.output, "The plugin FAILS.")) << r.output;
}

TEST(PluginCheck, APluginThatIgnoresTheTimeoutFailsTheTimeoutCase) {
  Job r = plugin_check::run(plugin_check::plugin(kFlawedPlugins, "ignoretimeout") +
                            " -np 2 --filter 'Timeouts.*'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const std::string line =
      plugin_check::case_lines(r.output, "Timeouts.APeerThatNeverCallsIsTheBackendsOwnTimeout");
  EXPECT_TRUE(has(line, "FAIL")) << r.output;
  EXPECT_TRUE(has(line, "the host's watchdog had to end the call")) << line;
  EXPECT_TRUE(has(line, "backend 'ignoretimeout' does not honour its timeout")) << line;
}

TEST(PluginCheck, APluginExportingMoreThanItsEntryFailsTheStaticRule) {
  Job r = plugin_check::run(plugin_check::plugin(kFlawedPlugins, "extraexport") +
                            " -np 1 --filter 'Barrier.*'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const std::string line = plugin_check::case_lines(r.output, "static.ExportsTheEntrySymbolOnly");
  EXPECT_TRUE(has(line, "FAIL")) << r.output;
  EXPECT_TRUE(has(line, "it also exports kvs_helper_that_should_be_hidden")) << line;
  EXPECT_TRUE(has(plugin_check::case_lines(r.output, "Barrier.CompletesRepeatedly"), "pass"))
      << r.output;
}

TEST(PluginCheck, APluginNamedOtherwiseThanItsFileFailsTheStaticRule) {
  Job r = plugin_check::run(plugin_check::plugin(kFlawedPlugins, "misnamed") +
                            " -np 1 --filter 'Barrier.*'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const std::string line = plugin_check::case_lines(r.output, "static.NameIsTheFilesName");
  EXPECT_TRUE(has(line, "FAIL")) << r.output;
  EXPECT_TRUE(has(line, "its table says 'othername'")) << line;
}

TEST(PluginCheck, BadUsageSaysWhatIsWrong) {
  Job r = run(kPluginCheck + " 2>&1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.output, "which plugin?")) << r.output;
  r = run(kPluginCheck + " /nonexistent/libhvd-backend-x.so 2>&1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(has(r.output, "/nonexistent/libhvd-backend-x.so: no such file")) << r.output;
  for (const char* counts : {"0", "+2", "1,1025", "0x2"}) {
    r = run(kPluginCheck + " x.so -np " + counts + " 2>&1");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(has(r.output, "-np takes rank counts")) << counts << ": " << r.output;
  }
  for (const char* count : {"0", "-1", "1000000000000", "1e3"}) {
    r = run(kPluginCheck + " x.so --max-count " + count + " 2>&1");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(has(r.output, "--max-count takes an element count of at least 1"))
        << count << ": " << r.output;
  }
}

// The naming rule where names are looked up: HVD_BACKEND=<name> refuses a file whose table says
// another name (saying both), a path takes it, and hvd-info lists it as failed.
TEST(NameRule, ABackendFoundByNameMustSayTheNameOfItsFile) {
  Job r = run("HVD_PLUGIN_PATH=" + kFlawedPlugins + " HVD_BACKEND=misnamed " + kHello + " 2>&1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output,
                  "its table says it is backend 'othername', but by the naming rule "
                  "this file is backend 'misnamed'"))
      << r.output;
  r = run("HVD_BACKEND=" + plugin_check::plugin(kFlawedPlugins, "misnamed") + " " + kHello +
          " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = run("HVD_PLUGIN_PATH=" + kFlawedPlugins + " " + kHvdInfo);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_FALSE(std::regex_search(r.output, std::regex("\n  othername +[0-9]"))) << r.output;
  EXPECT_TRUE(has(r.output,
                  "libhvd-backend-misnamed.so: its table says it is backend "
                  "'othername'"))
      << r.output;
}

TEST(PluginErrors, AnExceptionOutOfAHandWrittenTableNamesTheBackendAndTheEntry) {
  Job r = run("HVD_BACKEND=" + plugin_check::plugin(kFlawedPlugins, "throwing") + " " + kHello +
              " 2>&1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output,
                  "backend 'throwing' let a C++ exception out of its allreduce entry "
                  "(boom)"))
      << r.output;
}

TEST(PluginErrors, ALoadErrorIsTheDynamicLoadersWordsAlone) {
  Job r =
      run("HVD_BACKEND=" + plugin_check::plugin(kTestPlugins, "garbage") + " " + kHello + " 2>&1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "cannot be loaded as a shared library: ")) << r.output;
  EXPECT_TRUE(has(r.output, "file too short")) << r.output;
  EXPECT_FALSE(has(r.output, "Bad file descriptor")) << r.output;
  r = run("HVD_BACKEND=" + plugin_check::plugin(kTestPlugins, "noentry") + " " + kHello + " 2>&1");
  EXPECT_TRUE(has(r.output, "define `extern \"C\" HVD_PLUGIN_EXPORT")) << r.output;
}

// Stopping hvd-plugin-check (Ctrl-C, a CI timeout) stops the job it runs: hvdrun and every rank.
TEST(PluginCheck, StoppingItStopsTheJobItRuns) {
  const std::string script =
      "dir=$(mktemp -d); cp " + plugin_check::plugin(kTestPlugins, "kvs") +
      " \"$dir\"/; HVD_TEST_HANG=allreduce TMPDIR=\"$dir\" " + kPluginCheck +
      " \"$dir\"/libhvd-backend-kvs.so -np 2 >/dev/null 2>&1 & pid=$!; sleep 3; "
      "running=$(pgrep -f \"$dir\" | wc -l); kill -TERM $pid; wait $pid; echo \"rc=$?\"; "
      "sleep 1; echo \"running before=$running after=$(pgrep -f \"$dir\" | wc -l)\"; "
      "echo \"left: $(ls \"$dir\" | grep -c hvd-plugin-check)\"; rm -rf "
      "\"$dir\"";
  Job r = run("bash -c '" + std::regex_replace(script, std::regex("'"), "'\\''") + "'");
  EXPECT_TRUE(has(r.output, "rc=143")) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("running before=[1-9][0-9]* after=0")))
      << r.output;
  EXPECT_TRUE(has(r.output, "left: 0")) << "stopped, it must remove its work\n" << r.output;
}

// Where no GPU can be used, the nccl backend loads, says why in hvd-info, and refuses init with
// the CUDA runtime's reason on every rank (scripts/gpu-check.sh runs it where there is a GPU).
TEST(Nccl, WithoutAGpuHvdInfoAndInitSayWhy) {
  Job info = run("env -u HVD_PLUGIN_PATH " + kHvdInfo);
  if (!std::regex_search(info.output, std::regex("\n  nccl +[0-9]"))) {
    GTEST_SKIP() << "the nccl plugin is not built";
  }
  if (!has(info.output, "(no usable GPU: ")) {
    GTEST_SKIP() << "a GPU is usable here: scripts/gpu-check.sh runs the nccl backend";
  }
  // hvdrun stops the other ranks when the first one fails: each rank exits only once both have
  // failed and said why, so that neither is stopped before it prints.
  char dir[] = "/tmp/hvd-nccl-init.XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string rank_script =
      "\"$0\"; rc=$?; touch \"$1/$HVD_RANK\"; "
      "until [ -e \"$1/0\" ] && [ -e \"$1/1\" ]; do sleep 0.05; done; exit $rc";
  Job r = run("env -u HVD_PLUGIN_PATH " + kHvdrun + " -np 2 --backend nccl -- sh -c '" +
              rank_script + "' " + kHello + " " + dir + " 2>&1");
  (void)::remove((std::string(dir) + "/0").c_str());
  (void)::remove((std::string(dir) + "/1").c_str());
  (void)::rmdir(dir);
  EXPECT_NE(r.exit_code, 0) << r.output;
  for (const std::string rank : {"[0]", "[1]"}) {
    EXPECT_TRUE(has(r.output, rank + "<stderr>:hvd init failed: unsupported: init on backend "
                                     "'nccl' failed: rank 0: no usable GPU: "))
        << r.output;
  }
}

// hvd-info started through PATH, from any directory, searches the installed plugins beside its
// own binary (the dynamic loader knows the program only by the name typed).
TEST(HvdInfo, FoundThroughPathItSearchesBesideItsBinary) {
  const std::string bindir = kHvdInfo.substr(0, kHvdInfo.rfind('/'));
  Job r = run("cd / && env -u HVD_PLUGIN_PATH PATH=" + bindir + ":$PATH hvd-info");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r.output, "  1. " + bindir.substr(0, bindir.rfind('/')) + "/lib/hvd\n"))
      << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("\n  gloo +[0-9]"))) << r.output;
  EXPECT_FALSE(has(r.output, "which is not among the backends above")) << r.output;
}

// A failure that breaks the job's communicator fails every case after it: the report points at
// the first.
TEST(PluginCheck, ACommunicatorBrokenByOneCaseIsPointedOut) {
  Job r = plugin_check::run(
      plugin_check::plugin(kTestPlugins, "kvs") +
          " -np 1 --timeout 1 --filter 'AllDtypesAndOps/Allreduce.ExactAtEverySize/int32_*'",
      "HVD_TEST_HANG=allreduce HVD_TEST_FAULT_SKIP=4");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output,
      std::regex("At 1 rank, every case from AllDtypesAndOps/Allreduce\\.ExactAtEverySize/"
                 "int32_[a-z_]+ on failed\\.")))
      << r.output;
  EXPECT_TRUE(has(r.output, "fix that one first")) << r.output;
}
