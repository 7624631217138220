// hvdrun: start an N-rank job.
//
//   hvdrun -np 4 [--backend gloo] [--timeout S] [--plugin-path DIR] [--verbose] -- prog args...
//   hvdrun -np 4 -H hostA:2,hostB:2 [--backend NAME] -- prog args...      (through mpirun)
//   hvdrun -np 4 --mpi -- prog args...                                       (through mpirun)
//
// Hosts the rendezvous store and gives every rank the job's secret. On this host alone it starts
// the ranks itself, tags each output line with its rank ("[1]<stdout>:..."), and when a rank
// fails stops the others and exits with that rank's status. Across hosts (-H, --hostfile), for
// the mpi backend, and when asked (--mpi), it hands the launch to Open MPI's mpirun, as
// horovodrun does.
//
// hvdrun's death, however it comes (even SIGKILL), takes the job with it: every process it starts
// gets PR_SET_PDEATHSIG (die_with_hvdrun below), so no rank is left computing as an orphan.
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bootstrap/env.hpp"
#include "bootstrap/host.hpp"
#include "bootstrap/settings.hpp"
#include "bootstrap/store.hpp"
#include "common/log.hpp"
#include "hvd/sdk/env.hpp"

extern char** environ;

using namespace hvd::core;
using hvd::error;
using hvd::Result;

