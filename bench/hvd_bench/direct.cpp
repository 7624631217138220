#include "direct.hpp"

namespace hvd::bench {

Status run_through_hvd(Comm& comm, const CollectiveCall& c) {
  switch (c.collective) {
    case HVD_COLLECTIVE_ALLREDUCE:
      return comm.allreduce(c.send, c.recv, c.count, c.dtype, c.op, &c.placement);
    case HVD_COLLECTIVE_ALLGATHER:
      return comm.allgather(c.send, c.recv, c.count, c.dtype, &c.placement);
    case HVD_COLLECTIVE_BROADCAST:
      return comm.broadcast(c.send, c.recv, c.count, c.dtype, c.root, &c.placement);
    case HVD_COLLECTIVE_REDUCE_SCATTER:
      return comm.reduce_scatter(c.send, c.recv, c.count, c.dtype, c.op, &c.placement);
    case HVD_COLLECTIVE_ALLTOALL:
      return comm.alltoall(c.send, c.send_counts.data(), c.recv, c.count * c.send_counts.size(),
                           nullptr, c.dtype, &c.placement);
    default:  // barrier and join are not benchmarked
      break;
  }
  return error(HVD_ERR_INTERNAL, "unknown collective");
}

Result<std::unique_ptr<DirectLibrary>> open_direct(Comm& comm) {
  const std::string backend = comm.backend();
#ifdef HVD_BENCH_WITH_GLOO
  if (backend == "gloo") return open_direct_gloo(comm);
#endif
#ifdef HVD_BENCH_WITH_MPI
  if (backend == "mpi") return open_direct_mpi(comm);
#endif
#ifdef HVD_BENCH_WITH_NCCL
  if (backend == "nccl") return open_direct_nccl(comm);
#endif
  if (backend == "ofi") {
    return error(HVD_ERR_NOT_FOUND,
                 "no direct library collective to compare with (hvd's own algorithms over "
                 "libfabric)");
  }
  return error(HVD_ERR_NOT_FOUND, "no direct baseline: hvd-bench has none for backend '" + backend +
                                      "' (it knows gloo, mpi and nccl, where they were built)");
}

}  // namespace hvd::bench
