// hvdrun: start an N-rank job on this host.
//
//   hvdrun -np 4 [--backend gloo] [--timeout S] [--plugin-path DIR] [--verbose] -- prog args...
//
// Hosts the rendezvous store, gives each rank its HVD_* variables and the job's secret, tags
// each output line with its rank ("[1]<stdout>:..."), and when a rank fails stops the others
// and exits with that rank's status.
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "store.hpp"

extern char** environ;

using namespace hvd::core;

namespace {

constexpr auto kGracePeriod = std::chrono::seconds(5);

struct Options {
  int np = 0;
  std::string backend;
  std::string timeout;
  std::string plugin_path;
  bool verbose = false;
  std::vector<std::string> command;
};

void usage(FILE* out) {
  std::fprintf(out,
               "usage: hvdrun -np N [options] [--] program [args...]\n\n"
               "Starts N ranks of program on this host, connected through a rendezvous hosted "
               "by hvdrun.\n\n"
               "options:\n"
               "  -np, -n N            number of ranks (required)\n"
               "  --backend NAME       backend plugin for every rank (sets HVD_BACKEND)\n"
               "  --timeout SECONDS    bound on every wait (sets HVD_TIMEOUT)\n"
               "  --plugin-path DIRS   extra plugin directories (sets HVD_PLUGIN_PATH)\n"
               "  --verbose            print the environment given to the ranks\n"
               "  -h, --help           this text\n");
}

bool parse(int argc, char** argv, Options* o) {
  int i = 1;
  auto value = [&](const char* flag) -> const char* {
    if (i + 1 >= argc) {
      std::fprintf(stderr, "hvdrun: %s needs a value\n", flag);
      return nullptr;
    }
    return argv[++i];
  };
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    const char* v = nullptr;
    if (arg == "--") {
      ++i;
      break;
    } else if (arg == "-h" || arg == "--help") {
      usage(stdout);
      std::exit(0);
    } else if (arg == "-np" || arg == "-n" || arg == "--np") {
      if (!(v = value(argv[i]))) return false;
      char* end = nullptr;
      const long n = std::strtol(v, &end, 10);
      if (*end != '\0' || n < 1 || n > 4096) {
        std::fprintf(stderr, "hvdrun: -np '%s' is not a number of ranks (1-4096)\n", v);
        return false;
      }
      o->np = static_cast<int>(n);
    } else if (arg == "--backend") {
      if (!(v = value("--backend"))) return false;
      o->backend = v;
    } else if (arg == "--timeout") {
      if (!(v = value("--timeout"))) return false;
      o->timeout = v;
    } else if (arg == "--plugin-path") {
      if (!(v = value("--plugin-path"))) return false;
      o->plugin_path = v;
    } else if (arg == "--verbose" || arg == "-v") {
      o->verbose = true;
    } else if (!arg.empty() && arg[0] == '-') {
      std::fprintf(stderr, "hvdrun: unknown option '%s' (see --help)\n", arg.c_str());
      return false;
    } else {
      break;
    }
  }
  for (; i < argc; ++i) o->command.emplace_back(argv[i]);
  if (o->np == 0) {
    std::fprintf(stderr, "hvdrun: -np N is required (see --help)\n");
    return false;
  }
  if (o->command.empty()) {
    std::fprintf(stderr, "hvdrun: no program to run (see --help)\n");
    return false;
  }
  return true;
}

std::string random_secret() {
  std::random_device device;
  std::string out;
  for (int i = 0; i < 4; ++i) {
    char chunk[9];
    std::snprintf(chunk, sizeof chunk, "%08x", device());
    out += chunk;
  }
  return out;
}

// One output stream of one rank: a pipe and the partial line not yet printed.
struct Stream {
  int rank;
  bool is_stderr;
  int fd;
  std::string pending;
};

void emit(Stream& s, const std::string& line) {
  FILE* out = s.is_stderr ? stderr : stdout;
  std::fprintf(out, "[%d]<%s>:%s\n", s.rank, s.is_stderr ? "stderr" : "stdout", line.c_str());
  std::fflush(out);
}

// Read what is available; print complete lines. Returns false at end of stream.
bool pump(Stream& s) {
  char buffer[65536];
  const ssize_t n = ::read(s.fd, buffer, sizeof buffer);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) {
    if (!s.pending.empty()) emit(s, s.pending);
    s.pending.clear();
    return false;
  }
  s.pending.append(buffer, static_cast<size_t>(n));
  size_t start = 0;
  for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    emit(s, s.pending.substr(start, nl - start));
  }
  s.pending.erase(0, start);
  return true;
}

