// libFuzzer target: the scheduler's gather of tensor requests (scheduler/negotiation.hpp), the
// bytes every rank receives from every other rank each cycle a cache misses.
//
// Checked beyond "no crash": a count the bytes cannot hold allocates nothing for it (the
// allocation stays within a small multiple of the input, seen by ASan's allocator limits); what
// deserializes serializes to bytes that deserialize to the same bytes again.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "scheduler/negotiation.hpp"

namespace {

// An invariant that failed is a finding: say which, then crash for libFuzzer to keep the input.
#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto requests = hvd::core::deserialize(reinterpret_cast<const char*>(data), size);
  if (!requests.ok()) return 0;
  const std::vector<char> bytes = hvd::core::serialize(*requests);
  auto again = hvd::core::deserialize(bytes.data(), bytes.size());
  CHECK(again.ok());
  CHECK(again->size() == requests->size());
  CHECK(hvd::core::serialize(*again) == bytes);
  return 0;
}
