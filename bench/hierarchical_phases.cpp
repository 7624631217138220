// hvd-hierarchical-phases: the phases of a hierarchical allreduce timed one by one, through hvd's
// C API, to tell where its time goes (docs/performance.md, "Hierarchical allreduce").
//
//   hvdrun -np 4 ... hvd-hierarchical-phases [--bytes N] [--iters K]
//
// Splits the world into the ranks of each host and the ranks of each local rank across hosts (as
// HVD_HIERARCHICAL_ALLREDUCE does), then runs 1 + K iterations (the first not recorded) of the
// three phases back to back (reduce-scatter within the host, allreduce of this rank's block
// across hosts, allgather within the host), iteration after iteration with no barrier, as a
// training loop's allreduces come; then 1 + K iterations of the same phases each between
// barriers, and of an allreduce on the world communicator (flat, or hierarchical as
// HVD_HIERARCHICAL_ALLREDUCE says). Float32 data of value rank + 1, so every result is checked
// exactly. Rank 0 prints, per phase, the slowest, median and fastest rank's median time and the
// median rank's CPU time (the whole process, backend threads included). Ranks are assumed placed
// alike on every host, as hierarchical allreduce requires.
#include <hvd/hvd.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double cpu_ms() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1e3 +
         (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e3;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

bool ok(hvd_status status, const char* what) {
  if (status == HVD_SUCCESS) return true;
  std::fprintf(stderr, "hvd-hierarchical-phases: %s: %s\n", what, hvd_last_error());
  return false;
}

struct Timing {
  std::vector<double> wall, cpu;
};

}  // namespace

