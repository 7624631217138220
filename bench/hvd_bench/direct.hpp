// One collective call, made through hvd or on a backend's library directly (the baseline).
#ifndef HVD_BENCH_DIRECT_HPP
#define HVD_BENCH_DIRECT_HPP

#include <memory>
#include <string>
#include <vector>

#include "hvd/hvd.hpp"
#include "options.hpp"

namespace hvd::bench {

// Everything one call needs. `count` is hvd's count argument: allreduce and broadcast, the
// buffer's elements; allgather, each rank's part (the output holds size x count);
// reduce_scatter, each rank's result (the input holds size x count); alltoall, what each rank
// sends to each (send_counts, size entries of count; both buffers hold size x count).
struct CollectiveCall {
  hvd_collective collective = HVD_COLLECTIVE_ALLREDUCE;
  const void* send = nullptr;  // == recv for in place (for allgather: recv + rank's block)
  void* recv = nullptr;
  uint64_t count = 0;
  hvd_dtype dtype = HVD_FLOAT32;
  hvd_reduce_op op = HVD_SUM;
  int root = 0;
  std::vector<uint64_t> send_counts;  // alltoall
  hvd_placement placement{sizeof(hvd_placement), HVD_MEMORY_HOST, -1, nullptr};
};

Status run_through_hvd(Comm& comm, const CollectiveCall& call);

// A backend's own library, called without hvd: what the plugin host's cost is measured against.
class DirectLibrary {
 public:
  virtual ~DirectLibrary() = default;
  // The library's name for the call: "MPI_Allreduce", "gloo_algorithms::allreduce" (the Gloo
  // algorithms the plugin runs).
  virtual std::string call_name(hvd_collective collective) const = 0;
  // Empty when the library can run this call directly; else why not ("MPI has no bfloat16").
  virtual std::string unsupported(const CollectiveCall& call) const = 0;
  virtual Status run(const CollectiveCall& call) = 0;
};

// The direct library under `comm`'s backend, connected to the same ranks (a process set's too).
// Collective over `comm`. NOT_FOUND when hvd-bench knows no direct path for that backend.
Result<std::unique_ptr<DirectLibrary>> open_direct(Comm& comm);

#ifdef HVD_BENCH_WITH_GLOO
Result<std::unique_ptr<DirectLibrary>> open_direct_gloo(Comm& comm);
#endif
#ifdef HVD_BENCH_WITH_MPI
Result<std::unique_ptr<DirectLibrary>> open_direct_mpi(Comm& comm);
#endif
#ifdef HVD_BENCH_WITH_NCCL
Result<std::unique_ptr<DirectLibrary>> open_direct_nccl(Comm& comm);
#endif

}  // namespace hvd::bench

#endif  // HVD_BENCH_DIRECT_HPP
