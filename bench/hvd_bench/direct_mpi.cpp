// The MPI baseline: MPI_Allreduce / MPI_Allgather / MPI_Bcast on MPI_COMM_WORLD, in the MPI the
// mpi backend initialized (hvd-bench links the same libmpi, so it is one library in the process).
#include <mpi.h>

#include <climits>
#include <cstring>

#include "direct.hpp"

namespace hvd::bench {
namespace {

MPI_Datatype mpi_type(hvd_dtype dtype) {
  switch (dtype) {
    case HVD_UINT8:
      return MPI_UINT8_T;
    case HVD_INT8:
      return MPI_INT8_T;
    case HVD_INT32:
      return MPI_INT32_T;
    case HVD_INT64:
      return MPI_INT64_T;
    case HVD_FLOAT32:
      return MPI_FLOAT;
    case HVD_FLOAT64:
      return MPI_DOUBLE;
    default:
      return MPI_DATATYPE_NULL;
  }
}

MPI_Op mpi_op(hvd_reduce_op op) {
  switch (op) {
    case HVD_SUM:
      return MPI_SUM;
    case HVD_PRODUCT:
      return MPI_PROD;
    case HVD_MIN:
      return MPI_MIN;
    case HVD_MAX:
      return MPI_MAX;
    default:
      return MPI_OP_NULL;
  }
}

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
    if (mpi_type(c.dtype) == MPI_DATATYPE_NULL) {
      return std::string("MPI has no ") + hvd_dtype_name(c.dtype) + " type";
    }
    if (c.collective == Collective::kAllreduce && mpi_op(c.op) == MPI_OP_NULL) {
      return std::string("MPI has no ") + hvd_reduce_op_name(c.op) + " op";
    }
    if (c.count > static_cast<uint64_t>(INT_MAX)) return "count above INT_MAX";
    return "";
  }

  Status run(const CollectiveCall& c) override {
    const int count = static_cast<int>(c.count);
    const MPI_Datatype type = mpi_type(c.dtype);
    int rc = MPI_SUCCESS;
    switch (c.collective) {
      case Collective::kAllreduce:
        rc = MPI_Allreduce(c.send == c.recv ? MPI_IN_PLACE : c.send, c.recv, count, type,
                           mpi_op(c.op), MPI_COMM_WORLD);
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
