// hvd-bench's fusion mode (--tensors K): a training step's worth of small named tensors through
// the asynchronous API, fused and unfused, beside one allreduce of all their bytes.
#ifndef HVD_BENCH_FUSION_HPP
#define HVD_BENCH_FUSION_HPP

#include "hvd/hvd.hpp"
#include "options.hpp"

namespace hvd::bench {

struct FusionResult {
  int tensors = 0;
  uint64_t tensor_bytes = 0;
  std::string threshold;  // HVD_FUSION_THRESHOLD of the fused run ("default" if unset)
  // Medians of steps timed one by one, averaged over the ranks.
  double single_seconds = 0;   // one blocking allreduce of tensors x tensor_bytes
  double fused_seconds = 0;    // one step, fused, tensors submitted one by one
  double apart_seconds = 0;    // the same with the tensors not end to end (through the buffer)
  double grouped_seconds = 0;  // one step, fused, the whole step as one grouped submission
  double grouped_single_seconds = 0;         // the single allreduce in turns with the grouped steps
  double unfused_seconds = 0;                // one step, threshold 0
  double negotiation_seconds_per_cycle = 0;  // fused run, timed steps
  double cycles_per_step = 0;
  double calls_per_step_fused = 0;  // backend collectives per step
  double calls_per_step_unfused = 0;
  uint64_t full_negotiations = 0;  // in the fused run's timed steps: cache misses
  uint64_t wrong = 0;              // elements, summed over ranks and both runs
};

// Three communicators of one backend, alive together.
struct Communicators {
  Comm& fused;    // opened with the fusion threshold of the environment
  Comm& unfused;  // opened with HVD_FUSION_THRESHOLD=0
  Comm& direct;   // no scheduler: its blocking calls go straight to the backend
};

// Starts `comm`'s scheduler with one tiny asynchronous allreduce.
Status start_scheduler(Comm& comm);

// The single allreduce, fused, apart and unfused steps take turns, then the single allreduce and
// grouped steps; every figure is a median of steps timed one by one.
Status measure_fusion(const Communicators& comms, const Options& options, FusionResult* result);

}  // namespace hvd::bench

#endif  // HVD_BENCH_FUSION_HPP