volatile std::sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  if (!parse(argc, argv, &opt)) return 2;

  const std::string secret = random_secret();
  auto server = TcpStoreServer::start(HostPort{"127.0.0.1", 0}, secret);
  if (!server.ok()) {
    std::fprintf(stderr, "hvdrun: cannot host the rendezvous: %s\n",
                 server.status().message().c_str());
    return 1;
  }
  const std::string address = (*server)->address().to_string();

  // Everything the children need is built before fork: the child only calls exec.
  std::vector<std::string> base_env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    if (entry.rfind("HVD_RANK=", 0) == 0 || entry.rfind("HVD_SIZE=", 0) == 0 ||
        entry.rfind("HVD_LOCAL_", 0) == 0 || entry.rfind("HVD_RENDEZVOUS_", 0) == 0 ||
        entry.rfind("HVD_SECRET=", 0) == 0) {
      continue;  // ours win over anything inherited
    }
    base_env.push_back(entry);
  }
  std::vector<std::string> job_env = {
      "HVD_SIZE=" + std::to_string(opt.np), "HVD_LOCAL_SIZE=" + std::to_string(opt.np),
      "HVD_RENDEZVOUS_ADDR=" + address, "HVD_RENDEZVOUS_SERVER=external", "HVD_SECRET=" + secret};
  if (!opt.backend.empty()) job_env.push_back("HVD_BACKEND=" + opt.backend);
  if (!opt.timeout.empty()) job_env.push_back("HVD_TIMEOUT=" + opt.timeout);
  if (!opt.plugin_path.empty()) job_env.push_back("HVD_PLUGIN_PATH=" + opt.plugin_path);
  if (opt.verbose) {
    std::fprintf(stderr, "hvdrun: %d ranks of", opt.np);
    for (const auto& a : opt.command) std::fprintf(stderr, " %s", a.c_str());
    std::fprintf(stderr, "\nhvdrun: environment:");
    for (const auto& e : job_env) {
      std::fprintf(stderr, " %s",
                   e.rfind("HVD_SECRET=", 0) == 0 ? "HVD_SECRET=<hidden>" : e.c_str());
    }
    std::fprintf(stderr, " HVD_RANK=<rank> HVD_LOCAL_RANK=<rank>\n");
  }

  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);

  std::vector<char*> args;
  for (auto& a : opt.command) args.push_back(a.data());
  args.push_back(nullptr);

  std::map<pid_t, int> running;  // pid -> rank
  std::vector<Stream> streams;
  for (int rank = 0; rank < opt.np; ++rank) {
    std::vector<std::string> env = base_env;
    env.insert(env.end(), job_env.begin(), job_env.end());
    env.push_back("HVD_RANK=" + std::to_string(rank));
    env.push_back("HVD_LOCAL_RANK=" + std::to_string(rank));
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);

    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
      std::perror("hvdrun: pipe");
      return 1;
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("hvdrun: fork");
      return 1;
    }
    if (pid == 0) {
      ::setpgid(0, 0);  // a group per rank: stopping a rank stops what it started
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      ::execvpe(args[0], args.data(), envp.data());
      const std::string msg =
          std::string("hvdrun: cannot run '") + args[0] + "': " + std::strerror(errno) + "\n";
      (void)!::write(STDERR_FILENO, msg.data(), msg.size());
      ::_exit(127);
    }
    ::setpgid(pid, pid);
    ::close(out[1]);
    ::close(err[1]);
    running[pid] = rank;
    streams.push_back({rank, false, out[0], {}});
    streams.push_back({rank, true, err[0], {}});
  }

  int first_failed_rank = -1;
  int first_failed_status = 0;
  bool stopping = false;
  auto stop_at = Clock::time_point::max();
  bool killed = false;
  std::optional<Clock::time_point> drain_deadline;
  auto stop_all = [&](int sig) {
    for (const auto& [pid, rank] : running) ::kill(-pid, sig);
  };

  while (!running.empty() || !streams.empty()) {
    std::vector<pollfd> fds;
    for (const Stream& s : streams) fds.push_back({s.fd, POLLIN, 0});
    const int ready = ::poll(fds.data(), fds.size(), 100);
    if (ready > 0) {
      for (size_t i = fds.size(); i-- > 0;) {
        if (fds[i].revents == 0) continue;
        if (!pump(streams[i])) {
          ::close(streams[i].fd);
          streams.erase(streams.begin() + static_cast<std::ptrdiff_t>(i));
        }
      }
    }
    int status = 0;
    for (pid_t pid; (pid = ::waitpid(-1, &status, WNOHANG)) > 0;) {
      auto it = running.find(pid);
      if (it == running.end()) continue;
      const int rank = it->second;
      running.erase(it);
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed && first_failed_rank < 0 && !stopping) {
        first_failed_rank = rank;
        first_failed_status = status;
        std::fprintf(stderr, "hvdrun: rank %d (pid %d) %s; stopping the other ranks\n", rank, pid,
                     describe(status).c_str());
      }
    }
    if (g_signal != 0 && !stopping) {
      std::fprintf(stderr, "hvdrun: got signal %d; stopping all ranks\n", int(g_signal));
    }
    if ((first_failed_rank >= 0 || g_signal != 0) && !stopping) {
      stopping = true;
      stop_all(SIGTERM);
      stop_at = Clock::now() + kGracePeriod;
    }
    if (stopping && !killed && Clock::now() > stop_at) {
      stop_all(SIGKILL);
      killed = true;
    }
    // Once every rank is gone, output still held open by stray grandchildren gets a short grace.
    if (running.empty()) {
      if (!drain_deadline) drain_deadline = Clock::now() + std::chrono::seconds(2);
      if (Clock::now() > *drain_deadline) break;
    }
  }
  if (first_failed_rank >= 0) {
    std::fprintf(stderr, "hvdrun: job failed: rank %d %s\n", first_failed_rank,
                 describe(first_failed_status).c_str());
    if (WIFEXITED(first_failed_status)) return WEXITSTATUS(first_failed_status);
    return 128 + WTERMSIG(first_failed_status);
  }
  if (g_signal != 0) return 128 + g_signal;
  return 0;
}
