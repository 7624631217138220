#include "plugin_probe.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <optional>
#include <thread>

namespace hvd::core {
namespace {

// The report travels as length-prefixed fields ("<size>:<bytes>"): a description may hold any
// character, and the parent must tell a complete report from one cut short by a crash.
void put(std::string& out, const std::string& field) {
  out += std::to_string(field.size()) + ":" + field;
}

std::optional<std::string> take(const std::string& in, size_t& at) {
  const size_t colon = in.find(':', at);
  if (colon == std::string::npos || colon == at || colon - at > 9) return std::nullopt;
  size_t size = 0;
  for (size_t i = at; i < colon; ++i) {
    if (in[i] < '0' || in[i] > '9') return std::nullopt;
    size = size * 10 + static_cast<size_t>(in[i] - '0');
  }
  if (in.size() - colon - 1 < size) return std::nullopt;
  at = colon + 1 + size;
  return in.substr(colon + 1, size);
}

std::string encode(const Result<Plugin>& loaded) {
  std::string out;
  if (!loaded.ok()) {
    put(out, "failed");
    put(out, loaded.status().message());
    return out;
  }
  const Plugin& p = *loaded;
  put(out, "loaded");
  for (const std::string& field :
       {p.name, p.version, p.description,
        std::to_string(p.abi_major) + "." + std::to_string(p.abi_minor),
        capabilities_to_string(p.capabilities), dtypes_to_string(p.dtypes),
        reduce_ops_to_string(p.reduce_ops), optional_entries_to_string(p), p.path.string(),
        std::to_string(p.table->struct_size)}) {
    put(out, field);
  }
  return out;
}

// A plugin's summary, or the status of its failure; nullopt when the report is incomplete.
std::optional<Result<PluginSummary>> decode(const std::string& in) {
  size_t at = 0;
  const auto kind = take(in, at);
  if (kind == "failed") {
    const auto message = take(in, at);
    if (!message) return std::nullopt;
    return Result<PluginSummary>(error(HVD_ERR_PLUGIN, *message));
  }
  if (kind != "loaded") return std::nullopt;
  PluginSummary s;
  for (std::string* field :
       {&s.name, &s.version, &s.description, &s.abi, &s.capabilities, &s.dtypes, &s.reduce_ops,
        &s.optional_entries, &s.path, &s.struct_size}) {
    const auto value = take(in, at);
    if (!value) return std::nullopt;
    *field = *value;
  }
  return Result<PluginSummary>(std::move(s));
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// The child: load the plugin, report, end without running anything of the parent's at exit (its
// buffers, static destructors: they are the parent's to run).
[[noreturn]] void probe_child(const fs::path& file, bool by_name, int report_fd) {
  // A plugin that crashes would leave a core file of hvd-info in the working directory.
  const rlimit no_core = {0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);
  // A crash must end the child by its signal, which the parent names. A handler installed in this
  // process (a sanitizer's, which reports and exits with a status) would hide which it was.
  for (const int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTRAP, SIGSYS}) {
    struct sigaction default_action = {};
    default_action.sa_handler = SIG_DFL;
    ::sigaction(sig, &default_action, nullptr);
  }
  const std::string report = encode(by_name ? load_plugin_by_name(file) : load_plugin(file));
  for (size_t sent = 0; sent < report.size();) {
    const ssize_t n = ::write(report_fd, report.data() + sent, report.size() - sent);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ::_exit(3);
    sent += static_cast<size_t>(n);
  }
  ::_exit(0);
}

// Waits for `child` until `deadline`: its wait status, or nullopt when it is still running.
std::optional<int> wait_until(pid_t child, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    int status = 0;
    const pid_t done = ::waitpid(child, &status, WNOHANG);
    if (done == child) return status;
    if (done < 0 && errno != EINTR) return 0;  // not ours to wait for: nothing more to learn
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

Result<PluginSummary> probe_plugin(const fs::path& file, std::chrono::milliseconds timeout,
                                   bool by_name) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return error(HVD_ERR_SYSTEM, std::string("pipe: ") + std::strerror(errno));
  }
  std::fflush(nullptr);  // else the child's copy of unwritten output could be written twice
  const pid_t child = ::fork();
  if (child < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    return error(HVD_ERR_SYSTEM, std::string("fork: ") + std::strerror(err));
  }
  if (child == 0) {
    ::close(fds[0]);
    probe_child(file, by_name, fds[1]);
  }
  ::close(fds[1]);

  // Read until the report is complete, the pipe closes or the child ends. A process the plugin
  // started may hold the pipe open after the child ended: the pipe's end alone is not enough.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string report;
  std::optional<Result<PluginSummary>> decoded;
  std::optional<int> status;
  while (!decoded && !status && std::chrono::steady_clock::now() < deadline) {
    pollfd pfd = {fds[0], POLLIN, 0};
    const int ready = ::poll(&pfd, 1, 20);
    if (ready < 0 && errno != EINTR) break;
    if (ready > 0) {
      char buffer[4096];
      const ssize_t n = ::read(fds[0], buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // closed: the child has ended or is ending
      report.append(buffer, static_cast<size_t>(n));
      decoded = decode(report);
    } else {
      status = wait_until(child, std::chrono::steady_clock::now());
    }
  }
  ::close(fds[0]);
  if (!status) status = wait_until(child, deadline);
  const bool hung = !status;
  if (hung) {
    ::kill(child, SIGKILL);
    int killed = 0;
    while (::waitpid(child, &killed, 0) < 0 && errno == EINTR) {
    }
  }
  if (decoded) return *decoded;
  if (hung) {
    return error(HVD_ERR_PLUGIN, file.string() + ": did not finish loading within " +
                                     std::to_string(timeout.count()) +
                                     " ms (HVD_TIMEOUT); the process loading it was killed");
  }
  if (WIFSIGNALED(*status)) {
    return error(HVD_ERR_PLUGIN, file.string() + ": crashed (" + signal_name(WTERMSIG(*status)) +
                                     ") while loading");
  }
  return error(HVD_ERR_PLUGIN, file.string() + ": the process loading it exited with status " +
                                   std::to_string(WEXITSTATUS(*status)) + " without a report");
}

}  // namespace hvd::core
