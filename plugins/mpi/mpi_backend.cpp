// The MPI backend: hvd's collectives on the MPI library the job runs under (Open MPI here).
//
// It finds its peers through MPI itself (HVD_CAP_SELF_BOOTSTRAP): under mpirun no rendezvous
// variable is needed. It initializes MPI only if the application has not (and then finalizes it
// at process exit, so hvd may be initialized again), needs MPI_THREAD_SERIALIZED because hvd may
// call from a background thread, and works on its own duplicate of MPI_COMM_WORLD so that it
// never mixes with the application's MPI traffic.
#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "hvd/reduce.h"
#include "hvd/sdk/backend.hpp"
#include "mpi_types.hpp"

namespace {

using hvd::Status;

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(length));
}

Status check(int code, const char* what) {
  if (code == MPI_SUCCESS) return Status::success();
  return Status(HVD_ERR_REMOTE, std::string(what) + ": " + mpi_error_text(code));
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    default:
      return "MPI_THREAD_MULTIPLE";
  }
}

// float16 and bfloat16 have no MPI type: they travel as 16-bit integers and reduce through
// user-defined operations built on the SDK's kernels, one per (dtype, op).
template <hvd_dtype D, hvd_reduce_op O>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  hvd_reduce(inout, inout, in, static_cast<uint64_t>(*len), D, O);
}

struct HalfOps {
  MPI_Op ops[2][HVD_REDUCE_OP_COUNT] = {};  // [bfloat16?][op]

  Status create() {
    MPI_User_function* const fns[2][HVD_REDUCE_OP_COUNT] = {
        {half_reduce<HVD_FLOAT16, HVD_SUM>, half_reduce<HVD_FLOAT16, HVD_SUM>,
         half_reduce<HVD_FLOAT16, HVD_MIN>, half_reduce<HVD_FLOAT16, HVD_MAX>,
         half_reduce<HVD_FLOAT16, HVD_PRODUCT>},
        {half_reduce<HVD_BFLOAT16, HVD_SUM>, half_reduce<HVD_BFLOAT16, HVD_SUM>,
         half_reduce<HVD_BFLOAT16, HVD_MIN>, half_reduce<HVD_BFLOAT16, HVD_MAX>,
         half_reduce<HVD_BFLOAT16, HVD_PRODUCT>}};
    for (int t = 0; t < 2; ++t) {
      for (int o = 0; o < HVD_REDUCE_OP_COUNT; ++o) {
        HVD_RETURN_IF_ERROR(
            check(MPI_Op_create(fns[t][o], /*commute=*/1, &ops[t][o]), "MPI_Op_create"));
      }
    }
    return Status::success();
  }
  void free() {
    for (auto& row : ops) {
      for (MPI_Op& op : row) {
        if (op != MPI_OP_NULL && op != MPI_Op{}) MPI_Op_free(&op);
      }
    }
  }
};

// 16-bit floats travel as 16-bit words; the reduction is the backend's own user op.
MPI_Datatype mpi_type(hvd_dtype dtype) {
  const bool half = dtype == HVD_FLOAT16 || dtype == HVD_BFLOAT16;
  return half ? MPI_UINT16_T : hvd::mpi::builtin_type(dtype);
}

// AVERAGE sums, then divides.
MPI_Op builtin_op(hvd_reduce_op op) {
  return op == HVD_AVERAGE ? MPI_SUM : hvd::mpi::builtin_op(op);
}

// MPI counts are int: larger buffers would need derived datatypes, which hvd does not do yet.
Status to_int(uint64_t count, int* out, const char* what) {
  if (count > static_cast<uint64_t>(INT_MAX)) {
    return Status(HVD_ERR_UNSUPPORTED, std::string(what) + ": " + std::to_string(count) +
                                           " elements exceed MPI's int count limit");
  }
  *out = static_cast<int>(count);
  return Status::success();
}

// MPI_Finalize runs at process exit when this plugin initialized MPI: MPI cannot be initialized
// twice in one process, and hvd may be.
bool g_we_initialized_mpi = false;
void finalize_mpi_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

