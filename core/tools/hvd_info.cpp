// hvd-info: every backend plugin hvd can find, and why the ones it cannot use failed.
//
// Each plugin is loaded in a child process of its own (probe() below): the child loads it, writes
// what it found back over a pipe and ends. A plugin whose entry function crashes or never returns
// then costs its own line ("crashed (SIGSEGV) while loading"), not the listing of every other
// plugin. Forking and then loading a library in the child is safe here only because hvd-info has
// a single thread when it forks: nothing in it starts one. libhvd, which runs inside
// multithreaded applications, never probes this way (see resolve_backend in plugin_loader.hpp).
//
// Exit status: 0 when every plugin file found loads, 1 when some failed to load, crashed or hung
// (the others are listed all the same), 2 on bad usage or configuration.
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "hvd/backend.h"
#include "loader/plugin_loader.hpp"

using namespace hvd::core;
using hvd::error;
using hvd::Result;
using hvd::Status;

namespace {

// What a child reports of one plugin file: the listing's fields, or why it did not load.
struct Summary {
  std::string name, version, description, abi, capabilities, dtypes, reduce_ops, optional_entries;
  std::string path;
};

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
        reduce_ops_to_string(p.reduce_ops), optional_entries_to_string(p), p.path.string()}) {
    put(out, field);
  }
  return out;
}

// A plugin's summary, or the status of its failure; nullopt when the report is incomplete.
std::optional<Result<Summary>> decode(const std::string& in) {
  size_t at = 0;
  const auto kind = take(in, at);
  if (kind == "failed") {
    const auto message = take(in, at);
    if (!message) return std::nullopt;
    return Result<Summary>(error(HVD_ERR_PLUGIN, *message));
  }
  if (kind != "loaded") return std::nullopt;
  Summary s;
  for (std::string* field : {&s.name, &s.version, &s.description, &s.abi, &s.capabilities,
                             &s.dtypes, &s.reduce_ops, &s.optional_entries, &s.path}) {
    const auto value = take(in, at);
    if (!value) return std::nullopt;
    *field = *value;
  }
  return Result<Summary>(std::move(s));
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// The child: load the plugin, report, end without running anything of the parent's at exit (its
// buffers, static destructors: they are the parent's to run).
[[noreturn]] void probe_child(const fs::path& file, int report_fd) {
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
  const std::string report = encode(load_plugin(file));
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

// Load `file` in a child process, within `timeout`: its summary, or why it failed (HVD_ERR_PLUGIN
// naming the file: the loader's reason, a crash with its signal, a hang, an unexplained exit).
Result<Summary> probe(const fs::path& file, std::chrono::milliseconds timeout) {
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
    probe_child(file, fds[1]);
  }
  ::close(fds[1]);

  // Read until the report is complete, the pipe closes or the child ends. A process the plugin
  // started may hold the pipe open after the child ended: the pipe's end alone is not enough.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string report;
  std::optional<Result<Summary>> decoded;
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

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) {
      std::printf(
          "usage: hvd-info\n\nLists the backend plugins found in the plugin search path "
          "(HVD_PLUGIN_PATH, then the\ninstall location) with their versions and "
          "capabilities, and the files that failed to load.\nEach plugin is loaded in a "
          "process of its own, so one that crashes or hangs (HVD_TIMEOUT)\nis reported and "
          "the others are still listed. Exit status: 0 when every plugin loads, 1 when\nsome "
          "failed to.\n");
      return 0;
    }
    std::fprintf(stderr, "hvd-info: unknown argument '%s' (see --help)\n", argv[i]);
    return 2;
  }
  const EnvLookup env = process_env();
  const Result<std::chrono::milliseconds> timeout = timeout_from_env(env);
  if (!timeout.ok()) {
    std::fprintf(stderr, "hvd-info: %s\n", timeout.status().message().c_str());
    return 2;
  }
  const std::vector<fs::path> dirs = plugin_search_path(env);
  std::printf("hvd %s, backend ABI %d.%d\n\nPlugin search path:\n", HVD_VERSION_STRING,
              HVD_BACKEND_ABI_MAJOR, HVD_BACKEND_ABI_MINOR);
  for (size_t i = 0; i < dirs.size(); ++i) {
    std::printf("  %zu. %s%s\n", i + 1, dirs[i].c_str(),
                fs::is_directory(dirs[i]) ? "" : "  (does not exist)");
  }
  std::vector<Summary> plugins;
  std::vector<PluginFailure> failures;
  for (const fs::path& file : find_plugin_files(dirs)) {
    Result<Summary> probed = probe(file, *timeout);
    if (probed.ok()) {
      plugins.push_back(std::move(probed).value());
    } else {
      failures.push_back({file, probed.status()});
    }
  }
  std::printf("\nBackends (%zu):\n", plugins.size());
  if (!plugins.empty()) {
    std::printf("  %-10s %-28s %-5s %-34s %s\n", "NAME", "VERSION", "ABI", "CAPABILITIES", "PATH");
  }
  for (const Summary& p : plugins) {
    std::printf("  %-10s %-28s %-5s %-34s %s\n", p.name.c_str(), p.version.c_str(), p.abi.c_str(),
                p.capabilities.c_str(), p.path.c_str());
    if (!p.description.empty()) std::printf("  %-10s %s\n", "", p.description.c_str());
    std::printf("  %-10s dtypes: %s; reduce ops: %s; optional entries: %s\n", "", p.dtypes.c_str(),
                p.reduce_ops.c_str(), p.optional_entries.c_str());
  }
  if (!failures.empty()) {
    std::printf("\nFailed to load (%zu):\n", failures.size());
    for (const PluginFailure& f : failures) {
      std::printf("  %s\n    %s\n", f.path.c_str(), f.status.message().c_str());
    }
  }
  const auto chosen = knob(env, "BACKEND");
  std::printf("\nBackend for this environment: %s\n",
              chosen ? chosen->c_str() : "gloo (the default; set HVD_BACKEND to choose)");
  return failures.empty() ? 0 : 1;
}
