// The MPI baseline: MPI_Allreduce / MPI_Allgather / MPI_Bcast / MPI_Reduce_scatter_block /
// MPI_Alltoall on MPI_COMM_WORLD (for a process set, on a communicator of its members made with
// MPI_Comm_create_group), in the MPI the mpi backend initialized (hvd-bench links the same
// libmpi, so it is one library in the process).
#include <mpi.h>

#include <climits>
#include <cstring>
#include <vector>

#include "direct.hpp"
#include "mpi_types.hpp"

namespace hvd::bench {
namespace {

using hvd::mpi::builtin_op;
using hvd::mpi::builtin_type;

class DirectMpi final : public DirectLibrary {
 public:
  DirectMpi(MPI_Comm comm, int rank) : comm_(comm), rank_(rank) {}
  ~DirectMpi() override {
    if (comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
  }
  DirectMpi(const DirectMpi&) = delete;
  DirectMpi& operator=(const DirectMpi&) = delete;

  std::string call_name(hvd_collective c) const override {
    switch (c) {
      case HVD_COLLECTIVE_ALLREDUCE:
        return "MPI_Allreduce";
      case HVD_COLLECTIVE_ALLGATHER:
        return "MPI_Allgather";
      case HVD_COLLECTIVE_BROADCAST:
        return "MPI_Bcast";
      case HVD_COLLECTIVE_REDUCE_SCATTER:
        return "MPI_Reduce_scatter_block";
      case HVD_COLLECTIVE_ALLTOALL:
        return "MPI_Alltoall";
      default:  // barrier and join are not benchmarked
        break;
    }
    return "?";
  }

  std::string unsupported(const CollectiveCall& c) const override {
    if (c.placement.memory_type != HVD_MEMORY_HOST) return "host memory only";
    if (builtin_type(c.dtype) == MPI_DATATYPE_NULL) {
      return std::string("MPI has no ") + hvd_dtype_name(c.dtype) + " type";
    }
    if (hvd_collective_reduces(c.collective) && builtin_op(c.op) == MPI_OP_NULL) {
      return std::string("MPI has no ") + hvd_reduce_op_name(c.op) + " op";
    }
    if (c.count > static_cast<uint64_t>(INT_MAX)) return "count above INT_MAX";
    if (c.collective == HVD_COLLECTIVE_ALLTOALL && c.send == c.recv) return "never in place";
    return "";
  }

  Status run(const CollectiveCall& c) override {
    const int count = static_cast<int>(c.count);
    const MPI_Datatype type = builtin_type(c.dtype);
    int rc = MPI_SUCCESS;
    switch (c.collective) {
      case HVD_COLLECTIVE_ALLREDUCE:
        rc = MPI_Allreduce(c.send == c.recv ? MPI_IN_PLACE : c.send, c.recv, count, type,
                           builtin_op(c.op), comm_);
        break;
      case HVD_COLLECTIVE_ALLGATHER: {
        const char* mine = static_cast<const char*>(c.recv) +
                           static_cast<size_t>(rank_) * c.count * hvd_dtype_size(c.dtype);
        rc = MPI_Allgather(c.send == mine ? MPI_IN_PLACE : c.send, count, type, c.recv, count, type,
                           comm_);
        break;
      }
      case HVD_COLLECTIVE_BROADCAST:
        if (rank_ == c.root && c.send != c.recv) {
          std::memcpy(c.recv, c.send, c.count * hvd_dtype_size(c.dtype));
        }
        rc = MPI_Bcast(c.recv, count, type, c.root, comm_);
        break;
      case HVD_COLLECTIVE_REDUCE_SCATTER:  // in place: the input is recv's, as hvd's
        rc = MPI_Reduce_scatter_block(c.send == c.recv ? MPI_IN_PLACE : c.send, c.recv, count, type,
                                      builtin_op(c.op), comm_);
        break;
      case HVD_COLLECTIVE_ALLTOALL:
        rc = MPI_Alltoall(c.send, count, type, c.recv, count, type, comm_);
        break;
      default:  // barrier and join are not benchmarked
        break;
    }
    if (rc == MPI_SUCCESS) return Status::success();
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(rc, text, &length);
    return error(HVD_ERR_REMOTE, call_name(c.collective) + ": " + std::string(text, length));
  }

 private:
  MPI_Comm comm_;
  int rank_;
};

}  // namespace

Result<std::unique_ptr<DirectLibrary>> open_direct_mpi(Comm& comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    return error(HVD_ERR_STATE, "MPI is not initialized: the mpi backend did not start MPI here");
  }
  int world_rank = -1;
  int world_size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  // hvd's job ranks are MPI_COMM_WORLD's under mpirun. A communicator of every rank is the job's
  // (a process set ranks its members in increasing order); a smaller one a process set's, whose
  // members hvd names by job rank.
  const bool whole_world = comm.size() == world_size;
  std::vector<int> members(static_cast<size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r) {
    members[static_cast<size_t>(r)] = whole_world ? r : comm.job_rank(r);
  }
  if (members[static_cast<size_t>(comm.rank())] != world_rank) {
    return error(HVD_ERR_MISMATCH, "MPI_COMM_WORLD is rank " + std::to_string(world_rank) + " of " +
                                       std::to_string(world_size) + ", hvd's job rank " +
                                       std::to_string(members[static_cast<size_t>(comm.rank())]) +
                                       " (rank " + std::to_string(comm.rank()) + " of " +
                                       std::to_string(comm.size()) + " here)");
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if (whole_world) return std::unique_ptr<DirectLibrary>(new DirectMpi(MPI_COMM_WORLD, world_rank));
  // A process set: a communicator of its members alone (MPI_Comm_create_group is collective over
  // them only, as the set's benchmark is), ranked as hvd ranks them.
  MPI_Group world_group = MPI_GROUP_NULL;
  MPI_Group group = MPI_GROUP_NULL;
  MPI_Comm set = MPI_COMM_NULL;
  int rc = MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  if (rc == MPI_SUCCESS) {
    rc = MPI_Group_incl(world_group, comm.size(), members.data(), &group);
  }
  if (rc == MPI_SUCCESS) rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, 0, &set);
  if (group != MPI_GROUP_NULL) MPI_Group_free(&group);
  if (world_group != MPI_GROUP_NULL) MPI_Group_free(&world_group);
  if (rc != MPI_SUCCESS || set == MPI_COMM_NULL) {
    return error(HVD_ERR_REMOTE, "MPI_Comm_create_group for the process set failed");
  }
  MPI_Comm_set_errhandler(set, MPI_ERRORS_RETURN);
  return std::unique_ptr<DirectLibrary>(new DirectMpi(set, comm.rank()));
}

}  // namespace hvd::bench
