// plugin_loader.hpp — finding and loading backend plugins (Boost.DLL).
//
// Naming rule: backend <name> is the file libhvd-backend-<name>.so, whose table says <name>
// (a plugin given by path may call itself anything). Search path: each directory
// of HVD_PLUGIN_PATH (colon-separated), then the install location relative to libhvd
// (<libdir>/hvd). A loaded library is never unloaded: it stays in a process-lifetime registry,
// so no table or function pointer taken from it can dangle.
#ifndef HVD_CORE_LOADER_PLUGIN_LOADER_HPP
#define HVD_CORE_LOADER_PLUGIN_LOADER_HPP

#include <filesystem>
#include <string>
#include <vector>

#include "bootstrap/settings.hpp"
#include "hvd/backend.h"
#include "hvd/sdk/result.hpp"

namespace hvd::core {

namespace fs = std::filesystem;

// Every dtype and reduce op this hvd knows: a plugin is never passed any other.
constexpr uint64_t kKnownDtypes = HVD_DTYPE_BIT(HVD_DTYPE_COUNT) - 1;
constexpr uint64_t kKnownReduceOps = HVD_REDUCE_OP_BIT(HVD_REDUCE_OP_COUNT) - 1;

// A loaded plugin's table, read by the rules of its ABI minor: a field its table predates holds
// its default, so nothing else in hvd reads the table's 1.1 fields directly.
struct Plugin {
  std::string name;
  std::string version;
  std::string description;
  uint32_t abi_major = 0;
  uint32_t abi_minor = 0;
  uint64_t capabilities = 0;
  uint64_t dtypes = HVD_DTYPES_1_0;  // what it declared, within what this hvd knows
  uint64_t reduce_ops = HVD_REDUCE_OPS_1_0;
  fs::path path;
  const hvd_backend_v1* table = nullptr;  // for the 1.0 entries
  // The optional 1.1 entries: null where the plugin has none or its table predates them.
  decltype(hvd_backend_v1::split) split = nullptr;
  decltype(hvd_backend_v1::abort) abort = nullptr;
  decltype(hvd_backend_v1::alltoall) alltoall = nullptr;

  bool takes(hvd_dtype dtype) const {
    return dtype >= 0 && dtype < HVD_DTYPE_COUNT && (dtypes & HVD_DTYPE_BIT(dtype)) != 0;
  }
  bool takes(hvd_reduce_op op) const {
    return op >= 0 && op < HVD_REDUCE_OP_COUNT && (reduce_ops & HVD_REDUCE_OP_BIT(op)) != 0;
  }
  // The dtype hvd moves its own bytes in (control records, whose sizes are multiples of 8): the
  // narrowest integer the plugin takes, else the narrowest float (data movement is bit-exact).
  hvd_dtype byte_dtype() const;
  // An op the plugin takes: what a call that reduces nothing carries.
  hvd_reduce_op any_reduce_op() const;
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
std::vector<fs::path> plugin_search_path(const Settings& settings);

// What a shared library's dynamic section and symbol table (.dynamic, .dynsym: what the dynamic
// loader reads; they survive strip) say. Errors: HVD_ERR_PLUGIN when the file is not a readable
// 64-bit ELF file.
struct DynamicSymbols {
  std::vector<std::string> exported;  // defined; global or weak; default or protected visibility
  std::vector<std::string> imported;  // undefined, not weak: what its libraries must define
  std::vector<std::string> needed;    // DT_NEEDED: the libraries it names
  std::vector<std::string> copied;    // copy relocations: libraries' data an executable copies
};
Result<DynamicSymbols> dynamic_symbols(const fs::path& file);
Result<std::vector<std::string>> exported_symbols(const fs::path& file);  // dynamic_symbols's

// How load_plugin loads `file`: RTLD_NOW | RTLD_LOCAL, plus RTLD_DEEPBIND (the plugin and the
// libraries it brings bind among themselves first) where a C++ symbol it imports is already
// defined in a library it does not need (`clash`: PyTorch's wheels export a Gloo of their own),
// unless the executable has copied data of a library the plugin needs (`unsafe`: the plugin would
// bind to the never-initialized original), or a sanitizer runtime is loaded (it refuses
// RTLD_DEEPBIND).
struct PluginLoadMode {
  std::string clash;   // the first clashing symbol and where it is defined; empty: none
  std::string unsafe;  // the copied data that rules RTLD_DEEPBIND out; empty: none
  bool deep_bind() const { return !clash.empty() && unsafe.empty(); }
};
PluginLoadMode plugin_load_mode(const fs::path& file);

// "libhvd-backend-gloo.so" for "gloo".
std::string plugin_file_name(const std::string& backend);

// Validate a table and read it by its struct_size (`file` names it in errors). Errors:
// HVD_ERR_PLUGIN with the reason (ABI major mismatch naming both versions, malformed table).
Result<Plugin> plugin_from_table(const fs::path& file, const hvd_backend_v1* table);

// Load one file and validate its table. Errors: HVD_ERR_PLUGIN with the reason (not loadable,
// no entry symbol, ABI major mismatch naming both versions, malformed table).
Result<Plugin> load_plugin(const fs::path& file);

// load_plugin for a file found by the naming rule: its table must say the name of its file
// (libhvd-backend-gloo.so says "gloo"), else HVD_ERR_PLUGIN saying both. A plugin given by path
// (load_plugin) may call itself anything.
Result<Plugin> load_plugin_by_name(const fs::path& file);

// Every libhvd-backend-*.so in `dirs`, in search order and by name within a directory; a file
// name already found in an earlier directory is shadowed and left out. Nothing is loaded.
std::vector<fs::path> find_plugin_files(const std::vector<fs::path>& dirs);

// "gloo" for ".../libhvd-backend-gloo.so": the backend a plugin file provides, by the naming rule.
std::string backend_name_of(const fs::path& file);

// Every plugin find_plugin_files finds, loaded in this process, or with the reason it failed. A
// plugin that crashes while loading takes this process with it: hvd-info loads each in a child
// process instead (core/tools/hvd_info.cpp).
PluginScan scan_plugins(const std::vector<fs::path>& dirs);

// `spec` is a backend name (looked up in `dirs`) or a path containing '/'. An unknown name is
// HVD_ERR_NOT_FOUND with the backends whose files exist and the directories searched. Those
// backends are named by their files, not loaded: loading them to list them would run every
// plugin's code in the application, where one that crashes would take the application down with
// it, and probing them in a child instead (fork, then dlopen in the child) is not safe in a
// multithreaded application. The message points to hvd-info, which says which of them work.
Result<Plugin> resolve_backend(const std::string& spec, const std::vector<fs::path>& dirs);

// "host,cuda,allgatherv" for hvd-info and messages.
std::string capabilities_to_string(uint64_t capabilities);
// "int32,float32" and "sum,min": the named members of a dtype or reduce-op set ("all" for every
// one this hvd knows, "none" for none).
std::string dtypes_to_string(uint64_t dtypes);
std::string reduce_ops_to_string(uint64_t reduce_ops);
// "split,abort,alltoall": the optional 1.1 entries a plugin has ("none").
std::string optional_entries_to_string(const Plugin& plugin);

}  // namespace hvd::core

#endif  // HVD_CORE_LOADER_PLUGIN_LOADER_HPP