int main(int argc, char** argv) {
  uint64_t bytes = 64ull << 20;
  int iters = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--bytes" && i + 1 < argc) {
      bytes = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--iters" && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: hvd-hierarchical-phases [--bytes N] [--iters K]\n");
      return 2;
    }
  }
  hvd_comm* world = nullptr;
  if (!ok(hvd_init(nullptr, &world), "hvd_init")) return 1;
  const int rank = hvd_rank(world), size = hvd_size(world);
  const int local_size = hvd_local_size(world);
  hvd_comm* across = nullptr;
  hvd_comm* within = nullptr;
  // This rank's host is its rank among the ranks of its local rank, the same on every host.
  if (!ok(hvd_comm_split(world, hvd_local_rank(world), rank, &across), "split across hosts") ||
      !ok(hvd_comm_split(world, hvd_rank(across), rank, &within), "split within the host")) {
    return 1;
  }
  const uint64_t count = bytes / sizeof(float) / local_size * local_size;
  const uint64_t block = count / local_size;
  std::vector<float> input(count, float(rank + 1)), scattered(block), output(count);

  enum Phase {
    kScatter,
    kAcross,
    kGather,
    kTotal,
    kScatterAlone,
    kAcrossAlone,
    kGatherAlone,
    kWorld,
    kPhases
  };
  const char* const names[kPhases] = {
      "back to back: reduce-scatter within the host", "back to back: allreduce across hosts",
      "back to back: allgather within the host",      "back to back: the three phases",
      "between barriers: reduce-scatter within",      "between barriers: allreduce across",
      "between barriers: allgather within",           "allreduce on the world communicator"};
  std::vector<Timing> timing(kPhases);
  int it = 0;  // iteration 0 of each loop warms up (connections, buffers) and is not recorded
  const auto record = [&](int phase, double wall0, double cpu0) {
    if (it > 0) {
      timing[phase].wall.push_back(now_ms() - wall0);
      timing[phase].cpu.push_back(cpu_ms() - cpu0);
    }
  };
  const auto scatter = [&] {
    return ok(hvd_reduce_scatter(within, input.data(), scattered.data(), block, HVD_FLOAT32,
                                 HVD_SUM, nullptr),
              "reduce-scatter");
  };
  const auto reduce = [&] {
    return ok(hvd_allreduce(across, scattered.data(), scattered.data(), block, HVD_FLOAT32, HVD_SUM,
                            nullptr),
              "allreduce across hosts");
  };
  const auto gather = [&] {
    return ok(hvd_allgather(within, scattered.data(), output.data(), block, HVD_FLOAT32, nullptr),
              "allgather");
  };
  const float expected = float(size) * float(size + 1) / 2;
  const auto checked = [&](const char* what) {
    for (uint64_t i = 0; i < count; ++i) {
      if (output[i] != expected) {
        std::fprintf(stderr, "hvd-hierarchical-phases: rank %d, %s: element %llu is %g, not %g\n",
                     rank, what, static_cast<unsigned long long>(i), double(output[i]),
                     double(expected));
        return false;
      }
    }
    std::fill(output.begin(), output.end(), 0.0f);
    return true;
  };
  // Back to back, as a training loop's allreduces come: one barrier before them all.
  if (!ok(hvd_barrier(world), "barrier")) return 1;
  for (it = 0; it <= iters; ++it) {
    double start = now_ms(), start_cpu = cpu_ms(), w = start, c = start_cpu;
    if (!scatter()) return 1;
    record(kScatter, w, c);
    w = now_ms(), c = cpu_ms();
    if (!reduce()) return 1;
    record(kAcross, w, c);
    w = now_ms(), c = cpu_ms();
    if (!gather()) return 1;
    record(kGather, w, c);
    record(kTotal, start, start_cpu);
    if (!checked("back to back")) return 1;
  }
  for (it = 0; it <= iters; ++it) {
    for (int phase : {kScatterAlone, kAcrossAlone, kGatherAlone}) {
      if (!ok(hvd_barrier(world), "barrier")) return 1;
      const double w = now_ms(), c = cpu_ms();
      const bool done = phase == kScatterAlone  ? scatter()
                        : phase == kAcrossAlone ? reduce()
                                                : gather();
      if (!done) return 1;
      record(phase, w, c);
    }
    if (!checked("between barriers")) return 1;
    if (!ok(hvd_barrier(world), "barrier")) return 1;
    const double w = now_ms(), c = cpu_ms();
    if (!ok(hvd_allreduce(world, input.data(), output.data(), count, HVD_FLOAT32, HVD_SUM, nullptr),
            "allreduce on the world communicator")) {
      return 1;
    }
    record(kWorld, w, c);
    if (!checked("allreduce on the world communicator")) return 1;
  }

  // Every rank's medians to rank 0: [phase][wall, cpu].
  std::vector<double> mine(2 * kPhases), all(2 * kPhases * static_cast<size_t>(size));
  for (int p = 0; p < kPhases; ++p) {
    mine[2 * p] = median(timing[p].wall);
    mine[2 * p + 1] = median(timing[p].cpu);
  }
  if (!ok(hvd_allgather(world, mine.data(), all.data(), mine.size(), HVD_FLOAT64, nullptr),
          "allgather of the timings")) {
    return 1;
  }
  if (rank == 0) {
    std::printf(
        "# %d ranks, %d per host, backend %s; %llu bytes of float32, %d iterations after "
        "one warm-up; every result checked\n",
        size, local_size, hvd_backend_name(world),
        static_cast<unsigned long long>(count * sizeof(float)), iters);
    std::printf(
        "# per phase, over the ranks' medians: slowest, median and fastest rank (ms); "
        "CPU: the median rank's process CPU time (ms)\n");
    std::printf("%-48s %10s %10s %10s %10s\n", "phase", "slowest", "median", "fastest", "cpu");
    for (int p = 0; p < kPhases; ++p) {
      std::vector<double> wall, cpu;
      for (int r = 0; r < size; ++r) {
        wall.push_back(all[static_cast<size_t>(r) * mine.size() + 2 * p]);
        cpu.push_back(all[static_cast<size_t>(r) * mine.size() + 2 * p + 1]);
      }
      std::printf("%-48s %10.1f %10.1f %10.1f %10.1f\n", names[p],
                  *std::max_element(wall.begin(), wall.end()), median(wall),
                  *std::min_element(wall.begin(), wall.end()), median(cpu));
    }
  }
  const bool released = ok(hvd_finalize(within), "finalize") &&
                        ok(hvd_finalize(across), "finalize") && ok(hvd_finalize(world), "finalize");
  return released ? 0 : 1;
}
