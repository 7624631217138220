// hvd-plugin-check: is this backend plugin fit to ship? The static rules of the ABI, then hvd's
// conformance suite at each rank count, one line per case with the reason of every failure and
// skip. Exit status: 0 when nothing failed (skips included), 1 when a case failed, 2 on bad usage.
//
//   hvd-plugin-check path/to/libhvd-backend-mine.so [-np 1,2,3,4] [--timeout S] [--max-count N]
//                    [--filter GTEST_FILTER]
//
// The static rules are checked without running the plugin in this process: its table is read in
// a child process (plugin_probe.hpp), its exported symbols from the file's dynamic symbol table
// (exported_symbols, plugin_loader.hpp). The suite (<libexec>/hvd/hvd-conformance, the build tree
// has the same layout) runs under hvdrun, beside this program, each rank writing one line per case
// (HVD_CONFORMANCE_REPORT); a case fails when it fails on any rank.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/dll/runtime_symbol_info.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "hvd/backend.h"
#include "hvd/sdk/env.hpp"
#include "loader/plugin_loader.hpp"
#include "plugin_probe.hpp"

using namespace hvd::core;

namespace {

enum class Outcome { kPass, kSkip, kFail };

const char* label(Outcome o) {
  return o == Outcome::kPass ? "pass" : o == Outcome::kSkip ? "skip" : "FAIL";
}

struct Verdict {
  Outcome outcome = Outcome::kPass;
  std::string reason;  // for a skip or a failure
};

struct Options {
  fs::path plugin;
  std::vector<int> rank_counts = {1, 2, 3, 4};
  int timeout_s = 60;
  std::string max_count;
  std::string filter;
};

[[noreturn]] void usage(const std::string& complaint) {
  if (!complaint.empty()) std::fprintf(stderr, "hvd-plugin-check: %s\n\n", complaint.c_str());
  std::fprintf(complaint.empty() ? stdout : stderr,
               "usage: hvd-plugin-check PLUGIN.so [-np N[,N...]] [--timeout S] [--max-count N]\n"
               "                        [--filter GTEST_FILTER]\n\n"
               "Checks a backend plugin against the ABI's static rules (it loads with RTLD_NOW,\n"
               "exports hvd_backend_entry_v1 only, its table's struct_size fits its ABI minor,\n"
               "its name is its file's) and runs hvd's conformance suite on it under hvdrun at\n"
               "each rank count (default 1,2,3,4; HVD_TIMEOUT per call: --timeout, default 60;\n"
               "the timeout case, Timeouts.*, makes a communicator of its own with 2 s).\n"
               "Prints one line per case, with the reason of each skip and failure.\n"
               "Exit status: 0 nothing failed, 1 a case failed, 2 bad usage.\n");
  std::exit(complaint.empty() ? 0 : 2);
}

std::optional<int> positive(const std::string& text) {
  const std::optional<uint64_t> v = hvd::sdk::parse_whole(text, 1024);
  if (!v || *v < 1) return std::nullopt;
  return static_cast<int>(*v);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      usage("");
    } else if (arg == "-np") {
      o.rank_counts.clear();
      std::stringstream list(value());
      for (std::string n; std::getline(list, n, ',');) {
        const auto count = positive(n);
        if (!count) usage("-np takes rank counts such as 1,2,3,4, not '" + n + "'");
        if (std::find(o.rank_counts.begin(), o.rank_counts.end(), *count) == o.rank_counts.end())
          o.rank_counts.push_back(*count);
      }
      if (o.rank_counts.empty()) usage("-np takes at least one rank count");
    } else if (arg == "--timeout") {
      const auto t = positive(value());
      if (!t) usage("--timeout takes whole seconds, 1 to 1024");
      o.timeout_s = *t;
    } else if (arg == "--max-count") {
      o.max_count = value();
      const std::optional<uint64_t> count = hvd::sdk::parse_whole(o.max_count, 999999999999);
      if (!count || *count == 0) usage("--max-count takes an element count of at least 1");
    } else if (arg == "--filter") {
      o.filter = value();
    } else if (!arg.empty() && arg[0] == '-') {
      usage("unknown option '" + arg + "'");
    } else if (o.plugin.empty()) {
      o.plugin = arg;
    } else {
      usage("one plugin at a time ('" + o.plugin.string() + "' and '" + arg + "')");
    }
  }
  if (o.plugin.empty()) usage("which plugin? Give the path of its .so file");
  return o;
}