namespace {

constexpr auto kGracePeriod = std::chrono::seconds(5);

struct Options {
  int np = 0;
  std::string hosts;     // -H: "hostA:2,hostB:2"
  std::string hostfile;  // --hostfile
  std::string mpirun = "mpirun";
  std::string mpi_args;         // extra mpirun arguments, split on spaces
  std::string rendezvous_host;  // the address ranks reach hvdrun at (mpirun mode)
  std::string backend;
  std::string timeout;
  std::string plugin_path;
  bool verbose = false;
  bool mpi = false;  // launch through mpirun even on this host alone
  std::vector<std::string> command;
};

void usage(FILE* out) {
  std::fprintf(
      out,
      "usage: hvdrun -np N [options] [--] program [args...]\n\n"
      "Starts N ranks of program on this host, connected through a rendezvous hosted "
      "by hvdrun.\n\n"
      "options:\n"
      "  -np, -n N            number of ranks (required)\n"
      "  -H, --hosts LIST     hosts and slots, 'hostA:2,hostB:2': launch through mpirun\n"
      "  --hostfile FILE      an Open MPI hostfile: launch through mpirun\n"
      "  --mpi                launch through mpirun on this host too (what the mpi backend\n"
      "                       needs; --backend mpi implies it)\n"
      "  --mpirun PATH        the mpirun to use (default: mpirun from PATH)\n"
      "  --mpi-args 'ARGS'    extra arguments for mpirun (e.g. '--mca btl_tcp_if_include eth0')\n"
      "  --rendezvous-addr A  the address of this host that every rank can reach (mpirun\n"
      "                       mode; default: HVD_RENDEZVOUS_IFACE's address, loopback for\n"
      "                       a local job, else the first interface that is up)\n"
      "  --backend NAME       backend plugin for every rank (sets HVD_BACKEND)\n"
      "  --timeout SECONDS    bound on every wait (sets HVD_TIMEOUT)\n"
      "  --plugin-path DIRS   extra plugin directories (sets HVD_PLUGIN_PATH)\n"
      "  --verbose            print the environment given to the ranks (and the mpirun\n"
      "                       command)\n"
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
      const std::optional<uint64_t> n = hvd::sdk::parse_whole(v, 4096);
      if (!n || *n < 1) {
        std::fprintf(stderr, "hvdrun: -np '%s' is not a number of ranks (1-4096)\n", v);
        return false;
      }
      o->np = static_cast<int>(*n);
    } else if (arg == "-H" || arg == "--hosts" || arg == "-host" || arg == "--host") {
      if (!(v = value("-H"))) return false;
      o->hosts = v;
    } else if (arg == "--hostfile" || arg == "-hostfile") {
      if (!(v = value("--hostfile"))) return false;
      o->hostfile = v;
    } else if (arg == "--mpi") {
      o->mpi = true;
    } else if (arg == "--mpirun") {
      if (!(v = value("--mpirun"))) return false;
      o->mpirun = v;
    } else if (arg == "--mpi-args") {
      if (!(v = value("--mpi-args"))) return false;
      o->mpi_args = v;
    } else if (arg == "--rendezvous-addr") {
      if (!(v = value("--rendezvous-addr"))) return false;
      o->rendezvous_host = v;
    } else if (arg == "--backend") {
      if (!(v = value("--backend"))) return false;
      o->backend = v;
    } else if (arg == "--timeout") {
      if (!(v = value("--timeout"))) return false;
      o->timeout = v;
      // The ranks' own check, once here rather than on every rank after the launch.
      const auto checked = hvd::core::Settings().with(hvd::core::Knob::kTimeout, o->timeout);
      if (!checked.ok()) {
        std::fprintf(stderr, "hvdrun: --timeout: %s\n", checked.status().message().c_str());
        return false;
      }
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

// Between fork and exec, in the child: only async-signal-safe calls (hvdrun has threads by then,
// the rendezvous server's).
void write_stderr(const char* text) {
  if (text != nullptr) (void)!::write(STDERR_FILENO, text, std::strlen(text));
}

// SIGPIPE as hvdrun found it: hvdrun ignores it, and an ignored signal would survive exec into
// every rank, changing the application's own handling.
struct sigaction g_sigpipe_at_start = {};

// Ties the child's life to hvdrun's: when hvdrun dies, however (SIGKILL included, which no handler
// sees), the kernel sends the child `signal`. The setting survives exec (of a program that is not
// set-uid), so it holds for the rank the child becomes. The kernel sends it when the *thread* that
// forked the child ends, not the process: every fork in hvdrun happens on the main thread, which
// lives as long as hvdrun does. Keep it so.
// The child also gets SIGPIPE back as hvdrun found it.
void die_with_hvdrun(pid_t hvdrun, int signal) {
  ::sigaction(SIGPIPE, &g_sigpipe_at_start, nullptr);
  if (::prctl(PR_SET_PDEATHSIG, signal) != 0) {
    write_stderr(
        "hvdrun: prctl(PR_SET_PDEATHSIG) failed: not starting a process that could "
        "outlive hvdrun\n");
    ::_exit(127);
  }
  // hvdrun may have died between fork and prctl: then no signal will ever come, and the child has
  // already been handed to another parent.
  if (::getppid() != hvdrun) ::_exit(127);
}

// Waits for `child` to end, passing the first SIGINT or SIGTERM on to it as one SIGTERM: mpirun
// stops every rank on it, and a second signal would make it exit at once (see the guard). The
// signals in `waited` (SIGINT, SIGTERM, SIGCHLD) must be blocked in the calling thread: they are
// taken by sigtimedwait, so that no handler can run between a check and the wait. Returns the
// signal passed on, 0 for none, -1 when waitpid fails; `status` is the child's. Async-signal-safe
// (the guard runs it between fork and exit).
int wait_passing_on(pid_t child, const sigset_t& waited, int* status) {
  int passed_on = 0;
  for (;;) {
    const pid_t done = ::waitpid(child, status, WNOHANG);
    if (done == child) return passed_on;
    if (done < 0 && errno != EINTR) return -1;
    // The tick only bounds a missed SIGCHLD (one taken by a thread that does not block it).
    const timespec tick = {0, 100 * 1000 * 1000};
    const int sig = ::sigtimedwait(&waited, nullptr, &tick);
    if ((sig == SIGINT || sig == SIGTERM) && passed_on == 0) {
      ::kill(child, SIGTERM);
      passed_on = sig;
    }
  }
}

}  // namespace

// The hosts of an Open MPI hostfile: the first word of each line, after comments go. A file that
// cannot be read names no host here; mpirun reports it when it reads the file itself.
std::optional<std::vector<std::string>> hostfile_hosts(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::vector<std::string> hosts;
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line.substr(0, line.find('#')));
    if (std::string host; words >> host) hosts.push_back(host);
  }
  return hosts;
}

