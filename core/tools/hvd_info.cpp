// hvd-info: every backend plugin hvd can find, and why the ones it cannot use failed.
#include <cstdio>
#include <cstring>
#include <string>

#include "hvd/backend.h"
#include "loader/plugin_loader.hpp"

using namespace hvd::core;

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) {
      std::printf(
          "usage: hvd-info\n\nLists the backend plugins found in the plugin search path "
          "(HVD_PLUGIN_PATH, then the\ninstall location) with their versions and "
          "capabilities, and the files that failed to load.\n");
      return 0;
    }
    std::fprintf(stderr, "hvd-info: unknown argument '%s' (see --help)\n", argv[i]);
    return 2;
  }
  const EnvLookup env = process_env();
  const std::vector<fs::path> dirs = plugin_search_path(env);
  std::printf("hvd %s, backend ABI %d.%d\n\nPlugin search path:\n", HVD_VERSION_STRING,
              HVD_BACKEND_ABI_MAJOR, HVD_BACKEND_ABI_MINOR);
  for (size_t i = 0; i < dirs.size(); ++i) {
    std::printf("  %zu. %s%s\n", i + 1, dirs[i].c_str(),
                fs::is_directory(dirs[i]) ? "" : "  (does not exist)");
  }
  const PluginScan scan = scan_plugins(dirs);
  std::printf("\nBackends (%zu):\n", scan.plugins.size());
  if (!scan.plugins.empty()) {
    std::printf("  %-10s %-28s %-5s %-34s %s\n", "NAME", "VERSION", "ABI", "CAPABILITIES", "PATH");
  }
  for (const Plugin& p : scan.plugins) {
    const std::string abi = std::to_string(p.abi_major) + "." + std::to_string(p.abi_minor);
    std::printf("  %-10s %-28s %-5s %-34s %s\n", p.name.c_str(), p.version.c_str(), abi.c_str(),
                capabilities_to_string(p.capabilities).c_str(), p.path.c_str());
    if (!p.description.empty()) std::printf("  %-10s %s\n", "", p.description.c_str());
    std::printf("  %-10s dtypes: %s; reduce ops: %s; optional entries: %s\n", "",
                dtypes_to_string(p.dtypes).c_str(), reduce_ops_to_string(p.reduce_ops).c_str(),
                optional_entries_to_string(p).c_str());
  }
  if (!scan.failures.empty()) {
    std::printf("\nFailed to load (%zu):\n", scan.failures.size());
    for (const PluginFailure& f : scan.failures) {
      std::printf("  %s\n    %s\n", f.path.c_str(), f.status.message().c_str());
    }
  }
  const auto chosen = knob(env, "BACKEND");
  std::printf("\nBackend for this environment: %s\n",
              chosen ? chosen->c_str() : "gloo (the default; set HVD_BACKEND to choose)");
  return 0;
}
