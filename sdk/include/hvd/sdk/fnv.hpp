// fnv.hpp — FNV-1a: a 64-bit hash every rank computes alike from the same values (communicator
// ids, the per-rank counts of the calls ranks compare).
#ifndef HVD_SDK_FNV_HPP
#define HVD_SDK_FNV_HPP

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace hvd::sdk {

class Fnv1a {
 public:
  Fnv1a& add(std::string_view bytes) {
    for (const char c : bytes) mix(static_cast<unsigned char>(c));
    return *this;
  }
  // The value's eight bytes, least significant first: the same on every machine.
  Fnv1a& add(uint64_t value) {
    for (int byte = 0; byte < 8; ++byte) mix(static_cast<unsigned char>(value >> (8 * byte)));
    return *this;
  }
  uint64_t digest() const { return hash_; }

 private:
  void mix(unsigned char byte) { hash_ = (hash_ ^ byte) * 1099511628211ull; }
  uint64_t hash_ = 1469598103934665603ull;
};

}  // namespace hvd::sdk

#endif  // HVD_SDK_FNV_HPP
