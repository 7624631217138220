// The cost of one collective call through hvd: the C API, validation, the plugin's C table and
// back, on the noop backend (which does nothing). The goal is under 50 ns (docs/performance.md).
#include <benchmark/benchmark.h>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "hvd/hvd.hpp"
#include "noop_comm.hpp"

namespace {

// One communicator on the noop backend for every benchmark here.
hvd::Comm& noop() {
  static hvd::Comm comm = open_noop_comm();
  return comm;
}
hvd_comm* noop_comm() { return noop().get(); }

void BM_abi_allreduce(benchmark::State& state) {
  hvd_comm* comm = noop_comm();
  float value = 1;
  for (auto _ : state) {
    benchmark::DoNotOptimize(hvd_allreduce(comm, &value, &value, 1, HVD_FLOAT32, HVD_SUM, nullptr));
  }
}
BENCHMARK(BM_abi_allreduce);

void BM_abi_broadcast(benchmark::State& state) {
  hvd_comm* comm = noop_comm();
  float value = 1;
  for (auto _ : state) {
    benchmark::DoNotOptimize(hvd_broadcast(comm, &value, &value, 1, HVD_FLOAT32, 0, nullptr));
  }
}
BENCHMARK(BM_abi_broadcast);

// The C++ wrapper adds a Status on the way back.
void BM_cpp_allreduce(benchmark::State& state) {
  hvd::Comm& comm = noop();
  float value = 1;
  for (auto _ : state) benchmark::DoNotOptimize(comm.allreduce(&value, &value, 1, HVD_SUM));
}
BENCHMARK(BM_cpp_allreduce);

// The floor: an indirect call the compiler cannot inline, as a plugin table entry is.
__attribute__((noinline)) hvd_status nothing(const void*) { return HVD_SUCCESS; }
void BM_indirect_call(benchmark::State& state) {
  hvd_status (*volatile fn)(const void*) = &nothing;
  float value = 1;
  for (auto _ : state) benchmark::DoNotOptimize(fn(&value));
}
BENCHMARK(BM_indirect_call);

}  // namespace
