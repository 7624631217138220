// kvs_job.hpp — communicators over the kvs test backend for the unit tests: one process alone, or
// several ranks as processes. A communicator's world is one per process (each init takes the
// process's next store epoch), so its ranks cannot be threads: the test binary runs again once
// per rank, filtered to the calling test, with a store this process serves.
#ifndef HVD_TESTS_KVS_JOB_HPP
#define HVD_TESTS_KVS_JOB_HPP

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bootstrap/store.hpp"
#include "fake_env.hpp"

extern char** environ;

namespace hvd::testing {

inline const std::filesystem::path kTestPlugins = HVD_TEST_PLUGIN_DIR;

inline std::string test_plugin(const std::string& name) {
  return (kTestPlugins / ("libhvd-backend-" + name + ".so")).string();
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// `env`, with `name` set to `value` (a variable one rank sees otherwise than the others).
inline core::EnvLookup with_var(core::EnvLookup env, std::string name, std::string value) {
  return [env = std::move(env), name = std::move(name),
          value = std::move(value)](const std::string& asked) -> std::optional<std::string> {
    return asked == name ? std::optional<std::string>(value) : env(asked);
  };
}

// What a rank's process reports on, and how it learns who it is.
inline constexpr int kReportFd = 3;
inline constexpr const char* kRankVariable = "HVD_UNIT_RANK";

using RankMain = std::function<std::string(int rank, const core::EnvLookup& env)>;

namespace detail {

// In a rank's process: runs `main` with the job's variables, reports, and ends the process.
[[noreturn]] inline void run_as_rank(int size, std::map<std::string, std::string> vars,
                                     const RankMain& main) {
  const int rank = std::atoi(std::getenv(kRankVariable));
  const char* store = std::getenv("HVD_UNIT_STORE");
  const char* secret = std::getenv("HVD_UNIT_SECRET");
  vars["HVD_RANK"] = std::to_string(rank);
  vars["HVD_SIZE"] = std::to_string(size);
  vars["HVD_RENDEZVOUS_ADDR"] = store != nullptr ? store : "";
  vars["HVD_SECRET"] = secret != nullptr ? secret : "";
  vars["HVD_RENDEZVOUS_SERVER"] = "external";
  std::string report;
  try {
    report = main(rank, core::fake_env(vars));
  } catch (const std::exception& e) {
    report = std::string("threw: ") + e.what();
  }
  for (size_t done = 0; done < report.size();) {
    const ssize_t n = ::write(kReportFd, report.data() + done, report.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  std::_Exit(0);  // nothing of the test framework's: the parent's test is the one that counts
}

inline bool starts_with(const std::string& text, const char* prefix) {
  return text.rfind(prefix, 0) == 0;
}

}  // namespace detail

// Runs `main` on `size` ranks, each a process of its own that sees `vars` and the job's variables
// (HVD_RANK, HVD_SIZE, HVD_RENDEZVOUS_ADDR, HVD_SECRET), and returns what each rank's `main`
// returned, in rank order, or why a rank gave nothing ("ended without a report", "killed").
// Every rank is killed once `within` has passed. A rank runs the calling test from its start and
// leaves at its first run_ranks: one call per test.
inline std::vector<std::string> run_ranks(int size, const std::map<std::string, std::string>& vars,
                                          const RankMain& main,
                                          std::chrono::seconds within = std::chrono::seconds(120)) {
  if (std::getenv(kRankVariable) != nullptr) detail::run_as_rank(size, vars, main);
  std::vector<std::string> reports(static_cast<size_t>(size));
  const std::string secret = "unit-test-secret";
  auto server = core::TcpStoreServer::start(core::HostPort{"127.0.0.1", 0}, secret);
  if (!server.ok()) {
    ADD_FAILURE() << server.status().to_string();
    return reports;
  }
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string filter =
      std::string("--gtest_filter=") + test->test_suite_name() + "." + test->name();
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  // This environment, less what would change what a rank runs: the test framework's variables
  // (an output file, shards) and hvd's (a rank's are the test's alone).
  std::vector<std::string> base;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string variable = *e;
    if (detail::starts_with(variable, "GTEST_") || detail::starts_with(variable, "HVD_") ||
        detail::starts_with(variable, "HOROVOD_")) {
      continue;
    }
    base.push_back(variable);
  }
  struct Rank {
    pid_t pid = -1;
    int fd = -1;
  };
  std::vector<Rank> ranks(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    int ends[2];
    if (::pipe2(ends, O_CLOEXEC) != 0) break;
    if (ends[1] == kReportFd) {  // dup2 onto itself would keep close-on-exec
      const int moved = ::fcntl(ends[1], F_DUPFD_CLOEXEC, kReportFd + 1);
      ::close(ends[1]);
      ends[1] = moved;
    }
    std::vector<std::string> env = base;
    env.push_back(std::string(kRankVariable) + "=" + std::to_string(r));
    env.push_back("HVD_UNIT_STORE=" + (*server)->address().to_string());
    env.push_back("HVD_UNIT_SECRET=" + secret);
    std::vector<char*> envp;
    for (std::string& v : env) envp.push_back(v.data());
    envp.push_back(nullptr);
    std::vector<char*> argv{const_cast<char*>(exe.c_str()), const_cast<char*>(filter.c_str()),
                            nullptr};
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, ends[1], kReportFd);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    pid_t pid = -1;
    const int spawned =
        ::posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    ::close(ends[1]);
    if (spawned != 0) {
      ::close(ends[0]);
      reports[static_cast<size_t>(r)] = "could not start: " + std::string(std::strerror(spawned));
      continue;
    }
    ranks[static_cast<size_t>(r)] = Rank{pid, ends[0]};
  }
  const auto deadline = std::chrono::steady_clock::now() + within;
  for (;;) {
    std::vector<pollfd> open;
    for (const Rank& rank : ranks) {
      if (rank.fd >= 0) open.push_back(pollfd{rank.fd, POLLIN, 0});
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (open.empty() || left.count() <= 0) break;
    if (::poll(open.data(), open.size(), static_cast<int>(left.count())) < 0 && errno != EINTR) {
      break;
    }
    for (size_t r = 0; r < ranks.size(); ++r) {
      Rank& rank = ranks[r];
      const auto ready =
          std::find_if(open.begin(), open.end(), [&](const pollfd& p) { return p.fd == rank.fd; });
      if (rank.fd < 0 || ready == open.end() || ready->revents == 0) continue;
      char chunk[4096];
      const ssize_t n = ::read(rank.fd, chunk, sizeof chunk);
      if (n > 0) {
        reports[r].append(chunk, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(rank.fd);
        rank.fd = -1;
      }
    }
  }
  for (size_t r = 0; r < ranks.size(); ++r) {
    Rank& rank = ranks[r];
    if (rank.pid < 0) continue;
    const bool late = rank.fd >= 0;
    if (late) {
      ::kill(rank.pid, SIGKILL);
      ::close(rank.fd);
    }
    int status = 0;
    ::waitpid(rank.pid, &status, 0);
    if (late) {
      reports[r] = "killed: no report within " + std::to_string(within.count()) + " s";
    } else if (reports[r].empty()) {
      reports[r] = "ended without a report (" +
                   (WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                                      : "signal " + std::to_string(WTERMSIG(status))) +
                   ")";
    }
  }
  return reports;
}

}  // namespace hvd::testing

#endif  // HVD_TESTS_KVS_JOB_HPP
