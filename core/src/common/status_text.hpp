// status_text.hpp — two small things every part of the core says the same way: a status code
// that came from elsewhere (a plugin, a peer, the wire), and a number of seconds.
#ifndef HVD_CORE_COMMON_STATUS_TEXT_HPP
#define HVD_CORE_COMMON_STATUS_TEXT_HPP

#include <chrono>
#include <cstdio>
#include <string>

#include "hvd/types.h"

namespace hvd::core {

// `code` if it is one of hvd's error codes, else `otherwise` (a later version's code, or garbage).
inline hvd_status known_error(int code, hvd_status otherwise) {
  return code > HVD_SUCCESS && code <= HVD_ERR_IN_PROGRESS ? static_cast<hvd_status>(code)
                                                           : otherwise;
}

// "0.5", "60": seconds as people write them.
inline std::string seconds_number(std::chrono::duration<double> d) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", d.count());
  return text;
}
// "2 s"
inline std::string seconds_text(std::chrono::duration<double> d) {
  return seconds_number(d) + " s";
}

}  // namespace hvd::core

#endif  // HVD_CORE_COMMON_STATUS_TEXT_HPP