// Whether every rank of the job runs on this host: no host named, or every host named is this one.
// A host is this one when it resolves to an address of this network namespace (bootstrap/host.hpp),
// not because it shares the host name: loopback serves only ranks in this namespace.
bool job_on_this_host(const Options& opt) {
  std::vector<std::string> hosts;
  for (const std::string& entry : split(opt.hosts, ',')) {  // "host" or "host:slots"
    hosts.push_back(entry.substr(0, entry.find(':')));
  }
  if (!opt.hostfile.empty()) {
    const auto listed = hostfile_hosts(opt.hostfile);
    if (!listed || listed->empty()) return false;
    hosts.insert(hosts.end(), listed->begin(), listed->end());
  }
  for (const std::string& host : hosts) {
    if (!is_this_host(host)) return false;
  }
  return true;
}

// The address ranks reach this host at, when they may run elsewhere (mpirun mode).
Result<std::string> rendezvous_host(const Options& opt, bool on_this_host) {
  if (!opt.rendezvous_host.empty()) return opt.rendezvous_host;
  // The launcher's own environment: the other knobs are the ranks' to check.
  const Settings settings = Settings::read_leniently(process_env(), nullptr);
  if (const auto iface = settings.optional(Knob::kRendezvousIface))
    return interface_address(*iface);
  if (on_this_host) return std::string("127.0.0.1");
  std::string address = first_external_address();
  if (address.empty()) {
    return error(HVD_ERR_SYSTEM, "no network interface is up: pass --rendezvous-addr");
  }
  return address;
}

// Open MPI 4.1's default flags of its TCP transport, less "put".
constexpr const char* kTcpFlagsWithoutPut = "send,inplace,need-ack,need-csum,hetero-rdma";

