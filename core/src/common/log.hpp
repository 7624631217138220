// log.hpp — hvd's one logger: "[hvd rank R] level: message" on stderr, filtered by HVD_LOG_LEVEL
// (error, warning [default], info, debug), which hvd_init sets.
#ifndef HVD_CORE_COMMON_LOG_HPP
#define HVD_CORE_COMMON_LOG_HPP

#include <string>

#include "hvd/types.h"

namespace hvd::core {

void set_log_rank(int rank);
// "error", "warning", "info", "debug"; Horovod's "trace" is debug and "fatal" error.
void set_log_level(const std::string& level);
bool log_enabled(hvd_log_level level);
void log(hvd_log_level level, const std::string& message);

}  // namespace hvd::core

#endif  // HVD_CORE_COMMON_LOG_HPP
