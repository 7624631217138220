// hvd_fault_job: one collective on every rank, chosen per rank on the command line, to stage in a
// real job the failures a backend must turn into errors within HVD_TIMEOUT: ranks that disagree on
// the call or its count, a rank that stops. Each rank prints what its call returned and how long
// it took:
//
//   rank 0: allreduce of 1048576 float32 -> HVD_ERR_TIMEOUT after 2.01 s: <hvd_last_error()>
//
//   --call C                 allreduce (default), broadcast (from rank 0), allgather or barrier
//   --call-for-rank R=C      rank R calls C instead
//   --count N                float32 elements (default 1048576); --count-for-rank R=N
//   --stop-rank R            rank R stops itself (SIGSTOP) instead of calling; once rank 0 has
//                            reported, it kills rank R (SIGKILL), which ends the job
//   --kill-rank R=MS         rank R kills itself (SIGKILL) MS milliseconds into its call: a peer
//                            lost in the middle of the data, if the call lasts that long
//   --die-rank R             rank R kills itself (SIGKILL) instead of calling: a peer certainly
//                            lost while the others wait for it
//   --late-rank R=MS         rank R begins its call MS milliseconds after the others: a slow rank
//   --abort-rank R           rank R aborts its communicator (hvd_comm_abort) 0.5 s after the
//                            others began their call, instead of calling, then waits 3 s before
//                            finalizing: its peers must learn of it from the backend, not from
//                            its leaving
//   --fused                  start the fusion scheduler first (one asynchronous allreduce): the
//                            call then goes through it, negotiated
//   --linger S               after reporting, wait S seconds before finalizing: a launcher that
//                            ends the job when one rank leaves (mpirun) lets the others report
//
// It exits 0 whatever the calls returned (the test reads the lines), so that the launcher does
// not stop the other ranks before they report.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "hvd/hvd.h"

namespace {

struct Options {
  std::string call = "allreduce";
  std::map<int, std::string> call_for_rank;
  uint64_t count = 1048576;
  std::map<int, uint64_t> count_for_rank;
  int stop_rank = -1;
  int kill_rank = -1;
  int kill_after_ms = 0;
  int die_rank = -1;
  int abort_rank = -1;
  int late_rank = -1;
  int late_ms = 0;
  double linger = 0;
  bool fused = false;
};

std::pair<int, std::string> split(const std::string& value) {
  const size_t eq = value.find('=');
  return {std::atoi(value.substr(0, eq).c_str()), value.substr(eq + 1)};
}

bool parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--call" && has_value) {
      o->call = argv[++i];
    } else if (arg == "--call-for-rank" && has_value) {
      auto [r, call] = split(argv[++i]);
      o->call_for_rank[r] = call;
    } else if (arg == "--count" && has_value) {
      o->count = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--count-for-rank" && has_value) {
      auto [r, count] = split(argv[++i]);
      o->count_for_rank[r] = std::strtoull(count.c_str(), nullptr, 10);
    } else if (arg == "--kill-rank" && has_value) {
      auto [r, ms] = split(argv[++i]);
      o->kill_rank = r;
      o->kill_after_ms = std::atoi(ms.c_str());
    } else if (arg == "--die-rank" && has_value) {
      o->die_rank = std::atoi(argv[++i]);
    } else if (arg == "--late-rank" && has_value) {
      auto [r, ms] = split(argv[++i]);
      o->late_rank = r;
      o->late_ms = std::atoi(ms.c_str());
    } else if (arg == "--abort-rank" && has_value) {
      o->abort_rank = std::atoi(argv[++i]);
    } else if (arg == "--fused") {
      o->fused = true;
    } else if (arg == "--linger" && has_value) {
      o->linger = std::atof(argv[++i]);
    } else if (arg == "--stop-rank" && has_value) {
      o->stop_rank = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "hvd_fault_job: unknown argument %s\n", arg.c_str());
      return false;
    }
  }
  return true;
}

// One call's buffers, made before the clock starts: under a sanitizer, writing 64 MiB takes
// seconds, which the reported time is not about.
struct Buffers {
  std::vector<float> send;
  std::vector<float> all;  // allgather's output
};

