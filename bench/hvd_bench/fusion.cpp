#include "fusion.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace hvd::bench {
namespace {

using Clock = std::chrono::steady_clock;

// K tensors in one allocation each way, `gap` elements apart (0: end to end, as in a
// framework's flat gradient buffer; otherwise the scheduler copies them into its fusion buffer).
// Rank r's element at index j is (j + r) % 5, exact in float.
struct Tensors {
  Tensors(const Options& o, int rank, size_t gap = 0, const std::string& prefix = "grad.")
      : count(o.tensors), elements(o.tensor_bytes / sizeof(float)), stride(elements + gap) {
    send.resize(static_cast<size_t>(count) * stride);
    recv.assign(send.size(), -1.0f);
    for (size_t j = 0; j < send.size(); ++j) send[j] = static_cast<float>((j + rank) % 5);
    for (int k = 0; k < count; ++k) names.push_back(prefix + std::to_string(k));
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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

using Steps = std::vector<std::function<Status()>>;

Status warm_up(const Options& o, const Steps& steps) {
  for (int i = 0; i < o.warmup_iters; ++i) {
    for (const auto& step : steps) HVD_RETURN_IF_ERROR(step());
  }
  return Status::success();
}

// The steps take turns for `iters` rounds, each step timed on its own, so that they all share
// the moments of a noisy machine. Per step kind: the median over the rounds of the seconds
// averaged over the ranks.
Result<std::vector<double>> interleaved(Comm& direct, const Options& o, const Steps& steps) {
  HVD_RETURN_IF_ERROR(direct.barrier());
  const size_t iters = static_cast<size_t>(o.iters);
  std::vector<double> seconds(steps.size() * iters);  // by step kind, then round
  for (size_t i = 0; i < iters; ++i) {
    for (size_t k = 0; k < steps.size(); ++k) {
      const auto t0 = Clock::now();
      HVD_RETURN_IF_ERROR(steps[k]());
      seconds[k * iters + i] = std::chrono::duration<double>(Clock::now() - t0).count();
    }
  }
  HVD_RETURN_IF_ERROR(
      direct.allreduce(seconds.data(), seconds.data(), seconds.size(), HVD_FLOAT64, HVD_SUM));
  std::vector<double> medians;
  for (size_t k = 0; k < steps.size(); ++k) {
    std::vector<double> v(seconds.begin() + k * iters, seconds.begin() + (k + 1) * iters);
    medians.push_back(median(std::move(v)) / direct.size());
  }
  return medians;
}

Result<uint64_t> wrong_over_ranks(Comm& comm, const Tensors& t) {
  int64_t wrong = static_cast<int64_t>(t.wrong(comm.size()));
  HVD_RETURN_IF_ERROR(comm.allreduce(&wrong, &wrong, 1, HVD_SUM));
  return static_cast<uint64_t>(wrong);
}

}  // namespace

Status start_scheduler(Comm& comm) {
  int32_t x = 0;
  HVD_ASSIGN_OR_RETURN(Request r, comm.allreduce_async("hvd-bench.start", &x, &x, HVD_INT32,
                                                       std::vector<int64_t>{1}, HVD_SUM));
  return r.wait();
}

Status measure_fusion(const Communicators& comms, const Options& o, FusionResult* result) {
  Comm& direct = comms.direct;
  const int rank = direct.rank();
  Tensors single(o, rank), fused(o, rank), apart(o, rank, 16), unfused(o, rank);
  result->tensors = fused.count;
  result->tensor_bytes = fused.elements * sizeof(float);
  // The yardstick: one blocking allreduce of every tensor's bytes, straight to the backend.
  auto single_step = [&] {
    return direct.allreduce(single.send.data(), single.recv.data(), single.send.size(), HVD_FLOAT32,
                            HVD_SUM);
  };
  // The scheduler's counters over the fused steps and over the unfused steps.
  hvd_scheduler_stats fused_counts{}, unfused_counts{};
  auto counted = [](Comm& comm, hvd_scheduler_stats* counts, auto&& step) {
    const hvd_scheduler_stats before = comm.scheduler_stats();
    const Status s = step();
    const hvd_scheduler_stats after = comm.scheduler_stats();
    counts->cycles += after.cycles - before.cycles;
    counts->negotiation_seconds += after.negotiation_seconds - before.negotiation_seconds;
    counts->backend_calls += after.backend_calls - before.backend_calls;
    counts->full_negotiations += after.full_negotiations - before.full_negotiations;
    return s;
  };
  const Steps steps = {
      single_step,
      [&] { return counted(comms.fused, &fused_counts, [&] { return step(comms.fused, fused); }); },
      [&] { return step(comms.fused, apart); },  // the fused tensors' names and specs
      [&] {
        return counted(comms.unfused, &unfused_counts,
                       [&] { return step(comms.unfused, unfused); });
      },
  };
  HVD_RETURN_IF_ERROR(warm_up(o, steps));
  fused_counts = unfused_counts = {};
  HVD_ASSIGN_OR_RETURN(std::vector<double> medians, interleaved(direct, o, steps));
  result->single_seconds = medians[0];
  result->fused_seconds = medians[1];
  result->apart_seconds = medians[2];
  result->unfused_seconds = medians[3];
  const double cycles = static_cast<double>(fused_counts.cycles);
  result->cycles_per_step = cycles / o.iters;
  result->negotiation_seconds_per_cycle =
      cycles > 0 ? fused_counts.negotiation_seconds / cycles : 0;
  result->calls_per_step_fused = static_cast<double>(fused_counts.backend_calls) / o.iters;
  result->calls_per_step_unfused = static_cast<double>(unfused_counts.backend_calls) / o.iters;
  result->full_negotiations = fused_counts.full_negotiations;

  // Grouped steps name their tensors apart from the fused ones (a group is part of a tensor's
  // spec, and the default cache holds one step's worth), so they take turns with the yardstick
  // in a round of their own, and their ratio is to that round's yardstick.
  Tensors grouped(o, rank, 0, "group.");
  const Steps grouped_steps = {single_step, [&] { return grouped_step(comms.fused, grouped); }};
  HVD_RETURN_IF_ERROR(warm_up(o, grouped_steps));
  HVD_ASSIGN_OR_RETURN(medians, interleaved(direct, o, grouped_steps));
  result->grouped_single_seconds = medians[0];
  result->grouped_seconds = medians[1];
  for (const Tensors* x : {&single, &fused, &apart, &unfused, &grouped}) {
    HVD_ASSIGN_OR_RETURN(uint64_t wrong, wrong_over_ranks(direct, *x));
    result->wrong += wrong;
  }
  return Status::success();
}

}  // namespace hvd::bench
