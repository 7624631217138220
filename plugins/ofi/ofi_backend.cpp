// The libfabric backend: hvd's own collective algorithms (plugins/common/algorithms.hpp) over a
// libfabric provider's reliable tagged messages (endpoint.hpp).
//
// The provider is HVD_OFI_PROVIDER, or by default shm when every rank of the communicator is on
// this host (hvd's one host identity), else tcp;ofi_rxm. Any RDM provider with tagged messages
// works (verbs;ofi_rxm, efa, ...), untested here. A communicator made by split is made by init
// over its members: an endpoint of its own.
//
// Failures are errors within HVD_TIMEOUT, naming the peer (endpoint.hpp says how).
#include <rdma/fabric.h>

#include <memory>
#include <string>

#include "collectives.hpp"
#include "endpoint.hpp"
#include "hvd/sdk/backend.hpp"

namespace {

using hvd::Result;
using hvd::Status;
using hvd::ofi::Collectives;
using hvd::ofi::Endpoint;

std::string provider_for(const hvd::sdk::InitContext& ctx) {
  const bool one_host = ctx.member_local_size == ctx.size;
  return hvd::sdk::env_or("HVD_OFI_PROVIDER", one_host ? "shm" : "tcp;ofi_rxm");
}

class OfiBackend {
 public:
  static Result<std::unique_ptr<OfiBackend>> create(const hvd::sdk::InitContext& ctx) {
    const std::string provider = provider_for(ctx);
    // A knob this rank cannot take still lets the endpoint meet the others (Endpoint::open).
    const Result<hvd::algorithms::Tuning> tuned = hvd::ofi::tuning_from_environment(provider);
    const hvd::algorithms::Tuning tuning = tuned.ok() ? *tuned : hvd::algorithms::Tuning{};
    HVD_ASSIGN_OR_RETURN(
        std::unique_ptr<Endpoint> ep,
        Endpoint::open(ctx, provider, tuning.segment_bytes,
                       {{"HVD_OFI_RING_ALLREDUCE_BYTES", tuning.ring_allreduce_bytes},
                        {"HVD_OFI_SCATTER_BROADCAST_BYTES", tuning.scatter_broadcast_bytes},
                        {"HVD_OFI_SEGMENT_BYTES", tuning.segment_bytes}},
                       tuned.status()));
    if (ctx.rank == 0) {
      ctx.host.log(HVD_LOG_INFO, "ofi: provider " + ep->description() + ", " +
                                     std::to_string(ctx.size) + " ranks, ring segments of " +
                                     std::to_string(tuning.segment_bytes) + " B");
    }
    return std::unique_ptr<OfiBackend>(new OfiBackend(std::move(ep), tuning));
  }

  Status allreduce(const hvd_collective_args& args) { return collectives_.allreduce(args); }
  Status reduce_scatter(const hvd_collective_args& args) {
    return collectives_.reduce_scatter(args);
  }
  Status allgather(const hvd_collective_args& args) { return collectives_.allgather(args); }
  Status broadcast(const hvd_collective_args& args) { return collectives_.broadcast(args); }
  Status alltoall(const hvd_collective_args& args) { return collectives_.alltoall(args); }
  Status barrier() { return collectives_.barrier(); }
  Status abort() {
    ep_->abort();
    return Status::success();
  }

  static constexpr uint64_t dtypes = HVD_DTYPES_1_0;
  static constexpr uint64_t reduce_ops = HVD_REDUCE_OPS_1_0;

 private:
  OfiBackend(std::unique_ptr<Endpoint> ep, hvd::algorithms::Tuning tuning)
      : ep_(std::move(ep)), collectives_(*ep_, tuning) {}

  std::unique_ptr<Endpoint> ep_;
  Collectives collectives_;
};

}  // namespace

#define HVD_OFI_STRINGIFY_(x) #x
#define HVD_OFI_STRINGIFY(x) HVD_OFI_STRINGIFY_(x)

HVD_BACKEND_PLUGIN(OfiBackend, "ofi",
                   HVD_PLUGIN_VERSION " (libfabric " HVD_OFI_STRINGIFY(
                       FI_MAJOR_VERSION) "." HVD_OFI_STRINGIFY(FI_MINOR_VERSION) ")",
                   "libfabric RDM tagged messages with hvd's own algorithms; HVD_OFI_PROVIDER "
                   "(default shm on one host, tcp;ofi_rxm across hosts)",
                   HVD_CAP_HOST_MEMORY | HVD_CAP_ALLGATHERV)
