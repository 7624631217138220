// env.hpp — reading settings from the environment the same way in the core and in plugins: a
// variable's value or a fallback, and whole numbers written as digits alone.
#ifndef HVD_SDK_ENV_HPP
#define HVD_SDK_ENV_HPP

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

namespace hvd::sdk {

// Read an environment variable, or `fallback` when it is unset or empty.
inline std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return (value != nullptr && *value != '\0') ? std::string(value) : fallback;
}

// `text` as a whole decimal number of at most `maximum`: digits alone (no sign, space or base
// prefix), nullopt otherwise, and where it is too large for 64 bits.
inline std::optional<uint64_t> parse_whole(std::string_view text, uint64_t maximum = UINT64_MAX) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  const std::from_chars_result read = std::from_chars(text.data(), end, value);
  if (text.empty() || read.ec != std::errc() || read.ptr != end || value > maximum) {
    return std::nullopt;
  }
  return value;
}

}  // namespace hvd::sdk

#endif  // HVD_SDK_ENV_HPP
