// plugin_loader.hpp — finding and loading backend plugins (Boost.DLL).
//
// Naming rule: backend <name> is the file libhvd-backend-<name>.so. Search path: each directory
// of HVD_PLUGIN_PATH (colon-separated), then the install location relative to libhvd
// (<libdir>/hvd). A loaded library is never unloaded: it stays in a process-lifetime registry,
// so no table or function pointer taken from it can dangle.
#ifndef HVD_CORE_LOADER_PLUGIN_LOADER_HPP
#define HVD_CORE_LOADER_PLUGIN_LOADER_HPP

#include <filesystem>
#include <string>
#include <vector>

#include "bootstrap/env.hpp"
#include "hvd/backend.h"
#include "hvd/sdk/result.hpp"

namespace hvd::core {

namespace fs = std::filesystem;

struct Plugin {
  std::string name;
  std::string version;
  std::string description;
  uint32_t abi_major = 0;
  uint32_t abi_minor = 0;
  uint64_t capabilities = 0;
  fs::path path;
  const hvd_backend_v1* table = nullptr;
};

struct PluginFailure {
  fs::path path;
  Status status;
};

struct PluginScan {
  std::vector<Plugin> plugins;
  std::vector<PluginFailure> failures;
};

// The directories searched for plugins, in order.
std::vector<fs::path> plugin_search_path(const EnvLookup& env);

// "libhvd-backend-gloo.so" for "gloo".
std::string plugin_file_name(const std::string& backend);

// Load one file and validate its table. Errors: HVD_ERR_PLUGIN with the reason (not loadable,
// no entry symbol, ABI major mismatch naming both versions, malformed table).
Result<Plugin> load_plugin(const fs::path& file);

// Every libhvd-backend-*.so in `dirs` (first occurrence of a name wins), loaded or with the
// reason it failed.
PluginScan scan_plugins(const std::vector<fs::path>& dirs);

// `spec` is a backend name (looked up in `dirs`) or a path containing '/'. An unknown name is
// HVD_ERR_NOT_FOUND with the backends that exist and the directories searched.
Result<Plugin> resolve_backend(const std::string& spec, const std::vector<fs::path>& dirs);

// "host,cuda,allgatherv" for hvd-info and messages.
std::string capabilities_to_string(uint64_t capabilities);

}  // namespace hvd::core

#endif  // HVD_CORE_LOADER_PLUGIN_LOADER_HPP