// ---- the static rules -------------------------------------------------------------------------

struct StaticCase {
  std::string name;
  Verdict verdict;
};

// The size of a table of ABI 1.<minor>, for the minors this hvd knows.
size_t table_size_of_minor(unsigned minor) {
  static_assert(HVD_BACKEND_ABI_MINOR == 2, "add the new minor's table size here");
  return minor == 0 ? HVD_BACKEND_V1_SIZE_1_0 : HVD_BACKEND_V1_SIZE_1_1;  // 1.2 kept 1.1's table
}

std::vector<StaticCase> static_rules(const fs::path& file,
                                     const hvd::Result<PluginSummary>& probed) {
  std::vector<StaticCase> cases;
  cases.push_back({"static.LoadsWithRtldNowWithAValidTable",
                   probed.ok() ? Verdict{} : Verdict{Outcome::kFail, probed.status().message()}});

  Verdict exports;
  const auto symbols = exported_symbols(file);
  if (!symbols.ok()) {
    exports = {Outcome::kFail, "its symbols cannot be read: " + symbols.status().message()};
  } else {
    std::vector<std::string> extra;
    bool entry = false;
    for (const std::string& symbol : *symbols) {
      if (symbol == HVD_BACKEND_ENTRY_SYMBOL) {
        entry = true;
      } else {
        extra.push_back(symbol);
      }
    }
    std::string why;
    if (!entry) why = "it does not export " HVD_BACKEND_ENTRY_SYMBOL;
    if (!extra.empty()) {
      std::string list;
      for (size_t i = 0; i < extra.size() && i < 5; ++i) list += (i ? ", " : "") + extra[i];
      if (extra.size() > 5) list += ", ... (" + std::to_string(extra.size()) + " in all)";
      why += std::string(why.empty() ? "" : "; ") + "it also exports " + list +
             ": build with -fvisibility=hidden and the SDK's version script (hvd_add_backend, "
             "or pkg-config --variable=plugin_ldflags hvd-sdk), so that two plugins' symbols "
             "never collide";
    }
    if (!why.empty()) exports = {Outcome::kFail, why};
  }
  cases.push_back({"static.ExportsTheEntrySymbolOnly", exports});

  if (!probed.ok()) {
    for (const char* name : {"static.StructSizeFitsItsAbiMinor", "static.NameIsTheFilesName"}) {
      cases.push_back({name, {Outcome::kSkip, "the plugin did not load"}});
    }
    return cases;
  }
  const PluginSummary& p = *probed;
  Verdict size;
  const unsigned minor = static_cast<unsigned>(std::strtoul(
      p.abi.substr(p.abi.find('.') == std::string::npos ? 0 : p.abi.find('.') + 1).c_str(), nullptr,
      10));
  const size_t actual = std::strtoull(p.struct_size.c_str(), nullptr, 10);
  if (minor > HVD_BACKEND_ABI_MINOR && actual < sizeof(hvd_backend_v1)) {
    size = {Outcome::kFail, "its table says ABI " + p.abi + ", later than this hvd's, but its " +
                                "struct_size " + p.struct_size + " is less than this hvd's " +
                                std::to_string(sizeof(hvd_backend_v1)) + " bytes"};
  } else if (minor <= HVD_BACKEND_ABI_MINOR && actual != table_size_of_minor(minor)) {
    size = {Outcome::kFail, "its table says ABI " + p.abi + " and struct_size " + p.struct_size +
                                ", but an ABI " + p.abi + " table is " +
                                std::to_string(table_size_of_minor(minor)) +
                                " bytes: set struct_size = sizeof(hvd_backend_v1)"};
  }
  cases.push_back({"static.StructSizeFitsItsAbiMinor", size});

  Verdict name;
  if (file.filename().string() != plugin_file_name(p.name)) {
    name = {Outcome::kFail, "its table says '" + p.name + "', so HVD_BACKEND=" + p.name +
                                " looks for " + plugin_file_name(p.name) + ", but the file is " +
                                file.filename().string()};
  }
  cases.push_back({"static.NameIsTheFilesName", name});
  return cases;
}

