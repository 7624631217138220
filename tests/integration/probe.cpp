// hvd_probe: a tiny hvd program whose behaviour per rank is set on the command line, so that
// integration tests can stage disagreements and failures in real multi-process jobs.
//
//   --backend-for-rank R=SPEC   rank R initializes with backend SPEC (others use HVD_BACKEND)
//   --exit-after-init R=CODE    rank R exits with CODE right after init, without finalizing
//   --allreduce                 allreduce (rank + 1) as int32 sum and print the result
//   --hang                      sleep for a minute after the work (to be stopped by hvdrun)
//   --exit-zero                 exit 0 even when an hvd call failed (so hvdrun stops nobody)
//   --print-local               print the local rank and size hvd settled on
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>

#include "hvd/hvd.hpp"

int main(int argc, char** argv) {
  // The rank as the launcher set it (hvdrun or mpirun), needed before init picks a backend.
  const char* rank_text = std::getenv("HVD_RANK");
  if (rank_text == nullptr) rank_text = std::getenv("OMPI_COMM_WORLD_RANK");
  const int rank = rank_text != nullptr ? std::atoi(rank_text) : 0;
  std::map<int, std::string> backend_for_rank;
  std::map<int, int> exit_after_init;
  bool allreduce = false, hang = false, exit_zero = false, print_local = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto split = [&](std::string value) {
      const size_t eq = value.find('=');
      return std::make_pair(std::atoi(value.substr(0, eq).c_str()), value.substr(eq + 1));
    };
    if (arg == "--backend-for-rank" && i + 1 < argc) {
      auto [r, spec] = split(argv[++i]);
      backend_for_rank[r] = spec;
    } else if (arg == "--exit-after-init" && i + 1 < argc) {
      auto [r, code] = split(argv[++i]);
      exit_after_init[r] = std::atoi(code.c_str());
    } else if (arg == "--allreduce") {
      allreduce = true;
    } else if (arg == "--hang") {
      hang = true;
    } else if (arg == "--exit-zero") {
      exit_zero = true;
    } else if (arg == "--print-local") {
      print_local = true;
    } else {
      std::fprintf(stderr, "hvd_probe: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  const int failure = exit_zero ? 0 : 1;

  hvd::Comm::Options options;
  if (backend_for_rank.count(rank)) options.backend = backend_for_rank[rank];
  auto comm = hvd::Comm::init(options);
  if (!comm) {
    std::printf("rank %d: init failed: %s\n", rank, comm.status().to_string().c_str());
    return failure;
  }
  std::printf("rank %d: init ok on %s\n", rank, comm->backend().c_str());
  std::fflush(stdout);
  if (exit_after_init.count(rank)) _exit(exit_after_init[rank]);
  if (print_local) {
    std::printf("rank %d: local rank %d of %d\n", rank, comm->local_rank(), comm->local_size());
  }
  if (allreduce) {
    int32_t value = comm->rank() + 1;
    hvd::Status s = comm->allreduce(&value, &value, 1, HVD_SUM);
    if (!s.ok()) {
      std::printf("rank %d: allreduce failed: %s\n", rank, s.to_string().c_str());
      return failure;  // finalizes: must not wait out the timeout on a broken job
    }
    std::printf("rank %d: allreduce = %d\n", rank, value);
  }
  std::fflush(stdout);
  if (hang) std::this_thread::sleep_for(std::chrono::seconds(60));
  return 0;
}
