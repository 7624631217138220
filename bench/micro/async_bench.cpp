// The scheduler's cost per tensor: K named allreduces submitted one by one (the way a backward
// pass hands over its gradients), negotiated from the response cache, fused and completed, on the
// one-rank noop backend (a copy is all it does), so that what is timed is hvd's own work.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "hvd/hvd.hpp"
#include "noop_comm.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// A communicator of its own: its scheduler votes as soon as work arrives (HVD_CYCLE_TIME=0), so
// that the step is the scheduler's work and not its clock.
hvd::Comm& scheduled() {
  static hvd::Comm comm = [] {
    ::setenv("HVD_CYCLE_TIME", "0", 1);
    return open_noop_comm();
  }();
  return comm;
}

// 4 KiB float tensors end to end in one buffer, as in a flat gradient buffer, reduced in place
// (the noop backend then copies nothing).
struct Step {
  explicit Step(int tensors) : data(static_cast<size_t>(tensors) * kElements, 1.0f) {
    for (int k = 0; k < tensors; ++k) names.push_back("grad." + std::to_string(k));
    requests.reserve(names.size());
  }
  // Submits every tensor; false (and the benchmark skips) on an error.
  bool submit(hvd::Comm& comm, benchmark::State& state) {
    for (size_t k = 0; k < names.size(); ++k) {
      float* x = data.data() + k * kElements;
      auto r = comm.allreduce_async(names[k], x, x, HVD_FLOAT32, shape, HVD_SUM);
      if (!r.ok()) return state.SkipWithError(r.status().to_string().c_str()), false;
      requests.push_back(std::move(r).value());
    }
    return true;
  }
  bool wait(benchmark::State& state) {
    for (const hvd::Request& r : requests) {
      const hvd::Status s = r.wait();
      if (!s.ok()) return state.SkipWithError(s.to_string().c_str()), false;
    }
    requests.clear();
    return true;
  }
  static constexpr size_t kElements = 1024;
  const std::vector<int64_t> shape = {static_cast<int64_t>(kElements)};
  std::vector<float> data;
  std::vector<std::string> names;
  std::vector<hvd::Request> requests;
};

void per_tensor(benchmark::State& state) {
  state.counters["per_tensor"] = benchmark::Counter(
      static_cast<double>(state.range(0)),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// Submit and wait for K tensors: the whole step.
void BM_async_step(benchmark::State& state) {
  hvd::Comm& comm = scheduled();
  Step step(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    if (!step.submit(comm, state) || !step.wait(state)) break;
  }
  per_tensor(state);
}
BENCHMARK(BM_async_step)->Arg(1)->Arg(1024)->UseRealTime();

// The submissions alone: what the application's thread spends handing K tensors over.
void BM_async_submit(benchmark::State& state) {
  hvd::Comm& comm = scheduled();
  Step step(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    const auto start = Clock::now();
    if (!step.submit(comm, state)) break;
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - start).count());
    if (!step.wait(state)) break;
  }
  per_tensor(state);
}
BENCHMARK(BM_async_submit)->Arg(1024)->UseManualTime();

}  // namespace