// ---- the conformance jobs ---------------------------------------------------------------------

std::string tail_of(const fs::path& log, size_t lines) {
  std::ifstream in(log);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
    out += "      | " + all[i] + "\n";
  }
  return out;
}

// The signal that asked this program to stop (SIGINT, SIGTERM, SIGHUP), or 0.
volatile sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) { g_stop_signal = sig; }

// Stops the job: hvdrun stops its ranks on SIGTERM (within its grace period of 5 s), and a
// SIGKILL after that takes the ranks with it (they die with hvdrun: PR_SET_PDEATHSIG).
void stop_job(pid_t hvdrun) {
  ::kill(hvdrun, SIGTERM);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  int status = 0;
  while (std::chrono::steady_clock::now() < give_up) {
    const pid_t done = ::waitpid(hvdrun, &status, WNOHANG);
    if (done == hvdrun || (done < 0 && errno != EINTR)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(hvdrun, SIGKILL);
  while (::waitpid(hvdrun, &status, 0) < 0 && errno == EINTR) {
  }
}

// Runs `argv` (hvdrun) with stdout and stderr into `log` and no terminal input, stopped after
// `limit` or when this program is asked to stop, and ended if this program dies. Its wait
// status, or nullopt when it had to be stopped.
std::optional<int> run_job(const std::vector<std::string>& argv, const fs::path& log,
                           const std::vector<std::pair<std::string, std::string>>& env,
                           std::chrono::seconds limit) {
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) return 127 << 8;
  if (child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, 0);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    // What the caller's environment would change about the run: the suite's own knobs.
    for (const char* knob : {"GTEST_FILTER", "GTEST_SHARD_INDEX", "GTEST_TOTAL_SHARDS",
                             "GTEST_OUTPUT", "HVD_CONFORMANCE_MAX_COUNT", "HVD_BACKEND"}) {
      ::unsetenv(knob);
    }
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    int status = 0;
    const pid_t done = ::waitpid(child, &status, WNOHANG);
    if (done == child) return status;
    if (done < 0 && errno != EINTR) return 127 << 8;  // not ours to wait for
    if (g_stop_signal != 0 || std::chrono::steady_clock::now() >= deadline) {
      stop_job(child);
      return std::nullopt;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

struct Table {
  std::vector<std::string> order;                       // cases, in the order first seen
  std::map<std::string, std::map<int, Verdict>> cells;  // case -> rank count -> verdict

  void set(const std::string& name, int np, Verdict v) {
    if (cells.find(name) == cells.end()) order.push_back(name);
    cells[name][np] = std::move(v);
  }
};

const char* const kWatchdogWords = "did not return within HVD_TIMEOUT";

// One job's rank reports folded into the table: a case fails when any rank failed it, is
// skipped when every rank skipped it, and fails when a rank started it and never finished.
// True when a case's own failure explains the job's end; false when the job's output is the
// only explanation.
bool read_reports(const fs::path& dir, int np, bool job_ok, const std::string& job_words,
                  Table& table) {
  std::vector<std::string> order;
  std::map<std::string, std::map<int, Verdict>> by_rank;
  std::map<int, std::string> unfinished;
  for (int rank = 0; rank < np; ++rank) {
    std::ifstream in(dir / ("rank" + std::to_string(rank) + ".txt"));
    for (std::string line; std::getline(in, line);) {
      std::vector<std::string> f;
      std::stringstream fields(line);
      for (std::string x; std::getline(fields, x, '\t');) f.push_back(x);
      if (f.size() < 2) continue;
      if (f[0] == "start") {
        unfinished[rank] = f[1];
        if (by_rank.find(f[1]) == by_rank.end()) order.push_back(f[1]);
        by_rank[f[1]];
        continue;
      }
      unfinished.erase(rank);
      const std::string reason = f.size() > 2 ? f[2] : "";
      by_rank[f[1]][rank] = {f[0] == "pass"   ? Outcome::kPass
                             : f[0] == "skip" ? Outcome::kSkip
                                              : Outcome::kFail,
                             reason};
    }
  }
  for (const std::string& name : order) {
    const auto& ranks = by_rank[name];
    Verdict v{Outcome::kSkip, ""};
    bool any_pass = false;
    for (int rank = 0; rank < np && v.outcome != Outcome::kFail; ++rank) {
      const auto it = ranks.find(rank);
      if (it == ranks.end()) {
        const bool here = unfinished.count(rank) != 0 && unfinished[rank] == name;
        v = {Outcome::kFail, "rank " + std::to_string(rank) +
                                 (here ? " started it and never finished (" + job_words + ")"
                                       : " never ran it (" + job_words + ")")};
      } else if (it->second.outcome == Outcome::kFail) {
        v = {Outcome::kFail, "rank " + std::to_string(rank) + ": " + it->second.reason};
      } else if (it->second.outcome == Outcome::kPass) {
        any_pass = true;
      } else if (v.reason.empty()) {
        v.reason = it->second.reason;
      }
    }
    if (v.outcome != Outcome::kFail && any_pass) v = {};
    if (v.outcome == Outcome::kFail && v.reason.find(kWatchdogWords) != std::string::npos &&
        v.reason.find("watchdog") == std::string::npos) {
      v.reason +=
          " [the host's watchdog had to end the call: the plugin does not honour its "
          "timeout]";
    }
    table.set(name, np, v);
  }
  bool explained = false;
  for (const std::string& name : order) {
    const Verdict& v = table.cells[name][np];
    explained =
        explained || (v.outcome == Outcome::kFail && v.reason.find(job_words) == std::string::npos);
  }
  if (order.empty()) {
    table.set("job.RanksInitializeAndRunTheSuite", np,
              {Outcome::kFail, "no rank ran a case (" + job_words + ")"});
  } else if (!job_ok && !explained) {
    table.set("job.EndsCleanly", np, {Outcome::kFail, job_words});
  }
  return job_ok || explained;
}

std::string describe_status(const std::optional<int>& status, int limit_s) {
  if (!status) return "the job ran past " + std::to_string(limit_s) + " s and was killed";
  if (WIFEXITED(*status))
    return "hvdrun exited with status " + std::to_string(WEXITSTATUS(*status));
  return "hvdrun ended by signal " + std::to_string(WTERMSIG(*status));
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  // A SIGCHLD inherited as ignored would make every child's status unreadable.
  ::signal(SIGCHLD, SIG_DFL);
  struct sigaction stop = {};
  stop.sa_handler = on_stop_signal;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &stop, nullptr);
  std::error_code ec;
  const fs::path plugin = fs::absolute(o.plugin, ec);
  if (!fs::is_regular_file(plugin, ec)) {
    std::fprintf(stderr, "hvd-plugin-check: %s: no such file\n", plugin.c_str());
    return 2;
  }
  fs::path bindir;
  try {
    bindir = fs::path(boost::dll::program_location().string()).parent_path();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hvd-plugin-check: where am I? %s\n", e.what());
    return 2;
  }
  const fs::path hvdrun = bindir / "hvdrun";
  const fs::path suite = (bindir / HVD_CONFORMANCE_FROM_BINDIR).lexically_normal();
  for (const fs::path& needed : {hvdrun, suite}) {
    if (::access(needed.c_str(), X_OK) != 0) {
      std::fprintf(stderr, "hvd-plugin-check: %s is missing: is hvd completely installed?\n",
                   needed.c_str());
      return 2;
    }
  }

  std::printf("hvd-plugin-check %s\n", plugin.c_str());
  const auto probed = probe_plugin(plugin, std::chrono::seconds(o.timeout_s), /*by_name=*/false);
  if (probed.ok()) {
    const PluginSummary& p = *probed;
    std::printf(
        "backend '%s' %s, ABI %s, capabilities %s; dtypes %s; reduce ops %s; optional "
        "entries %s\n",
        p.name.c_str(), p.version.c_str(), p.abi.c_str(), p.capabilities.c_str(), p.dtypes.c_str(),
        p.reduce_ops.c_str(), p.optional_entries.c_str());
  }
  int passed = 0, skipped = 0, failed = 0;
  auto count = [&](Outcome outcome) {
    (outcome == Outcome::kPass ? passed : outcome == Outcome::kSkip ? skipped : failed)++;
  };
  std::printf("\nStatic rules\n");
  for (const StaticCase& c : static_rules(plugin, probed)) {
    count(c.verdict.outcome);
    std::printf("  %s  %s%s%s\n", label(c.verdict.outcome), c.name.c_str(),
                c.verdict.reason.empty() ? "" : "\n        ", c.verdict.reason.c_str());
  }
  if (!probed.ok()) {
    std::printf(
        "\nhvd-plugin-check: the plugin does not load; the conformance suite needs it to\n");
    return 1;
  }

  // The jobs' reports and output go under $TMPDIR (else /tmp), as mktemp(1) puts its files.
  const char* tmpdir = std::getenv("TMPDIR");
  std::string tmpl = (tmpdir != nullptr && *tmpdir != '\0' ? std::string(tmpdir) : "/tmp") +
                     "/hvd-plugin-check.XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    std::fprintf(stderr, "hvd-plugin-check: mkdtemp in %s: %s\n",
                 tmpl.substr(0, tmpl.rfind('/')).c_str(), std::strerror(errno));
    return 2;
  }
  const fs::path work = tmpl;
  std::string counts_text;
  for (int np : o.rank_counts)
    counts_text += (counts_text.empty() ? "" : ", ") + std::to_string(np);
  std::printf(
      "\nConformance at %s ranks: HVD_CONFORMANCE_TIMEOUT_CASE=1%s %s -np N --backend %s "
      "--timeout %d -- %s --gtest_brief=1%s\n",
      counts_text.c_str(),
      o.max_count.empty() ? "" : (" HVD_CONFORMANCE_MAX_COUNT=" + o.max_count).c_str(),
      hvdrun.c_str(), plugin.c_str(), o.timeout_s, suite.c_str(),
      o.filter.empty() ? "" : (" '--gtest_filter=" + o.filter + "'").c_str());
  Table table;
  std::vector<std::string> job_logs;
  for (int np : o.rank_counts) {
    const fs::path reports = work / ("np" + std::to_string(np));
    fs::create_directories(reports, ec);
    const fs::path log = work / ("np" + std::to_string(np) + ".log");
    std::vector<std::string> args = {hvdrun.string(),
                                     "-np",
                                     std::to_string(np),
                                     "--backend",
                                     plugin.string(),
                                     "--timeout",
                                     std::to_string(o.timeout_s),
                                     "--",
                                     suite.string(),
                                     "--gtest_brief=1"};
    if (!o.filter.empty()) args.push_back("--gtest_filter=" + o.filter);
    std::vector<std::pair<std::string, std::string>> env = {
        {"HVD_CONFORMANCE_REPORT", reports.string()}, {"HVD_CONFORMANCE_TIMEOUT_CASE", "1"}};
    if (!o.max_count.empty()) env.emplace_back("HVD_CONFORMANCE_MAX_COUNT", o.max_count);
    std::printf("  running %d rank%s ...\n", np, np == 1 ? "" : "s");
    std::fflush(stdout);
    const int limit_s = 900 + 4 * o.timeout_s;
    const auto status = run_job(args, log, env, std::chrono::seconds(limit_s));
    if (g_stop_signal != 0) {
      std::printf("hvd-plugin-check: stopped by signal %d; the job was stopped\n",
                  static_cast<int>(g_stop_signal));
      fs::remove_all(work, ec);
      return 128 + g_stop_signal;
    }
    const bool ok = status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
    const bool explained = read_reports(
        reports, np, ok, describe_status(status, limit_s) + "; its output: " + log.string(), table);
    if (!explained)
      job_logs.push_back("  " + std::to_string(np) + " ranks, " + describe_status(status, limit_s) +
                         ", the end of its output:\n" + tail_of(log, 12));
  }

  std::string header;
  for (int np : o.rank_counts) {
    char cell[16];
    std::snprintf(cell, sizeof cell, "np%-3d", np);
    header += cell;
  }
  std::printf("\n  %s case\n", header.c_str());
  for (const std::string& name : table.order) {
    const auto& row = table.cells[name];
    std::string cells;
    Outcome worst = Outcome::kPass;
    bool any_pass = false;
    std::vector<std::string> reasons;
    for (int np : o.rank_counts) {
      const auto it = row.find(np);
      char cell[16];
      std::snprintf(cell, sizeof cell, "%-5s", it == row.end() ? "-" : label(it->second.outcome));
      cells += cell;
      if (it == row.end()) continue;
      const Verdict& v = it->second;
      if (v.outcome == Outcome::kPass) any_pass = true;
      if (v.outcome == Outcome::kFail) worst = Outcome::kFail;
      if (v.outcome != Outcome::kPass && !v.reason.empty()) {
        const std::string line = "np" + std::to_string(np) + ": " + v.reason;
        if (std::find_if(reasons.begin(), reasons.end(), [&](const std::string& r) {
              return r.substr(r.find(':')) == line.substr(line.find(':'));
            }) == reasons.end()) {
          reasons.push_back(line);
        }
      }
    }
    if (worst != Outcome::kFail && !any_pass) worst = Outcome::kSkip;
    count(worst);
    std::printf("  %s %s\n", cells.c_str(), name.c_str());
    for (const std::string& r : reasons) std::printf("        %s\n", r.c_str());
  }
  // An error a plugin returns breaks the communicator for good, and every later case of that
  // job fails with it or because of it: point at the case that broke it.
  for (int np : o.rank_counts) {
    size_t first = table.order.size(), failing = 0;
    for (size_t i = table.order.size(); i-- > 0;) {
      const auto& row = table.cells[table.order[i]];
      const auto it = row.find(np);
      if (it == row.end()) continue;
      if (it->second.outcome != Outcome::kFail) break;
      first = i;
      ++failing;
    }
    if (failing >= 3) {
      std::printf(
          "\nAt %d rank%s, every case from %s on failed. A status other than success "
          "that the plugin returns breaks the communicator for good (plugin-abi.md, "
          "section 7), so the later failures may only follow from the first: fix that "
          "one first. (A dtype or op the plugin cannot do belongs out of its declared "
          "dtypes/reduce_ops, not in an error.)\n",
          np, np == 1 ? "" : "s", table.order[first].c_str());
    }
  }
  if (!job_logs.empty()) {
    std::printf("\nJobs that did not end cleanly:\n");
    for (const std::string& j : job_logs) std::printf("%s", j.c_str());
  }
  std::printf("\n%d cases: %d passed, %d skipped, %d failed. %s\n", passed + skipped + failed,
              passed, skipped, failed, failed == 0 ? "The plugin passes." : "The plugin FAILS.");
  if (failed == 0)
    fs::remove_all(work, ec);
  else
    std::printf("The jobs' reports and output are kept in %s\n", work.c_str());
  return failed == 0 ? 0 : 1;
}
