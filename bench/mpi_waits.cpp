// hvd-mpi-waits: the three ways the mpi backend could wait for one of MPI's collectives, timed
// side by side in one job, for each collective and size: MPI's blocking call on the calling thread
// (what an application calls, and hvd-bench's direct baseline; it cannot be bounded), the
// nonblocking call tested to completion (bounded: what the backend does by default), and the
// blocking call on another thread that the caller waits for (bounded: sdk::Runner, what the
// backend does where it is faster). Prints each one's median time per call over 5 repetitions.
// Which the backend takes per collective and size follows from these figures (plugins/mpi,
// docs/performance.md "MPI's collectives").
//
//   mpirun -np 2 hvd-mpi-waits
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "hvd/sdk/runner.hpp"
#include "hvd/types.h"

namespace {

using Clock = std::chrono::steady_clock;

// The collectives timed, in the order printed.
constexpr hvd_collective kCollectives[] = {HVD_COLLECTIVE_ALLREDUCE, HVD_COLLECTIVE_BROADCAST,
                                           HVD_COLLECTIVE_ALLGATHER, HVD_COLLECTIVE_REDUCE_SCATTER,
                                           HVD_COLLECTIVE_ALLTOALL};

struct Buffers {
  std::vector<float> in, out;
  std::vector<int> counts, displs;
  int n = 0;  // elements per rank
};

int blocking(hvd_collective c, Buffers& b, MPI_Comm comm) {
  switch (c) {
    case HVD_COLLECTIVE_ALLREDUCE:
      return MPI_Allreduce(b.in.data(), b.out.data(), b.n, MPI_FLOAT, MPI_SUM, comm);
    case HVD_COLLECTIVE_BROADCAST:
      return MPI_Bcast(b.in.data(), b.n, MPI_FLOAT, 0, comm);
    case HVD_COLLECTIVE_ALLGATHER:
      return MPI_Allgather(b.in.data(), b.n, MPI_FLOAT, b.out.data(), b.n, MPI_FLOAT, comm);
    case HVD_COLLECTIVE_REDUCE_SCATTER:
      return MPI_Reduce_scatter_block(b.in.data(), b.out.data(), b.n, MPI_FLOAT, MPI_SUM, comm);
    default:
      return MPI_Alltoallv(b.in.data(), b.counts.data(), b.displs.data(), MPI_FLOAT, b.out.data(),
                           b.counts.data(), b.displs.data(), MPI_FLOAT, comm);
  }
}

int nonblocking(hvd_collective c, Buffers& b, MPI_Comm comm) {
  MPI_Request r = MPI_REQUEST_NULL;
  int rc = MPI_SUCCESS;
  switch (c) {
    case HVD_COLLECTIVE_ALLREDUCE:
      rc = MPI_Iallreduce(b.in.data(), b.out.data(), b.n, MPI_FLOAT, MPI_SUM, comm, &r);
      break;
    case HVD_COLLECTIVE_BROADCAST:
      rc = MPI_Ibcast(b.in.data(), b.n, MPI_FLOAT, 0, comm, &r);
      break;
    case HVD_COLLECTIVE_ALLGATHER:
      rc = MPI_Iallgather(b.in.data(), b.n, MPI_FLOAT, b.out.data(), b.n, MPI_FLOAT, comm, &r);
      break;
    case HVD_COLLECTIVE_REDUCE_SCATTER:
      rc = MPI_Ireduce_scatter_block(b.in.data(), b.out.data(), b.n, MPI_FLOAT, MPI_SUM, comm, &r);
      break;
    default:
      rc = MPI_Ialltoallv(b.in.data(), b.counts.data(), b.displs.data(), MPI_FLOAT, b.out.data(),
                          b.counts.data(), b.displs.data(), MPI_FLOAT, comm, &r);
  }
  int done = 0;
  while (rc == MPI_SUCCESS && !done) rc = MPI_Test(&r, &done, MPI_STATUS_IGNORE);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  int size = 1;
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  hvd::sdk::Runner runner;
  const size_t bytes_per_rank[] = {8, 65536, 262144, 1048576, 16777216};
  if (rank == 0) {
    std::printf(
        "# %d ranks; us per call, median of 5 repetitions; nonblocking and thread / "
        "blocking in brackets\n",
        size);
    std::printf("%-15s %10s %12s %22s %22s\n", "collective", "bytes", "blocking", "nonblocking",
                "blocking on a thread");
  }
  for (const hvd_collective collective : kCollectives) {
    for (size_t bytes : bytes_per_rank) {
      Buffers b;
      b.n = static_cast<int>(bytes / sizeof(float));
      b.in.assign(static_cast<size_t>(b.n) * static_cast<size_t>(size), 1.0f);
      b.out.assign(b.in.size(), 0.0f);
      for (int r = 0; r < size; ++r) {
        b.counts.push_back(b.n);
        b.displs.push_back(r * b.n);
      }
      const int iterations = bytes < 1024 ? 2000 : bytes < 1000000 ? 200 : 10;
      std::vector<double> us[3];
      for (int rep = 0; rep < 5; ++rep) {
        for (int way = 0; way < 3; ++way) {
          MPI_Barrier(comm);
          const auto start = Clock::now();
          for (int i = 0; i < iterations; ++i) {
            if (way == 0) {
              blocking(collective, b, comm);
            } else if (way == 1) {
              nonblocking(collective, b, comm);
            } else {
              runner.run(
                  [&] {
                    blocking(collective, b, comm);
                    return hvd::Status::success();
                  },
                  Clock::now() + std::chrono::minutes(5));
            }
          }
          us[way].push_back(
              std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iterations);
        }
      }
      double median[3];
      for (int way = 0; way < 3; ++way) {
        std::sort(us[way].begin(), us[way].end());
        median[way] = us[way][2];
      }
      if (rank == 0) {
        std::printf("%-15s %10zu %12.1f %12.1f (%5.2fx) %12.1f (%5.2fx)\n",
                    hvd_collective_name(collective), bytes, median[0], median[1],
                    median[1] / median[0], median[2], median[2] / median[0]);
      }
    }
  }
  MPI_Comm_free(&comm);
  MPI_Finalize();
  return 0;
}
