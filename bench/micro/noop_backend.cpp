// noop: a backend whose collectives return at once, so a call's cost is the plugin host's alone.
// Built beside the micro benchmarks, never installed (--backend all must not find it).
#include <memory>

#include "hvd/sdk/backend.hpp"

class NoopBackend {
 public:
  static hvd::Result<std::unique_ptr<NoopBackend>> create(const hvd::sdk::InitContext&) {
    return std::make_unique<NoopBackend>();
  }
  hvd::Status allreduce(const hvd_collective_args&) { return hvd::Status::success(); }
  hvd::Status allgather(const hvd_collective_args&) { return hvd::Status::success(); }
  hvd::Status broadcast(const hvd_collective_args&) { return hvd::Status::success(); }
  hvd::Status barrier() { return hvd::Status::success(); }
};

HVD_BACKEND_PLUGIN(NoopBackend, "noop", "1.0.0", "returns at once (micro benchmarks)",
                   HVD_CAP_HOST_MEMORY)
