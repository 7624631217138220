#include "fusion.hpp"

#include <chrono>
#include <string>
#include <vector>

namespace hvd::bench {
namespace {

using Clock = std::chrono::steady_clock;

// K tensors in one allocation each way, `gap` elements apart (0: end to end, as in a
// framework's flat gradient buffer; otherwise the scheduler copies them into its fusion buffer).
// Rank r's element at index j is (j + r) % 5, exact in float.
struct Tensors {
  Tensors(const Options& o, int rank, size_t gap = 0)
      : count(o.tensors), elements(o.tensor_bytes / sizeof(float)), stride(elements + gap) {
    send.resize(static_cast<size_t>(count) * stride);
    recv.assign(send.size(), -1.0f);
    for (size_t j = 0; j < send.size(); ++j) send[j] = static_cast<float>((j + rank) % 5);
    for (int k = 0; k < count; ++k) names.push_back("grad." + std::to_string(k));
  }
  // Wrong elements of the last step on this rank.
  uint64_t wrong(int size) const {
    uint64_t n = 0;
    for (size_t k = 0; k < static_cast<size_t>(count); ++k) {
      for (size_t j = k * stride; j < k * stride + elements; ++j) {
        float want = 0;
        for (int r = 0; r < size; ++r) want += static_cast<float>((j + r) % 5);
        if (recv[j] != want) ++n;
      }
    }
    return n;
  }
  int count;
  size_t elements;
  size_t stride;
  std::vector<float> send, recv;
  std::vector<std::string> names;
};

// One training step: every tensor submitted by name, then every request waited for.
Status step(Comm& comm, Tensors& t) {
  std::vector<Request> requests;
  requests.reserve(static_cast<size_t>(t.count));
  const std::vector<int64_t> shape = {static_cast<int64_t>(t.elements)};
  for (int k = 0; k < t.count; ++k) {
    const size_t at = static_cast<size_t>(k) * t.stride;
    HVD_ASSIGN_OR_RETURN(Request r,
                         comm.allreduce_async(t.names[static_cast<size_t>(k)], t.send.data() + at,
                                              t.recv.data() + at, HVD_FLOAT32, shape, HVD_SUM));
    requests.push_back(std::move(r));
  }
  for (const Request& r : requests) HVD_RETURN_IF_ERROR(r.wait());
  return Status::success();
}

// The same step with every tensor in one grouped submission (hvd_grouped_async).
Status grouped_step(Comm& comm, Tensors& t) {
  std::vector<hvd_tensor> group(static_cast<size_t>(t.count));
  const int64_t shape[] = {static_cast<int64_t>(t.elements)};
  for (int k = 0; k < t.count; ++k) {
    hvd_tensor& x = group[static_cast<size_t>(k)];
    const size_t at = static_cast<size_t>(k) * t.stride;
    x.collective = HVD_COLLECTIVE_ALLREDUCE;
    x.name = t.names[static_cast<size_t>(k)].c_str();
    x.sendbuf = t.send.data() + at;
    x.recvbuf = t.recv.data() + at;
    x.dtype = HVD_FLOAT32;
    x.ndim = 1;
    x.shape = shape;
    x.op = HVD_SUM;
  }
  HVD_ASSIGN_OR_RETURN(std::vector<Request> requests, comm.grouped_async(std::move(group)));
  for (const Request& r : requests) HVD_RETURN_IF_ERROR(r.wait());
  return Status::success();
}

// Seconds per call of `fn` over `iters` calls after `warmup`, averaged over the ranks.
template <typename Fn>
Result<double> time_it(Comm& comm, int warmup, int iters, Fn&& fn) {
  for (int i = 0; i < warmup; ++i) HVD_RETURN_IF_ERROR(fn());
  HVD_RETURN_IF_ERROR(comm.barrier());
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) HVD_RETURN_IF_ERROR(fn());
  double seconds = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
  HVD_RETURN_IF_ERROR(comm.allreduce(&seconds, &seconds, 1, HVD_SUM));
  return seconds / comm.size();
}

Result<uint64_t> wrong_over_ranks(Comm& comm, const Tensors& t) {
  int64_t wrong = static_cast<int64_t>(t.wrong(comm.size()));
  HVD_RETURN_IF_ERROR(comm.allreduce(&wrong, &wrong, 1, HVD_SUM));
  return static_cast<uint64_t>(wrong);
}

}  // namespace

Status measure_fused(Comm& comm, const Options& o, FusionResult* result) {
  Tensors t(o, comm.rank());
  result->tensors = t.count;
  result->tensor_bytes = t.elements * sizeof(float);
  // The yardstick first, while the communicator has no scheduler: one blocking allreduce of
  // every tensor's bytes.
  HVD_ASSIGN_OR_RETURN(result->single_seconds, time_it(comm, o.warmup_iters, o.iters, [&] {
                         return comm.allreduce(t.send.data(), t.recv.data(), t.send.size(),
                                               HVD_FLOAT32, HVD_SUM);
                       }));
  for (int i = 0; i < o.warmup_iters; ++i) HVD_RETURN_IF_ERROR(step(comm, t));
  const hvd_scheduler_stats before = comm.scheduler_stats();
  HVD_ASSIGN_OR_RETURN(result->fused_seconds,
                       time_it(comm, 0, o.iters, [&] { return step(comm, t); }));
  const hvd_scheduler_stats after = comm.scheduler_stats();
  const double cycles = static_cast<double>(after.cycles - before.cycles);
  result->cycles_per_step = cycles / o.iters;
  result->negotiation_seconds_per_cycle =
      cycles > 0 ? (after.negotiation_seconds - before.negotiation_seconds) / cycles : 0;
  // The timing's own allreduce and barrier went through the scheduler too: one call each.
  result->calls_per_step_fused =
      static_cast<double>(after.backend_calls - before.backend_calls - 2) / o.iters;
  result->full_negotiations = after.full_negotiations - before.full_negotiations;
  HVD_ASSIGN_OR_RETURN(uint64_t wrong, wrong_over_ranks(comm, t));
  result->wrong += wrong;
  t.recv.assign(t.recv.size(), -1.0f);
  HVD_ASSIGN_OR_RETURN(result->grouped_seconds, time_it(comm, o.warmup_iters, o.iters,
                                                        [&] { return grouped_step(comm, t); }));
  HVD_ASSIGN_OR_RETURN(wrong, wrong_over_ranks(comm, t));
  result->wrong += wrong;
  Tensors apart(o, comm.rank(), 16);
  HVD_ASSIGN_OR_RETURN(result->apart_seconds,
                       time_it(comm, o.warmup_iters, o.iters, [&] { return step(comm, apart); }));
  HVD_ASSIGN_OR_RETURN(wrong, wrong_over_ranks(comm, apart));
  result->wrong += wrong;
  return Status::success();
}

Status measure_unfused(Comm& comm, const Options& o, FusionResult* result) {
  Tensors t(o, comm.rank());
  for (int i = 0; i < o.warmup_iters; ++i) HVD_RETURN_IF_ERROR(step(comm, t));
  const hvd_scheduler_stats before = comm.scheduler_stats();
  HVD_ASSIGN_OR_RETURN(result->unfused_seconds,
                       time_it(comm, 0, o.iters, [&] { return step(comm, t); }));
  const hvd_scheduler_stats after = comm.scheduler_stats();
  result->calls_per_step_unfused =
      static_cast<double>(after.backend_calls - before.backend_calls - 2) / o.iters;
  HVD_ASSIGN_OR_RETURN(uint64_t wrong, wrong_over_ranks(comm, t));
  result->wrong += wrong;
  return Status::success();
}

}  // namespace hvd::bench