// Hand the launch to mpirun: it starts the ranks (Open MPI's variables tell each its rank) and
// stops the job when one fails. hvd's variables travel by name (-x), so the secret is never on
// a command line.
int launch_with_mpirun(const Options& opt, const std::vector<std::string>& job_env) {
  for (const char* stale : {"HVD_RANK", "HVD_SIZE", "HVD_LOCAL_RANK", "HVD_LOCAL_SIZE"}) {
    ::unsetenv(stale);  // would override Open MPI's variables in local ranks
  }
  std::vector<std::string> argv = {opt.mpirun};
  if (::geteuid() == 0) argv.push_back("--allow-run-as-root");
  argv.insert(argv.end(), {"-np", std::to_string(opt.np)});
  if (!opt.hosts.empty()) {
    argv.insert(argv.end(), {"-H", opt.hosts});
  } else if (!opt.hostfile.empty()) {
    argv.insert(argv.end(), {"--hostfile", opt.hostfile});
  } else {
    argv.push_back("--oversubscribe");  // a local job, like hvdrun's own launcher
  }
  // As horovodrun: a rank bound to one core would starve the threads hvd and its backends run
  // beside it (Gloo's event loop, hvd's background thread). --mpi-args may bind again.
  argv.insert(argv.end(), {"--bind-to", "none", "--tag-output"});
  // Open MPI 4.1's TCP transport moves a large message by an emulated put unless told otherwise,
  // and that stalls when several ranks of a host send across hosts at once (the cross-host phase
  // of hierarchical allreduce took 1.0 s where the link allows 0.54 s; docs/performance.md). Its
  // send protocol keeps the link busy. A job that sets the flags itself keeps its own: Open MPI
  // would join two values given on the command line into one list.
  if (opt.mpi_args.find("btl_tcp_flags") == std::string::npos &&
      !process_env()("OMPI_MCA_btl_tcp_flags")) {
    argv.insert(argv.end(), {"--mca", "btl_tcp_flags", kTcpFlagsWithoutPut});
  }
  for (const std::string& arg : split(opt.mpi_args, ' ')) argv.push_back(arg);
  for (const std::string& entry : job_env) {
    const std::string name = entry.substr(0, entry.find('='));
    ::setenv(name.c_str(), entry.c_str() + name.size() + 1, 1);
    argv.insert(argv.end(), {"-x", name});
  }
  argv.insert(argv.end(), opt.command.begin(), opt.command.end());
  if (opt.verbose) {
    std::fprintf(stderr, "hvdrun:");
    for (const auto& a : argv) std::fprintf(stderr, " %s", a.c_str());
    std::fprintf(stderr, "\n");
  }
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // Built before fork: the child may only make async-signal-safe calls.
  const std::string cannot_run = "hvdrun: cannot run '" + opt.mpirun + "': ";
  const char* const need_open_mpi = ": multi-host jobs need Open MPI (Debian: openmpi-bin)\n";
  // hvdrun and the guard take SIGINT and SIGTERM by waiting for them (wait_passing_on), not
  // through a handler: blocked from before the fork, so the guard starts with them blocked too.
  // mpirun gets the mask hvdrun started with.
  sigset_t waited, previous_mask;
  ::sigemptyset(&waited);
  for (const int sig : {SIGINT, SIGTERM, SIGCHLD}) ::sigaddset(&waited, sig);
  ::pthread_sigmask(SIG_BLOCK, &waited, &previous_mask);
  if (g_signal != 0) {  // taken by the handler before they were blocked: start nothing
    std::fprintf(stderr, "hvdrun: got signal %d before mpirun started\n", int(g_signal));
    return 128 + g_signal;
  }
  const pid_t self = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("hvdrun: fork");
    return 1;
  }
  if (pid == 0) {
    // The guard: hvdrun -> guard -> mpirun. mpirun must get exactly one SIGTERM when hvdrun dies:
    // killed outright it leaves its ranks running (Open MPI 4.1.4: they stay, reparented, until
    // they end by themselves), on SIGTERM it stops every rank on every host and exits, but a
    // second SIGTERM while it does so makes it exit at once, and the ranks stay again.
    // PR_SET_PDEATHSIG is sent each time a child passes to another parent, and the children of a
    // multithreaded process pass from thread to thread as its threads die: mpirun forked by hvdrun
    // itself got two SIGTERMs and left its ranks. The guard has one thread, so mpirun, its only
    // child, gets one SIGTERM when the guard dies, and the guard dies with hvdrun.
    die_with_hvdrun(self, SIGKILL);
    const pid_t guard = ::getpid();
    const pid_t mpirun = ::fork();
    if (mpirun < 0) {
      write_stderr("hvdrun: fork (mpirun) failed\n");
      ::_exit(1);
    }
    if (mpirun == 0) {
      ::pthread_sigmask(SIG_SETMASK, &previous_mask, nullptr);
      die_with_hvdrun(guard, SIGTERM);
      ::execvp(args[0], args.data());
      write_stderr(cannot_run.c_str());
      write_stderr(strerrordesc_np(errno));
      write_stderr(need_open_mpi);
      ::_exit(127);
    }
    int mpirun_status = 0;
    if (wait_passing_on(mpirun, waited, &mpirun_status) < 0) ::_exit(1);
    if (WIFEXITED(mpirun_status)) ::_exit(WEXITSTATUS(mpirun_status));
    // End as mpirun did, so that hvdrun reports mpirun's own status.
    const int sig = WTERMSIG(mpirun_status);
    struct sigaction default_action = {};
    default_action.sa_handler = SIG_DFL;
    ::sigaction(sig, &default_action, nullptr);
    sigset_t unblock;
    ::sigemptyset(&unblock);
    ::sigaddset(&unblock, sig);
    ::pthread_sigmask(SIG_UNBLOCK, &unblock, nullptr);
    ::kill(guard, sig);
    ::_exit(128 + sig);
  }
  int status = 0;
  const int stopped_by = wait_passing_on(pid, waited, &status);
  ::pthread_sigmask(SIG_SETMASK, &previous_mask, nullptr);
  if (stopped_by < 0) {
    std::perror("hvdrun: waitpid");
    return 1;
  }
  if (stopped_by > 0) {
    std::fprintf(stderr, "hvdrun: got signal %d; mpirun stopped the job and %s\n", stopped_by,
                 describe(status).c_str());
    return 128 + stopped_by;
  }
  if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    std::fprintf(stderr, "hvdrun: job failed: mpirun %s\n", describe(status).c_str());
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

