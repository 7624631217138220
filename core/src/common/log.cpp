#include "common/log.hpp"

#include <atomic>
#include <cstdio>

namespace hvd::core {
namespace {

std::atomic<int> g_rank{-1};

std::atomic<int> g_threshold{HVD_LOG_WARNING};

hvd_log_level threshold() { return static_cast<hvd_log_level>(g_threshold.load()); }

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

void set_log_level(const std::string& level) {
  hvd_log_level value = HVD_LOG_WARNING;
  if (level == "error" || level == "fatal") value = HVD_LOG_ERROR;
  if (level == "info") value = HVD_LOG_INFO;
  if (level == "debug" || level == "trace") value = HVD_LOG_DEBUG;
  g_threshold.store(value);
}

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
