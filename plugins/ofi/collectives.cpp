#include "collectives.hpp"

#include <cstdint>
#include <string>

#include "hvd/sdk/env.hpp"

namespace hvd::ofi {
namespace {

Result<size_t> size_from_env(const char* name, size_t fallback, size_t minimum,
                             size_t maximum = SIZE_MAX) {
  const std::string text = sdk::env_or(name, "");
  if (text.empty()) return fallback;
  const std::optional<uint64_t> value = sdk::parse_whole(text, maximum);
  if (!value || *value < minimum) {
    return Status(HVD_ERR_INVALID_ARGUMENT,
                  std::string("ofi: ") + name + "='" + text + "' is not a whole number from " +
                      std::to_string(minimum) + " to " + std::to_string(maximum));
  }
  return static_cast<size_t>(*value);
}

}  // namespace

Result<algorithms::Tuning> tuning_from_environment(const std::string& provider) {
  algorithms::Tuning t;
  if (provider != "shm") t.segment_bytes = kNetworkSegmentBytes;
  HVD_ASSIGN_OR_RETURN(t.ring_allreduce_bytes,
                       size_from_env("HVD_OFI_RING_ALLREDUCE_BYTES", t.ring_allreduce_bytes, 0));
  HVD_ASSIGN_OR_RETURN(t.scatter_broadcast_bytes, size_from_env("HVD_OFI_SCATTER_BROADCAST_BYTES",
                                                                t.scatter_broadcast_bytes, 0));
  HVD_ASSIGN_OR_RETURN(t.segment_bytes,
                       size_from_env("HVD_OFI_SEGMENT_BYTES", t.segment_bytes, 4096));
  HVD_ASSIGN_OR_RETURN(
      t.segments_in_flight,
      size_from_env("HVD_OFI_SEGMENTS_IN_FLIGHT", t.segments_in_flight, 1, kMaxSegmentsInFlight));
  return t;
}

}  // namespace hvd::ofi