Buffers buffers_for(hvd_comm* comm, const std::string& call, uint64_t count) {
  Buffers b;
  b.send.assign(count, 1.0f);
  if (call == "allgather") b.all.resize(count * static_cast<uint64_t>(hvd_size(comm)));
  return b;
}

hvd_status run(hvd_comm* comm, const std::string& call, uint64_t count, Buffers& b) {
  if (call == "allreduce") {
    return hvd_allreduce(comm, b.send.data(), b.send.data(), count, HVD_FLOAT32, HVD_SUM, nullptr);
  }
  if (call == "broadcast") {
    return hvd_broadcast(comm, b.send.data(), b.send.data(), count, HVD_FLOAT32, 0, nullptr);
  }
  if (call == "allgather") {
    return hvd_allgather(comm, b.send.data(), b.all.data(), count, HVD_FLOAT32, nullptr);
  }
  if (call == "barrier") return hvd_barrier(comm);
  std::fprintf(stderr, "hvd_fault_job: unknown call %s\n", call.c_str());
  return HVD_ERR_INVALID_ARGUMENT;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, &o)) return 2;
  hvd_comm* comm = nullptr;
  if (hvd_init(nullptr, &comm) != HVD_SUCCESS) {
    std::printf("init failed: %s\n", hvd_last_error());
    return 1;
  }
  const int rank = hvd_rank(comm);
  const int size = hvd_size(comm);

  // Every rank's pid, so that rank 0 can end a stopped rank.
  int64_t pid = ::getpid();
  std::vector<int64_t> pids(static_cast<size_t>(size));
  if (hvd_allgather(comm, &pid, pids.data(), 1, HVD_INT64, nullptr) != HVD_SUCCESS) {
    std::printf("rank %d: allgather of pids failed: %s\n", rank, hvd_last_error());
    return 1;
  }

  if (o.fused) {
    int32_t one = 1;
    const int64_t shape[1] = {1};
    hvd_request* request = nullptr;
    if (hvd_allreduce_async(comm, "start the scheduler", &one, &one, HVD_INT32, 1, shape, HVD_SUM,
                            0, 0, nullptr, &request) != HVD_SUCCESS ||
        hvd_request_wait(request, -1) != HVD_SUCCESS) {
      std::printf("rank %d: starting the scheduler failed: %s\n", rank, hvd_last_error());
      return 1;
    }
    hvd_request_free(request);
  }

  if (rank == o.stop_rank) {
    std::printf("rank %d: stopping\n", rank);
    std::fflush(stdout);
    ::raise(SIGSTOP);
    ::_exit(0);  // only if continued
  }

  if (rank == o.die_rank) ::raise(SIGKILL);
  if (rank == o.abort_rank) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the others are in their call
    const hvd_status s = hvd_comm_abort(comm);
    std::printf("rank %d: aborted -> %s\n", rank, hvd_status_name(s));
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(3));
    hvd_finalize(comm);
    return 0;
  }

  const std::string call = o.call_for_rank.count(rank) ? o.call_for_rank[rank] : o.call;
  const uint64_t count = o.count_for_rank.count(rank) ? o.count_for_rank[rank] : o.count;
  if (rank == o.kill_rank) {
    std::thread([ms = o.kill_after_ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      ::raise(SIGKILL);
    }).detach();
  }
  Buffers buffers = buffers_for(comm, call, count);
  if (rank == o.late_rank) std::this_thread::sleep_for(std::chrono::milliseconds(o.late_ms));
  const auto start = std::chrono::steady_clock::now();
  const hvd_status s = run(comm, call, count, buffers);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("rank %d: %s of %llu float32 -> %s after %.2f s: %s\n", rank, call.c_str(),
              static_cast<unsigned long long>(count), hvd_status_name(s), seconds,
              s == HVD_SUCCESS ? "" : hvd_last_error());
  std::fflush(stdout);

  if (o.linger > 0) std::this_thread::sleep_for(std::chrono::duration<double>(o.linger));
  if (o.stop_rank >= 0 && rank == 0) ::kill(static_cast<pid_t>(pids[o.stop_rank]), SIGKILL);
  hvd_finalize(comm);
  return 0;
}
