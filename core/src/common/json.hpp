// json.hpp — a string as a JSON string literal: what hvd's hand-written JSON (the timeline,
// hvd-bench's results) needs, and no more.
#ifndef HVD_CORE_COMMON_JSON_HPP
#define HVD_CORE_COMMON_JSON_HPP

#include <cstdio>
#include <string>

namespace hvd::core {

inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace hvd::core

#endif  // HVD_CORE_COMMON_JSON_HPP
