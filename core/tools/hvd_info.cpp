// hvd-info: every backend plugin hvd can find, and why the ones it cannot use failed.
//
// Each plugin is loaded in a child process of its own (plugin_probe.hpp): one whose entry function
// crashes or never returns costs its own line ("crashed (SIGSEGV) while loading"), not the
// listing of every other plugin. hvd-info has a single thread: nothing in it starts one.
//
// Plugins are found by the naming rule, so each must say the name of its file
// (libhvd-backend-<name>.so says <name>): one that says another is listed as failed, since
// HVD_BACKEND=<name> would refuse it.
//
// Exit status: 0 when every plugin file found loads, 1 when some failed to load, crashed or hung
// (the others are listed all the same), 2 on bad usage or configuration.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bootstrap/settings.hpp"
#include "common/log.hpp"
#include "hvd/backend.h"
#include "loader/plugin_loader.hpp"
#include "plugin_probe.hpp"

using namespace hvd::core;
using hvd::Result;

namespace {

// Every knob of the table: its value here (or its default), and what it does.
void print_settings(const Settings& settings, const EnvLookup& env,
                    const std::vector<Settings::Problem>& problems) {
  std::printf(
      "\nSettings (HOROVOD_<name> is read where HVD_<name> is unset, except for the plugins'):\n");
  size_t width = 0;
  for (const KnobSpec& knob : knob_table()) width = std::max(width, std::strlen(knob.name) + 4);
  for (size_t i = 0; i < knob_table().size(); ++i) {
    const KnobSpec& knob = knob_table()[i];
    std::string value;
    std::string variable = std::string("HVD_") + knob.name;
    if (i < kKnobCount) {
      const auto k = static_cast<Knob>(i);
      variable = settings.variable(k);
      value =
          settings.is_set(k)
              ? settings.text(k)
              : (knob.fallback != nullptr ? std::string(knob.fallback) + " (default)" : "(unset)");
      if (k == Knob::kSecret && settings.is_set(k)) value = "(set)";
      for (const Settings::Problem& p : problems) {  // a refused value, and why
        if (p.knob == k) value = "INVALID: " + p.why.message();
      }
    } else {
      const auto set = env(variable);
      value = set ? *set : "(unset)";
    }
    std::printf("  %-*s %s\n  %-*s   %s%s%s\n", static_cast<int>(width), variable.c_str(),
                value.c_str(), static_cast<int>(width), "", knob.doc,
                knob.reader != nullptr ? "; read by " : "",
                knob.reader != nullptr ? knob.reader : "");
  }
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
          "the others are still listed, then every HVD_* setting with its value here.\nExit "
          "status: 0 when every plugin loads, 1 when some failed to, 2 when a setting's\nvalue "
          "is one hvd_init would refuse (it is listed, marked).\n");
      return 0;
    }
    std::fprintf(stderr, "hvd-info: unknown argument '%s' (see --help)\n", argv[i]);
    return 2;
  }
  const EnvLookup env = process_env();
  std::vector<Settings::Problem> problems;  // listed with the settings: this tool explains
  const Settings settings = Settings::read_leniently(env, &problems);
  set_log_level(settings.text(Knob::kLogLevel));
  const std::chrono::milliseconds timeout = settings.timeout();
  const std::vector<fs::path> dirs = plugin_search_path(settings);
  std::printf("hvd %s, backend ABI %d.%d\n\nPlugin search path:\n", HVD_VERSION_STRING,
              HVD_BACKEND_ABI_MAJOR, HVD_BACKEND_ABI_MINOR);
  for (size_t i = 0; i < dirs.size(); ++i) {
    std::printf("  %zu. %s%s\n", i + 1, dirs[i].c_str(),
                fs::is_directory(dirs[i]) ? "" : "  (does not exist)");
  }
  std::vector<PluginSummary> plugins;
  std::vector<PluginFailure> failures;
  for (const fs::path& file : find_plugin_files(dirs)) {
    Result<PluginSummary> probed = probe_plugin(file, timeout, /*by_name=*/true);
    if (probed.ok()) {
      plugins.push_back(std::move(probed).value());
    } else {
      failures.push_back({file, probed.status()});
    }
  }
  std::printf("\nBackends (%zu):\n", plugins.size());
  // Columns as wide as their widest entry: names and versions are the plugins' to choose.
  int name_w = 4, version_w = 7, caps_w = 12;
  for (const PluginSummary& p : plugins) {
    name_w = std::max(name_w, static_cast<int>(p.name.size()));
    version_w = std::max(version_w, static_cast<int>(p.version.size()));
    caps_w = std::max(caps_w, static_cast<int>(p.capabilities.size()));
  }
  if (!plugins.empty()) {
    std::printf("  %-*s  %-*s  %-5s %-*s  %s\n", name_w, "NAME", version_w, "VERSION", "ABI",
                caps_w, "CAPABILITIES", "PATH");
  }
  for (const PluginSummary& p : plugins) {
    std::printf("  %-*s  %-*s  %-5s %-*s  %s\n", name_w, p.name.c_str(), version_w,
                p.version.c_str(), p.abi.c_str(), caps_w, p.capabilities.c_str(), p.path.c_str());
    if (!p.description.empty()) std::printf("  %-*s  %s\n", name_w, "", p.description.c_str());
    std::printf("  %-*s  dtypes: %s; reduce ops: %s; optional entries: %s\n", name_w, "",
                p.dtypes.c_str(), p.reduce_ops.c_str(), p.optional_entries.c_str());
  }
  if (!failures.empty()) {
    std::printf("\nFailed to load (%zu):\n", failures.size());
    for (const PluginFailure& f : failures) {
      std::printf("  %s\n    %s\n", f.path.c_str(), f.status.message().c_str());
    }
  }
  print_settings(settings, env, problems);
  const std::string name = settings.text(Knob::kBackend);
  bool listed = name.find('/') != std::string::npos;  // a path is loaded as given
  for (const PluginSummary& p : plugins) listed = listed || p.name == name;
  std::printf("\nBackend for this environment: %s%s%s\n", name.c_str(),
              settings.is_set(Knob::kBackend) ? "" : " (the default; set HVD_BACKEND to choose)",
              listed ? "" : ", which is not among the backends above");
  if (!problems.empty()) {
    for (const Settings::Problem& p : problems) {
      std::fprintf(stderr, "hvd-info: %s\n", p.why.message().c_str());
    }
    return 2;
  }
  return failures.empty() ? 0 : 1;
}
