// noop: a backend of one rank whose collectives do the least that one rank's must (copy the input
// to the output when they differ), so a call's cost is the plugin host's alone. Built beside the
// micro benchmarks, never installed (--backend all must not find it).
#include <cstring>
#include <memory>

#include "hvd/sdk/backend.hpp"

namespace {

hvd::Status copy(const hvd_collective_args& a) {
  if (a.sendbuf != a.recvbuf && a.count > 0) {
    std::memcpy(a.recvbuf, a.sendbuf, a.count * hvd_dtype_size(a.dtype));
  }
  return hvd::Status::success();
}

}  // namespace

class NoopBackend {
 public:
  static hvd::Result<std::unique_ptr<NoopBackend>> create(const hvd::sdk::InitContext& context) {
    if (context.size != 1) return hvd::Status(HVD_ERR_INVALID_ARGUMENT, "noop runs one rank");
    return std::make_unique<NoopBackend>();
  }
  hvd::Status allreduce(const hvd_collective_args& a) { return copy(a); }
  hvd::Status allgather(const hvd_collective_args& a) { return copy(a); }
  hvd::Status broadcast(const hvd_collective_args& a) { return copy(a); }
  hvd::Status barrier() { return hvd::Status::success(); }
  // Nothing to stop: with an abort, the host calls the plugin directly, as it calls every real
  // backend, rather than through the thread it keeps for plugins that cannot be stopped.
  hvd::Status abort() { return hvd::Status::success(); }
};

HVD_BACKEND_PLUGIN(NoopBackend, "noop", "1.0.0", "one rank, copies only (micro benchmarks)",
                   HVD_CAP_HOST_MEMORY)
