// The MPI baseline: MPI_Allreduce / MPI_Allgather / MPI_Bcast on MPI_COMM_WORLD, in the MPI the
// mpi backend initialized (hvd-bench links the same libmpi, so it is one library in the process).
#include <mpi.h>

#include <climits>
#include <cstring>

#include "direct.hpp"
#include "mpi_types.hpp"

namespace hvd::bench {
namespace {

using hvd::mpi::builtin_op;
using hvd::mpi::builtin_type;

class DirectMpi final : public DirectLibrary {
 public:
  explicit DirectMpi(int rank) : rank_(rank) {}

  std::string call_name(Collective c) const override {
    switch (c) {
      case Collective::kAllreduce:
        return "MPI_Allreduce";
      case Collective::kAllgather:
        return "MPI_Allgather";
      case Collective::kBroadcast:
        return "MPI_Bcast";
    }
    return "?";
  }

  std::string unsupported(const CollectiveCall& c) const override {
    if (c.placement.memory_type != HVD_MEMORY_HOST) return "host memory only";
    if (builtin_type(c.dtype) == MPI_DATATYPE_NULL) {
      return std::string("MPI has no ") + hvd_dtype_name(c.dtype) + " type";
    }
    if (c.collective == Collective::kAllreduce && builtin_op(c.op) == MPI_OP_NULL) {
      return std::string("MPI has no ") + hvd_reduce_op_name(c.op) + " op";
    }
    if (c.count > static_cast<uint64_t>(INT_MAX)) return "count above INT_MAX";
    return "";
  }

  Status run(const CollectiveCall& c) override {
    const int count = static_cast<int>(c.count);
    const MPI_Datatype type = builtin_type(c.dtype);
    int rc = MPI_SUCCESS;
    switch (c.collective) {
      case Collective::kAllreduce:
        rc = MPI_Allreduce(c.send == c.recv ? MPI_IN_PLACE : c.send, c.recv, count, type,
                           builtin_op(c.op), MPI_COMM_WORLD);
        break;
      case Collective::kAllgather: {
        const char* mine = static_cast<const char*>(c.recv) +
                           static_cast<size_t>(rank_) * c.count * hvd_dtype_size(c.dtype);
        rc = MPI_Allgather(c.send == mine ? MPI_IN_PLACE : c.send, count, type, c.recv, count, type,
                           MPI_COMM_WORLD);
        break;
      }
      case Collective::kBroadcast:
        if (rank_ == c.root && c.send != c.recv) {
          std::memcpy(c.recv, c.send, c.count * hvd_dtype_size(c.dtype));
        }
        rc = MPI_Bcast(c.recv, count, type, c.root, MPI_COMM_WORLD);
        break;
    }
    if (rc == MPI_SUCCESS) return Status::success();
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(rc, text, &length);
    return error(HVD_ERR_REMOTE, call_name(c.collective) + ": " + std::string(text, length));
  }

 private:
  int rank_;
};

}  // namespace

Result<std::unique_ptr<DirectLibrary>> open_direct_mpi(Comm& comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    return error(HVD_ERR_STATE, "MPI is not initialized: the mpi backend did not start MPI here");
  }
  int rank = -1;
  int size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rank != comm.rank() || size != comm.size()) {
    return error(HVD_ERR_MISMATCH, "MPI_COMM_WORLD is rank " + std::to_string(rank) + " of " +
                                       std::to_string(size) + ", hvd's job rank " +
                                       std::to_string(comm.rank()) + " of " +
                                       std::to_string(comm.size()));
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return std::unique_ptr<DirectLibrary>(new DirectMpi(rank));
}

}  // namespace hvd::bench
