// call_shape.hpp — what every rank of one collective call must pass alike, as a fixed record that
// ranks exchange and compare byte for byte, and its text for the error that names two of them.
// The host's HVD_CHECK_ARGS sends it, and so do plugins that compare their ranks' calls before
// running them (gloo before its event loop, ofi before a message could meet a shorter receive).
#ifndef HVD_SDK_CALL_SHAPE_HPP
#define HVD_SDK_CALL_SHAPE_HPP

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "hvd/backend.h"
#include "hvd/sdk/fnv.hpp"
#include "hvd/types.h"

namespace hvd::sdk {

struct CallShape {
  static constexpr uint64_t kMagic = 0x326c6c6163647668;  // "hvdcall2": a call's record

  uint64_t magic = kMagic;
  int32_t collective = HVD_COLLECTIVE_BARRIER;  // hvd_collective
  int32_t dtype = 0;
  // Elements of this rank: what every rank passes alike (an allgather's input, a reduce-scatter's
  // result). 0 where the ranks' counts differ: an allgather with recv_counts, an alltoall.
  uint64_t count = 0;
  int32_t op = 0;      // allreduce, reduce_scatter; 0 for the others
  int32_t root = 0;    // broadcast; 0 for the others
  int32_t memory = 0;  // hvd_memory_type
  int32_t reserved = 0;
  uint64_t counts_digest = 0;  // an allgather's recv_counts (FNV-1a, never 0); 0 without them

  // The shape of a call on a communicator of `size` ranks; `args` NULL for a barrier. Only the
  // fields the collective reads are taken, so ranks differ where their calls do.
  static CallShape of(hvd_collective collective, const hvd_collective_args* args, int size) {
    CallShape s;
    s.collective = collective;
    if (args == nullptr) return s;
    s.dtype = args->dtype;
    s.memory = args->memory_type;
    s.count = args->count;
    if (hvd_collective_reduces(collective)) s.op = args->op;
    switch (collective) {
      case HVD_COLLECTIVE_BROADCAST:
        s.root = args->root;
        break;
      case HVD_COLLECTIVE_ALLGATHER:
        if (args->recv_counts != nullptr) {
          Fnv1a fnv;
          for (int r = 0; r < size; ++r) fnv.add(args->recv_counts[r]);
          s.counts_digest = fnv.digest() == 0 ? 1 : fnv.digest();
          s.count = 0;
        }
        break;
      case HVD_COLLECTIVE_ALLTOALL:  // each rank's counts are its own
        s.count = 0;
        break;
      default:
        break;
    }
    return s;
  }

  // A record as it came over the wire: a peer's bytes, whatever they are.
  static CallShape from_bytes(const void* bytes) {
    CallShape s;
    std::memcpy(static_cast<void*>(&s), bytes, sizeof s);
    return s;
  }

  bool operator==(const CallShape& other) const {
    return std::memcmp(this, &other, sizeof other) == 0;
  }
  bool operator!=(const CallShape& other) const { return !(*this == other); }

  // "allreduce of 7 float32 (sum)", "broadcast of 3 int32 from root 1", "allgather of float32
  // with recv_counts #00ab...", "barrier". Any bytes (a peer's) make a text.
  std::string describe() const {
    if (magic != kMagic) return "another kind of message";
    if (collective == HVD_COLLECTIVE_BARRIER) return "barrier";
    std::string text = std::string(hvd_collective_name(collective)) + " of ";
    if (collective != HVD_COLLECTIVE_ALLTOALL && counts_digest == 0) {
      text += std::to_string(count) + " ";
    }
    text += hvd_dtype_name(dtype);
    if (hvd_collective_reduces(collective))
      text += std::string(" (") + hvd_reduce_op_name(op) + ")";
    if (collective == HVD_COLLECTIVE_BROADCAST) text += " from root " + std::to_string(root);
    if (counts_digest != 0) {
      char digest[40];
      std::snprintf(digest, sizeof digest, " with recv_counts #%016llx",
                    static_cast<unsigned long long>(counts_digest));
      text += digest;
    }
    if (memory == HVD_MEMORY_CUDA) text += " in CUDA memory";
    return text;
  }
};
static_assert(sizeof(CallShape) == 48, "a fixed record, alike on every rank");

}  // namespace hvd::sdk

#endif  // HVD_SDK_CALL_SHAPE_HPP