class MpiBackend {
 public:
  static hvd::Result<std::unique_ptr<MpiBackend>> create(const hvd::sdk::InitContext& ctx) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = MPI_THREAD_SINGLE;
    if (!initialized) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (finalized) return Status(HVD_ERR_STATE, "MPI was already finalized in this process");
      HVD_RETURN_IF_ERROR(check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided),
                                "MPI_Init_thread"));
      if (!g_we_initialized_mpi) {
        g_we_initialized_mpi = true;
        std::atexit(finalize_mpi_at_exit);
      }
    } else {
      MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED) {
      return Status(HVD_ERR_UNSUPPORTED,
                    std::string("MPI provides ") + thread_level_name(provided) +
                        " but hvd's mpi backend needs MPI_THREAD_SERIALIZED (hvd calls MPI from "
                        "its own threads): initialize MPI with MPI_Init_thread(..., "
                        "MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE, ...)");
    }
    auto self = std::unique_ptr<MpiBackend>(new MpiBackend);
    HVD_RETURN_IF_ERROR(check(MPI_Comm_dup(MPI_COMM_WORLD, &self->comm_), "MPI_Comm_dup"));
    MPI_Comm_set_errhandler(self->comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(self->comm_, &self->rank_);
    MPI_Comm_size(self->comm_, &self->size_);
    if (self->rank_ != ctx.rank || self->size_ != ctx.size) {
      return Status(HVD_ERR_MISMATCH,
                    "MPI says this is rank " + std::to_string(self->rank_) + " of " +
                        std::to_string(self->size_) + " but hvd was told rank " +
                        std::to_string(ctx.rank) + " of " + std::to_string(ctx.size) +
                        ": launch with mpirun (or unset the HVD_RANK/HVD_SIZE variables)");
    }
    HVD_RETURN_IF_ERROR(self->half_ops_.create());
    return self;
  }

  ~MpiBackend() {
    half_ops_.free();
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  Status allreduce(const hvd_collective_args& a) {
    int count = 0;
    HVD_RETURN_IF_ERROR(to_int(a.count, &count, "allreduce"));
    if (count == 0) return Status::success();
    const bool half = a.dtype == HVD_FLOAT16 || a.dtype == HVD_BFLOAT16;
    const MPI_Op op = half ? half_ops_.ops[a.dtype == HVD_BFLOAT16][a.op] : builtin_op(a.op);
    const void* send = a.sendbuf == a.recvbuf ? MPI_IN_PLACE : a.sendbuf;
    HVD_RETURN_IF_ERROR(check(MPI_Allreduce(send, a.recvbuf, count, mpi_type(a.dtype), op, comm_),
                              "MPI_Allreduce"));
    if (a.op == HVD_AVERAGE) hvd_divide(a.recvbuf, a.count, a.dtype, size_);
    return Status::success();
  }

  Status allgather(const hvd_collective_args& a) {
    const size_t element = hvd_dtype_size(a.dtype);
    if (a.recv_counts != nullptr) return allgatherv(a, element);
    int count = 0;
    int total = 0;  // the receive buffer must be addressable with int counts too
    HVD_RETURN_IF_ERROR(to_int(a.count, &count, "allgather"));
    HVD_RETURN_IF_ERROR(to_int(a.count * static_cast<uint64_t>(size_), &total, "allgather"));
    if (count == 0) return Status::success();
    const char* mine =
        static_cast<const char*>(a.recvbuf) + static_cast<size_t>(rank_) * a.count * element;
    const void* send = a.sendbuf == mine ? MPI_IN_PLACE : a.sendbuf;
    const MPI_Datatype type = mpi_type(a.dtype);
    return check(MPI_Allgather(send, count, type, a.recvbuf, count, type, comm_), "MPI_Allgather");
  }

  Status broadcast(const hvd_collective_args& a) {
    int count = 0;
    HVD_RETURN_IF_ERROR(to_int(a.count, &count, "broadcast"));
    if (count == 0) return Status::success();
    if (rank_ == a.root && a.sendbuf != a.recvbuf) {
      std::memcpy(a.recvbuf, a.sendbuf, a.count * hvd_dtype_size(a.dtype));
    }
    return check(MPI_Bcast(a.recvbuf, count, mpi_type(a.dtype), a.root, comm_), "MPI_Bcast");
  }

  Status barrier() { return check(MPI_Barrier(comm_), "MPI_Barrier"); }

 private:
  MpiBackend() = default;

  Status allgatherv(const hvd_collective_args& a, size_t element) {
    std::vector<int> counts(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
    uint64_t offset = 0;
    for (int r = 0; r < size_; ++r) {
      HVD_RETURN_IF_ERROR(to_int(a.recv_counts[r], &counts[static_cast<size_t>(r)], "allgatherv"));
      HVD_RETURN_IF_ERROR(to_int(offset, &displs[static_cast<size_t>(r)], "allgatherv"));
      offset += a.recv_counts[r];
    }
    if (offset == 0) return Status::success();
    const char* mine = static_cast<const char*>(a.recvbuf) +
                       static_cast<size_t>(displs[static_cast<size_t>(rank_)]) * element;
    const void* send = a.sendbuf == mine ? MPI_IN_PLACE : a.sendbuf;
    const MPI_Datatype type = mpi_type(a.dtype);
    return check(MPI_Allgatherv(send, counts[static_cast<size_t>(rank_)], type, a.recvbuf,
                                counts.data(), displs.data(), type, comm_),
                 "MPI_Allgatherv");
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  HalfOps half_ops_;
};

std::string version() {
  char library[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(library, &length);
  std::string text(library, static_cast<size_t>(length));
  const size_t comma = text.find(',');  // "Open MPI v4.1.4, package: ..." -> "Open MPI v4.1.4"
  return std::string(HVD_PLUGIN_VERSION) + " (" + text.substr(0, comma) + ")";
}

}  // namespace

extern "C" HVD_PLUGIN_EXPORT const hvd_backend_v1* hvd_backend_entry_v1(void) {
  static const std::string v = version();
  return hvd::sdk::backend_table<MpiBackend>(
      "mpi", v.c_str(),
      "MPI collectives on a duplicate of MPI_COMM_WORLD (needs no rendezvous under mpirun)",
      HVD_CAP_HOST_MEMORY | HVD_CAP_ALLGATHERV | HVD_CAP_SELF_BOOTSTRAP);
}
