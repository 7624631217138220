#include "comm/agreement.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "common/status_text.hpp"

namespace hvd::core {
namespace {

std::string join_ranks(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

}  // namespace

std::string describe_backend_choice(const Result<Plugin>& loaded) {
  if (!loaded.ok()) {
    return "error\n" + std::to_string(loaded.status().code()) + "\n" + loaded.status().message();
  }
  // Everything a rank decides by before calling the plugin: ranks that differ in any of it would
  // refuse, stage or route one call differently, and hang where they should fail alike.
  const Plugin& p = *loaded;
  return "ok\n" + p.name + " " + p.version + " (ABI " + std::to_string(p.abi_major) + "." +
         std::to_string(p.abi_minor) + ") [" + capabilities_to_string(p.capabilities) +
         "; dtypes " + dtypes_to_string(p.dtypes) + "; reduce ops " +
         reduce_ops_to_string(p.reduce_ops) + "; optional entries " +
         optional_entries_to_string(p) + "]";
}

Status check_backend_agreement(const std::vector<std::string>& choices) {
  std::vector<int> failed;
  std::map<std::string, std::vector<int>> groups;  // "gloo 0.1.0 (ABI 1.0)" -> ranks
  std::vector<std::string> order;                  // group names by first rank
  for (int r = 0; r < static_cast<int>(choices.size()); ++r) {
    const std::string& choice = choices[static_cast<size_t>(r)];
    if (choice.rfind("ok\n", 0) == 0) {
      const std::string what = choice.substr(3);
      if (groups[what].empty()) order.push_back(what);
      groups[what].push_back(r);
    } else {
      failed.push_back(r);
    }
  }
  if (!failed.empty()) {
    // Report the lowest failing rank's own words: identical on every rank.
    std::istringstream first(choices[static_cast<size_t>(failed.front())]);
    std::string tag, code, message;
    std::getline(first, tag);
    std::getline(first, code);
    std::getline(first, message, '\0');
    return error(known_error(std::atoi(code.c_str()), HVD_ERR_PLUGIN),
                 "no backend on " + join_ranks(failed) + ": " + message);
  }
  if (order.size() > 1) {
    std::string message = "ranks chose different backends: ";
    for (size_t i = 0; i < order.size(); ++i) {
      const auto& ranks = groups[order[i]];
      message +=
          (i ? "; " : "") + join_ranks(ranks) + (ranks.size() == 1 ? " uses " : " use ") + order[i];
    }
    message +=
        ". Every rank must load the same backend, plugin version and ABI version "
        "(set the same HVD_BACKEND and HVD_PLUGIN_PATH on every rank).";
    return error(HVD_ERR_MISMATCH, message);
  }
  return Status::success();
}

std::string format_init_record(std::string host, const World& world, const std::string& choice) {
  host = host.substr(0, 255);
  std::replace(host.begin(), host.end(), '\n', ' ');
  return host + "\n" + std::to_string(world.local_rank) + " " + std::to_string(world.local_size) +
         "\n" + choice;
}

InitRecord parse_init_record(const std::string& record) {
  // "<host>\n<local rank> <local size>\n<choice>"
  InitRecord out;
  const size_t first = record.find('\n');
  const size_t second = first == std::string::npos ? first : record.find('\n', first + 1);
  out.host = record.substr(0, first);
  if (second != std::string::npos) {
    const std::string place = record.substr(first + 1, second - first - 1);
    int rank = 0, size = 1;
    if (std::sscanf(place.c_str(), "%d %d", &rank, &size) == 2) out.said = LocalPlace{rank, size};
    out.choice = record.substr(second + 1);
  }
  return out;
}

}  // namespace hvd::core
