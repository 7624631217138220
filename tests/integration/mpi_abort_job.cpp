// hvd_mpi_abort_job: the mpi backend's abort, through the plugin table, in a job of 2 ranks under
// mpirun (its ranks cannot be threads of one process). Rank 1 never calls; rank 0's allreduce,
// blocked on it, must end soon after another thread calls abort, however long the timeout, and
// every later call must fail at once. Prints what each step returned and when:
//
//   rank 0: allreduce -> HVD_ERR_STATE after 0.30 s: allreduce aborted after 300 ms
//
//   hvd_mpi_abort_job PLUGIN_PATH [COUNT]
//
// COUNT (float32 elements, 2 by default) picks the path: with MPI's collectives, 2 is the
// nonblocking call and 1048576 the blocking call on the plugin's thread.
#include <dlfcn.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "hvd/backend.h"

namespace {

thread_local std::string t_error;

// A self-bootstrapping backend needs no store: the services it could call say so.
hvd_status kv_set(void*, const char*, const void*, size_t) { return HVD_ERR_STATE; }
hvd_status kv_get(void*, const char*, int64_t, void**, size_t*) { return HVD_ERR_STATE; }
void free_value(void*, void* value) { std::free(value); }
hvd_status oob_allgather(void*, const void*, size_t, void*, int64_t) { return HVD_ERR_STATE; }
void log(void*, hvd_log_level, const char* message) { std::fprintf(stderr, "%s\n", message); }
void set_error(void*, const char* message) { t_error = message; }

double since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void report(int rank, const char* what, hvd_status s, double seconds, const std::string& error) {
  std::printf("rank %d: %s -> %s after %.2f s: %s\n", rank, what, hvd_status_name(s), seconds,
              s == HVD_SUCCESS ? "" : error.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: hvd_mpi_abort_job PLUGIN_PATH [COUNT]\n");
    return 2;
  }
  const uint64_t count = argc == 3 ? std::strtoull(argv[2], nullptr, 10) : 2;
  void* library = ::dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    std::fprintf(stderr, "%s\n", ::dlerror());
    return 1;
  }
  auto entry =
      reinterpret_cast<hvd_backend_entry_v1_fn>(::dlsym(library, HVD_BACKEND_ENTRY_SYMBOL));
  const hvd_backend_v1* table = entry != nullptr ? entry() : nullptr;
  if (table == nullptr || table->abort == nullptr) {
    std::fprintf(stderr, "no 1.1 table with abort in %s\n", argv[1]);
    return 1;
  }
  const char* rank_text = std::getenv("OMPI_COMM_WORLD_RANK");
  const int rank = rank_text != nullptr ? std::atoi(rank_text) : 0;

  hvd_host_services host{sizeof host, nullptr,       kv_set, kv_get,
                         free_value,  oob_allgather, log,    set_error};
  hvd_backend_init_args args{};
  args.struct_size = sizeof args;
  args.rank = rank;
  args.size = 2;
  args.local_rank = rank;
  args.local_size = 2;
  args.timeout_ms = 30000;  // abort, not the timeout, must end the call
  args.local_address = "";
  args.host = &host;
  hvd_backend_comm* comm = nullptr;
  if (table->init(&args, &comm) != HVD_SUCCESS) {
    std::printf("rank %d: init failed: %s\n", rank, t_error.c_str());
    return 1;
  }
  if (rank != 0) {
    std::this_thread::sleep_for(std::chrono::seconds(3));  // never calls; mpirun ends it
    return 0;
  }

  std::vector<float> data(count, 1.0f);
  hvd_collective_args a{};
  a.struct_size = sizeof a;
  a.sendbuf = data.data();
  a.recvbuf = data.data();
  a.count = count;
  a.dtype = HVD_FLOAT32;
  a.op = HVD_SUM;
  a.memory_type = HVD_MEMORY_HOST;
  a.device = -1;
  const auto start = std::chrono::steady_clock::now();
  auto call = std::async(std::launch::async, [&] {
    const hvd_status s = table->allreduce(comm, &a);
    return std::make_pair(s, t_error);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const hvd_status aborted = table->abort(comm);
  report(rank, "abort", aborted, since(start), t_error);
  const auto [s, error] = call.get();
  report(rank, "allreduce", s, since(start), error);

  auto later = std::chrono::steady_clock::now();
  t_error.clear();
  const hvd_status b = table->barrier(comm);
  report(rank, "then barrier", b, since(later), t_error);
  later = std::chrono::steady_clock::now();
  report(rank, "abort again", table->abort(comm), since(later), t_error);
  later = std::chrono::steady_clock::now();
  report(rank, "finalize", table->finalize(comm), since(later), t_error);
  return 0;
}
