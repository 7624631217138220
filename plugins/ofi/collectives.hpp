// collectives.hpp — the ofi plugin's collectives: hvd's algorithms (plugins/common/algorithms.hpp)
// over an Endpoint's tagged messages, each call begun and ended on the endpoint.
#ifndef HVD_OFI_COLLECTIVES_HPP
#define HVD_OFI_COLLECTIVES_HPP

#include <cstddef>
#include <exception>
#include <string>

#include "algorithms.hpp"
#include "endpoint.hpp"
#include "hvd/backend.h"

namespace hvd::ofi {

// Over a network: ofi_rxm's eager limit is set to the segment size (Endpoint::open), so every
// segment goes without a rendezvous, and a message that comes before its receive is held in a
// buffer of at most this size; 1 MiB did better than 4 MiB across namespace hosts
// (docs/performance.md).
inline constexpr size_t kNetworkSegmentBytes = size_t{1} << 20;
// Scratch slots times a segment must not overflow; far past any gain.
inline constexpr size_t kMaxSegmentsInFlight = 1024;

// The algorithms' knobs for `provider` (the name HVD_OFI_PROVIDER gives, "shm" on one host), then
// the environment's: HVD_OFI_RING_ALLREDUCE_BYTES, HVD_OFI_SCATTER_BROADCAST_BYTES,
// HVD_OFI_SEGMENT_BYTES, HVD_OFI_SEGMENTS_IN_FLIGHT (docs/performance.md gives the measurements
// behind the defaults).
Result<algorithms::Tuning> tuning_from_environment(const std::string& provider);

class Collectives {
 public:
  Collectives(Endpoint& endpoint, algorithms::Tuning tuning)
      : ep_(endpoint), algorithms_(endpoint, tuning) {}

  Status allreduce(const hvd_collective_args& args) {
    return call(HVD_COLLECTIVE_ALLREDUCE, &args, [&] { return algorithms_.allreduce(args); });
  }
  Status reduce_scatter(const hvd_collective_args& args) {
    return call(HVD_COLLECTIVE_REDUCE_SCATTER, &args,
                [&] { return algorithms_.reduce_scatter(args); });
  }
  Status allgather(const hvd_collective_args& args) {
    return call(HVD_COLLECTIVE_ALLGATHER, &args, [&] { return algorithms_.allgather(args); });
  }
  Status broadcast(const hvd_collective_args& args) {
    return call(HVD_COLLECTIVE_BROADCAST, &args, [&] { return algorithms_.broadcast(args); });
  }
  Status barrier() {
    return call(HVD_COLLECTIVE_BARRIER, nullptr, [&] { return algorithms_.barrier(); });
  }
  Status alltoall(const hvd_collective_args& args) {
    return call(HVD_COLLECTIVE_ALLTOALL, &args, [&] { return algorithms_.alltoall(args); });
  }

 private:
  // Runs `body` (a Status) as one call of the endpoint, whose ranks agree on `args` (a Shape):
  // begun, and ended however the body ends, an exception (no memory for a record or a buffer)
  // included, so that a failure always breaks the endpoint and cancels what the call had posted.
  template <typename Body>
  Status call(hvd_collective collective, const hvd_collective_args* args, Body&& body) {
    HVD_RETURN_IF_ERROR(ep_.begin(collective, args));
    Status status;
    try {
      status = body();
    } catch (const std::exception& e) {
      status = Status(HVD_ERR_SYSTEM,
                      std::string("ofi ") + hvd_collective_name(collective) + ": " + e.what());
    }
    return ep_.end(std::move(status));
  }

  Endpoint& ep_;
  algorithms::Algorithms<Endpoint> algorithms_;
};

}  // namespace hvd::ofi

#endif  // HVD_OFI_COLLECTIVES_HPP
