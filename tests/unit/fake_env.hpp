// An EnvLookup over a fixed map, so tests never depend on the real environment.
#ifndef HVD_TESTS_FAKE_ENV_HPP
#define HVD_TESTS_FAKE_ENV_HPP

#include <map>
#include <string>

#include "bootstrap/env.hpp"

namespace hvd::core {

inline EnvLookup fake_env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace hvd::core

#endif  // HVD_TESTS_FAKE_ENV_HPP