// Start every rank on this host, relay their output, stop all when one fails.
int launch_locally(const Options& opt, std::vector<std::string> job_env) {
  job_env.push_back("HVD_SIZE=" + std::to_string(opt.np));
  job_env.push_back("HVD_LOCAL_SIZE=" + std::to_string(opt.np));
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

  std::vector<std::string> command = opt.command;
  std::vector<char*> args;
  for (auto& a : command) args.push_back(a.data());
  args.push_back(nullptr);
  const std::string cannot_run = "hvdrun: cannot run '" + command[0] + "': ";

  const pid_t self = ::getpid();
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
      // SIGKILL: a rank whose launcher is gone has no one to report to, and a handler in the
      // application must not be able to keep it alive.
      die_with_hvdrun(self, SIGKILL);
      ::setpgid(0, 0);  // a group per rank: stopping a rank stops what it started
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      ::execvpe(args[0], args.data(), envp.data());
      write_stderr(cannot_run.c_str());
      write_stderr(strerrordesc_np(errno));
      write_stderr("\n");
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

int main(int argc, char** argv) {
  Options opt;
  if (!parse(argc, argv, &opt)) return 2;
  // What the rendezvous server logs here (the ranks check their knobs themselves).
  set_log_level(Settings::read_leniently(process_env(), nullptr).text(Knob::kLogLevel));
  const bool through_mpirun =
      opt.mpi || !opt.hosts.empty() || !opt.hostfile.empty() || opt.backend == "mpi";

  // The rendezvous. A job on this host alone (hvdrun's own launcher, or mpirun with no other
  // host) is served on the address it is advertised at, loopback unless told otherwise: nothing
  // off this host can reach it. Only when mpirun may place ranks elsewhere is it served on every
  // interface, advertised at an address the other hosts can reach (which this host may know
  // under another name, behind NAT say).
  const bool on_this_host = !through_mpirun || job_on_this_host(opt);
  std::string host = "127.0.0.1";
  if (through_mpirun) {
    Result<std::string> chosen = rendezvous_host(opt, on_this_host);
    if (!chosen.ok()) {
      std::fprintf(stderr, "hvdrun: %s\n", chosen.status().message().c_str());
      return 1;
    }
    host = *chosen;
  }
  const std::string secret = random_secret();
  // SIGINT, SIGTERM and SIGCHLD go to the main thread only: the rendezvous server's threads start
  // with them blocked, so that the main thread's waits are the ones they end.
  sigset_t stop_signals, previous_mask;
  ::sigemptyset(&stop_signals);
  for (const int sig : {SIGINT, SIGTERM, SIGCHLD}) ::sigaddset(&stop_signals, sig);
  ::pthread_sigmask(SIG_BLOCK, &stop_signals, &previous_mask);
  auto server = TcpStoreServer::start(HostPort{on_this_host ? host : "0.0.0.0", 0}, secret);
  ::pthread_sigmask(SIG_SETMASK, &previous_mask, nullptr);
  if (!server.ok()) {
    std::fprintf(stderr, "hvdrun: cannot host the rendezvous: %s\n",
                 server.status().message().c_str());
    return 1;
  }
  if (opt.verbose) {
    std::fprintf(stderr, "hvdrun: rendezvous listening on %s (%s), ranks reach it at %s\n",
                 (*server)->address().to_string().c_str(),
                 on_this_host ? "every rank on this host" : "ranks on other hosts",
                 HostPort{host, (*server)->address().port}.to_string().c_str());
  }
  std::vector<std::string> job_env = {
      "HVD_RENDEZVOUS_ADDR=" + HostPort{host, (*server)->address().port}.to_string(),
      "HVD_RENDEZVOUS_SERVER=external", "HVD_SECRET=" + secret};
  if (!opt.backend.empty()) job_env.push_back("HVD_BACKEND=" + opt.backend);
  if (!opt.timeout.empty()) job_env.push_back("HVD_TIMEOUT=" + opt.timeout);
  if (!opt.plugin_path.empty()) job_env.push_back("HVD_PLUGIN_PATH=" + opt.plugin_path);

  // Without SA_RESTART (std::signal sets it): the local launcher's poll is woken by them either
  // way, and no blocking call of hvdrun's may wait on past a signal. (Through mpirun they are
  // waited for instead: wait_passing_on.)
  struct sigaction stop = {};
  stop.sa_handler = on_signal;
  ::sigemptyset(&stop.sa_mask);
  stop.sa_flags = 0;
  ::sigaction(SIGINT, &stop, nullptr);
  ::sigaction(SIGTERM, &stop, nullptr);
  struct sigaction ignore = {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &g_sigpipe_at_start);
  return through_mpirun ? launch_with_mpirun(opt, job_env) : launch_locally(opt, job_env);
}
