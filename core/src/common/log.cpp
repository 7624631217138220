#include "common/log.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace hvd::core {
namespace {

std::atomic<int> g_rank{-1};

hvd_log_level threshold() {
  static const hvd_log_level level = [] {
    const char* text = std::getenv("HVD_LOG_LEVEL");
    if (text == nullptr) return HVD_LOG_WARNING;
    if (std::strcmp(text, "error") == 0) return HVD_LOG_ERROR;
    if (std::strcmp(text, "info") == 0) return HVD_LOG_INFO;
    if (std::strcmp(text, "debug") == 0 || std::strcmp(text, "trace") == 0) return HVD_LOG_DEBUG;
    return HVD_LOG_WARNING;
  }();
  return level;
}

const char* level_name(hvd_log_level level) {
  switch (level) {
    case HVD_LOG_ERROR:
      return "error";
    case HVD_LOG_WARNING:
      return "warning";
    case HVD_LOG_INFO:
      return "info";
    default:
      return "debug";
  }
}

}  // namespace

void set_log_rank(int rank) { g_rank.store(rank); }

bool log_enabled(hvd_log_level level) { return level <= threshold(); }

void log(hvd_log_level level, const std::string& message) {
  if (!log_enabled(level)) return;
  const int rank = g_rank.load();
  // One fprintf per line so that lines from several threads do not interleave.
  if (rank >= 0) {
    std::fprintf(stderr, "[hvd rank %d] %s: %s\n", rank, level_name(level), message.c_str());
  } else {
    std::fprintf(stderr, "[hvd] %s: %s\n", level_name(level), message.c_str());
  }
}

}  // namespace hvd::core
