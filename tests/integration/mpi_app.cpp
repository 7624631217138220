// An application that owns MPI: it initializes MPI itself at the thread level named on the
// command line, uses hvd's mpi backend, and then uses and finalizes MPI after hvd is done.
//
//   hvd_mpi_app single     hvd must refuse MPI_THREAD_SINGLE with a clear message
//   hvd_mpi_app multiple   hvd must work, and leave MPI initialized for the application
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "hvd/hvd.hpp"

int main(int argc, char** argv) {
  const bool single = argc > 1 && std::strcmp(argv[1], "single") == 0;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, single ? MPI_THREAD_SINGLE : MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);

  hvd::Comm::Options options;
  options.backend = "mpi";
  auto comm = hvd::Comm::init(options);
  int ok = 1;
  if (single) {
    std::printf("rank %d: %s\n", rank,
                comm.ok() ? "init unexpectedly succeeded" : comm.status().to_string().c_str());
    ok = !comm.ok() &&
         comm.status().message().find("needs MPI_THREAD_SERIALIZED") != std::string::npos;
  } else if (!comm.ok()) {
    std::printf("rank %d: init failed: %s\n", rank, comm.status().to_string().c_str());
    ok = 0;
  } else {
    int32_t value = rank + 1;
    ok = comm->allreduce(&value, &value, 1, HVD_SUM).ok();
    ok = ok && comm->finalize().ok();
    // MPI is the application's: still usable after hvd finalized.
    int32_t again = 1, total = 0;
    int finalized = 0;
    MPI_Finalized(&finalized);
    ok = ok && !finalized &&
         MPI_Allreduce(&again, &total, 1, MPI_INT32_T, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS;
    std::printf("rank %d: hvd allreduce = %d, application allreduce after hvd = %d\n", rank, value,
                total);
  }
  MPI_Finalize();
  std::printf("rank %d: %s\n", rank, ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
