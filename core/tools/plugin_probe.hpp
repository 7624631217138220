// plugin_probe.hpp — load a plugin file in a child process and report what it found.
//
// The child loads the plugin (RTLD_NOW, as libhvd does), writes what it found back over a pipe
// and ends. A plugin whose entry function crashes or never returns then costs its own report
// ("crashed (SIGSEGV) while loading"), not the process that asked. Forking and then loading a
// library in the child is safe only in a process with a single thread when it forks: hvd-info
// and hvd-plugin-check, never libhvd (see resolve_backend in plugin_loader.hpp).
#ifndef HVD_CORE_TOOLS_PLUGIN_PROBE_HPP
#define HVD_CORE_TOOLS_PLUGIN_PROBE_HPP

#include <chrono>
#include <string>

#include "loader/plugin_loader.hpp"

namespace hvd::core {

// What a child reports of one plugin file.
struct PluginSummary {
  std::string name, version, description, abi, capabilities, dtypes, reduce_ops, optional_entries;
  std::string path;
  std::string struct_size;  // the table's struct_size, in bytes
};

// Load `file` in a child process, within `timeout`: its summary, or why it failed (HVD_ERR_PLUGIN
// naming the file: the loader's reason, a crash with its signal, a hang, an unexplained exit).
// `by_name`: the file was found by the naming rule, so its table must say the name of its file.
Result<PluginSummary> probe_plugin(const fs::path& file, std::chrono::milliseconds timeout,
                                   bool by_name);

}  // namespace hvd::core

#endif  // HVD_CORE_TOOLS_PLUGIN_PROBE_HPP
