// hvd_kill_job: start a job with hvdrun, SIGKILL hvdrun once every rank runs, and check that the
// job dies with it: every rank, and every process hvdrun started (mpirun too), within a bound.
//
//   hvd_kill_job --hvdrun PATH --np N [--hvdrun-arg ARG]... [--ready TEXT] [--within SECONDS]
//                [--delay-ms MS | --random-delay-ms MAX] [--signal KILL|TERM|INT]
//                -- PROGRAM [ARGS...]
//   hvd_kill_job --rank-in DIR -- PROGRAM [ARGS...]      (what each rank runs: see below)
//
// Each rank is `hvd_kill_job --rank-in DIR -- PROGRAM ARGS`, which writes its pid to DIR/rank.<R>
// and execs PROGRAM: the pid stays the rank's. The driver makes itself a child subreaper, so
// whatever hvdrun leaves behind when it dies becomes the driver's child: it sees every rank's
// exit status where hvdrun was the rank's parent, and knows that nothing of the job is left once
// it has no child at all.
//
// --signal sends another signal than SIGKILL: hvdrun then stops the job itself, and must end with
// it within the bound too. The kill comes once every rank has written its pid and, with --ready,
// once the job's output holds TEXT N times (every rank is at work, past init), then after the
// delay.
//
// Prints one line per rank and a last line "RESULT ok|alive|early ..." for scripts
// (scripts/kill-repeat.sh). Exit status: 0 when every rank and every process of the job ended
// within the bound after the kill; 1 when something outlived it (then the driver kills it) or the
// job ended before it was killed; 2 on bad usage or a failure of the driver itself.
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* abbrev = sigabbrev_np(WTERMSIG(status));
    return std::string("killed by SIG") + (abbrev != nullptr ? abbrev : "?");
  }
  return "wait status " + std::to_string(status);
}

// Whether `pid` still runs: a zombie has ended, it only waits for its parent to reap it.
bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return false;
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos || paren + 2 >= text.size()) return false;
  const char state = text[paren + 2];
  return state != 'Z' && state != 'X';
}

int run_rank(const fs::path& dir, char** command) {
  const char* rank = std::getenv("HVD_RANK");
  if (rank == nullptr) rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (rank == nullptr) {
    std::fprintf(stderr, "hvd_kill_job: neither HVD_RANK nor OMPI_COMM_WORLD_RANK is set\n");
    return 127;
  }
  // Written aside and renamed, so the driver never reads half a pid.
  const fs::path file = dir / ("rank." + std::string(rank));
  {
    std::ofstream out(file.string() + ".tmp");
    out << ::getpid() << "\n";
    if (!out) {
      std::fprintf(stderr, "hvd_kill_job: cannot write %s.tmp\n", file.c_str());
      return 127;
    }
  }
  std::error_code ec;
  fs::rename(file.string() + ".tmp", file, ec);
  if (ec) {
    std::fprintf(stderr, "hvd_kill_job: cannot rename to %s: %s\n", file.c_str(),
                 ec.message().c_str());
    return 127;
  }
  ::execvp(command[0], command);
  std::fprintf(stderr, "hvd_kill_job: cannot run %s: %s\n", command[0], std::strerror(errno));
  return 127;
}

struct Rank {
  pid_t pid = 0;
  std::optional<int> status;      // when the driver reaped it
  std::optional<double> gone_ms;  // after the kill
};

// Whether any process is left to reap, without reaping it (its status is for the caller's loop).
bool has_children() {
  siginfo_t info = {};
  return !(::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) < 0 && errno == ECHILD);
}

