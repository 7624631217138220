// collectives.hpp — hvd's collective algorithms over an ofi Endpoint's tagged messages.
//
//   allreduce       recursive doubling below `ring_allreduce_bytes` (every rank gets the same
//                   bits: each pair combines in rank order, and the ranks past the largest power
//                   of two fold into a partner first); at and above it a ring reduce-scatter then
//                   a ring allgather, in segments, pipelined (see RingPass in collectives.cpp)
//   reduce_scatter  the ring's reduce-scatter alone
//   allgather(v)    the ring's allgather alone, received in place
//   broadcast       a binomial tree below `scatter_broadcast_bytes` or at 2 ranks; at and above
//                   it, the root scatters blocks and the ranks allgather them on the ring
//   barrier         dissemination: ceil(log2 n) rounds of empty messages
//   alltoall        every pair at once: all receives posted, then all sends
//
// Reductions are the SDK's hvd_reduce; AVERAGE sums, and the one rank that completes a block
// divides it before it travels on, so every rank has the same bits.
#ifndef HVD_OFI_COLLECTIVES_HPP
#define HVD_OFI_COLLECTIVES_HPP

#include <cstddef>
#include <exception>
#include <string>
#include <vector>

#include "endpoint.hpp"
#include "hvd/backend.h"

namespace hvd::ofi {

// The algorithms' knobs, from the environment (docs/performance.md gives the measurements
// behind the defaults).
struct Tuning {
  // Over a network: ofi_rxm's eager limit is set to it (Endpoint::open), so every segment goes
  // without a rendezvous, and a message that comes before its receive is held in a buffer of at
  // most this size; 1 MiB did better than 4 MiB across namespace hosts (docs/performance.md).
  static constexpr size_t kNetworkSegmentBytes = size_t{1} << 20;
  // Scratch slots times a segment must not overflow; far past any gain.
  static constexpr size_t kMaxSegmentsInFlight = 1024;

  size_t ring_allreduce_bytes = 64 << 10;    // HVD_OFI_RING_ALLREDUCE_BYTES
  size_t scatter_broadcast_bytes = 1 << 20;  // HVD_OFI_SCATTER_BROADCAST_BYTES
  size_t segment_bytes = 256 << 10;          // HVD_OFI_SEGMENT_BYTES: the ring's messages (shm)
  size_t segments_in_flight = 4;             // HVD_OFI_SEGMENTS_IN_FLIGHT: reduce-scatter buffers
  size_t sends_in_flight = 64;

  // The defaults for `provider` (the name HVD_OFI_PROVIDER gives, "shm" on one host), then the
  // environment's knobs.
  static Result<Tuning> from_environment(const std::string& provider);
};

class Collectives {
 public:
  Collectives(Endpoint& endpoint, Tuning tuning) : ep_(endpoint), tuning_(tuning) {}

  Status allreduce(const hvd_collective_args& args);
  Status reduce_scatter(const hvd_collective_args& args);
  Status allgather(const hvd_collective_args& args);
  Status broadcast(const hvd_collective_args& args);
  Status barrier();
  Status alltoall(const hvd_collective_args& args);

 private:
  Status allreduce_recursive_doubling(const hvd_collective_args& args);
  Status broadcast_tree(const hvd_collective_args& args);
  Status broadcast_scatter_allgather(const hvd_collective_args& args);
  // A scratch buffer of at least `bytes`, kept across calls.
  char* scratch(size_t bytes);
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
  Tuning tuning_;
  std::vector<char> scratch_;
};

}  // namespace hvd::ofi

#endif  // HVD_OFI_COLLECTIVES_HPP