void print_log(const fs::path& log) {
  std::ifstream in(log);
  std::printf("---- hvdrun's output ----\n");
  for (std::string line; std::getline(in, line);) std::printf("%s\n", line.c_str());
  std::printf("-------------------------\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string hvdrun;
  int np = 0;
  std::vector<std::string> hvdrun_args;
  double within_s = 5;
  int delay_ms = 0;
  bool random_delay = false;
  std::string ready;
  int kill_signal = SIGKILL;
  std::optional<fs::path> rank_dir;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--") {
      ++i;
      break;
    } else if (arg == "--rank-in" && has_value) {
      rank_dir = argv[++i];
    } else if (arg == "--hvdrun" && has_value) {
      hvdrun = argv[++i];
    } else if (arg == "--np" && has_value) {
      np = std::atoi(argv[++i]);
    } else if (arg == "--hvdrun-arg" && has_value) {
      hvdrun_args.emplace_back(argv[++i]);
    } else if (arg == "--signal" && has_value) {
      const std::string name = argv[++i];
      kill_signal = name == "TERM"   ? SIGTERM
                    : name == "INT"  ? SIGINT
                    : name == "KILL" ? SIGKILL
                                     : 0;
      if (kill_signal == 0) {
        std::fprintf(stderr, "hvd_kill_job: --signal takes KILL, TERM or INT\n");
        return 2;
      }
    } else if (arg == "--ready" && has_value) {
      ready = argv[++i];
    } else if (arg == "--within" && has_value) {
      within_s = std::atof(argv[++i]);
    } else if (arg == "--delay-ms" && has_value) {
      delay_ms = std::atoi(argv[++i]);
    } else if (arg == "--random-delay-ms" && has_value) {
      delay_ms = std::atoi(argv[++i]);
      random_delay = true;
    } else {
      std::fprintf(stderr, "hvd_kill_job: unknown argument '%s'\n", arg.c_str());
      return 2;
    }
  }
  if (i >= argc) {
    std::fprintf(stderr, "hvd_kill_job: no program after --\n");
    return 2;
  }
  if (rank_dir) return run_rank(*rank_dir, argv + i);
  if (hvdrun.empty() || np < 1) {
    std::fprintf(stderr, "hvd_kill_job: --hvdrun PATH and --np N are required\n");
    return 2;
  }
  if (random_delay) {
    std::mt19937 random(std::random_device{}());
    delay_ms = std::uniform_int_distribution<int>(0, delay_ms)(random);
  }

  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    std::perror("hvd_kill_job: prctl(PR_SET_CHILD_SUBREAPER)");
    return 2;
  }
  char dir_template[] = "/tmp/hvd-kill-job.XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) {
    std::perror("hvd_kill_job: mkdtemp");
    return 2;
  }
  const fs::path dir = dir_template;
  const fs::path log = dir / "hvdrun.log";
  struct RemoveDir {
    fs::path dir;
    ~RemoveDir() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } remove_dir{dir};

  std::vector<std::string> command = {hvdrun, "-np", std::to_string(np)};
  command.insert(command.end(), hvdrun_args.begin(), hvdrun_args.end());
  command.insert(command.end(),
                 {"--", fs::canonical("/proc/self/exe").string(), "--rank-in", dir.string(), "--"});
  for (int j = i; j < argc; ++j) command.emplace_back(argv[j]);
  std::vector<char*> args;
  for (auto& a : command) args.push_back(a.data());
  args.push_back(nullptr);

  const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    std::perror("hvd_kill_job: open the log");
    return 2;
  }
  const Clock::time_point started = Clock::now();
  const pid_t job = ::fork();
  if (job < 0) {
    std::perror("hvd_kill_job: fork");
    return 2;
  }
  if (job == 0) {
    ::dup2(log_fd, STDOUT_FILENO);
    ::dup2(log_fd, STDERR_FILENO);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(log_fd);

  // Every rank has started once every rank has written its pid.
  std::map<int, Rank> ranks;
  const auto start_deadline = Clock::now() + std::chrono::seconds(60);
  int status = 0;
  auto ready_count = [&] {
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    int count = 0;
    for (size_t at = text.find(ready); at != std::string::npos; at = text.find(ready, at + 1)) {
      ++count;
    }
    return count;
  };
  while (static_cast<int>(ranks.size()) < np || (!ready.empty() && ready_count() < np)) {
    for (int r = 0; r < np; ++r) {
      if (ranks.count(r)) continue;
      std::ifstream in(dir / ("rank." + std::to_string(r)));
      pid_t pid = 0;
      if (in >> pid && pid > 0) ranks[r].pid = pid;
    }
    if (::waitpid(job, &status, WNOHANG) == job) {
      std::printf("hvdrun %s before all %d ranks started\nRESULT early hvdrun ended on its own\n",
                  describe(status).c_str(), np);
      print_log(log);
      return 1;
    }
    if (Clock::now() > start_deadline) {
      std::printf(
          "only %zu of %d ranks started (and %d said '%s') within 60 s\n"
          "RESULT early the job never got to work\n",
          ranks.size(), np, ready.empty() ? 0 : ready_count(), ready.c_str());
      ::kill(job, SIGTERM);
      ::waitpid(job, &status, 0);
      print_log(log);
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  // A job that died before the kill died silently as far as this test is concerned.
  for (const auto& [r, rank] : ranks) {
    if (!alive(rank.pid)) {
      std::printf("rank %d (pid %d) ended before hvdrun was killed\nRESULT early a rank ended\n", r,
                  rank.pid);
      print_log(log);
      return 1;
    }
  }
  if (::waitpid(job, &status, WNOHANG) == job) {
    std::printf("hvdrun %s before it was killed\nRESULT early hvdrun ended on its own\n",
                describe(status).c_str());
    print_log(log);
    return 1;
  }

  const Clock::time_point killed = Clock::now();
  ::kill(job, kill_signal);
  const auto deadline = killed + std::chrono::duration<double>(within_s);
  std::map<pid_t, std::string> others;  // reaped processes of the job that are not ranks
  std::optional<int> job_status;
  bool children_left = true;
  for (;;) {
    for (pid_t pid; (pid = ::waitpid(-1, &status, WNOHANG)) > 0;) {
      bool is_rank = false;
      for (auto& [r, rank] : ranks) {
        if (rank.pid != pid) continue;
        is_rank = true;
        rank.status = status;
        if (!rank.gone_ms) rank.gone_ms = ms_since(killed);
      }
      if (pid == job) job_status = status;
      if (!is_rank && pid != job) others[pid] = describe(status);
    }
    children_left = has_children();
    bool ranks_left = false;
    for (auto& [r, rank] : ranks) {
      if (!rank.gone_ms && !alive(rank.pid)) rank.gone_ms = ms_since(killed);
      ranks_left = ranks_left || !rank.gone_ms;
    }
    if (!ranks_left && !children_left) break;
    if (Clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const double all_gone_ms = ms_since(killed);

  std::printf(
      "sent SIG%s to hvdrun (pid %d) %.0f ms after it started, %d ms after every rank was "
      "%s; hvdrun %s\n",
      sigabbrev_np(kill_signal), job,
      std::chrono::duration<double, std::milli>(killed - started).count(), delay_ms,
      ready.empty() ? "started" : "ready",
      job_status ? describe(*job_status).c_str() : "STILL RUNNING");
  double last_rank_ms = 0;
  std::vector<pid_t> survivors;
  for (const auto& [r, rank] : ranks) {
    if (!rank.gone_ms) {
      std::printf("rank %d (pid %d): STILL RUNNING %.1f s after hvdrun was killed\n", r, rank.pid,
                  within_s);
      survivors.push_back(rank.pid);
      continue;
    }
    last_rank_ms = std::max(last_rank_ms, *rank.gone_ms);
    std::printf("rank %d (pid %d): gone after %.1f ms, %s\n", r, rank.pid, *rank.gone_ms,
                rank.status ? describe(*rank.status).c_str()
                            : "reaped by its own parent (status not visible here)");
  }
  for (const auto& [pid, how] : others)
    std::printf("process %d of the job: %s\n", pid, how.c_str());
  if (survivors.empty() && !children_left) {
    std::printf("RESULT ok last_rank_ms=%.1f all_gone_ms=%.1f\n", last_rank_ms, all_gone_ms);
    return 0;
  }
  if (children_left) {
    std::printf("processes of the job still running %.1f s after hvdrun was killed:\n", within_s);
    std::fflush(stdout);
    std::string ps = "ps -o pid,ppid,stat,args --ppid " + std::to_string(::getpid());
    if (std::system(ps.c_str()) != 0) std::printf("(ps failed)\n");
  }
  // Clean up what outlived hvdrun, so that a failing run leaves nothing behind either.
  for (pid_t pid : survivors) ::kill(pid, SIGKILL);
  for (int round = 0; round < 100; ++round) {
    for (pid_t pid; (pid = ::waitpid(-1, &status, WNOHANG)) > 0;) {
    }
    if (!has_children()) break;
    std::ifstream children("/proc/" + std::to_string(::getpid()) + "/task/" +
                           std::to_string(::getpid()) + "/children");
    for (pid_t pid; children >> pid;) ::kill(pid, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::printf("RESULT alive ranks_left=%zu children_left=%d\n", survivors.size(),
              children_left ? 1 : 0);
  print_log(log);
  return 1;
}
